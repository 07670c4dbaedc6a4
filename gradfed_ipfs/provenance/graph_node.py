"""The parts of a computation graph: its node type, edge parsing and topological order.

:mod:`.graph` (the seed's store) and :mod:`.graph_ipld` (its dag-cbor form) both build on this
module, so neither imports the other's internals.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import CircularDependency, GraphSerializationError

__all__ = ["ComputationNode", "parse_edges", "topological_order"]


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


def topological_order(nodes: Iterable[str], edges: Sequence[tuple[str, str]]) -> list[str]:
    """Return node ids in a deterministic topological order (Kahn's algorithm).

    Zero-in-degree ids start sorted, and each batch of newly freed successors is sorted
    before it is enqueued. Edges naming unknown ids are ignored.

    Raises
    ------
    CircularDependency
        If the graph has a cycle; the message names the nodes left on or behind it.
    """
    in_degree = dict.fromkeys(nodes, 0)
    successors: dict[str, list[str]] = {n: [] for n in in_degree}
    for src, dst in edges:
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
    if len(order) != len(in_degree):
        stuck = sorted(n for n, d in in_degree.items() if d > 0)
        shown = ", ".join(stuck[:10]) + (", …" if len(stuck) > 10 else "")
        raise CircularDependency(f"computation graph has a cycle through: {shown}")
    return order
