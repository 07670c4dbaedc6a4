from __future__ import annotations

import json
import os
from pathlib import Path

import dag_cbor
import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs import Block, MemoryBlockStore
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import (
    BlockCorrupt,
    BlockNotFound,
    GraphIoError,
    GraphSerializationError,
    MalformedManifest,
)
from gradfed_ipfs.provenance import ComputationGraphStore, ComputationNode, GradientCheckpoint


def cid(label: str) -> str:
    return str(make_cid(label.encode(), "raw"))


def four_node_graph() -> ComputationGraphStore:
    graph = ComputationGraphStore()
    previous: list[str] = []
    for name in ("input", "matmul", "relu", "output"):
        graph.add_node(ComputationNode(name, name, previous).with_meta("k", name))
        graph.record_output(name, cid(name))
        previous = [cid(name)]
    return graph


def full_checkpoint() -> GradientCheckpoint:
    ckpt = GradientCheckpoint.new(four_node_graph(), 42).with_loss_cid(cid("loss"))
    ckpt.set_optimizer_state("fc1.weight", bytes(range(256)) * 3)
    ckpt.set_optimizer_state("fc1.bias", b"\x00\x01\x02")
    ckpt.set_optimizer_state("empty", b"")
    ckpt.set_parameter("fc1.weight", np.arange(12, dtype=np.float32).reshape(3, 4) / 7)
    ckpt.set_parameter("fc1.bias", np.array([np.float32(1e-30), -0.0, np.inf], np.float32))
    ckpt.set_residual("peer-a/fc1", np.array([0.25, -1e-8], np.float32))
    return ckpt


# ----------------------------------------------------------------------- seed §11 case


def test_gradient_checkpoint_save_load(tmp_path: Path) -> None:
    ckpt = GradientCheckpoint.new(four_node_graph(), 42).with_loss_cid("cid_loss")
    ckpt.set_optimizer_state("w1", b"\x01\x02\x03")
    ckpt.set_optimizer_state("w2", b"\xff" * 10)
    path = tmp_path / "ckpt.json"
    ckpt.save(path)
    loaded = GradientCheckpoint.load(path)
    assert loaded.step == 42
    assert loaded.loss_cid == "cid_loss"
    assert loaded.optimizer_state == {"w1": b"\x01\x02\x03", "w2": b"\xff" * 10}
    assert loaded.graph.node_count() == 4
    assert loaded == ckpt


def test_new_defaults_and_builder() -> None:
    ckpt = GradientCheckpoint.new(ComputationGraphStore(), 7)
    assert ckpt.loss_cid is None
    assert ckpt.optimizer_state == {}
    assert ckpt.timestamp > 1_600_000_000
    ckpt.set_optimizer_state("p", b"a")
    ckpt.set_optimizer_state("p", b"b")
    assert ckpt.optimizer_state == {"p": b"b"}


def test_json_is_seed_format(tmp_path: Path) -> None:
    ckpt = GradientCheckpoint.new(four_node_graph(), 3)
    ckpt.set_optimizer_state("w", b"\x05\x06")
    path = tmp_path / "c.json"
    ckpt.save(path)
    data = json.loads(path.read_text())
    assert data["optimizer_state"] == {"w": [5, 6]}
    assert set(data["graph"]) == {"nodes", "edges"}
    assert data["step"] == 3
    # A seed file (no parameters key) loads.
    del data["parameters"], data["residuals"]
    path.write_text(json.dumps(data))
    assert GradientCheckpoint.load(path).optimizer_state == {"w": b"\x05\x06"}


def test_parameters_survive_json_bit_for_bit(tmp_path: Path) -> None:
    ckpt = full_checkpoint()
    path = tmp_path / "p.json"
    ckpt.save(path)
    loaded = GradientCheckpoint.load(path)
    assert loaded == ckpt
    for name, value in ckpt.parameters.items():
        assert loaded.parameters[name].tobytes() == value.tobytes()


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.json"
    GradientCheckpoint.new(ComputationGraphStore(), 1).save(path)
    GradientCheckpoint.new(ComputationGraphStore(), 2).save(path)
    assert GradientCheckpoint.load(path).step == 2
    assert sorted(os.listdir(tmp_path)) == ["ckpt.json"]


