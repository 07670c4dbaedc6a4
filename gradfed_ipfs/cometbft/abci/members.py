"""The member set of a round chain: signed requests held in the state, decided at a round's close.

Pure and deterministic, like the round machine that calls it (:mod:`.rounds`). A chain whose
genesis names an admission policy (:attr:`~.rounds.RoundsGenesis.admission`) takes four more
kinds of transactions, each a signed statement of :mod:`~gradfed_ipfs.formats.agreed.membership` or
:mod:`.txs`:

- ``comet/validator`` of a non-member (its validator's key on this chain, dated by the round
  of its join) and ``agreed/join`` of the same peer: a **join** request, made at a round (it
  names it); held until it admits or expires
  (:data:`~gradfed_ipfs.formats.agreed.membership.JOIN_ROUNDS` rounds after it was made); a
  later-made join (or binding) of the same peer replaces a held one;
- ``agreed/approve`` of a member: a vote for a held (or later) join statement, by its CID;
- ``agreed/leave`` of a member: it leaves after the round it names.

At the close of round ``r`` (its roster decided), :func:`decide` makes the member set of the
rounds from ``r + 1`` on: the members, minus those whose leave names ``r`` or earlier, minus those
absent from the last ``evict_after`` rosters, minus those with **evidence** in round ``r``
(two signed contributions to one round), plus the joins that are admitted: the joiner is on the
allow-list, or (under ``"majority"`` / ``"two-thirds"``) more than half / two thirds of the
current members approved its join statement, and the join is fresh: made at or after the
first round of the last set that added or removed the joiner, and at most ``JOIN_ROUNDS``
rounds before the close (:func:`~gradfed_ipfs.formats.agreed.membership.join_timing_problem`,
the pubsub plane's rule). So a member that left (or was evicted) rejoins with a new join, and
its old one, replayed, is refused; so is a binding dated before that change (a binding names
the round of its join, each binding is used once). A set never becomes empty. Each change is also a
CometBFT **validator update**: power 1 for a joiner's bound key, 0 for a removed member's.

Refusals are typed (:class:`~.ledger.TxCode`): ``NOT_ALLOWED`` (no admission, or a joiner not on
the allow-list of an allow-list chain), ``ALREADY_MEMBER``, ``NOT_MEMBER`` (an approval or leave
of a non-member), ``OTHER_SESSION`` (another session, genesis or chain), ``CONFLICT`` (a second,
different request of one peer, a binding not of a later round than the one held, or a
validator key another member has), ``DUPLICATE`` (a statement used before, or a join, leave or
binding made before its author's last change of membership: old requests cannot be replayed),
``FULL`` (more than
:data:`MAX_PENDING` pending strangers, or approvals of one member).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from multiformats import CID

from ...cid import parse_cid
from ...errors import DecodeError
from ...formats.agreed.membership import (
    APPROVE,
    JOIN,
    JOIN_ROUNDS,
    LEAVE,
    MAX_MEMBERS,
    approvals_needed,
    join_timing_problem,
    leave_timing_problem,
    read_request,
)
from ...formats.statement import Statement
from .ledger import TxCode, Verdict
from .txs import VALIDATOR, decode_binding

__all__ = [
    "MAX_PENDING",
    "MEMBERSHIP_KINDS",
    "MemberRequests",
    "SetChange",
    "decide",
    "judge_request",
]

MEMBERSHIP_KINDS: Final = (JOIN, APPROVE, LEAVE, VALIDATOR)
"""The statement kinds that change a round chain's member set."""
MAX_PENDING: Final = 64
"""Most pending joining strangers, and most pending approvals of one member."""


@dataclass(frozen=True)
class SetChange:
    """A decided change of the member set.

    Attributes
    ----------
    round
        The first round of the new set (the closed round's number + 1).
    members
        The new members, sorted.
    changes
        ``(op, peer, statements)`` sorted by peer: ``join`` with its join statement and the
        approvals counted (sorted bytes), ``leave`` with its leave statement, ``evict`` with
        none (the rosters or the round's evidence call for it).
    updates
        The validator updates ``(Ed25519 public key, power)``: 1 for a joiner, 0 for a member
        gone (only members with a known key).
    keys
        The joiners' bound validator keys ``(peer, key)``.
    """

    round: int
    members: tuple[str, ...]
    changes: tuple[tuple[str, str, tuple[bytes, ...]], ...]
    updates: tuple[tuple[bytes, int], ...] = ()
    keys: tuple[tuple[str, bytes], ...] = ()


