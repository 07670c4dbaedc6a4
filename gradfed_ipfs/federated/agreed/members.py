"""A session's member set as its rounds go: the requests heard, proposed and checked sets.

:class:`MemberTracker` is the stateful side of :mod:`.membership` for one
:class:`~.session.AgreedSession`: it holds the current member set (round 0's is the session's
``config.members``; then each round's record names the next one when it changes), the last
``evict_after`` rosters (what evictions follow from), the same state after each of the last
:data:`KEPT_STATES` records (a resync onto another fork starts from its fork point's), and the
signed ``agreed/join``, ``agreed/approve`` and ``agreed/leave`` statements heard on the agreed
topic, bounded: one pending join per stranger (a later-made one replaces it; one made before the
stranger's last change of membership, a replay, is dropped; one expired is dropped) and
:data:`MAX_PENDING_JOINS` overall (under the allow-list policy only the listed peers' joins),
one approval per member and join, one leave per member; each newly held one is reported to
``on_request`` (a :class:`HeldRequest`). A coordinator proposes
:meth:`MemberTracker.proposal`; every peer checks a roster's proposal with
:meth:`MemberTracker.problem` before adopting it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from multiformats import CID

from ...block import Block
from ...errors import DecodeError
from ...formats.agreed.membership import (
    APPROVE,
    JOIN,
    JOIN_ROUNDS,
    LEAVE,
    MemberChange,
    MemberSet,
    read_request,
)
from ...formats.agreed.roster import AgreedRecord, Roster
from ...formats.statement import KeyBook, Statement, decode_statement
from ...storage.base import BlockStore
from .history import MemberState, member_states
from .membership import (
    Admission,
    absences,
    moved_after,
    next_member_set,
    roster_member_set_problem,
)

__all__ = ["KEPT_STATES", "MAX_PENDING_JOINS", "HeldRequest", "MemberTracker"]

MAX_PENDING_JOINS: Final = 64
"""Most join requests of strangers a peer holds at once (the first heard are kept)."""
KEPT_STATES: Final = 16
"""Records whose member state (set and last rosters after it) a peer keeps: a resync onto a
fork that split off within these rounds checks it from the fork point."""
_KINDS: Final = (JOIN, APPROVE, LEAVE)


class HeldRequest(NamedTuple):
    """A membership request a peer has just taken into its held requests.

    Attributes
    ----------
    kind
        ``agreed/join``, ``agreed/approve`` or ``agreed/leave``.
    author
        Who signed it.
    peer
        Whom it is about: the joiner (a join or an approval of one) or the leaver.
    round
        The round it names: a join's round it was made at, a leave's last round (agreed
        rounds); ``None`` for an approval (or a join made before joins named a round).
    """

    kind: str
    author: str
    peer: str
    round: int | None


class MemberTracker:
    """The member set of one session's rounds, and the requests that change it.

    Parameters
    ----------
    session, genesis
        The session identity (requests naming another are dropped).
    members
        The genesis member set (``config.members``).
    admission
        The session's policy; ``None``: the members never change (every request is dropped).
    keys
        Where request authors' keys are (``pubsub.keys``).
    on_request
        Called once with each request newly held (heard or this peer's own), e.g. to log
        that the next roster this peer makes can carry it.
    """

    def __init__(
        self,
        session: str,
        genesis: CID,
        members: Sequence[str],
        admission: Admission | None,
        keys: KeyBook,
        *,
        on_request: Callable[[HeldRequest], None] | None = None,
    ) -> None:
        self.session, self.genesis, self.admission, self.keys = session, genesis, admission, keys
        self.on_request = on_request
        self.genesis_set = MemberSet(session, genesis, 0, tuple(sorted(members)))
        self.current = self.genesis_set
        self.current_cid = self.genesis_set.to_block().cid
        self.rosters: list[Roster] = []  # the last evict_after adopted rosters, oldest first
        self.moved: dict[str, int] = {}  # peer -> first round of the last set that moved it
        self.first_open = 0  # the round after the last roster taken (joins older expire)
        # record CID -> the member state after it (the last KEPT_STATES records taken)
        self._after: dict[bytes, MemberState] = {}
        self.joins: dict[str, Statement] = {}  # stranger -> its join statement
        self.approvals: dict[tuple[str, str], Statement] = {}  # (approver, joiner) -> approval
        self.leaves: dict[str, Statement] = {}  # member -> its leave statement
        self._seen: set[bytes] = set()  # statement bytes held (re-announcements are dropped)
        self.new_joins: list[Statement] = []  # joins held since the session last looked

    @property
    def changed(self) -> bool:
        """Whether the current set is no longer the genesis set."""
        return self.current is not self.genesis_set

    @property
    def members(self) -> tuple[str, ...]:
        """The current members, sorted."""
        return self.current.members

    # ------------------------------------------------------------------ requests

    def known(self, data: bytes) -> bool:
        """Whether ``data`` is a request already held (a re-announcement)."""
        return bytes(data) in self._seen

    def offer(self, data: bytes, from_peer: str) -> Statement | None:
        """Hold a signed request heard from ``from_peer``; return it if it is a new one.

        Dropped (``None``): not a membership statement of this session, not its sender's, a
        join of a member or a leave of a stranger, beyond the bounds, or admission off.
        """
        if self.admission is None or self.known(data):
            return None
        try:
            statement = decode_statement(Block.new(bytes(data), "dag-cbor"), keys=self.keys)
            if statement.kind not in _KINDS or statement.author != from_peer:
                return None
            fields = read_request(statement.kind, statement.body)
        except DecodeError:
            return None
        same = fields["session"] == self.session and fields["genesis"] == self.genesis
        if not same or (statement.kind != APPROVE and fields["peer"] != statement.author):
            return None
        return statement if self._hold(statement, fields) else None

    def _hold(self, statement: Statement, fields: dict[str, object]) -> bool:
        author, members = statement.author, self.current.members
        if statement.kind == JOIN:
            if author in members or not self._fresh_join(author, fields["round"]):
                return False
            if author not in self.joins and len(self.joins) >= MAX_PENDING_JOINS:
                return False
            self.joins[author] = statement  # replaces an older one, and the votes for it
            self.approvals = {k: a for k, a in self.approvals.items() if k[1] != author}
            self.new_joins.append(statement)
        elif author not in members:
            return False
        elif statement.kind == LEAVE:
            if author in self.leaves:
                return False
            self.leaves[author] = statement
        elif not self._hold_approval(statement, fields["peer"], fields["join"]):
            return False
        self._seen.add(bytes(statement.block.data))
        if self.on_request is not None:
            named = fields.get("round")
            round_number = named if isinstance(named, int) else None
            self.on_request(HeldRequest(statement.kind, author, str(fields["peer"]), round_number))
        return True

    def _fresh_join(self, joiner: str, made_at: object) -> bool:
        """Whether a join made at ``made_at`` could admit ``joiner``, newer than its held one."""
        if not self._admissible(joiner):
            return False
        made = made_at if isinstance(made_at, int) else -1  # a join without a round: oldest
        moved = self.moved.get(joiner)
        if moved is not None and made < moved:  # from before its last change: a replay
            return False
        if isinstance(made_at, int) and self.first_open >= made_at + JOIN_ROUNDS:
            return False  # expired
        held = self.joins.get(joiner)
        if held is None:
            return True
        before = read_request(JOIN, held.body)["round"]
        return made > (before if isinstance(before, int) else -1)

    def _hold_approval(self, statement: Statement, joiner: object, join: object) -> bool:
        """Hold a member's approval: one per joiner, the one of its held join if there is one."""
        author, members = statement.author, self.current.members
        if not isinstance(joiner, str) or joiner in members or not isinstance(join, CID):
            return False
        held = self.approvals.get((author, joiner))
        if held is not None and not (self._approves(statement, joiner, join) and not
                                     self._approves(held, joiner, None)):  # fmt: skip
            return False
        if held is None and len(self.approvals) >= MAX_PENDING_JOINS * len(members):
            return False
        self.approvals[(author, joiner)] = statement
        return True

    def _approves(self, approval: Statement, joiner: str, join: CID | None) -> bool:
        """Whether ``approval`` (naming ``join``, else read) is of ``joiner``'s held join."""
        held = self.joins.get(joiner)
        named = read_request(APPROVE, approval.body)["join"] if join is None else join
        return held is not None and isinstance(named, CID) and named == held.block.cid

    def _admissible(self, joiner: str) -> bool:
        """Whether a join could ever be admitted (under the allow-list: only the listed)."""
        admission = self.admission
        return admission is not None and (
            admission.policy != "allow-list" or joiner in admission.allow
        )

    def hold_own(self, statement: Statement) -> None:
        """Hold this peer's own request (the board drops its own messages)."""
        fields = read_request(statement.kind, statement.body)
        self._hold(statement, fields)

    def wants_approval(self, join: Statement, me: str) -> bool:
        """Whether this member approves ``join`` by itself (its author on its own allow-list)."""
        admission = self.admission
        return (
            admission is not None
            and admission.policy != "allow-list"
            and me in self.current.members
            and join.author in admission.allow
            and (me, join.author) not in self.approvals
        )

    def requests(self) -> list[MemberChange]:
        """Return the joins (with the current members' approvals of them) and leaves held."""
        changes = []
        for joiner, join in sorted(self.joins.items()):
            cid = bytes(join.block.cid)
            approvals = sorted(
                s.block.data
                for (approver, peer), s in self.approvals.items()
                if peer == joiner and approver in self.current.members
                and bytes(read_request(APPROVE, s.body)["join"]) == cid
            )  # fmt: skip
            changes.append(MemberChange("join", joiner, (join.block.data, *approvals)))
        for peer, leave in sorted(self.leaves.items()):
            changes.append(MemberChange("leave", peer, (leave.block.data,)))
        return changes

    # ------------------------------------------------------------------ rounds

    def streaks(self, roster: Roster) -> dict[str, int]:
        """Absences of the current members over the kept rosters and round ``roster``'s."""
        return absences([*self.rosters, roster], self.current.members)

    def proposal(self, roster: Roster) -> MemberSet:
        """Return the set after ``roster``'s round from the requests held (``current``: none)."""
        if self.admission is None:
            return self.current
        return next_member_set(
            self.current, self.current_cid, roster.round, self.requests(), self.admission,
            self.streaks(roster), keys=self.keys, moved=self.moved,
        )  # fmt: skip

    def problem(self, roster: Roster, claimed: MemberSet | None) -> str:
        """Return why ``roster``'s member set ``claimed`` (``None``: unchanged) is wrong."""
        if self.admission is None:
            return "" if roster.members is None else "names a member set; members are fixed"
        return roster_member_set_problem(
            claimed, self.current, self.current_cid, roster, self.rosters, self.admission,
            keys=self.keys, moved=self.moved,
        )  # fmt: skip

    async def follow(
        self, store: BlockStore, chain: list[tuple[CID, AgreedRecord]], timeout: float
    ) -> None:
        """Follow a resync: check the member sets along ``chain``, take the last one's state.

        Raises
        ------
        RoundVerificationFailed
            If a record's member set is not the one its round calls for.
        """
        states = await self._states_along(store, chain, timeout)
        if states is None:
            return
        for (cid, _), state in zip(chain, states, strict=True):
            self._keep(cid, state)
        if states:
            self._take(states[-1])

    async def followable(
        self, store: BlockStore, chain: list[tuple[CID, AgreedRecord]], timeout: float
    ) -> MemberState | None:
        """Check the member sets along ``chain``; return the state it reaches.

        Changes nothing (:meth:`follow` takes it); ``None`` without an admission policy.

        Raises
        ------
        RoundVerificationFailed
            If a record's member set is not the one its round calls for.
        """
        states = await self._states_along(store, chain, timeout)
        if states is None:
            return None
        return states[-1] if states else self._state()

    async def _states_along(
        self, store: BlockStore, chain: list[tuple[CID, AgreedRecord]], timeout: float
    ) -> list[MemberState] | None:
        """Return the checked state after each record of ``chain`` (``None``: no policy).

        The walk starts from the state after the record ``chain`` extends (its fork point),
        not from this peer's own last one: a peer whose own last roster lost to another
        would otherwise count that roster's absences as well as the winner's.
        """
        if self.admission is None:
            return None
        start = self._state() if not chain else self._before(chain[0][1])
        return await member_states(
            store, chain, start, self.admission, keys=self.keys, timeout=timeout
        )

    def _state(self) -> MemberState:
        return MemberState(self.current, self.current_cid, tuple(self.rosters), dict(self.moved))

    def _before(self, record: AgreedRecord) -> MemberState:
        """Return the member state ``record`` starts from: after its ``prev`` (or genesis).

        A ``prev`` whose state this peer no longer keeps (or never had: a head adopted without
        its chain) is taken to be the current state, as it is when ``prev`` is this peer's head.
        """
        if record.prev is None:
            return MemberState(self.genesis_set, self.genesis_set.to_block().cid)
        return self._after.get(bytes(record.prev)) or self._state()

    def _keep(self, record: CID, state: MemberState) -> None:
        self._after[bytes(record)] = state
        while len(self._after) > KEPT_STATES:
            del self._after[next(iter(self._after))]  # the oldest taken

    def _take(self, state: MemberState) -> None:
        self.rosters = list(state.rosters)
        self.moved = dict(state.moved)
        if state.rosters:
            self.first_open = state.rosters[-1].round + 1
        if bytes(state.cid) != bytes(self.current_cid):
            self.adopt(state.members, state.cid)

    def rewind(self, record: CID | None) -> None:
        """Go back to the member state after ``record`` (``None``: the genesis set), if kept."""
        if record is None:
            self._take(MemberState(self.genesis_set, self.genesis_set.to_block().cid))
        elif bytes(record) in self._after:
            self._take(self._after[bytes(record)])

    def advance(self, record: CID, roster: Roster, new: tuple[MemberSet, CID] | None) -> None:
        """Take the outcome of round ``roster`` (its ``record``): keep the roster, adopt the set."""
        keep = None if self.admission is None else self.admission.evict_after
        if keep is not None:
            self.rosters = [*self.rosters, roster][-keep:]
        else:
            self.rosters = []
        if new is not None:
            self.adopt(*new)
        self._expire(roster.round + 1)
        if self.admission is not None:
            self._keep(record, self._state())

    def _expire(self, first_open: int) -> None:
        """Drop the joins that cannot admit by the close of ``first_open`` or later."""
        self.first_open = first_open
        expired = set()
        for joiner, join in list(self.joins.items()):
            made = read_request(JOIN, join.body)["round"]
            if isinstance(made, int) and first_open >= made + JOIN_ROUNDS:
                expired.add(joiner)
                del self.joins[joiner]
        self.approvals = {k: a for k, a in self.approvals.items() if k[1] not in expired}

    def adopt(self, member_set: MemberSet, cid: CID) -> None:
        """Make ``member_set`` current and drop the requests it settled or made moot."""
        self.current, self.current_cid = member_set, cid
        self.moved = moved_after(self.moved, member_set)
        members = set(member_set.members)
        self.joins = {p: s for p, s in self.joins.items() if p not in members}
        self.leaves = {p: s for p, s in self.leaves.items() if p in members}
        self.approvals = {
            k: s for k, s in self.approvals.items() if k[0] in members and k[1] in self.joins
        }
        held = [*self.joins.values(), *self.leaves.values(), *self.approvals.values()]
        self._seen = {bytes(s.block.data) for s in held}
