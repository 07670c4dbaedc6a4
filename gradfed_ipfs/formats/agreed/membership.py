"""Who is in an agreed session, round by round: signed requests and the member-set record.

Three statements (:mod:`~.statement`; each body a small dag-cbor map naming the session):

``agreed/join``
    ``{session, genesis, peer, round}``: ``peer`` (the author) asks to become a member, made
    at round ``round`` (the first round the joiner's base record leaves open). So a join is
    fresh by construction: it can admit only by the close of a round ``r`` with
    ``round <= r < round + JOIN_ROUNDS``, and only if ``round`` is at or after the first round
    of the last member set that added or removed ``peer`` (:func:`join_timing_problem`). A
    member that left and rejoins signs a new join (new bytes, new CID) and a replay of its
    old one is refused. A join without ``round`` (written before it existed) is valid only for
    a peer no member set has added or removed yet, so old records still verify.
``agreed/approve``
    ``{session, genesis, peer, join}``: a member approves the join statement whose CID is
    ``join`` (admission by more than half or two thirds of the members).
``agreed/leave``
    ``{session, genesis, peer, round}``: ``peer`` (the author) leaves after round ``round``;
    refused if ``round`` is before the first round of its current membership (a leave from an
    earlier membership, replayed: :func:`leave_timing_problem`).

And one record, ``gradfed.members`` v1: ``{session, genesis, round, members, prev, changes}``,
the member set that rounds from ``round`` on use (``members`` sorted and unique), linked to the
set it replaced (``prev``; ``None`` for the genesis set). ``changes`` are
``[[op, peer, [statement...]]...]`` sorted by peer: ``join`` with its join statement and the
approvals, ``leave`` with its leave statement, ``evict`` with none (an eviction follows from the
chain's rosters, which a verifier re-reads). So a member set can be checked offline from its
record alone, with the rosters for evictions.

Every decoder checks sizes, types, counts and order before building anything and raises
:class:`~gradfed_ipfs.errors.MalformedManifest`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from multiformats import CID

from ...block import Block
from ...cid import DAG_CBOR, make_cid
from ...errors import MalformedManifest
from ..records import decode_record, encode_record, require
from ..statement import MAX_STATEMENT_BYTES

__all__ = [
    "APPROVE",
    "JOIN",
    "LEAVE",
    "JOIN_ROUNDS",
    "MAX_MEMBERS",
    "ChangeOp",
    "MemberChange",
    "MemberSet",
    "approve_body",
    "approvals_needed",
    "join_body",
    "join_timing_problem",
    "leave_body",
    "leave_timing_problem",
    "read_request",
]

JOIN: Final = "agreed/join"
APPROVE: Final = "agreed/approve"
LEAVE: Final = "agreed/leave"
MAX_MEMBERS: Final = 1024
JOIN_ROUNDS: Final = 16
"""Rounds a join is valid for: one made at round ``n`` can admit by the close of rounds
``n .. n + JOIN_ROUNDS - 1`` (then its author signs a new one)."""
"""Most members a member set may name (as many as a roster's entries)."""
MAX_SET_BYTES: Final = 1024 * 1024
"""Largest encoded member-set record accepted."""
_MAX_STATEMENTS: Final = MAX_MEMBERS + 1  # a join and one approval per member
_RECORD: Final = "gradfed.members"
_OPS: Final = ("join", "leave", "evict")
_PEER_CHARS: Final = 128

ChangeOp = Literal["join", "leave", "evict"]


def _peer(value: object, where: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= _PEER_CHARS or not value.isascii():
        raise MalformedManifest(f"{where}: not a peer ID")
    return value


def _body(kind: str, fields: dict[str, Any]) -> bytes:
    return encode_record({"type": f"gradfed.{kind}", "version": 1, **fields}).data


def join_body(session: str, genesis: CID, peer: str, round_number: int) -> bytes:
    """Return the body of ``peer``'s ``agreed/join`` statement, made at round ``round_number``.

    ``round_number`` is the first round the joiner knows to be open (its base record's round
    + 1); the join admits by the close of that round or one of the next ``JOIN_ROUNDS - 1``.
    """
    fields = {"session": session, "genesis": genesis, "peer": peer, "round": round_number}
    return _body("join", fields)


def approve_body(session: str, genesis: CID, joiner: str, join: CID) -> bytes:
    """Return the body of a member's ``agreed/approve`` of ``joiner``'s join statement ``join``."""
    return _body("approve", {"session": session, "genesis": genesis, "peer": joiner, "join": join})


def leave_body(session: str, genesis: CID, peer: str, round_number: int) -> bytes:
    """Return the body of ``peer``'s ``agreed/leave`` statement (it leaves after the round)."""
    fields = {"session": session, "genesis": genesis, "peer": peer, "round": round_number}
    return _body("leave", fields)


def approvals_needed(policy: str, members: int) -> int:
    """Return how many members' approvals admit a join (0 under the allow-list).

    ``policy`` is ``"majority"`` (more than half), ``"two-thirds"`` (more than two thirds) or
    ``"allow-list"`` (no vote); ``members`` the current member count.
    """
    if policy == "majority":
        return members // 2 + 1
    if policy == "two-thirds":
        return (2 * members) // 3 + 1
    return 0


def join_timing_problem(made_at: int | None, moved_at: int | None, closing: int) -> str:
    """Return why a join made at round ``made_at`` cannot admit by round ``closing``'s close.

    ``moved_at`` is the first round of the last member set that added or removed the joiner
    (``None``: none did). ``made_at`` ``None`` is a join without a round (an old format): valid
    only for a peer never added or removed. ``""`` when it can admit.
    """
    if made_at is None:
        return "" if moved_at is None else "a join without a round, after a member-set change"
    if moved_at is not None and made_at < moved_at:
        return f"a join made at round {made_at}, before its change at round {moved_at} (replay)"
    if closing < made_at:
        return f"a join made at round {made_at}, not yet"
    if closing >= made_at + JOIN_ROUNDS:
        return f"a join made at round {made_at} expired ({JOIN_ROUNDS} rounds)"
    return ""


def leave_timing_problem(after: int, moved_at: int | None) -> str:
    """Return why a leave after round ``after`` is not of the leaver's current membership.

    ``moved_at`` is the first round of the member set that last added it (``None``: a genesis
    member never removed). ``""`` when the leave is its current membership's.
    """
    if moved_at is not None and after < moved_at:
        return f"a leave after round {after}, before its membership from round {moved_at}"
    return ""


def read_request(kind: str, body: bytes) -> dict[str, Any]:
    """Decode a join, approve or leave statement's body (checked fields; ``join`` a CID).

    A leave's ``round`` is an ``int``; a join's an ``int`` or ``None`` (a join without it).

    Raises
    ------
    MalformedManifest
        If it is not that kind's body.
    """
    short = {JOIN: "join", APPROVE: "approve", LEAVE: "leave"}.get(kind)
    if short is None:
        raise MalformedManifest(f"{kind!r} is not a membership statement")
    block = Block(make_cid(body, DAG_CBOR), body)
    record = decode_record(block, f"gradfed.{short}")
    where = f"{kind} statement"
    fields = {
        "session": require(record, "session", str, where),
        "genesis": require(record, "genesis", CID, where),
        "peer": _peer(record.get("peer"), where),
    }
    if short == "approve":
        fields["join"] = require(record, "join", CID, where)
    if short == "leave" or (short == "join" and "round" in record):
        round_number = require(record, "round", int, where)
        if round_number < 0:
            raise MalformedManifest(f"{where}: negative round")
        fields["round"] = round_number
    elif short == "join":
        fields["round"] = None
    return fields


@dataclass(frozen=True)
class MemberChange:
    """One change of a member set: who, how, and the signed statements that justify it."""

    op: ChangeOp
    peer: str
    statements: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class MemberSet:
    """The members that rounds from ``round`` on use (see the module docstring)."""

    session: str
    genesis: CID
    round: int
    members: tuple[str, ...]
    prev: CID | None = None
    changes: tuple[MemberChange, ...] = ()

    def to_block(self) -> Block:
        """Encode as a ``gradfed.members`` dag-cbor block."""
        return encode_record(
            {
                "type": _RECORD,
                "version": 1,
                "session": self.session,
                "genesis": self.genesis,
                "round": self.round,
                "members": list(self.members),
                "prev": self.prev,
                "changes": [[c.op, c.peer, list(c.statements)] for c in self.changes],
            }
        )

    @classmethod
    def from_block(cls, block: Block) -> MemberSet:
        """Decode a ``gradfed.members`` block, bounded before anything is built.

        Raises
        ------
        MalformedManifest
            If it is too large, not a member set, or its fields are out of bounds or order.
        """
        if len(block.data) > MAX_SET_BYTES:
            raise MalformedManifest(f"member set of {len(block.data)} bytes > {MAX_SET_BYTES}")
        record = decode_record(block, _RECORD)
        where = f"member set {block.cid}"
        round_number = require(record, "round", int, where)
        members = require(record, "members", list, where)
        changes = require(record, "changes", list, where)
        prev = record.get("prev")
        if round_number < 0 or not (prev is None or isinstance(prev, CID)):
            raise MalformedManifest(f"{where}: bad round or prev")
        if not 1 <= len(members) <= MAX_MEMBERS or len(changes) > 2 * MAX_MEMBERS:
            raise MalformedManifest(f"{where}: {len(members)} members, {len(changes)} changes")
        peers = tuple(_peer(m, where) for m in members)
        if list(peers) != sorted(set(peers)):
            raise MalformedManifest(f"{where}: members are not sorted and unique")
        parsed = tuple(_change(c, where) for c in changes)
        if [c.peer for c in parsed] != sorted({c.peer for c in parsed}):
            raise MalformedManifest(f"{where}: changes are not sorted by peer, one each")
        return cls(
            require(record, "session", str, where), require(record, "genesis", CID, where),
            round_number, peers, prev, parsed,
        )  # fmt: skip


def _change(value: object, where: str) -> MemberChange:
    if not isinstance(value, list) or len(value) != 3 or value[0] not in _OPS:
        raise MalformedManifest(f"{where}: a change is not [op, peer, statements]")
    op, peer, statements = value
    if not isinstance(statements, list) or len(statements) > _MAX_STATEMENTS:
        raise MalformedManifest(f"{where}: a change's statements are not a bounded list")
    if not all(isinstance(s, bytes) and len(s) <= MAX_STATEMENT_BYTES for s in statements):
        raise MalformedManifest(f"{where}: a change's statement is not bytes within bounds")
    return MemberChange(cast("ChangeOp", op), _peer(peer, where), tuple(statements))