@dataclass
class MemberRequests:
    """The membership requests a chain holds, and the statements it has used (no replays)."""

    joins: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)  # joiner -> (CID, data)
    made: dict[str, int | None] = field(default_factory=dict)  # joiner -> its join's round
    bound: dict[str, bytes] = field(default_factory=dict)  # joiner -> its validator key
    bound_at: dict[str, int] = field(default_factory=dict)  # joiner -> its binding's round
    # (approver, joiner) -> (the approved join statement's CID, the approval's data)
    approvals: dict[tuple[str, str], tuple[bytes, bytes]] = field(default_factory=dict)
    leaves: dict[str, tuple[int, bytes]] = field(default_factory=dict)  # member -> (after, data)
    used: set[str] = field(default_factory=set)  # CIDs of every request ever accepted
    # peer -> first round of the last decided set that added or removed it
    moved: dict[str, int] = field(default_factory=dict)

    def copy(self) -> MemberRequests:
        """Return an independent copy (a block being finalized forks the state)."""
        return MemberRequests(
            dict(self.joins), dict(self.made), dict(self.bound), dict(self.bound_at),
            dict(self.approvals), dict(self.leaves), set(self.used), dict(self.moved),
        )  # fmt: skip


@dataclass(frozen=True)
class ChainRules:
    """What the requests are judged against (from the genesis and ``InitChain``)."""

    session: str
    genesis: str
    chain_id: str
    policy: str  # "" (members fixed), "allow-list", "majority", "two-thirds"
    allow: frozenset[str]
    evict_after: int  # 0: never by absence


def judge_request(
    rules: ChainRules,
    members: Collection[str],
    keys: Mapping[str, bytes],
    requests: MemberRequests,
    statement: Statement,
    open_round: int,
) -> Verdict:
    """Judge one membership statement; on ``OK`` it is held in ``requests`` (mutated).

    ``open_round`` is the chain's current round: a join or binding dated later than the next
    one is refused (``OTHER_ROUND``), since a future date would outlive its author's leaves.
    """
    cid = str(statement.block.cid)
    if not rules.policy:
        return Verdict(TxCode.NOT_ALLOWED, "this chain's members are fixed (no admission)")
    # every statement once, bindings too: a member that left binds its key again at the round
    # of its new join, so with new bytes
    if cid in requests.used:
        return Verdict(TxCode.DUPLICATE, f"statement {cid} was used before")
    try:
        if statement.kind == VALIDATOR:
            verdict = _bind(rules, members, keys, requests, statement, open_round)
        else:
            verdict = _request(rules, members, requests, statement, open_round)
    except DecodeError as exc:
        return Verdict(TxCode.MALFORMED, str(exc))
    if verdict.code == TxCode.OK:
        requests.used.add(cid)
    return verdict


def _future(kind: str, dated: int, open_round: int) -> Verdict | None:
    """Refuse a join or binding dated past the round after ``open_round`` (see above)."""
    if dated <= open_round + 1:
        return None
    return Verdict(TxCode.OTHER_ROUND, f"{kind} dated round {dated}, past {open_round + 1}")


def _stranger(
    rules: ChainRules, members: Collection[str], requests: MemberRequests, peer: str
) -> Verdict | None:
    """Why ``peer`` may not ask to join now (``None``: it may)."""
    if peer in members:
        return Verdict(TxCode.ALREADY_MEMBER, f"{peer:.60} is a member")
    if rules.policy == "allow-list" and peer not in rules.allow:
        return Verdict(TxCode.NOT_ALLOWED, f"{peer:.60} is not on the allow-list")
    waiting = set(requests.joins) | set(requests.bound)
    if peer not in waiting and len(waiting) >= MAX_PENDING:
        return Verdict(TxCode.FULL, f"{MAX_PENDING} joins are pending")
    return None


