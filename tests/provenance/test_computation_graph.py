from __future__ import annotations

import dag_cbor
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multiformats import CID

from gradfed_ipfs import Block, MemoryBlockStore, parse_cid
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import (
    BlockCorrupt,
    CircularDependency,
    ComputationGraphError,
    GradfedError,
    GraphNodeNotFound,
    GraphSerializationError,
    MalformedArrow,
    MalformedManifest,
    ShapeMismatch,
)
from gradfed_ipfs.formats import encode_arrow_file
from gradfed_ipfs.provenance import (
    ComputationGraphStore,
    ComputationNode,
    provenance_chain_from_store,
)


def cid(label: str) -> str:
    return str(make_cid(label.encode(), "raw"))


def linear_graph(names: tuple[str, ...] = ("input", "matmul", "relu", "output")):
    """A linear chain input -> matmul -> relu -> output, linked by fake labels."""
    graph = ComputationGraphStore()
    nodes = []
    previous: list[str] = []
    for name in names:
        node = ComputationNode(name, name, list(previous))
        graph.add_node(node)
        graph.record_output(name, f"cid_{name}")
        previous = [f"cid_{name}"]
        nodes.append(node)
    return graph, nodes


def real_cid_graph() -> ComputationGraphStore:
    """A -> B -> D and A -> C -> D with real CIDs, plus metadata and a gradient."""
    graph = ComputationGraphStore()
    graph.add_node(ComputationNode("A", "input", []).with_meta("layer", "0"))
    graph.add_node(ComputationNode("B", "matmul", [cid("a_out"), cid("weights")]))
    graph.add_node(ComputationNode("C", "relu", [cid("a_out")]))
    graph.add_node(ComputationNode("D", "add", [cid("b_out"), cid("c_out")]))
    for name in "ABCD":
        graph.record_output(name, cid(f"{name.lower()}_out"))
    graph.record_gradient("D", cid("d_grad"))
    return graph


# ----------------------------------------------------------------------- seed §11 cases


def test_add_and_retrieve_node() -> None:
    graph = ComputationGraphStore()
    node = ComputationNode.new("matmul", ["cid_a", "cid_b"]).with_meta("layer", "fc1")
    graph.add_node(node)
    got = graph.get_node(node.id)
    assert got is not None
    assert got.op == "matmul"
    assert got.metadata == {"layer": "fc1"}
    assert got.output_cid is None
    assert got.gradient_cid is None
    assert len(node.id) == 36
    assert ComputationNode.new("x").id != node.id


def test_topological_order() -> None:
    graph, _ = linear_graph()
    order = graph.topological_order()
    assert order.index("input") < order.index("matmul") < order.index("relu")
    assert order.index("relu") < order.index("output")


def test_record_output_and_gradient() -> None:
    graph = ComputationGraphStore()
    graph.add_node(ComputationNode("a", "op", []))
    graph.add_node(ComputationNode("b", "op", ["out_a"]))
    assert graph.edge_count() == 0
    graph.record_output("a", "out_a")
    graph.record_output("a", "out_a")  # no duplicate edge
    graph.record_gradient("a", "grad_a")
    assert graph.edges == [("a", "b")]
    node = graph.get_node("a")
    assert node is not None
    assert node.output_cid == "out_a"
    assert node.gradient_cid == "grad_a"


def test_record_output_missing_node() -> None:
    with pytest.raises(GraphNodeNotFound, match="Node not found: x"):
        ComputationGraphStore().record_output("x", "c")


def test_record_gradient_missing_node() -> None:
    with pytest.raises(ComputationGraphError):
        ComputationGraphStore().record_gradient("x", "c")
    with pytest.raises(KeyError):
        ComputationGraphStore().record_gradient("x", "c")


def test_checkpoint_roundtrip() -> None:
    graph, _ = linear_graph()
    restored = ComputationGraphStore.from_checkpoint(graph.checkpoint())
    assert restored.node_count() == 4
    assert restored.edge_count() == graph.edge_count() == 3
    assert restored == graph
    assert restored.topological_order() == graph.topological_order()


def test_from_checkpoint_errors() -> None:
    with pytest.raises(GraphSerializationError, match="Checkpoint deserialization"):
        ComputationGraphStore.from_checkpoint(b"{not json")
    with pytest.raises(GraphSerializationError):
        ComputationGraphStore.from_checkpoint(b'{"nodes": {}, "edges": [["a", "b"]]}')
    with pytest.raises(GraphSerializationError):
        ComputationGraphStore.from_checkpoint(b'{"nodes": {"a": {"id": "a"}}, "edges": []}')


