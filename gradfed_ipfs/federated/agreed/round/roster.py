"""The roster step of an agreed round: from the contributions heard to one adopted roster.

:class:`RosterPhase` is owned by :class:`~gradfed_ipfs.federated.agreed.session.AgreedSession`
(one per started session) and handed each round's :class:`~.context.RoundContext`: it decides
which contributions are ready, builds, publishes or derives the roster, and adopts the
best-ranked valid roster heard (directly, or through another peer's ``done`` record).

A roster is taken only when it is this round's, every entry is its owner's signed
contribution (this peer's own entry its own), and its coordinator's takeover time has come by
this peer's clock (:meth:`~.config.AgreedConfig.takeover_at`); one heard by message only from
the coordinator it names. One heard early is kept and tried when its time comes.

A round re-run after an equivocation (``ctx.awaited``: the members the proof's rosters
listed) waits for those members, who rewind when the proof reaches them, not all at once:
until every awaited contribution is ready (or :data:`REWIND_WAIT` of ``round_timeout`` has
passed) this peer publishes no roster and takes none that leaves an awaited member out; then
its schedule (collect, takeovers, deadline) starts, as if the round had started then. So the
first peer to rewind cannot finish the round alone before the others rewind (each would then
re-run it alone: a second split).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from multiformats import CID

from ...._types import FloatArray
from ....block import Block
from ....errors import (
    BadSignature,
    BlockNotFound,
    BlockStoreError,
    BlockTimeout,
    DecodeError,
    QuorumNotReached,
)
from ....formats.agreed.membership import MemberSet
from ....formats.agreed.roster import (
    MAX_INLINE_BYTES,
    AgreedRecord,
    Roster,
    verify_roster_coordinator,
)
from ....storage.base import BlockStore
from ...exchange.fetcher import ContributionFetcher, is_transient
from ...exchange.records import carried_or_fetched
from ..context import AdoptedRoster, RoundContext, SessionMessages
from ..history import load_record
from ..members import MemberTracker
from .coordinator import MAX_ROUNDS_AHEAD, RoundBoard, RoundState, effective_quorum, roster_problem
from .readiness import Entry, ReadyTracker

__all__ = ["MAX_WALK_BACK", "REWIND_WAIT", "RosterPhase", "walk_back"]

logger = logging.getLogger("gradfed_ipfs.federated.agreed")

_TICK: Final = 0.05
"""Wait between checks while something is retried: a fetch, a roster not served yet (s)."""
_IDLE_TICK: Final = 1.0
"""Longest wait for a board change otherwise: the clock-driven steps (close, takeovers,
deadline) wake the loop at their own time, so N members waiting cost no wake-ups every 50 ms."""
_Entry = Entry
_VOTE_WAIT: Final = 1.0
"""Longest wait for a ``done`` record when counting the votes behind an early roster (s)."""
MAX_WALK_BACK: Final = MAX_ROUNDS_AHEAD
"""Most records walked back from a later round's ``done`` to find a missed round's roster."""
REWIND_WAIT: Final = 0.5
"""Fraction of ``round_timeout`` a re-run round waits at most for its awaited members."""


async def walk_back(
    store: BlockStore, r: int, head: CID, timeout: float
) -> tuple[CID, AgreedRecord] | None:
    """Round ``r``'s record in the chain of records ending at ``head`` (a later round's).

    ``None`` if the chain skips round ``r``. Raises ``BlockStoreError`` or ``DecodeError``.
    """
    cid, record = head, await load_record(store, head, timeout=timeout)
    while record.round > r and record.prev is not None:
        prev = await load_record(store, record.prev, timeout=timeout)
        if prev.round != record.round - 1:
            return None  # not a chain of rounds: no record of round r in it
        cid, record = record.prev, prev
    return (cid, record) if record.round == r else None


@dataclass
class _Collection:
    """How one round's roster step stands: its limits, the rosters tried, the one derived."""

    members: set[str]
    quorum: int
    close_at: float
    deadline: float
    tried: set[bytes] = field(default_factory=set)
    derived: bytes | None = None  # the coordinator's roster, derived here before heard
    waiting: bool = False  # a roster message whose time has come is still being fetched
    learned: dict[bytes, CID] = field(default_factory=dict)  # rosters named by done records
    # roster -> the coordinator signatures the records naming it carry
    learned_signatures: dict[bytes, set[bytes]] = field(default_factory=dict)
    # (signer, roster CID) of roster messages not from the coordinator they name: refused by
    # sender, not by CID (the named coordinator's own message may carry the same roster)
    refused: set[tuple[str, bytes]] = field(default_factory=set)
    named: dict[bytes, bytes | None] = field(default_factory=dict)  # done record -> its roster
    ranks: dict[str, int] = field(default_factory=dict)  # member -> coordinator rank
    wake_at: float = float("inf")  # the next clock-driven step heard of (monotonic s)
    heads_walked: int = -1  # the board's done count when records were last walked
    settled: tuple[int, set[bytes]] = (-1, set())  # done count -> rosters a majority named
    awaiting: frozenset[str] = frozenset()  # a re-run round's members not ready yet
    await_until: float = float("inf")  # when a re-run round stops waiting for them


