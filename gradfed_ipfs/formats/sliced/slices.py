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

And one small JSON pubsub message, :class:`SliceMessage`, of three kinds: ``slice`` (a slice
record CID for slice ``k`` in ``phase``, with the record's bytes in base64 when they fit, so
that readers need not fetch them), ``proj`` (the sender's check values: projections
``⟨z_k, g[k]⟩``, one float per slice, or for median and trimmed-mean rounds its values at the
``s`` spot-checked coordinates of every slice, and ``checked``: the values it computed from
another sender's blocks for a slice that sender wrote) and ``fraud`` (a fraud record CID).
The sender is pubsub's ``from``; on a signing board the message is the sender's signed
statement (kind ``sliced/<kind>``).

Decoders check sizes, types, counts and order and raise
:class:`~gradfed_ipfs.errors.MalformedManifest` (records) or
:class:`~gradfed_ipfs.errors.MalformedAnnouncement` (messages).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

from multiformats import CID

from ...block import Block
from ...cid import DAG_CBOR, RAW, cid_to_str, parse_cid, verify_cid
from ...errors import BlockCorrupt, DecodeError, MalformedAnnouncement, MalformedManifest
from ..agreed.roster import MAX_PEER_ID_CHARS, MAX_ROSTER_ENTRIES, MAX_WEIGHT
from ..fast_cbor import encode_dag_cbor
from ..limits import load_json
from ..memo import DecodeMemo
from ..records import decode_record, encode_record, require
from ..statement import PEER_ID_KEYS, KeyBook, Signer, Statement, decode_statement, sign_statement

__all__ = [
    "MAX_SLICE_MESSAGE_BYTES",
    "MAX_SLICE_RECORD_BYTES",
    "SLICE_RULES",
    "Checked",
    "FraudRecord",
    "SliceInputs",
    "SliceKind",
    "SliceMessage",
    "SliceRecord",
    "split_slice_rule",
]

MAX_SLICE_RECORD_BYTES: Final = 256 * 1024
"""Largest slice or fraud record decoded, in bytes."""
MAX_SLICE_MESSAGE_BYTES: Final = 64 * 1024
"""Largest slice-board pubsub message accepted, in bytes (1024 projections fit)."""
SLICE_RULES: Final = ("fedavg", "median", "trimmed_mean")
"""Rules a slice record may name (coordinate-wise rules only); ``trimmed_mean`` is spelt
``trimmed_mean:<beta>`` (see :func:`split_slice_rule`)."""
_SLICE: Final = "gradfed.slice"
_FRAUD: Final = "gradfed.slice-fraud"
_MAX_INDEX: Final = 1 << 53
_MESSAGES: Final[DecodeMemo[tuple[bytes, str], SliceMessage]] = DecodeMemo()
_RECORDS: Final[DecodeMemo[bytes, SliceRecord]] = DecodeMemo()


def split_slice_rule(rule: str) -> tuple[str, float] | None:
    """Return ``(name, beta)`` of a slice rule, or ``None`` if it is not one.

    ``fedavg`` and ``median`` take no parameter (``beta`` is 0); ``trimmed_mean:<beta>`` needs
    ``0 <= beta < 0.5`` written as Python's ``repr`` of the float (one spelling per value, so
    every peer writes the same record bytes).
    """
    name, _, parameter = rule.partition(":")
    if name in ("fedavg", "median") and rule == name:
        return name, 0.0
    if name != "trimmed_mean" or len(parameter) > 32:
        return None
    try:
        beta = float(parameter)
    except ValueError:
        return None
    if not 0.0 <= beta < 0.5 or repr(beta) != parameter:
        return None
    return name, beta


def _peer(value: object, where: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_PEER_ID_CHARS:
        raise MalformedManifest(f"{where}: peer ID is not a short string")
    return value


def _link(value: object, where: str, codecs: tuple[int, ...]) -> CID:
    if not isinstance(value, CID) or value.codec.code not in codecs:
        raise MalformedManifest(f"{where}: not a CID link of the expected codec")
    return parse_cid(value)


def _input(item: object, where: str) -> tuple[str, CID]:
    if not isinstance(item, list) or len(item) != 2:
        raise MalformedManifest(f"{where}: an input is not [peer, cid]")
    return _peer(item[0], where), _link(item[1], where, (RAW, DAG_CBOR))


def _count(value: object, where: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < _MAX_INDEX:
        raise MalformedManifest(f"{where}: not an integer >= {low}")
    return value


def _block(block: Block, where: str) -> None:
    if len(block.data) > MAX_SLICE_RECORD_BYTES:
        raise MalformedManifest(f"{where}: {len(block.data)} bytes is too large")


_KNOWN_INPUTS: Final = object()


@dataclass(frozen=True)
class SliceInputs:
    """A slice record's expected ``inputs``, checked once, and their dag-cbor encoding.

    Every slice record of a phase names the same N inputs (the roster minus the missing
    senders); :meth:`SliceRecord.from_block` given them compares a record's ``inputs`` bytes
    with :attr:`encoded` instead of decoding and checking N peer IDs and N CIDs again.
    """

    inputs: tuple[tuple[str, CID], ...]
    encoded: bytes

    @classmethod
    def of(cls, inputs: Iterable[tuple[str, CID]]) -> SliceInputs:
        """Check ``(peer, contribution)`` pairs as a record's inputs are checked; encode them.

        Raises
        ------
        MalformedManifest
            If a peer ID or CID is not one a slice record may name.
        """
        where = "expected slice inputs"
        pairs = tuple((_peer(p, where), _link(c, where, (RAW, DAG_CBOR))) for p, c in inputs)
        return cls(pairs, encode_dag_cbor([[p, c] for p, c in pairs]))


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
    def from_block(cls, block: Block, expected: SliceInputs | None = None) -> SliceRecord:
        """Decode and check a slice record (remembered: :class:`~.memo.DecodeMemo`).

        ``expected`` inputs (:class:`SliceInputs`), when the record names exactly those, are
        not decoded again: the result and the errors are the same either way.

        Raises
        ------
        MalformedManifest
            If it is too large, not a v1 slice record, or a field is out of shape: an unknown
            rule, a non-finite learning rate, an empty slice, inputs or missing peers not
            unique, more than ``MAX_ROSTER_ENTRIES`` of them, a weight sum out of range.
        """
        # Decoded with ``expected``, a record is remembered but decoded again (it is cheap then).
        known = _RECORDS.get(block.data) if expected is None else None
        if known is None:
            known = _RECORDS.put(block.data, cls._from_block(block, expected), len(block.data))
        return known

    @classmethod
    def _from_block(cls, block: Block, expected: SliceInputs | None) -> SliceRecord:
        where = f"slice record {cid_to_str(block.cid)}"
        _block(block, where)
        known = None if expected is None else {expected.encoded: _KNOWN_INPUTS}
        record = decode_record(block, _SLICE, known=known)
        rule = require(record, "rule", str, where)
        if split_slice_rule(rule) is None:
            raise MalformedManifest(f"{where}: unknown rule {rule!r:.40}")
        rate = require(record, "learning_rate", float, where)
        if not math.isfinite(rate):
            raise MalformedManifest(f"{where}: learning rate is not finite")
        known_inputs = None
        if expected is not None and record.get("inputs") is _KNOWN_INPUTS:
            known_inputs = expected.inputs  # checked by SliceInputs.of
        inputs = known_inputs or require(record, "inputs", list, where)
        missing = require(record, "missing", list, where)
        if len(inputs) + len(missing) > MAX_ROSTER_ENTRIES or not inputs:
            raise MalformedManifest(f"{where}: 1..{MAX_ROSTER_ENTRIES} inputs required")
        pairs = list(known_inputs or (_input(item, where) for item in inputs))
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
        where = f"fraud record {cid_to_str(block.cid)}"
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


Checked = tuple[int, str, tuple[float, ...]]
"""One checked value set of a ``proj`` message: ``(k, author, values)``."""


SliceKind = Literal["slice", "partial", "proj", "fraud"]
_MESSAGE: Final = "gradfed.slice-msg"
_SIGNED: Final = "gradfed.slice-signed"


@dataclass(frozen=True)
class SliceMessage:
    """One slice-board message: a slice record (``cid``), projections (``values``) or a fraud.

    ``phase`` is the missing-set phase of a ``slice`` or ``partial`` message (``-1``: a slice
    recomputed after a proven lie); ``sender`` is pubsub's authenticated ``from`` and is not
    encoded. A ``partial`` message names a chained round's partial-sum record
    (:class:`~gradfed_ipfs.formats.sliced.partials.PartialRecord`) of step ``k = slice · G + j``.
    """

    kind: SliceKind
    sender: str
    roster: CID
    phase: int = 0
    k: int = 0
    cid: CID | None = None
    values: tuple[float, ...] = ()
    block: bytes | None = field(default=None, compare=False, repr=False)
    """A ``slice`` (or ``partial``) message's record bytes (they hash to ``cid``): readers need
    not fetch them.
    Sent only when the message stays within :data:`MAX_SLICE_MESSAGE_BYTES`."""
    checked: tuple[Checked, ...] = ()
    """A ``proj`` message's check values of other senders, each ``(k, author, values)``: what
    this peer computed from ``author``'s contribution blocks for slice ``k``, which ``author``
    wrote (a reducer's own check values are not taken on its word)."""
    signed: Statement | None = field(default=None, compare=False, repr=False)
    """The sender's signed statement of this message (kind ``sliced/<kind>``, body
    :meth:`statement_body`): what a proof of its lie names. ``None``: unsigned (boards of
    peers simulated in one process)."""

    def statement_body(self) -> bytes:
        """Return the bytes a sender signs: the message's JSON without the record's bytes."""
        return SliceMessage(
            self.kind, self.sender, self.roster, self.phase, self.k, self.cid, self.values,
            checked=self.checked,
        ).encode()  # fmt: skip

    async def sign(self, signer: Signer, keys: KeyBook = PEER_ID_KEYS) -> SliceMessage:
        """Return this message signed by ``signer`` (one signature: re-announce its bytes)."""
        statement = await sign_statement(
            signer, f"sliced/{self.kind}", self.statement_body(), keys=keys
        )
        return dataclasses.replace(self, signed=statement)

    def encode(self) -> bytes:
        """Return the JSON bytes (without the sender); the record's bytes only if they fit.

        A signed message is ``{t, kind, st, block?}``: its statement's block in base64 (the
        fields are the statement's body), ``kind`` in clear for filters.
        """
        if self.signed is not None:
            return self._encode_signed(self.signed)
        body: dict[str, object] = {
            "t": _MESSAGE,
            "kind": self.kind,
            "roster": cid_to_str(self.roster),  # str(CID): ~1 ms in multiformats
            "phase": self.phase,
            "k": self.k,
            "cid": None if self.cid is None else cid_to_str(self.cid),
            "values": list(self.values),
        }
        if self.checked:
            body["checked"] = [[k, author, list(values)] for k, author, values in self.checked]
        if self.block is not None:
            body["block"] = base64.b64encode(self.block).decode()
            data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
            if len(data) <= MAX_SLICE_MESSAGE_BYTES:
                return data
            del body["block"]  # too large to ride along: readers fetch the record by CID
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()

    def _encode_signed(self, signed: Statement) -> bytes:
        body: dict[str, object] = {
            "t": _SIGNED,
            "kind": self.kind,
            "st": base64.b64encode(signed.block.data).decode(),
        }
        if self.block is not None:
            body["block"] = base64.b64encode(self.block).decode()
            data = json.dumps(body, separators=(",", ":")).encode()
            if len(data) <= MAX_SLICE_MESSAGE_BYTES:
                return data
            del body["block"]
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, sender: str, keys: KeyBook = PEER_ID_KEYS) -> SliceMessage:
        """Decode a message from ``sender`` (remembered: :class:`~.memo.DecodeMemo`).

        A signed message's statement is checked: its author must be ``sender`` (found in
        ``keys``), its kind ``sliced/<kind>``, its body a message of that kind.

        Raises
        ------
        MalformedAnnouncement
            If it is too large, not JSON of this shape, a CID does not parse or is not
            dag-cbor, a ``slice``/``fraud`` lacks its CID, or a projection is not finite.
        BadSignature
            If a signed message's signature does not verify.
        """
        key = (bytes(data), sender)
        known = _MESSAGES.get(key)
        if known is None:
            known = _MESSAGES.put(key, cls._decode(data, sender, keys), len(data))
        return known

    @classmethod
    def _decode(cls, data: bytes, sender: str, keys: KeyBook = PEER_ID_KEYS) -> SliceMessage:
        if len(data) > MAX_SLICE_MESSAGE_BYTES:
            raise MalformedAnnouncement(f"slice message of {len(data)} bytes is too large")
        body = load_json(data, "slice message", error=MalformedAnnouncement)
        if isinstance(body, dict) and body.get("t") == _SIGNED:
            return cls._decode_signed(body, sender, keys)
        return cls._decode_fields(body, sender)

    @classmethod
    def _decode_signed(cls, body: dict[str, object], sender: str, keys: KeyBook) -> SliceMessage:
        kind, text = body.get("kind"), body.get("st")
        if kind not in ("slice", "partial", "proj", "fraud") or not isinstance(text, str):
            raise MalformedAnnouncement("signed slice message: no kind or statement")
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise MalformedAnnouncement(f"signed slice message: statement: {exc}") from None
        statement = decode_statement(Block.new(raw, "dag-cbor"), kind=f"sliced/{kind}", keys=keys)
        if statement.author != sender:
            raise MalformedAnnouncement(
                f"signed slice message from {sender:.60} is {statement.author:.60}'s"
            )
        inner = load_json(statement.body, "slice message", error=MalformedAnnouncement)
        message = cls._decode_fields(inner, sender)
        if message.kind != kind or message.block is not None:
            raise MalformedAnnouncement("signed slice message: its statement is another message")
        block = _inline_block(body.get("block"), message.cid, message.kind)
        return dataclasses.replace(message, block=block, signed=statement)

    @classmethod
    def _decode_fields(cls, body: object, sender: str) -> SliceMessage:
        if not isinstance(body, dict) or body.get("t") != _MESSAGE:
            raise MalformedAnnouncement("not a slice message")
        kind = body.get("kind")
        if kind not in ("slice", "partial", "proj", "fraud"):
            raise MalformedAnnouncement(f"unknown slice message kind {kind!r:.20}")
        numbers = []
        for key in ("phase", "k"):
            value = body.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or not -1 <= value < 1 << 20:
                raise MalformedAnnouncement(f"slice message: {key} out of range")
            numbers.append(value)
        phase, k = numbers
        values = body.get("values")
        if not isinstance(values, list) or len(values) > MAX_ROSTER_ENTRIES:
            raise MalformedAnnouncement("slice message: values is not a short list")
        if not _finite(values):
            raise MalformedAnnouncement("slice message: a projection is not a finite number")
        link = body.get("cid")
        if (link is None) != (kind == "proj"):
            raise MalformedAnnouncement(f"slice message: a {kind} message with(out) a CID")
        try:
            roster = parse_cid(str(body.get("roster")))
            cid = None if link is None else parse_cid(str(link))
        except DecodeError as exc:
            raise MalformedAnnouncement(f"slice message: {exc}") from None
        if roster.codec.code != DAG_CBOR or (cid is not None and cid.codec.code != DAG_CBOR):
            raise MalformedAnnouncement("slice message: links must be dag-cbor records")
        block = _inline_block(body.get("block"), cid, kind)
        checked = _checked(body.get("checked"), kind)
        return cls(
            kind, sender, roster, phase, k, cid, tuple(float(v) for v in values), block, checked
        )


def _finite(values: object) -> bool:
    return isinstance(values, list) and all(
        isinstance(v, float | int) and not isinstance(v, bool) and math.isfinite(v) for v in values
    )


def _checked(items: object, kind: str) -> tuple[Checked, ...]:
    """Return a ``proj`` message's ``checked`` entries, bounded and typed.

    Raises
    ------
    MalformedAnnouncement
        If they come with another kind, or are not short lists of ``[k, peer, [finite...]]``.
    """
    if items is None:
        return ()
    if kind != "proj" or not isinstance(items, list) or len(items) > MAX_ROSTER_ENTRIES:
        raise MalformedAnnouncement("slice message: checked is not a short list of a proj")
    out: list[Checked] = []
    total = 0
    for item in items:
        if not isinstance(item, list) or len(item) != 3:
            raise MalformedAnnouncement("slice message: a checked entry is not [k, peer, values]")
        k, author, values = item
        if (
            not isinstance(k, int)
            or isinstance(k, bool)
            or not 0 <= k < 1 << 20
            or not isinstance(author, str)
            or not 0 < len(author) <= MAX_PEER_ID_CHARS
            or not _finite(values)
        ):
            raise MalformedAnnouncement("slice message: a checked entry is malformed")
        total += len(values)
        if total > MAX_ROSTER_ENTRIES:
            raise MalformedAnnouncement("slice message: too many checked values")
        out.append((k, author, tuple(float(v) for v in values)))
    return tuple(out)


def _inline_block(text: object, cid: CID | None, kind: str) -> bytes | None:
    """Return a ``slice`` message's inline record bytes, checked against its CID.

    Raises
    ------
    MalformedAnnouncement
        If they are not base64, come with another kind, or do not hash to ``cid``.
    """
    if text is None:
        return None
    if kind not in ("slice", "partial") or cid is None or not isinstance(text, str):
        raise MalformedAnnouncement(f"slice message: a {kind} message with inline bytes")
    try:
        block = base64.b64decode(text, validate=True)
        verify_cid(cid, block)
    except BlockCorrupt:
        raise MalformedAnnouncement("slice message: inline bytes do not hash to its CID") from None
    except (binascii.Error, ValueError) as exc:
        raise MalformedAnnouncement(f"slice message: inline record bytes: {exc}") from None
    return block