def test_provenance_chain() -> None:
    graph = ComputationGraphStore()
    graph.add_node(ComputationNode("A", "input", []))
    graph.record_output("A", "cid_a")
    graph.add_node(ComputationNode("B", "matmul", ["cid_a"]))
    graph.record_output("B", "cid_b")
    graph.add_node(ComputationNode("C", "relu", ["cid_b"]))
    graph.record_output("C", "cid_c")
    chain = graph.provenance_chain("cid_c")
    assert [n.id for n in chain] == ["A", "B", "C"]
    assert chain[-1].output_cid == "cid_c"
    assert chain[0].input_cids == []


def test_provenance_chain_unknown_cid() -> None:
    graph, _ = linear_graph()
    assert graph.provenance_chain("nope") == []


def test_provenance_chain_diamond_visits_each_node_once() -> None:
    chain = real_cid_graph().provenance_chain(cid("d_out"))
    # The seed's order: D's last input (c) is explored first, and the visits are reversed.
    assert [n.id for n in chain] == ["B", "A", "C", "D"]


def test_provenance_chain_deep_graph_is_iterative() -> None:
    graph, _ = linear_graph(tuple(f"n{i:05d}" for i in range(3000)))
    assert len(graph.provenance_chain("cid_n02999")) == 3000


def test_find_consumers() -> None:
    graph = ComputationGraphStore()
    graph.add_node(ComputationNode("a", "op", ["shared_cid"]))
    graph.add_node(ComputationNode("b", "op", ["shared_cid", "other_cid"]))
    assert sorted(n.id for n in graph.find_consumers("shared_cid")) == ["a", "b"]
    assert [n.id for n in graph.find_consumers("other_cid")] == ["b"]


def test_empty_graph_topological_order() -> None:
    assert ComputationGraphStore().topological_order() == []


def test_single_node_graph() -> None:
    graph = ComputationGraphStore()
    graph.add_node(ComputationNode("only", "op", []))
    assert graph.topological_order() == ["only"]


def test_graph_store_node_and_edge_counts() -> None:
    graph, _ = linear_graph()
    assert graph.node_count() == 4
    assert graph.edge_count() == 3
    assert len(graph.nodes()) == 4


def test_topological_order_is_deterministic_sorted_frontier() -> None:
    graph = ComputationGraphStore()
    for name in ("z", "b", "m"):
        graph.add_node(ComputationNode(name, "op", []))
        graph.record_output(name, f"out_{name}")
    graph.add_node(ComputationNode("sink", "op", ["out_z", "out_b", "out_m"]))
    assert graph.topological_order() == ["b", "m", "z", "sink"]


# ----------------------------------------------------------------------- cycles


def test_cycle_raises_circular_dependency() -> None:
    graph = ComputationGraphStore()
    graph.add_node(ComputationNode("root", "op", []))
    graph.record_output("root", "r")
    graph.add_node(ComputationNode("x", "op", ["r", "y_out"]))
    graph.add_node(ComputationNode("y", "op", ["x_out"]))
    graph.record_output("x", "x_out")
    graph.record_output("y", "y_out")
    with pytest.raises(CircularDependency, match="x, y"):
        graph.topological_order()


async def test_cycle_cannot_be_saved() -> None:
    graph = ComputationGraphStore()
    graph.add_node(ComputationNode("x", "op", ["y_out"]))
    graph.add_node(ComputationNode("y", "op", ["x_out"]))
    graph.record_output("x", "x_out")
    graph.record_output("y", "y_out")
    store = MemoryBlockStore()
    with pytest.raises(CircularDependency):
        await graph.save_to_store(store)
    assert len(store) == 0


# ----------------------------------------------------------------------- Arrow gradients


async def test_store_and_load_gradient_arrow() -> None:
    store = MemoryBlockStore()
    graph = ComputationGraphStore()
    graph.add_node(ComputationNode("n", "matmul", []))
    data = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    grad_cid = await graph.store_gradient_as_arrow("n", data, [2, 3], store)
    assert grad_cid
    assert grad_cid.startswith("bafkrei")  # raw codec, not dag-cbor
    node = graph.get_node("n")
    assert node is not None
    assert node.gradient_cid == grad_cid
    block = await store.get(grad_cid)  # the CID resolves
    assert block.data.startswith(b"ARROW1")
    values = ComputationGraphStore.load_gradient_from_arrow(block.data, [2, 3])
    np.testing.assert_array_equal(values, data)
    np.testing.assert_array_equal(await graph.load_gradient("n", store), data)
    encoded = ComputationGraphStore.encode_gradient_arrow(data, [2, 3])
    np.testing.assert_array_equal(ComputationGraphStore.load_gradient_from_arrow(encoded), data)


