"""Equivocation proofs: two conflicting signed statements of one author, checkable offline.

A member that tells two peers two different things about one round (two rosters for one
round and base, two contributions for one round and base) has signed both. The two
statements together are a proof anyone verifies with a :class:`~.statement.KeyBook`, without
trusting whoever hands it on.

``gradfed.equivocation`` v1 (dag-cbor)
    ``{statements: [bytes, bytes], rosters: [bytes...]}``: the two published statements (signed
    agreed messages, :func:`~.roster.open_message`), in byte order; ``rosters`` are the roster
    blocks a ``roster`` statement names but does not carry inline (its base is in the roster),
    in byte order. Nothing else: one proof of a conflict is one block, whoever built it.

A conflict is: the same author, kind, session, genesis and round, and the same base (a
``contrib``'s own ``base``; a ``roster``'s roster block's), with different claims. Two
``done`` statements are not evidence: an honest peer announces another head of a round after
it resyncs. :func:`decode_equivocation` checks size before decoding, both signatures, and the
conflict, and raises :class:`~gradfed_ipfs.errors.MalformedManifest` or
:class:`~gradfed_ipfs.errors.BadSignature`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from multiformats import CID

from ...block import Block
from ...errors import MalformedManifest
from ..records import decode_record, encode_record, require
from ..statement import PEER_ID_KEYS, KeyBook
from .roster import (
    MAX_RECORD_BYTES,
    MAX_SIGNED_MESSAGE_BYTES,
    AgreedMessage,
    Roster,
    message_kind,
    open_message,
)

__all__ = [
    "EQUIVOCATION",
    "MAX_PROOF_BYTES",
    "EquivocationProof",
    "decode_equivocation",
    "equivocation_proof",
    "is_equivocation",
]

EQUIVOCATION: Final = "gradfed.equivocation"
"""Record type of an equivocation proof."""
MAX_PROOF_BYTES: Final = 2 * (MAX_SIGNED_MESSAGE_BYTES + MAX_RECORD_BYTES) + 1024
"""Largest proof decoded: two signed messages and two roster blocks, with framing."""


@dataclass(frozen=True)
class EquivocationProof:
    """A verified proof that ``author`` signed two conflicting statements of one round.

    Attributes
    ----------
    author
        The equivocator (the statements' signer).
    kind
        The statements' kind (``agreed/roster`` or ``agreed/contrib``).
    session, genesis, round
        The session and round the statements are about.
    base
        The model CID both claims build on.
    claims
        What each statement names (two roster or contribution CIDs; equal for two contribs
        of different weights), in the proof's order.
    block
        The encoded proof (its CID names it).
    listed
        The peers either roster lists (empty for contributions): the members the rosters'
        author may have split, whom a re-run of the round waits for.
    """

    author: str
    kind: str
    session: str
    genesis: CID
    round: int
    base: CID
    claims: tuple[CID, CID]
    block: Block
    listed: frozenset[str] = frozenset()


def is_equivocation(data: bytes) -> bool:
    """Whether ``data`` is meant as an equivocation proof (a dag-cbor record of that type)."""
    if len(data) > MAX_PROOF_BYTES or not data or data[:1] == b"{":
        return False
    try:
        decode_record(Block.new(data, "dag-cbor"), EQUIVOCATION)
    except MalformedManifest:
        return False
    return True


def _roster_of(message: AgreedMessage, carried: Mapping[bytes, bytes], where: str) -> Roster:
    """Return the roster a ``roster`` message names: inline, else among the proof's rosters."""
    data = message.inline if message.inline is not None else carried.get(bytes(message.cid))
    if data is None:
        raise MalformedManifest(f"{where}: roster {message.cid} is neither inline nor carried")
    block = Block.new(data, "dag-cbor")
    if bytes(block.cid) != bytes(message.cid):
        raise MalformedManifest(f"{where}: a carried roster does not hash to {message.cid}")
    roster = Roster.from_block(block)
    if (roster.session, bytes(roster.genesis), roster.round) != (
        message.session,
        bytes(message.genesis),
        message.round,
    ):
        raise MalformedManifest(f"{where}: roster {message.cid} is not the message's round")
    return roster


def _base_of(message: AgreedMessage, carried: Mapping[bytes, bytes], where: str) -> CID:
    if message.kind == "contrib" and message.base is not None:
        return message.base
    if message.kind == "roster":
        return _roster_of(message, carried, where).base
    raise MalformedManifest(f"{where}: {message.kind} statements are not evidence")


def _conflict(
    first: AgreedMessage, second: AgreedMessage, carried: Mapping[bytes, bytes], where: str
) -> CID:
    """Check two messages are one author's conflicting claims; return their common base."""
    same = (first.peer, first.kind, first.session, bytes(first.genesis), first.round) == (
        second.peer, second.kind, second.session, bytes(second.genesis), second.round,
    )  # fmt: skip
    if not same:
        raise MalformedManifest(f"{where}: not one author's statements of one round and kind")
    base = _base_of(first, carried, where)
    if bytes(_base_of(second, carried, where)) != bytes(base):
        raise MalformedManifest(f"{where}: the statements build on different models")
    if (bytes(first.cid), first.weight) == (bytes(second.cid), second.weight):
        raise MalformedManifest(f"{where}: the statements make the same claim")
    return base


def decode_equivocation(block: Block, *, keys: KeyBook = PEER_ID_KEYS) -> EquivocationProof:
    """Decode and verify an equivocation proof (size bounded before decoding).

    Raises
    ------
    MalformedManifest
        If it is too large, not a v1 proof, not canonical, or its statements do not conflict
        (two authors, two rounds or bases, the same claim twice, ``done`` statements).
    BadSignature
        If a statement's signature does not verify.
    """
    where = f"equivocation proof {block.cid}"
    if len(block.data) > MAX_PROOF_BYTES:
        raise MalformedManifest(f"{where}: {len(block.data)} bytes > {MAX_PROOF_BYTES}")
    record = decode_record(block, EQUIVOCATION)
    statements = require(record, "statements", list, where)
    rosters = require(record, "rosters", list, where)
    if len(statements) != 2 or len(rosters) > 2:
        raise MalformedManifest(f"{where}: not two statements and at most two rosters")
    for item, limit in [(s, MAX_SIGNED_MESSAGE_BYTES) for s in statements] + [
        (r, MAX_RECORD_BYTES) for r in rosters
    ]:
        if not isinstance(item, bytes) or len(item) > limit:
            raise MalformedManifest(f"{where}: an item is not bytes of at most {limit}")
    if statements[0] >= statements[1] or rosters != sorted(set(rosters)):
        raise MalformedManifest(f"{where}: statements or rosters not in byte order, or repeated")
    (first, _), (second, _) = (open_message(s, keys) for s in statements)
    carried = {bytes(Block.new(r, "dag-cbor").cid): r for r in rosters}
    base = _conflict(first, second, carried, where)
    named = {bytes(m.cid) for m in (first, second) if m.kind == "roster" and m.inline is None}
    if set(carried) != named:
        raise MalformedManifest(f"{where}: carries rosters other than those its statements name")
    listed = frozenset(
        peer
        for m in (first, second)
        if m.kind == "roster"
        for peer in _roster_of(m, carried, where).peers
    )
    return EquivocationProof(
        first.peer, message_kind(first.kind), first.session, first.genesis, first.round, base,
        (first.cid, second.cid), block, listed,
    )  # fmt: skip


def equivocation_proof(
    first: bytes,
    second: bytes,
    rosters: Mapping[bytes, Block] | None = None,
    *,
    keys: KeyBook = PEER_ID_KEYS,
) -> EquivocationProof:
    """Build (and verify) the proof of two published statements, ``first`` and ``second``.

    ``rosters`` holds, by CID bytes, the roster blocks that ``roster`` statements name without
    carrying them inline (others are ignored). Both orders give the same block.

    Raises
    ------
    MalformedManifest, BadSignature
        If the statements are not a proof (:func:`decode_equivocation`).
    """
    pair = sorted((bytes(first), bytes(second)))
    needed = []
    for data in pair:
        message, _ = open_message(data, keys)
        if message.kind == "roster" and message.inline is None and rosters is not None:
            known = rosters.get(bytes(message.cid))
            if known is not None:
                needed.append(bytes(known.data))
    block = encode_record(
        {"type": EQUIVOCATION, "version": 1, "statements": pair, "rosters": sorted(set(needed))}
    )
    return decode_equivocation(block, keys=keys)
