"""A CID-linked computation DAG, stored as IPLD (dag-cbor) blocks (seed-api §7).

Nodes refer to tensors by CID string; an edge ``producer → consumer`` exists because the
producer's ``output_cid`` is one of the consumer's ``input_cids``. Fixes over the seed:

- :meth:`ComputationGraphStore.topological_order` raises
  :class:`~gradfed_ipfs.errors.CircularDependency` on a cycle (the seed dropped those nodes).
- Missing nodes raise :class:`~gradfed_ipfs.errors.GraphNodeNotFound` (the seed raised
  ``InvalidGradient("Node not found: …")``; ``GraphNodeNotFound`` is also a ``KeyError``).
- :meth:`ComputationGraphStore.store_gradient_as_arrow` is async and really stores the Arrow
  bytes in a block store as a **raw** block (the seed labelled them dag-cbor and threw them
  away), so the recorded CID resolves. An encoding over 1 MiB becomes a chunked DAG
  (:func:`gradfed_ipfs.storage.dag.put_gradient`) whose manifest CID is recorded instead.
- The graph is content addressed. :meth:`ComputationGraphStore.save_to_store` writes each node
  as a dag-cbor block, in topological order, whose ``inputs``, ``output`` and ``gradient`` are
  CID links and whose ``parents`` link the node blocks of its producers; a root block maps node
  ids to node blocks and keeps the edge list. :meth:`ComputationGraphStore.load_from_store`
  restores the same graph from the root CID (layout in :mod:`gradfed_ipfs.provenance.graph_ipld`).

"""

from __future__ import annotations

import copy
import json
import math
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from multiformats import CID

from .._types import CIDLike, FloatArray, GradientLike
from ..cid import is_dag_cbor
from ..errors import (
    CircularDependency,
    GraphNodeNotFound,
    GraphSerializationError,
    IncompatibleDtype,
    MalformedArrow,
    ShapeMismatch,
)
from ..formats.arrow import decode_gradient, open_arrow_file
from ..formats.arrow import store_gradient_as_arrow as encode_gradient
from ..formats.limits import load_json
from ..storage.base import Block, BlockStore
from ..storage.dag import DEFAULT_CHUNK_BYTES, fetch_gradient, put_gradient

__all__ = [
    "ComputationGraphStore",
    "ComputationNode",
    "parse_edges",
]