async def test_gradient_shape_preserved() -> None:
    store = MemoryBlockStore()
    graph = ComputationGraphStore()
    graph.add_node(ComputationNode("n", "conv", []))
    tensor = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    await graph.store_gradient_as_arrow("n", tensor, [2, 3, 4], store)
    values = await graph.load_gradient("n", store, [2, 3, 4])
    np.testing.assert_array_equal(values.reshape(2, 3, 4), tensor)


async def test_gradient_shape_mismatch_error() -> None:
    store = MemoryBlockStore()
    graph = ComputationGraphStore()
    graph.add_node(ComputationNode("n", "op", []))
    await graph.store_gradient_as_arrow("n", np.ones(6), [2, 3], store)
    with pytest.raises(ShapeMismatch):
        await graph.load_gradient("n", store, [3, 2])
    with pytest.raises(ShapeMismatch):
        await graph.store_gradient_as_arrow("n", np.ones(6), [4, 2], store)


async def test_large_gradient_is_stored_as_chunked_dag() -> None:
    store = MemoryBlockStore()
    graph = ComputationGraphStore()
    graph.add_node(ComputationNode("n", "conv", []))
    big = np.random.default_rng(5).standard_normal((600, 1000)).astype(np.float32)  # 2.4 MB
    grad_cid = await graph.store_gradient_as_arrow("n", big, [600, 1000], store)
    assert grad_cid.startswith("bafyrei")  # manifest of chunk blocks
    values = await graph.load_gradient("n", store, [600, 1000])
    assert values.tobytes() == big.tobytes()
    with pytest.raises(ShapeMismatch):
        await graph.load_gradient("n", store, [1000, 600])


async def test_store_gradient_node_not_found() -> None:
    store = MemoryBlockStore()
    with pytest.raises(GraphNodeNotFound):
        await ComputationGraphStore().store_gradient_as_arrow("x", [1.0], [1], store)
    assert len(store) == 0  # nothing encoded or stored for a missing node


def test_load_seed_layout_gradient_column() -> None:
    column = pa.array(np.arange(6, dtype=np.float32), type=pa.float32())
    field = pa.field(
        "gradient",
        pa.float32(),
        nullable=False,
        metadata={"shape": "[2, 3]", "dtype": "float32", "gradient_shape": "2,3"},
    )
    schema = pa.schema([field])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(pa.record_batch([column], schema=schema))
    data = sink.getvalue().to_pybytes()
    values = ComputationGraphStore.load_gradient_from_arrow(data, [2, 3])
    np.testing.assert_array_equal(values, np.arange(6))
    with pytest.raises(ShapeMismatch):
        ComputationGraphStore.load_gradient_from_arrow(data, [3, 2])


def test_load_gradient_rejects_other_arrow_files() -> None:
    data = encode_arrow_file({"other": pa.array([1.0], type=pa.float32())}, {})
    with pytest.raises(MalformedArrow, match="gradient"):
        ComputationGraphStore.load_gradient_from_arrow(data)
    with pytest.raises(MalformedArrow):
        ComputationGraphStore.load_gradient_from_arrow(b"not arrow at all")


# ----------------------------------------------------------------------- IPLD persistence


async def test_save_and_load_graph_from_store() -> None:
    store = MemoryBlockStore()
    graph = real_cid_graph()
    root = await graph.save_to_store(store)
    assert root.codec.name == "dag-cbor"
    assert str(root).startswith("bafyrei")
    assert len(store) == 5  # 4 nodes + root
    assert await store.is_pinned(root)
    loaded = await ComputationGraphStore.load_from_store(root, store)
    assert loaded == graph
    assert loaded.edges == graph.edges
    assert loaded.topological_order() == graph.topological_order()
    # Same graph, same root: content addressing is deterministic.
    assert await loaded.save_to_store(MemoryBlockStore()) == root


async def test_node_blocks_hold_real_cid_links() -> None:
    store = MemoryBlockStore()
    graph = real_cid_graph()
    root = await graph.save_to_store(store)
    root_record = dag_cbor.decode((await store.get(root)).data)
    assert root_record["type"] == "gradfed/graph"
    d_block = dag_cbor.decode((await store.get(root_record["nodes"]["D"])).data)
    assert all(isinstance(link, CID) for link in d_block["inputs"])
    assert d_block["inputs"][0] == parse_cid(cid("b_out"))
    assert isinstance(d_block["output"], CID)
    assert d_block["gradient"] == parse_cid(cid("d_grad"))
    parents = {bytes(p) for p in d_block["parents"]}
    assert parents == {bytes(root_record["nodes"]["B"]), bytes(root_record["nodes"]["C"])}