def _bind(
    rules: ChainRules,
    members: Collection[str],
    keys: Mapping[str, bytes],
    requests: MemberRequests,
    statement: Statement,
    open_round: int,
) -> Verdict:
    author = statement.author
    refused = _stranger(rules, members, requests, author)
    if refused is not None:
        return refused
    binding = decode_binding(statement.body)
    if (binding.session, binding.chain_id) != (rules.session, rules.chain_id):
        return Verdict(TxCode.OTHER_SESSION, "a validator binding of another chain")
    future = _future(statement.kind, binding.round, open_round)
    if future is not None:
        return future
    # dated by its join's round, judged like the join: one made before its author's last
    # change of membership (its leave or eviction) is a replay
    moved = requests.moved.get(author)
    if moved is not None and binding.round < moved:
        return Verdict(
            TxCode.DUPLICATE,
            f"a binding of round {binding.round}, before its change at round {moved} (replay)",
        )
    before = requests.bound_at.get(author)
    if before is not None and binding.round <= before:
        return Verdict(
            TxCode.CONFLICT, f"{author:.60} bound a validator key at round {before} already"
        )
    others = {p: k for p, k in requests.bound.items() if p != author}
    if binding.pub_key in keys.values() or binding.pub_key in others.values():
        return Verdict(TxCode.CONFLICT, "that validator key is another peer's")
    requests.bound[author] = binding.pub_key
    requests.bound_at[author] = binding.round
    return Verdict(TxCode.OK)


def _request(
    rules: ChainRules,
    members: Collection[str],
    requests: MemberRequests,
    statement: Statement,
    open_round: int,
) -> Verdict:
    fields = read_request(statement.kind, statement.body)
    theirs = fields["genesis"]
    if fields["session"] != rules.session or not isinstance(theirs, CID):
        return Verdict(TxCode.OTHER_SESSION, f"{statement.kind} of another session")
    if bytes(theirs) != bytes(parse_cid(rules.genesis)):
        return Verdict(TxCode.OTHER_SESSION, f"{statement.kind} of another genesis")
    author, peer = statement.author, str(fields["peer"])
    if statement.kind != APPROVE and peer != author:
        return Verdict(TxCode.MALFORMED, f"{statement.kind} for {peer:.60} by another peer")
    if statement.kind == JOIN:
        return _join(rules, members, requests, statement, fields["round"], open_round)
    if author not in members:
        return Verdict(TxCode.NOT_MEMBER, f"{author:.60} is not a member")
    if statement.kind == LEAVE:
        if author in requests.leaves:
            return Verdict(TxCode.CONFLICT, f"{author:.60} is leaving already")
        after = int(str(fields["round"]))
        stale = leave_timing_problem(after, requests.moved.get(author))
        if stale:
            return Verdict(TxCode.DUPLICATE, stale)
        requests.leaves[author] = (after, statement.block.data)
        return Verdict(TxCode.OK)
    return _approval(members, requests, statement, peer, fields["join"])


def _join(
    rules: ChainRules,
    members: Collection[str],
    requests: MemberRequests,
    statement: Statement,
    made_at: object,
    open_round: int,
) -> Verdict:
    author = statement.author
    refused = _stranger(rules, members, requests, author)
    if refused is not None:
        return refused
    made = made_at if isinstance(made_at, int) else None
    future = None if made is None else _future(statement.kind, made, open_round)
    if future is not None:
        return future
    # judged as if closing at the round it was made: only a replay is refused here (the
    # window is the close's to judge: decide)
    stale = join_timing_problem(made, requests.moved.get(author), 0 if made is None else made)
    if stale:
        return Verdict(TxCode.DUPLICATE, stale)
    if author in requests.joins:
        before = requests.made.get(author)
        if made is None or (before is not None and made <= before):
            return Verdict(TxCode.CONFLICT, f"{author:.60} asked to join already")
    requests.joins[author] = (bytes(statement.block.cid), statement.block.data)
    requests.made[author] = made
    return Verdict(TxCode.OK)


