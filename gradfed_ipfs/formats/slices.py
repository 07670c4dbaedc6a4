"""Reduce-scatter wire forms, without I/O: slice records and fraud records (issue 14).

Two dag-cbor records (keys sorted canonically, CIDs as tag-42 links):

``gradfed.slice`` v1
    ``{roster, base, k, offset, length, rule, learning_rate, inputs: [[peer, contribution]...],
    missing: [peer...], weight_sum, result}``: slice ``k`` (values ``offset … offset+length``)
    of the round whose roster is ``roster``, aggregated from ``inputs`` (roster order) with
    ``rule``; ``missing`` are roster peers excluded from every slice. The reducer is *not*
    named, so any two honest reducers of the same slice write byte-identical records.
``gradfed.slice-fraud`` v1
    ``{roster, k, reducer, claimed, correct}``: reducer ``reducer`` announced slice record
    ``claimed`` whose result differs from ``correct`` (the record anyone recomputes from the
    same inputs). Honest detectors write byte-identical fraud records.

Decoders check sizes, types, counts and order and raise
:class:`~gradfed_ipfs.errors.MalformedManifest`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from multiformats import CID

from ..block import Block
from ..cid import DAG_CBOR, RAW, parse_cid
from ..errors import MalformedManifest
from .records import decode_record, encode_record, require
from .roster import MAX_PEER_ID_CHARS, MAX_ROSTER_ENTRIES, MAX_WEIGHT

__all__ = [
    "MAX_SLICE_RECORD_BYTES",
    "SLICE_RULES",
    "FraudRecord",
    "SliceRecord",
]

MAX_SLICE_RECORD_BYTES: Final = 256 * 1024
"""Largest slice or fraud record decoded, in bytes."""
SLICE_RULES: Final = ("fedavg", "median")
"""Rules a slice record may name (coordinate-wise rules only)."""
_SLICE: Final = "gradfed.slice"
_FRAUD: Final = "gradfed.slice-fraud"
_MAX_INDEX: Final = 1 << 53


def _peer(value: object, where: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_PEER_ID_CHARS:
        raise MalformedManifest(f"{where}: peer ID is not a short string")
    return value


def _link(value: object, where: str, codecs: tuple[int, ...]) -> CID:
    if not isinstance(value, CID) or value.codec.code not in codecs:
        raise MalformedManifest(f"{where}: not a CID link of the expected codec")
    return parse_cid(value)


def _count(value: object, where: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < _MAX_INDEX:
        raise MalformedManifest(f"{where}: not an integer >= {low}")
    return value


def _block(block: Block, where: str) -> None:
    if len(block.data) > MAX_SLICE_RECORD_BYTES:
        raise MalformedManifest(f"{where}: {len(block.data)} bytes is too large")


@dataclass(frozen=True)
class SliceRecord:
    """One reduced slice of an agreed round; see the module docstring for the fields.

    ``inputs`` lists ``(peer, contribution CID)`` in roster order, without ``missing`` peers;
    ``weight_sum`` is the sum of their integer weights; ``result`` is the CID of the slice's
    ``length`` float32 values.
    """

    roster: CID
    base: CID
    k: int
    offset: int
    length: int
    rule: str
    learning_rate: float
    inputs: tuple[tuple[str, CID], ...]
    missing: tuple[str, ...]
    weight_sum: int
    result: CID

    def to_block(self) -> Block:
        """Encode as a dag-cbor block."""
        return encode_record(
            {
                "type": _SLICE,
                "version": 1,
                "roster": self.roster,
                "base": self.base,
                "k": self.k,
                "offset": self.offset,
                "length": self.length,
                "rule": self.rule,
                "learning_rate": float(self.learning_rate),
                "inputs": [[peer, cid] for peer, cid in self.inputs],
                "missing": list(self.missing),
                "weight_sum": self.weight_sum,
                "result": self.result,
            }
        )

    @classmethod
    def from_block(cls, block: Block) -> SliceRecord:
        """Decode and check a slice record.

        Raises
        ------
        MalformedManifest
            If it is too large, not a v1 slice record, or a field is out of shape: an unknown
            rule, a non-finite learning rate, an empty slice, inputs or missing peers not
            unique, more than ``MAX_ROSTER_ENTRIES`` of them, a weight sum out of range.
        """
        where = f"slice record {block.cid}"
        _block(block, where)
        record = decode_record(block, _SLICE)
        rule = require(record, "rule", str, where)
        if rule not in SLICE_RULES:
            raise MalformedManifest(f"{where}: unknown rule {rule!r:.40}")
        rate = require(record, "learning_rate", float, where)
        if not math.isfinite(rate):
            raise MalformedManifest(f"{where}: learning rate is not finite")
        inputs = require(record, "inputs", list, where)
        missing = require(record, "missing", list, where)
        if len(inputs) + len(missing) > MAX_ROSTER_ENTRIES or not inputs:
            raise MalformedManifest(f"{where}: 1..{MAX_ROSTER_ENTRIES} inputs required")
        pairs = []
        for item in inputs:
            if not isinstance(item, list) or len(item) != 2:
                raise MalformedManifest(f"{where}: an input is not [peer, cid]")
            pairs.append((_peer(item[0], where), _link(item[1], where, (RAW, DAG_CBOR))))
        absent = tuple(_peer(p, where) for p in missing)
        names = [p for p, _ in pairs] + list(absent)
        if len(set(names)) != len(names) or list(absent) != sorted(absent):
            raise MalformedManifest(f"{where}: peers repeat or missing peers are not sorted")
        weight_sum = _count(record.get("weight_sum"), where, 1)
        if weight_sum > MAX_WEIGHT * MAX_ROSTER_ENTRIES:
            raise MalformedManifest(f"{where}: weight sum out of range")
        return cls(
            roster=_link(record.get("roster"), where, (DAG_CBOR,)),
            base=_link(record.get("base"), where, (RAW, DAG_CBOR)),
            k=_count(record.get("k"), where),
            offset=_count(record.get("offset"), where),
            length=_count(record.get("length"), where, 1),
            rule=rule,
            learning_rate=rate,
            inputs=tuple(pairs),
            missing=absent,
            weight_sum=weight_sum,
            result=_link(record.get("result"), where, (RAW, DAG_CBOR)),
        )


@dataclass(frozen=True)
class FraudRecord:
    """Proof material of a lying reducer: its claimed record and the recomputed one."""

    roster: CID
    k: int
    reducer: str
    claimed: CID
    correct: CID

    def to_block(self) -> Block:
        """Encode as a dag-cbor block."""
        return encode_record(
            {
                "type": _FRAUD,
                "version": 1,
                "roster": self.roster,
                "k": self.k,
                "reducer": self.reducer,
                "claimed": self.claimed,
                "correct": self.correct,
            }
        )

    @classmethod
    def from_block(cls, block: Block) -> FraudRecord:
        """Decode and check a fraud record.

        Raises
        ------
        MalformedManifest
            If it is too large, not a v1 fraud record, a link is not dag-cbor, or
            ``claimed == correct``.
        """
        where = f"fraud record {block.cid}"
        _block(block, where)
        record = decode_record(block, _FRAUD)
        claimed = _link(record.get("claimed"), where, (DAG_CBOR,))
        correct = _link(record.get("correct"), where, (DAG_CBOR,))
        if claimed == correct:
            raise MalformedManifest(f"{where}: the claimed and correct records are the same")
        return cls(
            roster=_link(record.get("roster"), where, (DAG_CBOR,)),
            k=_count(record.get("k"), where),
            reducer=_peer(record.get("reducer"), where),
            claimed=claimed,
            correct=correct,
        )