def test_failed_save_keeps_old_file(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.json"
    GradientCheckpoint.new(ComputationGraphStore(), 1).save(path)
    (tmp_path / "dir_target").mkdir()
    (tmp_path / "dir_target" / "x").write_text("occupied")
    with pytest.raises(GraphIoError):
        GradientCheckpoint.new(ComputationGraphStore(), 2).save(tmp_path / "dir_target")
    assert GradientCheckpoint.load(path).step == 1
    assert sorted(os.listdir(tmp_path)) == ["ckpt.json", "dir_target"]
    with pytest.raises(GraphIoError):
        GradientCheckpoint.new(ComputationGraphStore(), 2).save(tmp_path / "missing" / "c.json")


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(GraphIoError):
        GradientCheckpoint.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(GraphSerializationError):
        GradientCheckpoint.load(bad)
    bad.write_text('{"step": "x", "timestamp": 1, "graph": {"nodes": {}, "edges": []}}')
    with pytest.raises(GraphSerializationError):
        GradientCheckpoint.load(bad)
    graph = '"graph": {"nodes": {}, "edges": []}'
    bad.write_text('{"step": 1, "timestamp": 1, "optimizer_state": {"w": 10}, ' + graph + "}")
    with pytest.raises(GraphSerializationError, match="lists of byte values"):
        GradientCheckpoint.load(bad)
    bad.write_text('{"step": 1, "timestamp": 1, "optimizer_state": {"w": [256]}, ' + graph + "}")
    with pytest.raises(GraphSerializationError):
        GradientCheckpoint.load(bad)


# ----------------------------------------------------------------------- content addressing


async def test_store_round_trip_gives_same_state() -> None:
    store = MemoryBlockStore()
    ckpt = full_checkpoint()
    root = await ckpt.save_to_store(store)
    assert str(root).startswith("bafyrei")
    assert await store.is_pinned(root)
    restored = await GradientCheckpoint.load_from_store(root, store)
    assert restored == ckpt
    for name, value in ckpt.parameters.items():
        assert restored.parameters[name].tobytes() == value.tobytes()
        assert restored.parameters[name].flags.writeable
    # Deterministic: the same state commits to the same CID.
    assert await restored.commit(MemoryBlockStore()) == root


async def test_large_parameter_is_chunked_and_restored() -> None:
    store = MemoryBlockStore()
    ckpt = GradientCheckpoint.new(ComputationGraphStore(), 1)
    big = np.random.default_rng(3).standard_normal((700, 1000)).astype(np.float32)  # 2.8 MB
    ckpt.set_parameter("big", big)
    ckpt.set_residual("r", big[:2])
    root = await ckpt.save_to_store(store)
    record = dag_cbor.decode((await store.get(root)).data)
    assert record["parameters"]["big"].codec.name == "dag-cbor"  # a chunk manifest
    assert record["residuals"]["r"].codec.name == "raw"
    restored = await GradientCheckpoint.load_from_store(root, store)
    assert restored == ckpt
    assert restored.parameters["big"].tobytes() == big.tobytes()


async def test_record_links_graph_blobs_and_parameters() -> None:
    store = MemoryBlockStore()
    ckpt = full_checkpoint()
    root = await ckpt.save_to_store(store)
    record = dag_cbor.decode((await store.get(root)).data)
    assert record["type"] == "gradfed/checkpoint"
    assert record["step"] == 42
    assert isinstance(record["graph"], CID)
    assert record["graph"] == await ckpt.graph.save_to_store(MemoryBlockStore())
    assert isinstance(record["loss"], CID)
    blob = record["optimizer_state"]["fc1.weight"]
    assert blob.codec.name == "raw"
    assert (await store.get(blob)).data == bytes(range(256)) * 3
    assert record["optimizer_state"]["empty"] == b""
    assert all(link.codec.name == "raw" for link in record["parameters"].values())


async def test_restore_detects_tampered_blob() -> None:
    store = MemoryBlockStore()
    root = await full_checkpoint().save_to_store(store)
    record = dag_cbor.decode((await store.get(root)).data)
    key = bytes(record["optimizer_state"]["fc1.bias"])
    cid_obj, data = store.blocks[key]
    store.blocks[key] = (cid_obj, b"\x09" + data[1:])
    with pytest.raises(BlockCorrupt):
        await GradientCheckpoint.restore(root, store)


async def test_restore_missing_block() -> None:
    store = MemoryBlockStore()
    root = await full_checkpoint().save_to_store(store)
    record = dag_cbor.decode((await store.get(root)).data)
    await store.delete(record["graph"])
    with pytest.raises(BlockNotFound):
        await GradientCheckpoint.load_from_store(root, store)


async def test_restore_rejects_swapped_parameter() -> None:
    store = MemoryBlockStore()
    root = await full_checkpoint().save_to_store(store)
    record = dag_cbor.decode((await store.get(root)).data)
    params = record["parameters"]
    params["fc1.weight"], params["fc1.bias"] = params["fc1.bias"], params["fc1.weight"]
    forged = await store.put(Block.new(dag_cbor.encode(record), "dag-cbor"))
    with pytest.raises(MalformedManifest, match="parameter block"):
        await GradientCheckpoint.load_from_store(forged, store)
    record["step"] = True
    forged = await store.put(Block.new(dag_cbor.encode(record), "dag-cbor"))
    with pytest.raises(MalformedManifest, match="step"):
        await GradientCheckpoint.load_from_store(forged, store)


# ----------------------------------------------------------------------- real Kubo


@pytest.mark.kubo
async def test_checkpoint_round_trip_through_kubo(kubo_store) -> None:  # type: ignore[no-untyped-def]
    ckpt = full_checkpoint()
    root = await ckpt.save_to_store(kubo_store)
    assert str(root).startswith("bafyrei")
    restored = await GradientCheckpoint.load_from_store(root, kubo_store)
    assert restored == ckpt
    assert await restored.save_to_store(MemoryBlockStore()) == root
