"""Member sets that change in the chain: admission by policy, leave, eviction after absences.

Pure and deterministic, so every peer (and a verifier) reaches the same member set from the same
statements and rosters:

- **join**: a peer's signed ``agreed/join``; admitted when the session's :class:`Admission`
  allows it: it is on the allow-list (``"allow-list"``), or more than half (``"majority"``) or
  more than two thirds (``"two-thirds"``) of the current members signed an ``agreed/approve``
  of that join statement; and when it is fresh: made at or after the first round of the last
  set that added or removed the joiner, within ``JOIN_ROUNDS`` rounds
  (:func:`~gradfed_ipfs.formats.agreed.membership.join_timing_problem`), so a member that
  left can rejoin with a new join and a replay of its old one is refused;
- **leave**: a member's signed ``agreed/leave`` (it takes part up to the round it names) of
  its current membership (not one replayed from before it last joined);
- **evict**: a member absent from the rosters of the last ``evict_after`` rounds (a member set
  never shrinks below one member by eviction). Round ``r``'s roster names the set of the
  rounds from ``r + 1`` on, so a member absent from round ``r`` on is out of the member set
  of round ``r + evict_after``.

:func:`next_member_set` builds the next set from the current one and the changes a round
carries; :func:`member_set_problem` says why a claimed next set is not that one (``""`` when
it is). Both take ``moved`` (:func:`moved_after`): per peer, the first round of the last
member set that added or removed it, which the chain of sets gives.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from multiformats import CID

from ...block import Block
from ...errors import ConfigError, DecodeError
from ...formats.agreed.membership import (
    APPROVE,
    JOIN,
    LEAVE,
    MAX_MEMBERS,
    MemberChange,
    MemberSet,
    approvals_needed,
    join_timing_problem,
    leave_timing_problem,
    read_request,
)
from ...formats.agreed.roster import Roster
from ...formats.statement import PEER_ID_KEYS, KeyBook, Statement, decode_statement

__all__ = [
    "ADMISSION_POLICIES",
    "Admission",
    "AdmissionPolicy",
    "absences",
    "approvals_needed",
    "change_problem",
    "evictions",
    "member_set_problem",
    "moved_after",
    "next_member_set",
    "roster_member_set_problem",
]

AdmissionPolicy = Literal["allow-list", "majority", "two-thirds"]
ADMISSION_POLICIES: Final[tuple[AdmissionPolicy, ...]] = ("allow-list", "majority", "two-thirds")


@dataclass(frozen=True)
class Admission:
    """Who may join a running session, and when an absent member is evicted.

    Attributes
    ----------
    policy
        ``"allow-list"``: peers in ``allow``; ``"majority"`` / ``"two-thirds"``: peers whose
        join more than half / two thirds of the current members approved.
    allow
        The allow-list (peer IDs).
    evict_after
        Rounds a member may be absent from every roster before it is evicted (``None``: never).
    """

    policy: AdmissionPolicy = "allow-list"
    allow: tuple[str, ...] = field(default=())
    evict_after: int | None = None

    def __post_init__(self) -> None:
        # The policy is checked where it is read (a federation file names the field it failed).
        if self.evict_after is not None and self.evict_after < 1:
            raise ConfigError("evict_after must be at least 1 round (or None)")


_NONE_MOVED: Final[Mapping[str, int]] = {}


def moved_after(moved: Mapping[str, int], member_set: MemberSet) -> dict[str, int]:
    """Return ``moved`` after ``member_set``: its changed peers moved at its ``round``.

    ``moved`` maps a peer to the first round of the last member set that added or removed it.
    """
    return {**moved, **{change.peer: member_set.round for change in member_set.changes}}


def _statement(data: bytes, kind: str, keys: KeyBook) -> Statement:
    return decode_statement(Block.new(data, "dag-cbor"), kind=kind, keys=keys)


def _request(
    data: bytes, kind: str, session: str, genesis: CID, keys: KeyBook
) -> tuple[Statement, dict[str, object]]:
    """Decode a signed request of this session whose ``peer`` is its author (else raise)."""
    statement = _statement(data, kind, keys)
    fields = read_request(kind, statement.body)
    theirs = fields["genesis"]
    if fields["session"] != session or not isinstance(theirs, CID) or theirs != genesis:
        raise DecodeError(f"{kind} statement of another session")
    if kind != APPROVE and fields["peer"] != statement.author:
        raise DecodeError(f"{kind} statement for {fields['peer']} signed by {statement.author}")
    return statement, fields


def _join_problem(
    change: MemberChange,
    current: MemberSet,
    closing: int,
    admission: Admission,
    keys: KeyBook,
    moved: Mapping[str, int],
) -> str:
    join, fields = _request(change.statements[0], JOIN, current.session, current.genesis, keys)
    if change.peer in current.members:
        return f"{change.peer} is a member already"
    if join.author != change.peer:
        return f"the join statement is {join.author}'s"
    made_at = fields["round"]
    timing = join_timing_problem(
        made_at if isinstance(made_at, int) else None, moved.get(change.peer), closing
    )
    if timing:
        return timing
    needed = approvals_needed(admission.policy, len(current.members))
    if needed == 0:
        return "" if change.peer in admission.allow else f"{change.peer} is not on the allow-list"
    approvers = set()
    for data in change.statements[1:]:
        approval, fields = _request(data, APPROVE, current.session, current.genesis, keys)
        join_cid = fields["join"]
        if fields["peer"] != change.peer or not isinstance(join_cid, CID):
            return "an approval of another join"
        if bytes(join_cid) != bytes(join.block.cid) or approval.author not in current.members:
            return "an approval of another join, or by a non-member"
        approvers.add(approval.author)
    if len(approvers) < needed:
        return f"{len(approvers)} approvals < {needed} ({admission.policy})"
    return ""


def change_problem(
    change: MemberChange,
    current: MemberSet,
    round_number: int,
    admission: Admission,
    *,
    keys: KeyBook = PEER_ID_KEYS,
    moved: Mapping[str, int] = _NONE_MOVED,
) -> str:
    """Return why ``change`` cannot be made by round ``round_number``'s roster (``""``: it can).

    ``moved`` is :func:`moved_after` of the chain's sets up to ``current``. Evictions are not
    judged here (they follow from the rosters: :func:`evictions`).
    """
    try:
        if change.op == "join":
            if not change.statements:
                return "a join without its statement"
            return _join_problem(change, current, round_number, admission, keys, moved)
        if change.op == "leave":
            if len(change.statements) != 1:
                return "a leave needs exactly its statement"
            _, fields = _request(
                change.statements[0], LEAVE, current.session, current.genesis, keys
            )
            if change.peer not in current.members or fields["peer"] != change.peer:
                return f"{change.peer} cannot leave: not a member, or not its statement"
            left_after = fields["round"]
            if not isinstance(left_after, int) or left_after > round_number:
                return f"{change.peer} leaves after round {left_after}, not yet"
            return leave_timing_problem(left_after, moved.get(change.peer))
        return "" if not change.statements else "an eviction carries no statements"
    except DecodeError as exc:
        return f"{change.op} of {change.peer}: {exc}"


def absences(rosters: Sequence[Roster], members: Collection[str]) -> dict[str, int]:
    """Return, per member, how many of the last rounds in ``rosters`` (oldest first) missed it.

    A roster that did not expect the member (before it joined) ends its streak.
    """
    streaks = {}
    for member in members:
        streak = 0
        for roster in reversed(rosters):
            if member in roster.peers or member not in roster.expected:
                break
            streak += 1
        streaks[member] = streak
    return streaks


def evictions(
    admission: Admission, members: Sequence[str], streaks: Mapping[str, int]
) -> tuple[str, ...]:
    """Return the members to evict (absent ``evict_after`` rounds), keeping at least one."""
    if admission.evict_after is None:
        return ()
    gone = tuple(sorted(m for m in members if streaks.get(m, 0) >= admission.evict_after))
    return gone if len(gone) < len(members) else ()


def next_member_set(
    current: MemberSet,
    current_cid: CID,
    round_number: int,
    requests: Sequence[MemberChange],
    admission: Admission,
    streaks: Mapping[str, int],
    *,
    keys: KeyBook = PEER_ID_KEYS,
    moved: Mapping[str, int] = _NONE_MOVED,
) -> MemberSet:
    """Return the member set after round ``round_number``: ``current`` with what holds applied.

    ``requests`` are the joins and leaves a coordinator holds (those with a problem are left
    out); the evictions follow from ``streaks`` (:func:`absences` of the chain's rosters);
    ``moved`` as for :func:`change_problem`. The same set, byte for byte, on every peer that
    holds the same requests; ``current`` itself when nothing changes.
    """
    chosen: dict[str, MemberChange] = {}
    for change in sorted(requests, key=lambda c: (c.peer, c.op)):
        skip = change.op == "evict" or change.peer in chosen
        problem = skip or change_problem(
            change, current, round_number, admission, keys=keys, moved=moved
        )
        if not problem:
            chosen[change.peer] = change
    for peer in evictions(admission, current.members, streaks):
        chosen.setdefault(peer, MemberChange("evict", peer))
    if not chosen:
        return current
    joined = {peer for peer, change in chosen.items() if change.op == "join"}
    members = (set(current.members) - set(chosen)) | joined
    if not members or len(members) > MAX_MEMBERS:
        return current  # never an empty set, never more than a roster can hold
    return MemberSet(
        current.session, current.genesis, round_number + 1, tuple(sorted(members)), current_cid,
        tuple(chosen[p] for p in sorted(chosen)),
    )  # fmt: skip


def member_set_problem(
    claimed: MemberSet,
    current: MemberSet,
    current_cid: CID,
    round_number: int,
    admission: Admission,
    streaks: Mapping[str, int],
    *,
    keys: KeyBook = PEER_ID_KEYS,
    moved: Mapping[str, int] = _NONE_MOVED,
) -> str:
    """Return why ``claimed`` is not the member set after round ``round_number`` (``""``: it is).

    It must be what :func:`next_member_set` makes of its own changes: every change valid, and
    exactly the evictions the rosters call for.
    """
    for change in claimed.changes:
        problem = change_problem(change, current, round_number, admission, keys=keys, moved=moved)
        if problem:
            return problem
    rebuilt = next_member_set(
        current, current_cid, round_number, [c for c in claimed.changes if c.op != "evict"],
        admission, streaks, keys=keys, moved=moved,
    )  # fmt: skip
    if rebuilt.to_block().cid != claimed.to_block().cid:
        return f"not the member set after round {round_number} (evictions or fields differ)"
    return ""


def roster_member_set_problem(
    claimed: MemberSet | None,
    current: MemberSet,
    current_cid: CID,
    roster: Roster,
    history: Sequence[Roster],
    admission: Admission,
    *,
    keys: KeyBook = PEER_ID_KEYS,
    moved: Mapping[str, int] = _NONE_MOVED,
) -> str:
    """Return why ``claimed`` is not the set after ``roster``'s round (``""``: it is).

    ``claimed`` is the set the roster names (``None``: unchanged); ``history`` the rosters of
    the rounds before (oldest first; the last ``evict_after`` suffice): with ``roster`` they
    give the absences; ``moved`` as for :func:`change_problem`. A roster must expect exactly
    the current members.
    """
    if roster.expected != current.members:
        return f"expects {len(roster.expected)} peers, not round {roster.round}'s members"
    streaks = absences([*history, roster], current.members)
    if claimed is None:
        rebuilt = next_member_set(
            current, current_cid, roster.round, [], admission, streaks, keys=keys
        )
        return "" if rebuilt is current else "leaves out the evictions its rosters call for"
    return member_set_problem(
        claimed, current, current_cid, roster.round, admission, streaks, keys=keys, moved=moved
    )