def _complete(ready: dict[str, Entry], members: set[str]) -> bool:
    """Whether ``ready`` holds every member's contribution (O(1) unless it may)."""
    return len(ready) == len(members) and ready.keys() == members


def _own_problem(ctx: RoundContext, roster: Roster) -> str:
    """Why ``roster`` fails this peer's own check: its own entry must be its contribution."""
    mine = [e for e in roster.entries if e.peer == ctx.peer]
    if mine and bytes(mine[0].contribution) != bytes(ctx.own.cid):
        return f"lists {mine[0].contribution} as this peer's contribution, not {ctx.own.cid}"
    return ""


class RosterPhase:
    """The roster step of one session's peer (see the module docstring).

    Parameters
    ----------
    store
        The peer's block store (rosters and records are fetched from it).
    board
        What the peer has heard.
    messages
        The peer's announcements.
    fetcher
        The session's contribution fetcher (roots only in a reduce-scatter session).
    sliced
        Whether rounds reduce-scatter (a roster is then adopted without aggregating it).
    members
        The session's member set and requests: a coordinator's roster proposes the next set
        from them, and a roster whose proposal is not the one they call for is refused.
    """

    def __init__(
        self,
        store: BlockStore,
        board: RoundBoard,
        messages: SessionMessages,
        fetcher: ContributionFetcher,
        *,
        sliced: bool,
        members: MemberTracker | None = None,
    ) -> None:
        self._store, self._board = store, board
        self._messages, self._fetcher, self._sliced = messages, fetcher, sliced
        self._members = members
        self._rosters: dict[bytes, tuple[Roster, Block]] = {}
        self._member_sets: dict[bytes, tuple[MemberSet, CID]] = {}  # roster -> its checked set

    @property
    def board(self) -> RoundBoard:
        """What this peer heard of each round (the contributions announced on pubsub)."""
        return self._board

    def fetch(self, cid: CID, d: int) -> asyncio.Task[FloatArray]:
        """Fetch (once) and check the contribution ``cid`` of ``d`` values."""
        return self._fetcher.fetch(cid, d)

    def forget(self) -> None:
        """Drop the rosters decoded so far (a round ended)."""
        self._rosters.clear()
        self._member_sets.clear()

    async def take(self, ctx: RoundContext) -> AdoptedRoster:
        """Collect contributions until a valid roster is adopted; return it.

        Raises
        ------
        QuorumNotReached
            If no roster with ``min_peers`` contributions was adopted by ``round_timeout``.
        """
        config = ctx.config
        c = _Collection(
            members=set(config.members) - ctx.barred,
            quorum=effective_quorum(config, ctx.barred),
            close_at=ctx.started + config.collect_timeout + ctx.rank * config.takeover_timeout,
            deadline=ctx.started + config.round_timeout,
            ranks={p: i for i, p in enumerate(ctx.ranking)},
            awaiting=ctx.awaited & (set(config.members) - ctx.barred),
            await_until=ctx.started + REWIND_WAIT * config.round_timeout,
        )
        state = self._board.state(ctx.number)
        tracker = ReadyTracker(ctx, state.contributions, self._fetcher)
        while True:
            event = self._board.changed
            tracker.update()  # O(what changed), not O(N) a board change
            c.wake_at = float("inf")
            self._end_wait(ctx, c, tracker)
            adopted = await self._try_rosters(ctx, c)
            if adopted is not None:
                break
            if await self._close(ctx, c, tracker):
                continue
            now = time.monotonic()
            if now >= c.deadline:
                raise QuorumNotReached(ctx.number, len(self._ready(ctx)), c.quorum)
            wait = _TICK if c.waiting or tracker.retry else _IDLE_TICK
            due = min(c.wake_at, c.deadline, c.close_at if c.close_at > now else c.deadline)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), max(0.0, min(wait, due - now)))
        if bytes(adopted.cid) != c.derived:
            self._messages.withdraw("contrib")  # a published roster settled the contributions
        # else nobody has published it yet: the peers that lost this contribution's messages
        # learn it only from these re-announcements (until the next round's, or forever in a
        # reduce-scatter round, which waits for their slices: seen across processes).
        return adopted

    @staticmethod
    def _end_wait(ctx: RoundContext, c: _Collection, tracker: ReadyTracker) -> None:
        """End a re-run round's wait once its awaited members are ready (or at its bound).

        The round's schedule then starts: its close, takeovers and deadline move by the wait.
        """
        if not c.awaiting:
            return
        now = time.monotonic()
        if c.awaiting.issubset(tracker.ready) or now >= c.await_until:
            waited = now - ctx.started
            c.close_at, c.deadline = c.close_at + waited, c.deadline + waited
            c.awaiting = frozenset()
        else:
            c.wake_at = min(c.wake_at, c.await_until)

    async def _close(self, ctx: RoundContext, c: _Collection, tracker: ReadyTracker) -> bool:
        """Publish (or derive) a roster if this peer may now; return whether it did.

        Never once more than half the members announced this round's ``done`` or a later one:
        the round is over elsewhere, and this (late) peer takes the roster it settled on.
        Never while a re-run round waits for its awaited members (:meth:`_end_wait`).
        ``tracker``'s count says when to look; the roster lists a full walk's result.
        """
        if c.awaiting:
            return False
        over = self._board.heads_from(ctx.number, but=ctx.peer)
        if 2 * over > len(ctx.config.members):
            return False
        state = self._board.state(ctx.number)
        own = state.rosters.get(ctx.peer)
        if own is not None and bytes(own) in c.tried:  # its own check refused it: not again
            return False
        derivable = self._members is None or self._members.admission is None  # else: its requests
        if (
            derivable
            and not ctx.excluded  # a complete roster: its record needs no coordinator signature
            and c.quorum == len(c.members)
            and not c.waiting
            and ctx.ranking[0] not in state.rosters
        ):
            # min_peers = all: the only roster any coordinator may publish is the complete
            # one, so a peer holding every member's contribution derives it without waiting.
            ready = self._ready(ctx) if _complete(tracker.ready, c.members) else {}
            if set(ready) == c.members:
                if ctx.rank == 0:
                    await self._publish(ctx, ready)
                else:
                    c.derived = bytes(self._derive(ctx, ctx.ranking[0], ready))
                return True
        if not c.waiting:  # no roster due is on its way (early ones wait for their time)
            closing = time.monotonic() >= c.close_at and len(tracker.ready) >= c.quorum
            if not closing and not (ctx.rank == 0 and _complete(tracker.ready, c.members)):
                return False
            ready = self._ready(ctx)
            complete = set(ready) == c.members  # every member but proven liars
            if len(ready) != len(tracker.ready):  # the board changed under it: walk it again
                tracker.reset()
            if (ctx.rank == 0 and complete) or (
                time.monotonic() >= c.close_at and len(ready) >= c.quorum
            ):
                await self._publish(ctx, ready)
                return True
        return False

    def _ready(self, ctx: RoundContext) -> dict[str, _Entry]:
        """Contributions on this round's base whose blocks are fetched and verified.

        A full walk (O(N)): once a :class:`~.readiness.ReadyTracker` says a roster is due.
        """
        entries = {ctx.peer: (ctx.own.cid, ctx.own.weight, ctx.own.signature)}
        base = bytes(ctx.base)
        for peer, c in self._board.state(ctx.number).contributions.items():
            if bytes(c.base) == base:
                entries[peer] = (c.cid, c.weight, c.signature)
        for peer in ctx.barred:  # proven liars and equivocators: no roster may list them
            entries.pop(peer, None)
        for peer, (_, weight, _) in list(entries.items()):
            if weight > ctx.config.max_weight:  # no roster may list it either
                ctx.rejected[peer] = f"weight {weight} > max_weight {ctx.config.max_weight}"
                del entries[peer]
        ready = {}
        for peer, (cid, weight, signature) in entries.items():
            task = self._fetcher.get(cid)
            if task is None or not task.done() or task.cancelled():
                continue
            if task.exception() is None:
                ready[peer] = (cid, weight, signature)
            elif not is_transient(task):
                ctx.rejected[peer] = f"contribution {cid}: {task.exception()}"
        return ready

    def _derive(
        self,
        ctx: RoundContext,
        coordinator: str,
        ready: dict[str, _Entry],
        members: CID | None = None,
    ) -> CID:
        """Build (and cache) the roster ``coordinator`` would publish from ``ready``."""
        config = ctx.config
        roster = Roster.new(
            self._board.session, self._board.genesis, ctx.number, ctx.base, coordinator,
            config.members, ready, members,
        )  # fmt: skip
        block = roster.to_block()
        self._rosters[bytes(block.cid)] = (roster, block)
        self._board.state(ctx.number).rosters.setdefault(coordinator, block.cid)
        return block.cid

    async def _publish(self, ctx: RoundContext, ready: dict[str, _Entry]) -> None:
        cid = self._derive(ctx, ctx.peer, ready, await self._propose(ctx, ready))
        block = self._rosters[bytes(cid)][1]
        inline = block.data if len(block.data) <= MAX_INLINE_BYTES else None
        if inline is None:
            await self._store.put(block, pin=False)  # peers fetch it now; pinned when done
        message = self._messages.make("roster", ctx.number, cid, inline=inline)
        statement = await self._messages.post("roster", message)
        signatures = self._board.state(ctx.number).roster_signatures
        signatures.setdefault(ctx.peer, statement.signature)  # the board drops its own
        logger.debug(
            "round %d: %s published roster %s (%d entries)", ctx.number, ctx.peer, cid, len(ready)
        )

    async def _propose(self, ctx: RoundContext, ready: dict[str, _Entry]) -> CID | None:
        """Return the next member set this coordinator's roster names (stored; ``None``: same)."""
        tracker = self._members
        if tracker is None:
            return None
        plain = Roster.new(
            self._board.session, self._board.genesis, ctx.number, ctx.base, ctx.peer,
            ctx.config.members, ready,
        )  # fmt: skip
        proposed = tracker.proposal(plain)
        if proposed is tracker.current:
            return None
        block = proposed.to_block()
        await self._store.put(block, pin=False)  # peers fetch it to check; pinned when done
        return block.cid

    async def _member_set_problem(self, ctx: RoundContext, cid: CID, roster: Roster) -> str:
        """Fetch and check the member set ``roster`` proposes; ``""`` when it is the right one."""
        tracker = self._members
        if tracker is None:
            return ""
        claimed = None
        if roster.members is not None:
            try:
                block = await self._store.get(roster.members, timeout=ctx.config.fetch_timeout)
                claimed = MemberSet.from_block(block)
            except (BlockStoreError, DecodeError) as exc:
                return f"member set {roster.members}: {exc}"
        problem = tracker.problem(roster, claimed)
        if not problem and claimed is not None and roster.members is not None:
            self._member_sets[bytes(cid)] = (claimed, roster.members)
        return f"member set: {problem}" if problem else ""

    async def _try_rosters(self, ctx: RoundContext, c: _Collection) -> AdoptedRoster | None:
        """Adopt the best-ranked valid roster heard (directly or through a ``done`` record).

        A roster message counts once its sender's takeover time has come (an early one is
        kept, not fetched). A peer that heard neither round ``r``'s rosters nor its ``done``
        messages (they are re-announced only until their senders' next round, so a peer busy
        elsewhere, e.g. resyncing, can miss them all) but hears a later round's ``done`` walks
        that record's ``prev`` links back to round ``r`` (at most :data:`MAX_WALK_BACK`
        records) for its roster, taken once its named coordinator's time has come.
        """
        state, ranks = self._board.state(ctx.number), c.ranks
        elapsed = time.monotonic() - ctx.started
        heard = [(ranks[p], p, cid) for p, cid in state.rosters.items() if p in ranks]
        due = [(rank, p, cid) for rank, p, cid in heard if ctx.config.takeover_at(rank) <= elapsed]
        for rank, _, _ in heard:  # wake up when an early one's time comes
            at = ctx.config.takeover_at(rank)
            if at > elapsed:
                c.wake_at = min(c.wake_at, ctx.started + at)
        if len(due) < len(heard) and state.done:  # early by this clock: settled already?
            settled = await self._settled(ctx, state, c)
            due = [
                (rank, p, cid)
                for rank, p, cid in heard
                if (rank, p, cid) in due or bytes(cid) in settled
            ]
        if not [x for x in due if not self._ruled_out(c, x[1], x[2])]:
            # Only rosters already refused are due (a member's first roster is the only one
            # the board keeps: a bad one hides its author's later good one): the round may be
            # over elsewhere, and its records name the roster it settled on.
            await self._rosters_from_records(ctx, state, c)
        candidates: list[tuple[CID, str | None]] = [(cid, p) for _, p, cid in sorted(due)]
        candidates += [(cid, None) for cid in c.learned.values()]
        c.waiting = False
        for cid, author in candidates:
            if self._ruled_out(c, author, cid):
                continue
            adopted = await self._adopt(ctx, cid, author, c)
            if adopted is not None:
                return adopted
        return None

    @staticmethod
    def _ruled_out(c: _Collection, author: str | None, cid: CID) -> bool:
        """Whether roster ``cid`` (from ``author``; ``None``: a record's) was refused already."""
        return bytes(cid) in c.tried or (author or "", bytes(cid)) in c.refused

    async def _settled(self, ctx: RoundContext, state: RoundState, c: _Collection) -> set[bytes]:
        """Roster CIDs that this round's ``done`` records of more than half the members name.

        A peer that starts a round late (its clock behind the others') would otherwise wait
        for a roster's time the others have long passed, or publish its own.
        """
        if c.settled[0] == self._board.done_heard:  # no done heard since: the same votes
            return c.settled[1]
        votes: Counter[bytes] = Counter()
        for head in list(state.done.values()):  # a done may come in while a record loads
            key = bytes(head.record)
            if key not in c.named:
                c.named[key] = None  # one try a record: a record nobody serves costs one wait
                try:
                    record = await load_record(self._store, head.record, timeout=_VOTE_WAIT)
                except (BlockStoreError, DecodeError):
                    continue
                if record.round == ctx.number and bytes(record.base) == bytes(ctx.base):
                    c.named[key] = bytes(record.roster)
            roster = c.named[key]
            if roster is not None:
                votes[roster] += 1
        settled = {cid for cid, n in votes.items() if 2 * n > len(ctx.config.members)}
        c.settled = (self._board.done_heard, settled)
        return settled

    async def _rosters_from_records(
        self, ctx: RoundContext, state: RoundState, c: _Collection
    ) -> None:
        """Learn round ``r``'s rosters from the ``done`` records heard (this round's or later)."""
        r, heard = ctx.number, self._board.done_heard
        if c.heads_walked == heard:  # no done heard since the last walk: nothing new
            return
        c.heads_walked = heard
        later = []
        if self._board.heads_from(r + 1):  # O(N): only once a later round's done is heard
            heads = self._board.heads.items()
            later = [(p, h) for p, h in heads if r < h.round <= r + MAX_WALK_BACK]
        for peer, head in [*state.done.items(), *later]:
            if bytes(head.record) in c.tried:
                continue
            c.tried.add(bytes(head.record))
            try:
                found = await walk_back(self._store, r, head.record, ctx.config.fetch_timeout)
            except (BlockStoreError, DecodeError) as exc:
                ctx.rejected[peer] = f"record {head.record}: {exc}"
                continue
            if found is not None and bytes(found[1].base) == bytes(ctx.base):
                record = found[1]
                c.learned.setdefault(bytes(record.roster), record.roster)
                if record.roster_signature is not None:
                    signatures = c.learned_signatures.setdefault(bytes(record.roster), set())
                    if len(signatures) < MAX_WALK_BACK:  # one a record walked: bounded anyway
                        signatures.add(record.roster_signature)

    async def _adopt(
        self, ctx: RoundContext, cid: CID, author: str | None, c: _Collection
    ) -> AdoptedRoster | None:
        """Validate a roster and its contributions; ``None`` while its blocks are still coming.

        ``author`` is the roster message's signer (``None``: learned from a record). Reduce-
        scatter rounds check only the roots here; ``gradients`` is then ``None``.
        """
        tried = c.tried
        roster = await self._checked_roster(ctx, cid, author, c)
        if roster is None:
            return None
        signed, signature = self._coordinator_signature(ctx, c, cid, author, roster)
        if not signed:
            return None
        tasks = [self.fetch(entry.contribution, ctx.d) for entry in roster.entries]
        if not all(task.done() for task in tasks):
            c.waiting = c.waiting or author is not None
            return None
        gradients = []
        for entry, task in zip(roster.entries, tasks, strict=True):
            if task.cancelled() or task.exception() is not None:
                if is_transient(task):
                    self.fetch(entry.contribution, ctx.d)  # retry until the round deadline
                    c.waiting = c.waiting or author is not None
                    return None
                tried.add(bytes(cid))
                what = "cancelled" if task.cancelled() else task.exception()
                why = f"roster {cid} lists a bad {entry.contribution}: {what}"
                earlier = ctx.rejected.get(roster.coordinator)  # e.g. that contribution's reason
                ctx.rejected[roster.coordinator] = f"{why}; {earlier}" if earlier else why
                return None
            gradients.append(task.result())
        block = self._rosters[bytes(cid)][1]
        logger.debug(
            "round %d: adopted %s after %.3fs", ctx.number, cid, time.monotonic() - ctx.started
        )
        return AdoptedRoster(
            cid, roster, block, None if self._sliced else tuple(gradients),
            self._member_sets.get(bytes(cid)), signature,
        )  # fmt: skip

    def _coordinator_signature(
        self, ctx: RoundContext, c: _Collection, cid: CID, author: str | None, roster: Roster
    ) -> tuple[bool, bytes | None]:
        """Return whether ``roster`` may be adopted for its coordinator's signature, and it.

        A roster leaving an expected peer out needs its coordinator's signature of its
        ``roster`` message (the round's record carries it:
        :func:`~gradfed_ipfs.formats.agreed.roster.verify_roster_coordinator`): the message's, or
        one a record naming it carries. A message whose signature is not over the roster as a
        coordinator sends it (inline when small) is refused by sender; without any signature
        yet (a roster this peer derived, or records without one) it is tried again later.
        """
        keys = self._board.keys
        if keys is None or not roster.absent:
            return True, None
        state = self._board.state(ctx.number)
        if author is not None:
            heard = state.roster_signatures.get(author)
            named = state.rosters.get(author)
            found = [heard] if heard is not None and named is not None and named == cid else []
        else:
            found = sorted(c.learned_signatures.get(bytes(cid), ()))
        block = self._rosters[bytes(cid)][1]
        for signature in found:
            try:
                verify_roster_coordinator(roster, block, signature, keys)
            except BadSignature as exc:
                if author is not None:
                    c.refused.add((author, bytes(cid)))
                    ctx.rejected[author] = f"roster {cid}: {exc}"
                continue
            return True, signature
        return False, None

    async def _checked_roster(
        self, ctx: RoundContext, cid: CID, author: str | None, c: _Collection
    ) -> Roster | None:
        """Load roster ``cid`` and check it fits the round; ``None`` (rejected, or not yet).

        Checked: :func:`~.coordinator.roster_problem` with the entries' signatures, the
        coordinator named (the message's signer), this peer's own entry, and for a roster
        learned from a record its coordinator's takeover time (else it is tried again later).
        """
        tried = c.tried
        try:
            roster = await self._load_roster(cid, ctx.config.fetch_timeout)
        except BlockTimeout as exc:
            # Waited fetch_timeout for it: a coordinator puts its roster before announcing it
            # (or sends it inline), so a member announcing one nobody serves must not hold the
            # round until round_timeout; later ranks may now publish theirs.
            tried.add(bytes(cid))
            ctx.rejected[f"roster {cid}"] = f"not served: {exc}"
            return None
        except (BlockNotFound, BlockStoreError) as exc:
            logger.debug("round %d: roster %s not fetched yet: %s", ctx.number, cid, exc)
            # A roster message's coordinator put it first: worth waiting for. One a record
            # names is tried again, but holds nobody back: any member can announce a record
            # naming a roster nobody serves (this peer publishes its own roster when due).
            c.waiting = c.waiting or author is not None
            return None
        except DecodeError as exc:
            tried.add(bytes(cid))
            ctx.rejected[f"roster {cid}"] = str(exc)
            return None
        if self._refused(ctx, c, cid, author, roster):
            return None
        problem = await self._member_set_problem(ctx, cid, roster)
        if problem:  # the coordinator it names proposed it (its signer, checked above)
            c.tried.add(bytes(cid))
            ctx.rejected[roster.coordinator] = f"roster {cid}: {problem}"
            return None
        if c.awaiting and not c.awaiting.issubset(roster.peers):
            c.wake_at = min(c.wake_at, c.await_until)  # leaves out a member a re-run waits for
            return None
        if author is None:  # learned from a record: its named coordinator's time must come
            rank = ctx.ranking.index(roster.coordinator)
            if ctx.config.takeover_at(rank) > time.monotonic() - ctx.started:
                c.wake_at = min(c.wake_at, ctx.started + ctx.config.takeover_at(rank))
                return None
        return roster

    def _refused(
        self, ctx: RoundContext, c: _Collection, cid: CID, author: str | None, roster: Roster
    ) -> bool:
        """Check a loaded roster; name whom to blame in ``ctx.rejected`` if it is refused.

        A roster that is not this round's (or lists what its owners did not sign, or not this
        peer's own contribution as its entry) is refused by CID; a roster message from another
        member than the coordinator it names, by sender and CID.
        """
        problem = roster_problem(
            roster, self._board.session, self._board.genesis, ctx.number, ctx.base,
            ctx.config, ctx.barred, self._board.keys,
        ) or _own_problem(ctx, roster)  # fmt: skip
        if not problem and roster.coordinator not in ctx.ranking:
            problem = f"its coordinator {roster.coordinator} is a proven equivocator"
        if problem:
            c.tried.add(bytes(cid))
            ctx.rejected[author or roster.coordinator] = f"roster {cid}: {problem}"
            return True
        if author is not None and roster.coordinator != author:
            c.refused.add((author, bytes(cid)))
            ctx.rejected[author] = f"roster {cid}: names {roster.coordinator} as coordinator"
            return True
        return False

    async def _load_roster(self, cid: CID, timeout: float) -> Roster:
        """Decode a roster once: from its inline message, else fetched from the store."""
        known = self._rosters.get(bytes(cid))
        if known is None:
            carried = self._board.inline.get(bytes(cid))
            inline = None if carried is None else carried[1]
            block = await carried_or_fetched(self._store, cid, inline, timeout=timeout)
            known = self._rosters[bytes(cid)] = (Roster.from_block(block), block)
        return known[0]