@dataclass
class ComputationNode:
    """One operation in the graph.

    Attributes
    ----------
    id
        Unique id (a UUID4 string from :meth:`new`).
    op
        The operation, e.g. ``"matmul"``.
    input_cids
        CIDs of the input tensors.
    output_cid
        CID of the output tensor, once known.
    gradient_cid
        CID of the gradient w.r.t. the output, once known.
    metadata
        Free-form string metadata.
    """

    id: str
    op: str
    input_cids: list[str] = field(default_factory=list)
    output_cid: str | None = None
    gradient_cid: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    @classmethod
    def new(cls, op: str, input_cids: Sequence[str] = ()) -> ComputationNode:
        """Build a node with a fresh UUID4 id, no output, no gradient and no metadata."""
        return cls(str(uuid.uuid4()), op, [str(c) for c in input_cids])

    def with_meta(self, key: str, value: str) -> ComputationNode:
        """Add a metadata entry and return ``self`` (builder)."""
        self.metadata[key] = value
        return self

    def to_dict(self) -> dict[str, Any]:
        """Return the seed's JSON form (keys ``id, op, input_cids, output_cid, …``)."""
        return {
            "id": self.id,
            "op": self.op,
            "input_cids": list(self.input_cids),
            "output_cid": self.output_cid,
            "gradient_cid": self.gradient_cid,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: Any) -> ComputationNode:
        """Parse :meth:`to_dict` output; ``GraphSerializationError`` if it is not one."""
        if not isinstance(data, Mapping):
            raise GraphSerializationError(f"node must be an object, got {type(data).__name__}")
        try:
            node = cls(
                data["id"],
                data["op"],
                list(data["input_cids"]),
                data.get("output_cid"),
                data.get("gradient_cid"),
                dict(data.get("metadata") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GraphSerializationError(f"malformed node: {exc}") from exc
        node._check()
        return node

    def _check(self) -> None:
        texts = [self.id, self.op, *self.input_cids, *self.metadata, *self.metadata.values()]
        optional = [self.output_cid, self.gradient_cid]
        if not all(isinstance(t, str) for t in texts) or not all(
            t is None or isinstance(t, str) for t in optional
        ):
            raise GraphSerializationError(f"node {self.id!r}: fields must be strings")


class ComputationGraphStore:
    """The computation DAG: nodes by id and producer→consumer edges (the seed's store)."""

    def __init__(self) -> None:
        self._nodes: dict[str, ComputationNode] = {}
        self._edges: list[tuple[str, str]] = []

    # ---------------------------------------------------------------- building

    def add_node(self, node: ComputationNode) -> None:
        """Insert ``node``, adding an edge from every existing producer of one of its inputs.

        As in the seed: no edges are added *from* the new node to existing consumers, and
        re-inserting an id replaces the node but keeps its old edges.
        """
        inputs = set(node.input_cids)
        for existing in self._nodes.values():
            if existing.output_cid is not None and existing.output_cid in inputs:
                self._edges.append((existing.id, node.id))
        self._nodes[node.id] = node

    def _require(self, node_id: str) -> ComputationNode:
        node = self._nodes.get(node_id)
        if node is None:
            raise GraphNodeNotFound(node_id)
        return node

    def record_output(self, node_id: str, output_cid: str) -> None:
        """Set a node's output and add edges to every other node consuming it (no duplicates).

        Raises
        ------
        GraphNodeNotFound
            If there is no such node.
        """
        node = self._require(node_id)
        node.output_cid = str(output_cid)
        present = set(self._edges)
        for other in self._nodes.values():
            edge = (node_id, other.id)
            if other.id != node_id and node.output_cid in other.input_cids and edge not in present:
                self._edges.append(edge)
                present.add(edge)

    def record_gradient(self, node_id: str, gradient_cid: str) -> None:
        """Set a node's gradient CID; ``GraphNodeNotFound`` if there is no such node."""
        self._require(node_id).gradient_cid = str(gradient_cid)

    # ---------------------------------------------------------------- queries

    def get_node(self, node_id: str) -> ComputationNode | None:
        """Return the node, or ``None``."""
        return self._nodes.get(node_id)

    def node_count(self) -> int:
        """Return the number of nodes."""
        return len(self._nodes)

    def edge_count(self) -> int:
        """Return the number of edges (duplicates from re-inserted nodes included)."""
        return len(self._edges)

    def nodes(self) -> list[ComputationNode]:
        """Return all nodes, in insertion order."""
        return list(self._nodes.values())

    @property
    def edges(self) -> list[tuple[str, str]]:
        """The ``(producer_id, consumer_id)`` edges (a copy)."""
        return list(self._edges)

    def __iter__(self) -> Iterator[ComputationNode]:
        return iter(list(self._nodes.values()))

    def __len__(self) -> int:
        return len(self._nodes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ComputationGraphStore):
            return NotImplemented
        return self._nodes == other._nodes and sorted(self._edges) == sorted(other._edges)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def copy(self) -> ComputationGraphStore:
        """Return a deep copy (the seed's ``Clone``)."""
        return copy.deepcopy(self)

    def topological_order(self) -> list[str]:
        """Return node ids in a deterministic topological order (Kahn's algorithm).

        Zero-in-degree ids start sorted, and each batch of newly freed successors is sorted
        before it is enqueued. The backward order is the reverse.

        Raises
        ------
        CircularDependency
            If the graph has a cycle; the message names the nodes left on or behind it.
        """
        in_degree = dict.fromkeys(self._nodes, 0)
        successors: dict[str, list[str]] = {n: [] for n in self._nodes}
        for src, dst in self._edges:
            if src in in_degree and dst in in_degree:
                in_degree[dst] += 1
                successors[src].append(dst)
        queue = sorted(n for n, d in in_degree.items() if d == 0)
        order: list[str] = []
        head = 0
        while head < len(queue):
            current = queue[head]
            head += 1
            order.append(current)
            freed = []
            for nxt in successors[current]:
                in_degree[nxt] -= 1
                if in_degree[nxt] == 0:
                    freed.append(nxt)
            queue.extend(sorted(freed))
        if len(order) != len(self._nodes):
            stuck = sorted(n for n, d in in_degree.items() if d > 0)
            shown = ", ".join(stuck[:10]) + (", …" if len(stuck) > 10 else "")
            raise CircularDependency(f"computation graph has a cycle through: {shown}")
        return order

    def find_consumers(self, cid: str) -> list[ComputationNode]:
        """Return every node that lists ``cid`` among its inputs (insertion order)."""
        return [n for n in self._nodes.values() if cid in n.input_cids]

    def provenance_chain(self, output_cid: str) -> list[ComputationNode]:
        """Return the nodes ``output_cid`` derives from, root first, its producer last.

        A depth-first walk backwards through inputs from the (first) producer of
        ``output_cid``, each node visited once, reversed. Linear chains come out earliest to
        latest. An unknown CID gives ``[]``. Iterative, so deep graphs do not hit Python's
        recursion limit.
        """
        producers: dict[str, ComputationNode] = {}
        for candidate in self._nodes.values():
            if candidate.output_cid is not None:
                producers.setdefault(candidate.output_cid, candidate)
        start = producers.get(output_cid)
        if start is None:
            return []
        visited: list[ComputationNode] = []
        seen: set[str] = set()
        stack = [start]
        while stack:
            node = stack.pop()
            if node.id in seen:
                continue
            seen.add(node.id)
            visited.append(node)
            for cid in reversed(node.input_cids):
                producer = producers.get(cid)
                if producer is not None and producer.id not in seen:
                    stack.append(producer)
        visited.reverse()
        return visited

    # ---------------------------------------------------------------- gradients as blocks

    async def store_gradient_as_arrow(
        self,
        node_id: str,
        gradient_data: GradientLike,
        shape: Sequence[int],
        store: BlockStore,
        *,
        pin: bool = True,
    ) -> str:
        """Encode a gradient as an Arrow block, store it (raw codec) and record its CID.

        Parameters
        ----------
        node_id
            The node whose ``gradient_cid`` is set; checked before anything is encoded.
        gradient_data
            The flat (row-major) values.
        shape
            The tensor shape recorded in the block; must hold exactly the values.
        store
            Where the block is written.
        pin
            Pin the block (default).

        Returns
        -------
        str
            The block's CID (``bafkrei…``), or a chunk manifest's (``bafyrei…``) for an encoding
            over 1 MiB; it resolves in ``store``.

        Raises
        ------
        GraphNodeNotFound
            If there is no such node.
        ShapeMismatch
            If ``prod(shape)`` differs from the number of values.
        """
        node = self._require(node_id)
        values = np.asarray(gradient_data, dtype=np.float32).reshape(-1)
        dims = tuple(int(d) for d in shape)
        if math.prod(dims) != values.size:
            raise ShapeMismatch([math.prod(dims)], [values.size])
        data = encode_gradient(values, shape=dims, layer=node_id)
        if len(data) <= DEFAULT_CHUNK_BYTES:
            cid = await store.put(Block.new(data, "raw"), pin=pin)
        else:  # too large for one block: a chunked DAG (dag-cbor manifest CID)
            cid = await put_gradient(store, values, shape=dims, pin=pin)
        node.gradient_cid = str(cid)
        return node.gradient_cid

    @staticmethod
    def encode_gradient_arrow(gradient_data: GradientLike, shape: Sequence[int]) -> bytes:
        """Return the Arrow IPC bytes :meth:`store_gradient_as_arrow` would store."""
        values = np.asarray(gradient_data, dtype=np.float32).reshape(-1)
        return encode_gradient(values, shape=tuple(int(d) for d in shape))

    @staticmethod
    def load_gradient_from_arrow(
        arrow_bytes: bytes | bytearray | memoryview, expected_shape: Sequence[int] = ()
    ) -> FloatArray:
        """Decode a gradient block (ours, or the seed's ``gradient``-column layout).

        Parameters
        ----------
        arrow_bytes
            Untrusted Arrow IPC file bytes.
        expected_shape
            When non-empty, the recorded shape must equal it.

        Returns
        -------
        FloatArray
            The flat float32 values.

        Raises
        ------
        ShapeMismatch
            If ``expected_shape`` is given and differs from the recorded shape.
        IncompatibleDtype
            If the seed's ``gradient`` column is not Float32.
        MalformedArrow
            If the bytes are not a gradient Arrow file.
        """
        try:
            decoded = decode_gradient(arrow_bytes)
            values, shape = decoded.values, list(decoded.shape)
        except MalformedArrow as exc:
            if "'value' column" not in str(exc):
                raise
            values, shape = _decode_seed_layout(arrow_bytes)
        if expected_shape and list(expected_shape) != shape:
            raise ShapeMismatch(list(expected_shape), shape)
        return values

    async def load_gradient(
        self, node_id: str, store: BlockStore, expected_shape: Sequence[int] = ()
    ) -> FloatArray:
        """Fetch and decode a node's stored gradient.

        Raises
        ------
        GraphNodeNotFound
            If there is no such node, or it has no gradient CID.
        """
        node = self._require(node_id)
        if node.gradient_cid is None:
            raise GraphNodeNotFound(f"{node_id} (no gradient recorded)")
        if is_dag_cbor(node.gradient_cid):
            tensor = await fetch_gradient(store, node.gradient_cid)
            if expected_shape and list(expected_shape) != list(tensor.shape):
                raise ShapeMismatch(list(expected_shape), list(tensor.shape))
            return tensor.reshape(-1)
        block = await store.get(node.gradient_cid)
        return self.load_gradient_from_arrow(block.data, expected_shape)

    # ---------------------------------------------------------------- JSON checkpoint

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"nodes": {id: node}, "edges": [[from, to], …]}``."""
        return {
            "nodes": {nid: n.to_dict() for nid, n in self._nodes.items()},
            "edges": [[a, b] for a, b in self._edges],
        }

    @classmethod
    def from_dict(cls, data: Any) -> ComputationGraphStore:
        """Parse :meth:`to_dict` output; ``GraphSerializationError`` if it is not one."""
        if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), Mapping):
            raise GraphSerializationError("Checkpoint deserialization: expected {nodes, edges}")
        graph = cls()
        for nid, raw in data["nodes"].items():
            node = ComputationNode.from_dict(raw)
            if node.id != nid:
                raise GraphSerializationError(f"node key {nid!r} differs from its id {node.id!r}")
            graph._nodes[nid] = node
        edges = parse_edges(data.get("edges", []), graph._nodes)
        if edges is None:
            raise GraphSerializationError("Checkpoint deserialization: bad edges")
        graph._edges = edges
        return graph

    def checkpoint(self) -> bytes:
        """Serialize the graph as the seed's JSON bytes."""
        return json.dumps(self.to_dict()).encode("utf-8")

    @classmethod
    def from_checkpoint(cls, data: bytes | str) -> ComputationGraphStore:
        """Restore a graph from :meth:`checkpoint` bytes.

        Raises
        ------
        GraphSerializationError
            If the bytes are not such a checkpoint.
        """
        parsed = load_json(data, "Checkpoint deserialization", error=GraphSerializationError)
        return cls.from_dict(parsed)

    # ---------------------------------------------------------------- IPLD

    @classmethod
    def from_parts(
        cls, nodes: Mapping[str, ComputationNode], edges: Sequence[tuple[str, str]]
    ) -> ComputationGraphStore:
        """Build a graph from nodes and edges taken as they are (no edges are derived)."""
        graph = cls()
        graph._nodes = dict(nodes)
        graph._edges = list(edges)
        return graph

    async def save_to_store(self, store: BlockStore, *, pin: bool = True) -> CID:
        """Write every node and a root as dag-cbor blocks; return the root CID.

        See :func:`gradfed_ipfs.provenance.graph_ipld.save_graph` for the layout.

        Raises
        ------
        CircularDependency
            If the graph has a cycle (a Merkle DAG cannot hold one).
        """
        from .graph_ipld import save_graph

        return await save_graph(self, store, pin=pin)

    @classmethod
    async def load_from_store(cls, cid: CIDLike, store: BlockStore) -> ComputationGraphStore:
        """Restore a graph from its root CID; see :func:`gradfed_ipfs.provenance.load_graph`.

        Raises
        ------
        MalformedManifest
            If a block is not a graph record of the expected form.
        """
        from .graph_ipld import load_graph

        return await load_graph(cid, store)


# --------------------------------------------------------------------------- helpers


def parse_edges(data: object, nodes: Mapping[str, object]) -> list[tuple[str, str]] | None:
    """Return ``[(from, to), …]`` if ``data`` lists pairs of known node ids, else ``None``."""
    if not isinstance(data, list):
        return None
    edges = []
    for edge in data:
        if not isinstance(edge, list | tuple) or len(edge) != 2:
            return None
        src, dst = edge
        if not (isinstance(src, str) and isinstance(dst, str) and src in nodes and dst in nodes):
            return None
        edges.append((src, dst))
    return edges


def _decode_seed_layout(data: bytes | bytearray | memoryview) -> tuple[FloatArray, list[int]]:
    """Decode the seed's layout: one ``gradient`` column, ``shape`` in field metadata."""
    schema, batches = open_arrow_file(data)
    index = schema.get_field_index("gradient")
    if index < 0:
        raise MalformedArrow("Arrow IPC block does not contain a 'gradient' column")
    column_field = schema.field(index)
    if column_field.type != pa.float32():
        raise IncompatibleDtype("Float32")
    parts = []
    for batch in batches:
        column = batch.column(index)
        if column.null_count:
            raise MalformedArrow("'gradient' column has nulls")
        parts.append(column.to_numpy(zero_copy_only=False).astype(np.float32, copy=False))
    values = np.concatenate(parts) if parts else np.empty(0, np.float32)
    meta = {k.decode("utf-8", "replace"): v for k, v in (column_field.metadata or {}).items()}
    shape = (
        load_json(meta["shape"], "'shape' metadata", error=MalformedArrow)
        if "shape" in meta
        else [int(values.size)]
    )
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise MalformedArrow(f"bad 'shape' metadata: {shape!r:.60}")
    return values, shape
