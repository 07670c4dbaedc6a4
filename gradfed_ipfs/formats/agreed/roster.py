"""Agreed-round wire forms, without I/O: rosters, round records and the pubsub messages.

Two dag-cbor records (keys sorted canonically, CIDs as tag-42 links):

``gradfed.roster`` v1
    ``{session, genesis, round, base, coordinator, expected: [peer...],
    entries: [[peer, contribution, weight, signature]...], members?}``, entries sorted by peer
    ID, one per peer. ``base`` is the model CID the round starts from; every peer aggregates
    exactly ``entries``; ``members`` (only when the round changes it) names the next member set.
    ``signature`` is the entry owner's signature (plain or delegated) of its ``agreed/contrib``
    statement (:func:`contribution_body`, rebuilt from the roster and the entry), so a roster
    cannot name a contribution its owner did not announce (:func:`verify_roster_entries`);
    entries of three items (no signature) still decode, and are refused by those checks.
``gradfed.agreed-round`` v1
    ``{session, genesis, round, prev, base, roster, result, learning_rate}``: ``prev`` links the
    previous round's record (``None`` for round 0), ``result`` is the new model CID; optional
    ``rule``, ``state`` (a custom update rule), ``slices`` (a reduce-scatter round's slice
    records, in slice order), ``frauds`` (the round's fraud records, in slice order) and
    ``excluded`` (every peer proven a lying reducer in this round or an earlier one, sorted)
    and ``members`` (the next member set's CID, when the round changed it); ``roster_signature``
    (its coordinator's signature of its ``agreed/roster`` message, when the roster leaves an
    expected peer out: :func:`verify_roster_coordinator`).

And one small JSON pubsub message, :class:`AgreedMessage`, of three kinds: ``contrib`` (a
peer's contribution CID and weight for a round on a base model), ``roster`` (a coordinator's
roster CID) and ``done`` (a peer's result model CID and round record CID: its head). On the
wire it is the body of its sender's signed statement (:mod:`~.statement`) of kind
``agreed/contrib``, ``agreed/roster`` or ``agreed/done`` (:func:`sign_message`,
:func:`open_message`).

Every decoder checks sizes, types, counts and order before building anything, and raises
:class:`~gradfed_ipfs.errors.MalformedManifest` (records) or
:class:`~gradfed_ipfs.errors.MalformedAnnouncement` (messages).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from multiformats import CID

from ...block import Block
from ...cid import DAG_CBOR, RAW, cid_to_str, make_cid, parse_cid
from ...errors import (
    BadSignature,
    ConfigError,
    DecodeError,
    MalformedAnnouncement,
    MalformedManifest,
)
from ...tensor.packing import PackSpec
from ..fast_cbor import encode_dag_cbor
from ..memo import DecodeMemo
from ..pubsub import decode_multibase, encode_multibase
from ..records import decode_record, encode_record, require
from ..statement import (
    PEER_ID_KEYS,
    SIGNATURE_LENGTHS,
    KeyBook,
    Signer,
    Statement,
    decode_statement,
    sign_statement,
    verify_signed,
)

__all__ = [
    "MAX_INLINE_BYTES",
    "MAX_MESSAGE_BYTES",
    "MAX_SIGNED_MESSAGE_BYTES",
    "MAX_PEER_ID_CHARS",
    "MAX_ROSTER_ENTRIES",
    "MAX_WEIGHT",
    "AgreedMessage",
    "AgreedRecord",
    "MessageKind",
    "Roster",
    "RosterEntry",
    "COMET_CONTRIBUTION",
    "comet_contribution_body",
    "contribution_body",
    "message_kind",
    "open_message",
    "sign_message",
    "roster_message_body",
    "verify_roster_coordinator",
    "verify_roster_entries",
]

MAX_ROSTER_ENTRIES: Final = 1024
"""Most entries (and expected peers) a roster may list."""
MAX_PEER_ID_CHARS: Final = 128
"""Longest peer ID accepted (Kubo's are 52 characters)."""
MAX_WEIGHT: Final = 1 << 40
"""Largest contribution weight (sample count) accepted."""
MAX_MESSAGE_BYTES: Final = 8192
"""Largest agreed-round pubsub message accepted, in bytes."""
MAX_SIGNED_MESSAGE_BYTES: Final = MAX_MESSAGE_BYTES + 1024
"""Largest signed agreed message (its statement: the message plus author and signature)."""
MAX_INLINE_BYTES: Final = 3072
"""Largest roster block carried inside its ``roster`` message (larger ones are fetched)."""
MAX_RECORD_BYTES: Final = 384 * 1024
"""Largest roster or round record block decoded, in bytes (a roster of
:data:`MAX_ROSTER_ENTRIES` entries with delegated signatures is about 330 KB)."""
MAX_TEXT_CHARS: Final = 256
"""Longest session ID accepted."""

MessageKind = Literal["contrib", "roster", "done"]
_KINDS: Final = ("contrib", "roster", "done")
_ROSTER: Final = "gradfed.roster"
_RECORD: Final = "gradfed.agreed-round"
_MESSAGE: Final = "gradfed.agreed-message"  # a memo key only: messages are JSON
_SIGNED: Final = "gradfed.agreed-statement"  # a memo key only
_MEMO: Final[DecodeMemo[tuple[str, bytes], Any]] = DecodeMemo()
"""Rosters, records and messages decoded (:class:`~.memo.DecodeMemo`), by kind and bytes."""
_ENTRIES_VERIFIED: Final[DecodeMemo[tuple[object, ...], bool]] = DecodeMemo()
"""Roster entries whose signature verified, by key book and everything the signed body holds
(session, genesis, round, base, peer, CID, weight) with the signature: each member checks the
adopted roster's N entries, and rebuilding N statement bodies to find their verified signatures
was most of that (only successes are kept)."""


def _peer(value: object, where: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_PEER_ID_CHARS:
        raise MalformedManifest(f"{where}: peer ID is not a short string")
    return value


def _content_cid(value: object, where: str) -> CID:
    """Check a link to a gradient or model: a raw block or a dag-cbor manifest."""
    if not isinstance(value, CID) or value.codec.code not in (RAW, DAG_CBOR):
        raise MalformedManifest(f"{where}: not a raw or dag-cbor CID link")
    return parse_cid(value)


def _record_cid(value: object, where: str) -> CID:
    if not isinstance(value, CID) or value.codec.code != DAG_CBOR:
        raise MalformedManifest(f"{where}: not a dag-cbor CID link")
    return parse_cid(value)


def _round(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 53:
        raise MalformedManifest(f"{where}: round is not a non-negative integer")
    return value


def _session(value: object, where: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT_CHARS:
        raise MalformedManifest(f"{where}: session is not a short string")
    return value


def _packing(value: object, where: str) -> PackSpec:
    if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
        raise MalformedManifest(f"{where}: encoding is not a label")
    try:
        return PackSpec.parse(value)
    except ConfigError as exc:
        raise MalformedManifest(f"{where}: {exc}") from None


def _checked_block(block: Block, where: str) -> None:
    if len(block.data) > MAX_RECORD_BYTES:
        raise MalformedManifest(f"{where} {block.cid}: {len(block.data)} bytes is too large")


@dataclass(frozen=True, slots=True)
class RosterEntry:
    """One roster line: a peer, its contribution's CID, weight (samples) and signature.

    ``signature`` is the peer's of its ``agreed/contrib`` statement (``None``: unsigned,
    refused by :func:`verify_roster_entries`).
    """

    peer: str
    contribution: CID
    weight: int
    signature: bytes | None = None


@dataclass(frozen=True)
class Roster:
    """The agreed set of contributions of one round, in aggregation order (sorted by peer).

    Attributes
    ----------
    session, genesis
        The session's name and genesis model CID (its identity).
    round
        Round number.
    base
        Model CID the round starts from.
    coordinator
        Peer that published the roster.
    expected
        Peers expected in the round (sorted); those without an entry are absent.
    entries
        Contributions, sorted by peer, one per peer.
    members
        CID of the member set the coordinator proposes for the next rounds
        (:class:`~.membership.MemberSet`), when this round changes it; else ``None`` (not
        written, so a session of fixed members keeps its bytes).
    """

    session: str
    genesis: CID
    round: int
    base: CID
    coordinator: str
    expected: tuple[str, ...]
    entries: tuple[RosterEntry, ...]
    members: CID | None = None

    @classmethod
    def new(
        cls,
        session: str,
        genesis: CID,
        round_number: int,
        base: CID,
        coordinator: str,
        expected: tuple[str, ...] | list[str],
        entries: Mapping[str, tuple[CID, int] | tuple[CID, int, bytes | None]],
        members: CID | None = None,
    ) -> Roster:
        """Build a roster, sorting ``entries`` and ``expected``.

        ``entries`` maps a peer to (CID, weight) or (CID, weight, its contribution signature);
        ``members`` is the proposed next member set's CID (only when the round changes it).
        """
        lines = tuple(RosterEntry(p, *entries[p]) for p in sorted(entries))
        return cls(
            session, genesis, round_number, base, coordinator, tuple(sorted(expected)), lines,
            members,
        )  # fmt: skip

    @functools.cached_property
    def peers(self) -> tuple[str, ...]:
        """The peers with an entry, in roster order (made once: asked O(N) times a round)."""
        return tuple(entry.peer for entry in self.entries)

    @functools.cached_property
    def peer_set(self) -> frozenset[str]:
        """:attr:`peers` as a set, for membership tests (made once)."""
        return frozenset(self.peers)

    @property
    def absent(self) -> tuple[str, ...]:
        """Expected peers without an entry, sorted."""
        listed = set(self.peers)
        return tuple(p for p in self.expected if p not in listed)

    def to_block(self) -> Block:
        """Encode as a dag-cbor block."""
        return encode_record(
            {
                "type": _ROSTER,
                "version": 1,
                "session": self.session,
                "genesis": self.genesis,
                "round": self.round,
                "base": self.base,
                "coordinator": self.coordinator,
                "expected": list(self.expected),
                "entries": [_entry_fields(e) for e in self.entries],
                **({} if self.members is None else {"members": self.members}),
            }
        )

    @classmethod
    def from_block(cls, block: Block) -> Roster:
        """Decode and check a roster block (remembered: :class:`~.memo.DecodeMemo`).

        Raises
        ------
        MalformedManifest
            If it is too large, not a v1 roster, or any field is out of shape: entries not
            strictly sorted by peer, a weight outside ``[1, MAX_WEIGHT]``, too many entries.
        """
        known = _MEMO.get((_ROSTER, block.data))
        if known is None:
            known = _MEMO.put((_ROSTER, block.data), cls._from_block(block), len(block.data))
        return cast(Roster, known)

    @classmethod
    def _from_block(cls, block: Block) -> Roster:
        where = f"roster {cid_to_str(block.cid)}"  # str(CID) costs ~1 ms
        _checked_block(block, where)
        record = decode_record(block, _ROSTER)
        expected = require(record, "expected", list, where)
        entries = require(record, "entries", list, where)
        if len(entries) > MAX_ROSTER_ENTRIES or len(expected) > MAX_ROSTER_ENTRIES:
            raise MalformedManifest(f"{where}: more than {MAX_ROSTER_ENTRIES} entries")
        peers = tuple(_peer(p, where) for p in expected)
        if list(peers) != sorted(set(peers)):
            raise MalformedManifest(f"{where}: expected peers are not sorted and unique")
        lines = [_entry(item, where) for item in entries]
        members = record.get("members")
        names = [line.peer for line in lines]
        if names != sorted(set(names)):
            raise MalformedManifest(f"{where}: entries are not sorted by unique peer")
        return cls(
            session=_session(record.get("session"), where),
            genesis=_content_cid(record.get("genesis"), where),
            round=_round(record.get("round"), where),
            base=_content_cid(record.get("base"), where),
            coordinator=_peer(record.get("coordinator"), where),
            expected=peers,
            entries=tuple(lines),
            members=None if members is None else _record_cid(members, where),
        )


def _entry_fields(entry: RosterEntry) -> list[Any]:
    fields: list[Any] = [entry.peer, entry.contribution, entry.weight]
    return fields if entry.signature is None else [*fields, entry.signature]


def _entry(item: object, where: str) -> RosterEntry:
    """Decode one ``[peer, cid, weight(, signature)]`` entry."""
    if not isinstance(item, list) or len(item) not in (3, 4):
        raise MalformedManifest(
            f"{where}: an entry is not [peer, cid, weight] or [peer, cid, weight, signature]"
        )
    weight = item[2]
    if not isinstance(weight, int) or isinstance(weight, bool):
        raise MalformedManifest(f"{where}: weight is not an integer")
    if not 1 <= weight <= MAX_WEIGHT:
        raise MalformedManifest(f"{where}: weight {weight} out of range")
    signature = item[3] if len(item) == 4 else None
    if signature is not None and (
        not isinstance(signature, bytes) or len(signature) not in SIGNATURE_LENGTHS
    ):
        raise MalformedManifest(f"{where}: an entry's signature is not {SIGNATURE_LENGTHS} bytes")
    return RosterEntry(_peer(item[0], where), _content_cid(item[1], where), weight, signature)


def contribution_body(roster: Roster, entry: RosterEntry) -> bytes:
    """Return the body of the ``agreed/contrib`` statement ``entry``'s owner signed.

    The owner's ``contrib`` message of the roster's session, genesis, round and base, naming
    the entry's peer, CID and weight (:meth:`AgreedMessage.encode` is canonical: receivers
    refuse a ``contrib`` whose bytes are not, so every listed signature is over these bytes).
    """
    return AgreedMessage(
        "contrib", roster.session, roster.genesis, roster.round, entry.peer, entry.contribution,
        roster.base, entry.weight,
    ).encode()  # fmt: skip


COMET_CONTRIBUTION: Final = "comet/contribution"
"""Kind of a contribution transaction on a CometBFT control plane (its entries' signatures)."""


def comet_contribution_body(
    session: str, round_number: int, cid: CID, weight: int, base: CID
) -> bytes:
    """Return the body of a ``comet/contribution`` transaction (dag-cbor, CIDs as text).

    A roster decided on a CometBFT chain lists each entry with the signature of its owner's
    contribution transaction: the same claim (this CID, weight and base in this round of the
    session) as an ``agreed/contrib`` statement.
    """
    return encode_dag_cbor(
        {"session": session, "round": round_number, "cid": cid_to_str(cid),
         "weight": int(weight), "base": cid_to_str(base)}
    )  # fmt: skip


def _entry_verifies(roster: Roster, entry: RosterEntry, keys: KeyBook) -> None:
    """Verify ``entry``'s signature as its ``agreed/contrib``, else its chain transaction."""
    assert entry.signature is not None  # noqa: S101 - checked by the caller
    try:
        verify_signed(
            entry.peer, message_kind("contrib"), contribution_body(roster, entry),
            entry.signature, keys,
        )  # fmt: skip
    except BadSignature:
        body = comet_contribution_body(
            roster.session, roster.round, entry.contribution, entry.weight, roster.base
        )
        verify_signed(entry.peer, COMET_CONTRIBUTION, body, entry.signature, keys)


def verify_roster_entries(roster: Roster, keys: KeyBook = PEER_ID_KEYS) -> None:
    """Check every entry carries its owner's signature of the contribution it lists.

    The signature is of its owner's ``agreed/contrib`` statement, or (a roster decided on a
    CometBFT chain) of its ``comet/contribution`` transaction.

    Raises
    ------
    BadSignature
        Naming the first entry whose signature is missing or does not verify (another
        round's, base's, CID's or weight's statement, or another author's).
    """
    place = (keys, roster.session, bytes(roster.genesis), roster.round, bytes(roster.base))
    for entry in roster.entries:
        if entry.signature is None:
            raise BadSignature(f"roster entry of {entry.peer:.60} is not signed")
        key = (*place, entry.peer, bytes(entry.contribution), entry.weight, entry.signature)
        if _ENTRIES_VERIFIED.get(key):
            continue
        try:
            _entry_verifies(roster, entry, keys)
        except BadSignature as exc:
            raise BadSignature(
                f"roster entry of {entry.peer:.60} is not its signed contribution: {exc}"
            ) from None
        _ENTRIES_VERIFIED.put(key, True, len(entry.peer) + len(entry.signature) + 128)


def roster_message_body(roster: Roster, block: Block) -> bytes:
    """Return the body of the ``agreed/roster`` message its coordinator published for ``block``.

    The coordinator's message of the roster's session, genesis and round naming ``block``'s
    CID, carrying the block inline when it is at most :data:`MAX_INLINE_BYTES` (as every
    coordinator sends it; :func:`open_message` refuses a non-canonical one), so its signature
    is checked offline from the roster block alone (:func:`verify_roster_coordinator`).
    """
    inline = block.data if len(block.data) <= MAX_INLINE_BYTES else None
    return AgreedMessage(
        "roster", roster.session, roster.genesis, roster.round, roster.coordinator, block.cid,
        inline=inline,
    ).encode()  # fmt: skip


def _decided_on_chain(roster: Roster, keys: KeyBook) -> bool:
    """Whether every entry is its owner's ``comet/contribution`` transaction (a chain's roster)."""
    for entry in roster.entries:
        body = comet_contribution_body(
            roster.session, roster.round, entry.contribution, entry.weight, roster.base
        )
        try:
            verify_signed(entry.peer, COMET_CONTRIBUTION, body, entry.signature or b"", keys)
        except BadSignature:
            return False
    return bool(roster.entries)


def verify_roster_coordinator(
    roster: Roster, block: Block, signature: bytes | None, keys: KeyBook = PEER_ID_KEYS
) -> None:
    """Check a roster that leaves an expected peer out carries its coordinator's signature.

    ``signature`` is the named coordinator's of its ``agreed/roster`` message
    (:func:`roster_message_body`; a record carries it as
    :attr:`AgreedRecord.roster_signature`): a roster learned through a record is then the
    coordinator's own, and a member cannot rebuild a round with others' signed contributions
    left out. A roster listing every expected peer needs none (nothing was left out: every
    peer derives the same one), nor does one whose entries are all CometBFT contribution
    transactions (the chain decided it; an offline reader does not check the chain).

    Raises
    ------
    BadSignature
        If the signature is missing or is not the coordinator's of this roster.
    """
    if not roster.absent or _decided_on_chain(roster, keys):
        return
    if signature is None:
        raise BadSignature(
            f"roster {cid_to_str(block.cid)} leaves out {', '.join(roster.absent)[:120]} "
            f"and carries no signature of its coordinator {roster.coordinator:.60}"
        )
    body = roster_message_body(roster, block)
    verify_signed(roster.coordinator, message_kind("roster"), body, signature, keys)


@dataclass(frozen=True)
class AgreedRecord:
    """The record of one agreed round; peers that agree write byte-identical records.

    Attributes
    ----------
    session, genesis, round
        As in :class:`Roster`.
    prev
        The previous round's record CID, ``None`` for the first round.
    base
        Model CID the round started from.
    roster
        The roster's CID.
    result
        The new model's CID: ``float32(base + learning_rate · weighted mean of the roster)``.
    learning_rate
        The factor of the update rule.
    rule
        Label of a custom update rule (a server optimizer, a robust rule), ``None`` for the
        default weighted mean; only written when set, so default records keep their bytes.
    state
        CID of the custom rule's state after this round (a gradient block or DAG), or ``None``.
    slices
        A reduce-scatter round's slice records
        (:class:`~gradfed_ipfs.formats.sliced.slices.SliceRecord`
        CIDs, in slice order), ``None`` for an all-to-all round; only written when set.
    frauds
        The :class:`~gradfed_ipfs.formats.sliced.slices.FraudRecord` CIDs of lies proven in this
        round (slice order), ``None`` when there were none; only written when set.
    excluded
        Peers proven lying reducers in this round or earlier (sorted): no later roster of the
        session may list them. ``None`` when there are none; only written when set.
    model_stored
        Whether the round's holders put ``result`` (and ``state``) in their repos. ``False``
        (written only then) means a reader rebuilds them: from the newest earlier record whose
        model is stored, re-aggregating the rounds since
        (:func:`~gradfed_ipfs.federated.agreed.history.load_result`).
    encoding
        The contributions' packed encoding (:attr:`~gradfed_ipfs.tensor.packing.PackSpec.label`,
        e.g. ``int8/1024``), ``None`` for dense float32; only written when set.
    members
        CID of the member set that rounds after this one use, when this round changed it
        (its roster's ``members``); ``None`` otherwise (only written when set).
    roster_signature
        The roster's coordinator's signature of its ``agreed/roster`` message
        (:func:`roster_message_body`), written when the roster leaves an expected peer out
        (:func:`verify_roster_coordinator`); ``None`` otherwise.
    """

    session: str
    genesis: CID
    round: int
    prev: CID | None
    base: CID
    roster: CID
    result: CID
    learning_rate: float
    rule: str | None = None
    state: CID | None = None
    slices: tuple[CID, ...] | None = None
    frauds: tuple[CID, ...] | None = None
    excluded: tuple[str, ...] | None = None
    model_stored: bool = True
    encoding: str | None = None
    members: CID | None = None
    roster_signature: bytes | None = None

    @property
    def packing(self) -> PackSpec | None:
        """The contributions' encoding, parsed from :attr:`encoding` (``None``: dense)."""
        return None if self.encoding is None else PackSpec.parse(self.encoding)

    def to_block(self) -> Block:
        """Encode as a dag-cbor block."""
        return encode_record(
            {
                "type": _RECORD,
                "version": 1,
                "session": self.session,
                "genesis": self.genesis,
                "round": self.round,
                "prev": self.prev,
                "base": self.base,
                "roster": self.roster,
                "result": self.result,
                "learning_rate": float(self.learning_rate),
                **({} if self.rule is None else {"rule": self.rule}),
                **({} if self.state is None else {"state": self.state}),
                **({} if self.slices is None else {"slices": list(self.slices)}),
                **({} if self.frauds is None else {"frauds": list(self.frauds)}),
                **({} if self.excluded is None else {"excluded": list(self.excluded)}),
                **({} if self.model_stored else {"model_stored": False}),
                **({} if self.encoding is None else {"encoding": self.encoding}),
                **({} if self.members is None else {"members": self.members}),
                **(
                    {}
                    if self.roster_signature is None
                    else {"roster_signature": self.roster_signature}
                ),
            }
        )

    @classmethod
    def from_block(cls, block: Block) -> AgreedRecord:
        """Decode and check a round record block (remembered: :class:`~.memo.DecodeMemo`).

        Raises
        ------
        MalformedManifest
            If it is too large, not a v1 agreed-round record, or a field is out of shape.
        """
        known = _MEMO.get((_RECORD, block.data))
        if known is None:
            known = _MEMO.put((_RECORD, block.data), cls._from_block(block), len(block.data))
        return cast(AgreedRecord, known)

    @classmethod
    def _from_block(cls, block: Block) -> AgreedRecord:
        where = f"round record {cid_to_str(block.cid)}"
        _checked_block(block, where)
        record = decode_record(block, _RECORD)
        prev = record.get("prev")
        rate = record.get("learning_rate")
        if not isinstance(rate, float) or not math.isfinite(rate):
            raise MalformedManifest(f"{where}: learning_rate is not a finite float")
        rule, state = record.get("rule"), record.get("state")
        if rule is not None and (not isinstance(rule, str) or not 0 < len(rule) <= MAX_TEXT_CHARS):
            raise MalformedManifest(f"{where}: rule is not a label of 1..{MAX_TEXT_CHARS} chars")
        slices = record.get("slices")
        if slices is not None and (
            not isinstance(slices, list) or not 0 < len(slices) <= MAX_ROSTER_ENTRIES
        ):
            raise MalformedManifest(f"{where}: slices is not a list of 1..{MAX_ROSTER_ENTRIES}")
        frauds, excluded = record.get("frauds"), record.get("excluded")
        for name, value in (("frauds", frauds), ("excluded", excluded)):
            if value is not None and (
                not isinstance(value, list) or not 0 < len(value) <= MAX_ROSTER_ENTRIES
            ):
                raise MalformedManifest(f"{where}: {name} is not a list of 1..{MAX_ROSTER_ENTRIES}")
        peers = None if excluded is None else tuple(_peer(p, where) for p in excluded)
        if peers is not None and list(peers) != sorted(set(peers)):
            raise MalformedManifest(f"{where}: excluded peers are not sorted and unique")
        if record.get("model_stored", False) is not False:  # one encoding per record
            raise MalformedManifest(f"{where}: model_stored is written only as false")
        encoding = record.get("encoding")
        label = None if encoding is None else _packing(encoding, where).label
        members = record.get("members")
        signature = record.get("roster_signature")
        if signature is not None and (
            not isinstance(signature, bytes) or len(signature) not in SIGNATURE_LENGTHS
        ):
            raise MalformedManifest(f"{where}: roster_signature is not {SIGNATURE_LENGTHS} bytes")
        return cls(
            session=_session(record.get("session"), where),
            genesis=_content_cid(record.get("genesis"), where),
            round=_round(record.get("round"), where),
            prev=None if prev is None else _record_cid(prev, where),
            base=_content_cid(record.get("base"), where),
            roster=_record_cid(record.get("roster"), where),
            result=_content_cid(record.get("result"), where),
            learning_rate=rate,
            rule=rule,
            state=None if state is None else _content_cid(state, where),
            slices=None if slices is None else tuple(_record_cid(c, where) for c in slices),
            frauds=None if frauds is None else tuple(_record_cid(c, where) for c in frauds),
            excluded=peers,
            model_stored="model_stored" not in record,
            encoding=label,
            members=None if members is None else _record_cid(members, where),
            roster_signature=signature,
        )


@dataclass(frozen=True, slots=True)
class AgreedMessage:
    """One agreed-round pubsub message (JSON on the wire).

    Attributes
    ----------
    kind
        ``contrib``, ``roster`` or ``done``.
    session, genesis, round
        Which session and round it is about.
    peer
        The sender (receivers require it to equal the authenticated pubsub ``from``).
    cid
        ``contrib``: the contribution; ``roster``: the roster; ``done``: the result model.
    base
        ``contrib``: the model the contribution was computed on; else ``None``.
    weight
        ``contrib``: the contribution's weight (samples); else ``None``.
    record
        ``done``: the round record CID (the sender's head); else ``None``.
    inline
        ``roster``: the roster block's bytes when at most :data:`MAX_INLINE_BYTES` (saves a
        fetch; receivers check them against ``cid``); else ``None``.
    """

    kind: MessageKind
    session: str
    genesis: CID
    round: int
    peer: str
    cid: CID
    base: CID | None = None
    weight: int | None = None
    record: CID | None = None
    inline: bytes | None = None

    def encode(self) -> bytes:
        """Return the compact JSON bytes."""
        body: dict[str, Any] = {
            "v": 1,
            "kind": self.kind,
            "session": self.session,
            "genesis": _cid_text(self.genesis),
            "round": self.round,
            "peer": self.peer,
            "cid": _cid_text(self.cid),
        }
        for key in ("base", "weight", "record"):
            value = getattr(self, key)
            if value is not None:
                body[key] = value if isinstance(value, int) else _cid_text(value)
        if self.inline is not None:
            body["inline"] = encode_multibase(self.inline)
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> AgreedMessage:
        """Parse and check a message (remembered: :class:`~.memo.DecodeMemo`).

        Raises
        ------
        MalformedAnnouncement
            If it is too large, not JSON, or a field is missing or out of shape for its kind.
        """
        known = _MEMO.get((_MESSAGE, bytes(data)))
        if known is None:
            known = _MEMO.put((_MESSAGE, bytes(data)), cls._decode(data), len(data))
        return cast(AgreedMessage, known)

    @classmethod
    def _decode(cls, data: bytes) -> AgreedMessage:
        if len(data) > MAX_MESSAGE_BYTES:
            raise MalformedAnnouncement(f"agreed message of {len(data)} bytes is too large")
        try:
            body = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise MalformedAnnouncement(f"agreed message is not JSON: {exc}") from None
        if not isinstance(body, dict) or body.get("v") != 1 or body.get("kind") not in _KINDS:
            raise MalformedAnnouncement("not a v1 agreed-round message")
        kind = body["kind"]
        try:
            message = cls(
                kind=kind,
                session=_session(body.get("session"), "message"),
                genesis=_text_cid(body.get("genesis")),
                round=_round(body.get("round"), "message"),
                peer=_peer(body.get("peer"), "message"),
                cid=_text_cid(body.get("cid")),
                base=_text_cid(body["base"]) if "base" in body else None,
                weight=body.get("weight"),
                record=_text_cid(body["record"]) if "record" in body else None,
                inline=_inline(body["inline"], body.get("cid")) if "inline" in body else None,
            )
        except (MalformedManifest, DecodeError) as exc:
            raise MalformedAnnouncement(f"agreed message: {exc}") from None
        if (message.base is not None, message.weight is not None) != ((kind == "contrib",) * 2) or (
            message.record is not None
        ) != (kind == "done"):
            raise MalformedAnnouncement(f"agreed {kind} message has the wrong fields")
        weight = message.weight
        if weight is not None and (
            not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= MAX_WEIGHT
        ):
            raise MalformedAnnouncement(f"agreed message weight {weight!r} out of range")
        return message


def message_kind(kind: MessageKind) -> str:
    """Return the statement kind an agreed message of ``kind`` is signed as (``agreed/…``)."""
    return f"agreed/{kind}"


async def sign_message(
    message: AgreedMessage, signer: Signer, keys: KeyBook = PEER_ID_KEYS
) -> Statement:
    """Sign ``message`` as its sender's statement; its block's bytes are what is published."""
    return await sign_statement(signer, message_kind(message.kind), message.encode(), keys=keys)


def open_message(data: bytes, keys: KeyBook = PEER_ID_KEYS) -> tuple[AgreedMessage, bytes]:
    """Decode a published agreed message, its sender's statement; return it and its signature.

    Remembered (:class:`~.memo.DecodeMemo`, by key book and bytes): a re-publication is not
    verified again.

    The statement's author must be the message's ``peer``, its kind the message's, and a
    ``contrib`` or ``roster`` body canonical (roster entries and records carry only the
    signature of those bytes).

    Raises
    ------
    MalformedManifest
        If ``data`` is not a statement (an unsigned message) or is too large.
    BadSignature
        If its signature does not verify.
    MalformedAnnouncement
        If the body is not an agreed message, or is not the author's, of the statement's kind,
        or (``contrib``) canonical.
    """
    key = (_SIGNED, keys, bytes(data))
    known = _SIGNED_MEMO.get(key)
    if known is None:
        known = _SIGNED_MEMO.put(key, _open(bytes(data), keys), len(data))
    return known


def _open(data: bytes, keys: KeyBook) -> tuple[AgreedMessage, bytes]:
    if len(data) > MAX_SIGNED_MESSAGE_BYTES:
        raise MalformedManifest(f"signed agreed message of {len(data)} bytes is too large")
    if not data or data[:1] == b"{":  # a plain JSON message: unsigned (not worth a CID)
        raise MalformedManifest("agreed message is not a signed statement")
    statement = decode_statement(Block.new(data, "dag-cbor"), keys=keys)
    message = AgreedMessage.decode(statement.body)
    if statement.author != message.peer or statement.kind != message_kind(message.kind):
        raise MalformedAnnouncement(
            f"a {statement.kind} statement of {statement.author:.60} carries a {message.kind} "
            f"message of {message.peer:.60}"
        )
    if message.kind in ("contrib", "roster") and message.encode() != statement.body:
        raise MalformedAnnouncement(f"agreed {message.kind} message is not in canonical form")
    return message, statement.signature


_SIGNED_MEMO: Final[DecodeMemo[tuple[str, KeyBook, bytes], tuple[AgreedMessage, bytes]]] = (
    DecodeMemo()
)


def _text_cid(value: object) -> CID:
    if not isinstance(value, str) or len(value) > 200:
        raise MalformedManifest("CID is not a short string")
    return _parse_text_cid(value)


def _inline(value: object, cid: object) -> bytes:
    if not isinstance(value, str) or len(value) > 2 * MAX_INLINE_BYTES:
        raise MalformedManifest("inline block is not a short string")
    data = decode_multibase(value)
    if len(data) > MAX_INLINE_BYTES or bytes(make_cid(data, "dag-cbor")) != bytes(_text_cid(cid)):
        raise MalformedManifest("inline block does not hash to the message's CID")
    return data


@functools.lru_cache(maxsize=4096)
def _parse_text_cid(text: str) -> CID:
    # multiformats validates every call at run time (~ms per CID); messages are re-announced,
    # so the same few CIDs are parsed over and over.
    return parse_cid(text)


def _cid_text(cid: CID) -> str:
    return cid_to_str(cid)