async def test_fake_labels_survive_persistence() -> None:
    store = MemoryBlockStore()
    graph, _ = linear_graph()
    loaded = await ComputationGraphStore.load_from_store(await graph.save_to_store(store), store)
    assert loaded == graph


async def test_provenance_chain_on_persisted_graph() -> None:
    store = MemoryBlockStore()
    graph = real_cid_graph()
    root = await graph.save_to_store(store)
    in_memory = [n.id for n in graph.provenance_chain(cid("d_out"))]
    persisted = await provenance_chain_from_store(root, cid("d_out"), store)
    assert [n.id for n in persisted] == in_memory
    assert await provenance_chain_from_store(root, "unknown", store) == []


async def test_load_from_store_detects_tampering() -> None:
    store = MemoryBlockStore()
    root = await real_cid_graph().save_to_store(store)
    key = bytes(root)
    cid_obj, data = store.blocks[key]
    store.blocks[key] = (cid_obj, data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(BlockCorrupt):
        await ComputationGraphStore.load_from_store(root, store)


async def test_load_from_store_rejects_wrong_records() -> None:
    store = MemoryBlockStore()
    other = await store.put(Block.new(dag_cbor.encode({"type": "other", "version": 1}), 0x71))
    with pytest.raises(MalformedManifest):
        await ComputationGraphStore.load_from_store(other, store)
    raw = await store.put(Block.new(b"\xff\xfe", "raw"))
    with pytest.raises(MalformedManifest):
        await ComputationGraphStore.load_from_store(raw, store)
    # A root whose edges disagree with the nodes' parent links.
    graph = real_cid_graph()
    root = await graph.save_to_store(store)
    record = dag_cbor.decode((await store.get(root)).data)
    record["edges"] = [e for e in record["edges"] if e != ["A", "B"]]
    forged = await store.put(Block.new(dag_cbor.encode(record), "dag-cbor"))
    with pytest.raises(MalformedManifest, match="parent links"):
        await ComputationGraphStore.load_from_store(forged, store)


# ----------------------------------------------------------------------- real Kubo


@pytest.mark.kubo
async def test_graph_root_round_trip_through_kubo(kubo_store) -> None:  # type: ignore[no-untyped-def]
    graph = ComputationGraphStore()
    graph.add_node(ComputationNode("x", "input", []))
    x_out = await graph.store_gradient_as_arrow("x", [1.0, 2.0], [2], kubo_store)
    graph.record_output("x", x_out)
    graph.add_node(ComputationNode("y", "relu", [x_out]).with_meta("layer", "fc1"))
    await graph.store_gradient_as_arrow("y", np.arange(6.0), [2, 3], kubo_store)
    root = await graph.save_to_store(kubo_store)
    assert await kubo_store.is_pinned(root)
    loaded = await ComputationGraphStore.load_from_store(root, kubo_store)
    assert loaded == graph
    values = await loaded.load_gradient("y", kubo_store, [2, 3])
    np.testing.assert_array_equal(values, np.arange(6.0))


# ----------------------------------------------------------------------- untrusted records

_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
    | st.binary(max_size=4)
    | st.just(make_cid(b"x"))
    | st.sampled_from(["A", "B", "C", "D"])
)
_ipld_values = st.recursive(
    _leaves,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(
    target=st.sampled_from(["root", "node"]),
    key=st.sampled_from(
        ["type", "version", "nodes", "edges", "id", "op", "inputs", "output", "gradient",
         "metadata", "parents", "extra"]
    ),
    value=_ipld_values,
)  # fmt: skip
async def test_graph_loader_fuzz(target: str, key: str, value: object) -> None:
    store = MemoryBlockStore()
    root = await real_cid_graph().save_to_store(store)
    root_record = dag_cbor.decode((await store.get(root)).data)
    if target == "node":
        node = dag_cbor.decode((await store.get(root_record["nodes"]["B"])).data)
        node[key] = value
        root_record["nodes"]["B"] = await store.put(Block.new(dag_cbor.encode(node), "dag-cbor"))
    else:
        root_record[key] = value
    forged = await store.put(Block.new(dag_cbor.encode(root_record), "dag-cbor"))
    try:
        graph = await ComputationGraphStore.load_from_store(forged, store)
    except GradfedError:
        return
    # Whatever loads is a usable graph (a Merkle DAG of parent links cannot hold a cycle).
    assert len(graph.topological_order()) == graph.node_count()
