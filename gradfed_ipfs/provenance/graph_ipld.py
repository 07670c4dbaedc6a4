"""The computation graph as IPLD: dag-cbor node blocks linked by CID, under one root block.

Node block::

    {"type": "gradfed/graph-node", "version": 1, "id": str, "op": str,
     "inputs": [link|str], "output": link|str|null, "gradient": link|str|null,
     "metadata": {str: str}, "parents": [link to node block, ...]}

Root block::

    {"type": "gradfed/graph", "version": 1, "nodes": {id: link}, "edges": [[from, to], ...]}

Nodes are written in topological order, so each node block links the blocks of its producers
(``parents``): a node's CID commits to its whole history. The root keeps the seed's edge list
(duplicates included) so that the graph restores exactly. A tensor reference that parses as a
CID is stored as a link; any other label (the seed's tests use ``"cid_a"``) is kept as text.
Loaded CIDs are canonical strings (base32 for CIDv1).

Links to tensors make the graph a partial DAG when those tensors are not stored: ``block/put``
pins the root regardless, but a recursive ``pin/add`` of the root on Kubo then waits for the
missing blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from multiformats import CID

from .._types import CIDLike
from ..cid import parse_cid
from ..errors import MalformedManifest
from ..formats.records import decode_record, encode_record, from_link, to_link
from ..storage.base import Block, BlockStore, fetch_all
from .graph_node import ComputationNode, parse_edges, topological_order

__all__ = [
    "GRAPH_RECORD_TYPE",
    "NODE_RECORD_TYPE",
    "load_graph_parts",
    "save_graph_parts",
]

GRAPH_RECORD_TYPE: Final = "gradfed/graph"
"""``type`` field of a graph root block."""
NODE_RECORD_TYPE: Final = "gradfed/graph-node"
"""``type`` field of a graph node block."""
_VERSION: Final = 1


async def save_graph_parts(
    nodes: Mapping[str, ComputationNode],
    edges: Sequence[tuple[str, str]],
    store: BlockStore,
    *,
    pin: bool = True,
) -> CID:
    """Write every node and a root as dag-cbor blocks; return the root CID.

    Only the root is pinned (a recursive pin on Kubo covers the node blocks).

    Parameters
    ----------
    nodes
        Node id → node, in the order the root lists them.
    edges
        ``(producer id, consumer id)`` pairs, duplicates kept.
    store
        Where the blocks go.
    pin
        Pin the root.

    Raises
    ------
    CircularDependency
        If the graph has a cycle (a Merkle DAG cannot hold one).
    BlockTooLarge
        If the root (one link per node) exceeds 2 MiB, around 20,000 nodes.
    """
    order = topological_order(nodes, edges)
    producers: dict[str, set[str]] = {nid: set() for nid in order}
    for src, dst in edges:
        producers[dst].add(src)
    node_cids: dict[str, CID] = {}
    for nid in order:
        node = nodes[nid]
        record: dict[str, Any] = {
            "type": NODE_RECORD_TYPE,
            "version": _VERSION,
            "id": node.id,
            "op": node.op,
            "inputs": [to_link(c) for c in node.input_cids],
            "output": None if node.output_cid is None else to_link(node.output_cid),
            "gradient": None if node.gradient_cid is None else to_link(node.gradient_cid),
            "metadata": dict(node.metadata),
            "parents": [node_cids[p] for p in sorted(producers[nid])],
        }
        node_cids[nid] = await store.put(encode_record(record), pin=False)
    root: dict[str, Any] = {
        "type": GRAPH_RECORD_TYPE,
        "version": _VERSION,
        "nodes": {nid: node_cids[nid] for nid in nodes},
        "edges": [[a, b] for a, b in edges],
    }
    return await store.put(encode_record(root), pin=pin)


async def load_graph_parts(
    cid: CIDLike, store: BlockStore
) -> tuple[dict[str, ComputationNode], list[tuple[str, str]]]:
    """Restore a graph's nodes and edges from its root CID (see :func:`save_graph_parts`).

    Every block is verified against its CID by the store, and each node's ``parents`` links
    must agree with the root's edges.

    Raises
    ------
    MalformedManifest
        If a block is not a graph record of the expected form.
    BlockNotFound
        If a block cannot be fetched.
    """
    parsed = parse_cid(cid)
    root = decode_record(await store.get(parsed), GRAPH_RECORD_TYPE, _VERSION)
    nodes_field, edges_field = root.get("nodes"), root.get("edges")
    if not isinstance(nodes_field, dict) or not isinstance(edges_field, list):
        raise MalformedManifest(f"graph root {parsed} needs a nodes map and an edges list")
    node_links: dict[str, CID] = {}
    for nid, link in nodes_field.items():
        if not isinstance(link, CID):
            raise MalformedManifest(f"graph root {parsed}: node {nid!r} is not a link")
        node_links[nid] = link
    nodes: dict[str, ComputationNode] = {}
    parents: dict[str, set[bytes]] = {}
    for nid, block in zip(node_links, await fetch_all(store, node_links.values()), strict=True):
        node, parent_links = _decode_node(block)
        if node.id != nid:
            raise MalformedManifest(f"node block {block.cid} has id {node.id!r}, not {nid!r}")
        nodes[nid] = node
        parents[nid] = parent_links
    edges = parse_edges(edges_field, nodes)
    if edges is None:
        raise MalformedManifest(f"graph root {parsed}: edges must be pairs of node ids")
    expected: dict[str, set[bytes]] = {nid: set() for nid in nodes}
    for src, dst in edges:
        expected[dst].add(bytes(node_links[src]))
    for nid, links in parents.items():
        if links != expected[nid]:
            raise MalformedManifest(f"node {nid!r}: parent links disagree with the root edges")
    return nodes, edges


def _decode_node(block: Block) -> tuple[ComputationNode, set[bytes]]:
    record = decode_record(block, NODE_RECORD_TYPE, _VERSION)
    inputs, parents, metadata = record.get("inputs"), record.get("parents"), record.get("metadata")
    if not isinstance(inputs, list) or not isinstance(parents, list):
        raise MalformedManifest(f"node block {block.cid}: inputs and parents must be lists")
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise MalformedManifest(f"node block {block.cid}: metadata must map text to text")
    if not all(isinstance(p, CID) for p in parents):
        raise MalformedManifest(f"node block {block.cid}: parents must be links")
    nid, op = record.get("id"), record.get("op")
    if not isinstance(nid, str) or not isinstance(op, str):
        raise MalformedManifest(f"node block {block.cid}: id and op must be text")
    output, gradient = record.get("output"), record.get("gradient")
    node = ComputationNode(
        nid,
        op,
        [from_link(c, "input") for c in inputs],
        None if output is None else from_link(output, "output"),
        None if gradient is None else from_link(gradient, "gradient"),
        dict(metadata),
    )
    return node, {bytes(p) for p in parents}
