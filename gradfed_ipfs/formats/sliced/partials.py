"""Chained reduce-scatter wire forms, without I/O: partial-sum records and their blocks (issue 14).

A chained round (:mod:`gradfed_ipfs.federated.sliced.chain`) reduces slice ``k`` in
``G`` steps along the roster: step ``j`` adds group ``j``'s senders to the float64 partial sum
step ``j − 1`` left. Each step but the last writes one dag-cbor record:

``gradfed.slice-partial`` v1
    ``{roster, k, j, groups, offset, length, prev, inputs: [[peer, contribution]...],
    missing: [peer...], weight_sum, values: [raw CID...]}``: step ``j`` of ``groups`` (the
    roster cut into ``groups`` runs of consecutive peers; the last step writes the slice record,
    so ``j ≤ groups − 2``); ``prev`` (a link, or null for ``j = 0``) plus
    ``Σ (w_i / weight_sum) · float64(g_i[offset : offset+length])`` over ``inputs`` in roster
    order, as :func:`~gradfed_ipfs.tensor.deterministic.partial_update` computes it. The values
    are little-endian float64 cut into raw blocks of :data:`PARTIAL_BLOCK_VALUES` (8 MiB of a
    slice would not fit Kubo's 2 MiB block limit). The step is *not* named, so two honest
    peers of one step write byte-identical records.

Decoders check sizes, types, counts and order before allocating and raise
:class:`~gradfed_ipfs.errors.MalformedManifest`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from multiformats import CID

from ...block import Block
from ...cid import DAG_CBOR, RAW, cid_to_str, make_cid
from ...errors import MalformedManifest
from ..agreed.roster import MAX_ROSTER_ENTRIES, MAX_WEIGHT
from ..memo import DecodeMemo
from ..records import decode_record, encode_record, require
from .slices import _block, _count, _input, _link, _peer

__all__ = [
    "PARTIAL_BLOCK_VALUES",
    "PartialRecord",
    "partial_blocks",
    "partial_values",
]

PARTIAL_BLOCK_VALUES: Final = 1 << 17
"""float64 values per raw block of a partial sum (1 MiB)."""
_PARTIAL: Final = "gradfed.slice-partial"
_RECORDS: Final[DecodeMemo[bytes, PartialRecord]] = DecodeMemo()


def partial_blocks(values: np.ndarray) -> list[Block]:
    """Return the raw blocks of a float64 partial sum (little-endian, in order).

    Raises
    ------
    MalformedManifest
        If ``values`` is empty, not float64, or not finite.
    """
    flat = np.ascontiguousarray(values).reshape(-1)
    if flat.dtype != np.float64 or not flat.size or not np.isfinite(flat).all():
        raise MalformedManifest("a partial sum is a non-empty finite float64 vector")
    data = flat.astype("<f8", copy=False).tobytes()
    step = PARTIAL_BLOCK_VALUES * 8
    pieces = [data[i : i + step] for i in range(0, len(data), step)]
    return [Block.from_parts(make_cid(piece), piece) for piece in pieces]


def partial_values(blocks: Sequence[Block], length: int) -> np.ndarray:
    """Return the ``length`` float64 values of a partial sum from its raw blocks, in order.

    Raises
    ------
    MalformedManifest
        If the blocks are not :data:`PARTIAL_BLOCK_VALUES` values each (the last the rest), or
        a value is not finite (an honest sum of finite float32 values never overflows).
    """
    if len(blocks) != -(-length // PARTIAL_BLOCK_VALUES):
        raise MalformedManifest(f"a partial sum of {length} values has {len(blocks)} blocks")
    for i, block in enumerate(blocks):
        want = min(PARTIAL_BLOCK_VALUES, length - i * PARTIAL_BLOCK_VALUES) * 8
        if len(block.data) != want:
            raise MalformedManifest(f"partial block {i}: {len(block.data)} bytes, not {want}")
    values = np.frombuffer(b"".join(b.data for b in blocks), "<f8").astype(np.float64)
    if not np.isfinite(values).all():
        raise MalformedManifest("a partial sum has a non-finite value")
    return values


@dataclass(frozen=True)
class PartialRecord:
    """One step of a chained slice; see the module docstring for the fields.

    ``inputs`` are group ``j``'s senders this step added, in roster order; ``missing`` are the
    roster peers left out of the chain so far (sorted); ``weight_sum`` is the ``W`` of every
    coefficient ``w_i / W``; ``values`` are the raw blocks of the ``length`` float64 sums.
    """

    roster: CID
    k: int
    j: int
    groups: int
    offset: int
    length: int
    prev: CID | None
    inputs: tuple[tuple[str, CID], ...]
    missing: tuple[str, ...]
    weight_sum: int
    values: tuple[CID, ...]

    def to_block(self) -> Block:
        """Encode as a dag-cbor block."""
        return encode_record(
            {
                "type": _PARTIAL,
                "version": 1,
                "roster": self.roster,
                "k": self.k,
                "j": self.j,
                "groups": self.groups,
                "offset": self.offset,
                "length": self.length,
                "prev": self.prev,
                "inputs": [[peer, cid] for peer, cid in self.inputs],
                "missing": list(self.missing),
                "weight_sum": self.weight_sum,
                "values": list(self.values),
            }
        )

    @classmethod
    def from_block(cls, block: Block) -> PartialRecord:
        """Decode and check a partial-sum record (remembered: :class:`~.memo.DecodeMemo`).

        Raises
        ------
        MalformedManifest
            If it is too large, not a v1 partial record, or a field is out of shape: peers
            not unique or missing peers unsorted, ``prev`` absent for ``j > 0`` (or present
            for ``j = 0``), a value-block count that does not fit ``length``.
        """
        known = _RECORDS.get(block.data)
        if known is None:
            known = _RECORDS.put(block.data, cls._from_block(block), len(block.data))
        return known

    @classmethod
    def _from_block(cls, block: Block) -> PartialRecord:
        where = f"partial record {cid_to_str(block.cid)}"
        _block(block, where)
        record = decode_record(block, _PARTIAL)
        inputs = require(record, "inputs", list, where)
        missing = require(record, "missing", list, where)
        if len(inputs) + len(missing) > MAX_ROSTER_ENTRIES:
            raise MalformedManifest(f"{where}: more than {MAX_ROSTER_ENTRIES} peers")
        pairs = tuple(_input(item, where) for item in inputs)
        absent = tuple(_peer(p, where) for p in missing)
        names = [p for p, _ in pairs] + list(absent)
        if len(set(names)) != len(names) or list(absent) != sorted(absent):
            raise MalformedManifest(f"{where}: peers repeat or missing peers are not sorted")
        j = _count(record.get("j"), where)
        groups = _count(record.get("groups"), where, 2)
        if groups > MAX_ROSTER_ENTRIES or j > groups - 2:
            raise MalformedManifest(f"{where}: step {j} of {groups} is not a partial step")
        raw_prev = record.get("prev")
        if (raw_prev is None) != (j == 0):
            raise MalformedManifest(f"{where}: step {j} with(out) a previous partial")
        prev = None if raw_prev is None else _link(raw_prev, where, (DAG_CBOR,))
        length = _count(record.get("length"), where, 1)
        links = require(record, "values", list, where)
        if len(links) != -(-length // PARTIAL_BLOCK_VALUES):
            raise MalformedManifest(f"{where}: {len(links)} value blocks for {length} values")
        weight_sum = _count(record.get("weight_sum"), where, 1)
        if weight_sum > MAX_WEIGHT * MAX_ROSTER_ENTRIES:
            raise MalformedManifest(f"{where}: weight sum out of range")
        return cls(
            roster=_link(record.get("roster"), where, (DAG_CBOR,)),
            k=_count(record.get("k"), where),
            j=j,
            groups=groups,
            offset=_count(record.get("offset"), where),
            length=length,
            prev=prev,
            inputs=pairs,
            missing=absent,
            weight_sum=weight_sum,
            values=tuple(_link(c, where, (RAW,)) for c in links),
        )