def _approval(
    members: Collection[str],
    requests: MemberRequests,
    statement: Statement,
    peer: str,
    join: object,
) -> Verdict:
    author = statement.author
    if peer in members:
        return Verdict(TxCode.ALREADY_MEMBER, f"approval of {peer:.60}, a member")
    if (author, peer) in requests.approvals:
        return Verdict(TxCode.CONFLICT, f"{author:.60} approved {peer:.60} already")
    if sum(1 for approver, _ in requests.approvals if approver == author) >= MAX_PENDING:
        return Verdict(TxCode.FULL, f"{author:.60} has {MAX_PENDING} approvals pending")
    if not isinstance(join, CID):
        return Verdict(TxCode.MALFORMED, "an approval names no join statement")
    requests.approvals[author, peer] = (bytes(join), statement.block.data)
    return Verdict(TxCode.OK)


def _admitted(
    rules: ChainRules, members: Sequence[str], requests: MemberRequests, joiner: str
) -> tuple[bytes, ...] | None:
    """Return the approvals that admit ``joiner`` (none on the allow-list); ``None``: not yet."""
    if joiner not in requests.bound:
        return None
    if joiner in rules.allow:
        return ()
    needed = approvals_needed(rules.policy, len(members))
    join_cid = requests.joins[joiner][0]
    votes = sorted(
        data
        for (approver, peer), (cid, data) in requests.approvals.items()
        if peer == joiner and cid == join_cid and approver in members
    )
    return tuple(votes) if needed and len(votes) >= needed else None


def decide(
    rules: ChainRules,
    closed: int,
    members: tuple[str, ...],
    keys: Mapping[str, bytes],
    requests: MemberRequests,
    gone: Mapping[str, str],
) -> SetChange | None:
    """Return the change the close of round ``closed`` makes (``None``: none); settle requests.

    ``gone`` maps members that must go by the rosters or the round's evidence to ``"evict"``.
    ``requests`` loses what the change settles (joins admitted, leaves made, approvals of them).
    """
    changes: dict[str, tuple[str, tuple[bytes, ...]]] = dict.fromkeys(gone, ("evict", ()))
    for peer, (after, data) in sorted(requests.leaves.items()):
        if peer in members and after <= closed and peer not in changes:
            changes[peer] = ("leave", (data,))
    for joiner in sorted(requests.joins):
        if joiner in members:  # admitted meanwhile by an earlier close: nothing to do
            continue
        timing = join_timing_problem(requests.made[joiner], requests.moved.get(joiner), closed)
        if timing:  # not yet (made for a later round)
            continue
        votes = _admitted(rules, members, requests, joiner)
        if votes is not None:
            changes[joiner] = ("join", (requests.joins[joiner][1], *votes))
    _expire(requests, {p for p, (op, _) in changes.items() if op == "join"}, closed + 1)
    joined = {p for p, (op, _) in changes.items() if op == "join"}
    new = tuple(sorted((set(members) - set(changes)) | joined))
    if not changes or not 1 <= len(new) <= MAX_MEMBERS:  # never empty, never beyond a roster
        return None
    for peer in changes:
        requests.leaves.pop(peer, None)
        requests.joins.pop(peer, None)
        requests.made.pop(peer, None)
        requests.moved[peer] = closed + 1
    requests.approvals = {k: v for k, v in requests.approvals.items() if k[1] in requests.joins}
    bound = tuple((p, requests.bound.pop(p)) for p in sorted(joined))
    for peer in joined:
        requests.bound_at.pop(peer, None)
    updates = [(key, 1) for _, key in bound]
    updates += [(keys[p], 0) for p in sorted(changes) if p not in joined and p in keys]
    lines = tuple((op, p, statements) for p, (op, statements) in sorted(changes.items()))
    return SetChange(closed + 1, new, lines, tuple(updates), bound)


def _expire(requests: MemberRequests, admitted: Collection[str], first_open: int) -> None:
    """Drop the joins (not ``admitted``) that no close from ``first_open`` on can admit."""
    expired = {
        joiner for joiner, made in requests.made.items()
        if joiner not in admitted and made is not None and first_open >= made + JOIN_ROUNDS
    }  # fmt: skip
    for joiner in expired:
        requests.joins.pop(joiner, None)
        del requests.made[joiner]
    requests.approvals = {k: v for k, v in requests.approvals.items() if k[1] not in expired}
