"""``AgreedSession``: rounds whose contributions and result are content-addressed and agreed.

Pubsub is lossy, so nothing here needs every message to arrive; lost messages cost time,
never consistency (DESIGN §7, issue 13). A session is named by ``(session, genesis)``: the
genesis is the CID of the initial model, committed once; the topic is
``gradfed/v1/<session>/agreed/<genesis>``. Round ``r`` starts from model CID ``M_r``:

1. **contribute**: commit the local gradient, announce ``contrib{cid, weight, base=M_r}``;
   every message this peer owes is re-announced until its phase ends (its latest ``done``
   forever: that is its head, for late joiners), first after ``announce_interval``, then at
   doubling intervals up to ``max_announce_interval`` (lost messages cost time; a flood of
   re-publications costs every peer CPU);
2. **roster**: the coordinator (rank 0 of :func:`coordinator_ranking`) publishes, as soon as
   every member's contribution is fetched and verified (or at ``collect_timeout`` with at least
   ``min_peers``), the dag-cbor :class:`~gradfed_ipfs.formats.roster.Roster` of what it holds;
   rank ``k`` does the same ``k · takeover_timeout`` later if no roster has been seen;
3. **aggregate**: every peer aggregates exactly the roster, in roster order, with
   :func:`~gradfed_ipfs.tensor.deterministic.deterministic_update` (the rule
   ``M_{r+1} = float32(M_r + learning_rate · Σ (w_i/W) g_i)``), fetching by CID any listed
   contribution it lacks, so every honest peer gets the same bytes and the same CID;
4. **done**: it commits the model and an :class:`~gradfed_ipfs.formats.roster.AgreedRecord`
   (``prev``, roster and result CIDs; byte-identical on every peer), announces
   ``done{result, record}``; the other peers' ``done`` are checked (waiting up to
   ``done_timeout``, by default not at all, then again when the next round starts): a
   different record raises :class:`~gradfed_ipfs.errors.RoundMismatch`; the cure is
   :meth:`AgreedSession.resync` (also how a restarted or late peer catches up).

A peer that misses the roster message learns the roster from another peer's ``done`` record;
in a reduce-scatter round the others have finished it also re-verifies that record instead of
waiting for slices nobody announces any more (``RosterPhase._slices_or_record``).
No roster with ``min_peers`` contributions by ``round_timeout`` raises
:class:`~gradfed_ipfs.errors.QuorumNotReached`. The coordinator is trusted to list only
contributions that were announced (peers do check that it lists members' verified blocks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from typing import Final

import numpy as np
from multiformats import CID

from ..._types import CIDLike, FloatArray, GradientLike
from ...block import Block
from ...cid import parse_cid
from ...errors import (
    GenesisMismatch,
    InvalidGradient,
    QuorumNotReached,
    RoundMismatch,
)
from ...formats.roster import (
    AgreedRecord,
    Roster,
)
from ...kubo.pubsub import PubsubTransport
from ...storage.base import BlockStore
from ...storage.dag import fetch_gradient, put_gradient
from ...storage.retention import GatedStore, RetentionHook
from ..exchange.announcer import Reannouncer
from ..exchange.encoded import encode_gradient
from ..exchange.fetcher import ContributionFetcher
from ..sliced.peer import ReduceScatterResult
from .config import AgreedConfig, AgreedRoundResult, ResyncResult, agreed_topic
from .coordinator import (
    Head,
    RoundBoard,
    best_head,
    coordinator_ranking,
    effective_quorum,
    model_holders,
)
from .history import check_exclusions, load_head
from .roster import RosterPhase
from .slicing import RootFetcher, SliceStep, slice_report
from .storage import RoundStorage

__all__ = ["AgreedConfig", "AgreedRoundResult", "AgreedSession", "ResyncResult", "agreed_topic"]

logger = logging.getLogger("gradfed_ipfs.federated.agreed")

_TICK: Final = 0.05
"""Longest wait between checks of the clock-driven steps (seconds)."""


class AgreedSession(RosterPhase, RoundStorage):
    """One peer of an agreed session (see the module docstring).

    Parameters
    ----------
    store
        This peer's block store (its daemon; peers' blocks arrive through it).
    pubsub
        This peer's pubsub transport.
    session
        Session name.
    genesis
        CID of the session's initial model (see :meth:`commit_genesis`).
    config
        Members and timing.
    retention
        Told each round's blocks once stored (a
        :class:`~gradfed_ipfs.storage.retention.RetentionKeeper`, which unpins and collects);
        its gate is held by every fetch and put, so its collections never race them. Records
        and rosters are then pinned alone (direct pins), so they do not keep what they link.
    """

    def __init__(
        self,
        store: BlockStore,
        pubsub: PubsubTransport,
        session: str,
        genesis: CIDLike,
        config: AgreedConfig,
        *,
        retention: RetentionHook | None = None,
    ) -> None:
        self.store = store
        self.retention = retention
        self.pubsub = pubsub
        self.session = session
        self.genesis = parse_cid(genesis)
        self.config = config
        self.topic = agreed_topic(session, self.genesis)
        self.peer_id = ""
        self.round = 0
        self.model_cid = self.genesis
        self.model: FloatArray = np.zeros(0, np.float32)
        self.head: CID | None = None
        self.history: dict[bytes, int] = {}  # record CID -> round, of records this peer followed
        self._board: RoundBoard | None = None
        self._announcer = Reannouncer(
            pubsub, self.topic, config.announce_interval, config.max_announce_interval
        )
        self._tasks: list[asyncio.Task[None]] = []
        fetch_store = store if retention is None else GatedStore(store, retention.gate)
        self._fetcher = ContributionFetcher(fetch_store, config.fetch_timeout, self._poke)
        self._own: tuple[CID, asyncio.Future[CID]] | None = None
        self._rosters: dict[bytes, tuple[Roster, Block]] = {}
        self._pending: list[asyncio.Future[object]] = []
        self._holds_head = False
        self.rule_state: FloatArray | None = None  # state of config.rule after the last round
        self._adopted_state: FloatArray | None = None

    # ------------------------------------------------------------------ lifecycle

    @staticmethod
    async def commit_genesis(store: BlockStore, model: GradientLike) -> CID:
        """Commit (and pin) the initial model; its CID names the session."""
        return await put_gradient(store, np.asarray(model, np.float32).reshape(-1))

    async def start(self, model: GradientLike | None = None) -> None:
        """Subscribe and start announcing; begin at the genesis model.

        Parameters
        ----------
        model
            This peer's initial model; it must hash to the genesis CID. When ``None`` the
            genesis model is fetched by CID.

        Raises
        ------
        GenesisMismatch
            If ``model`` is not the session's genesis model, or this peer is not a member.
        """
        if model is not None:
            cid = await self.commit_genesis(self.store, model)
            if bytes(cid) != bytes(self.genesis):
                raise GenesisMismatch(
                    f"this peer's initial model is {cid}, session {self.session!r} starts from "
                    f"{self.genesis}: refusing to join"
                )
        self.model = np.array(
            await fetch_gradient(self.store, self.genesis, timeout=self.config.fetch_timeout),
            dtype=np.float32,
        ).reshape(-1)
        self.peer_id = await self.pubsub.local_peer_id()
        if self.peer_id not in self.config.members:
            raise GenesisMismatch(f"peer {self.peer_id} is not a member of {self.session!r}")
        self._board = RoundBoard(self.session, self.genesis, self.peer_id, self.config.members)
        self._slicing, self.aggregation_reason = await SliceStep.open(self, self._fetcher.store)
        if self._slicing is not None:  # only roots are checked before the roster
            self._fetcher = RootFetcher(self._fetcher.store, self.config.fetch_timeout, self._poke)
        messages = self.pubsub.subscribe(self.topic)
        self._tasks = [
            asyncio.create_task(self._listen(messages)),
            asyncio.create_task(self._announcer.run()),
        ]

    async def _settle(self, *, keep: int = 0) -> None:
        """Wait until at most ``keep`` rounds' blocks are still being stored (raising a failure)."""
        while len(self._pending) > keep or (self._pending and self._pending[0].done()):
            await self._pending.pop(0)

    async def aclose(self) -> None:
        """Store what is pending, stop announcing and listening (store and transport stay open).

        A holder of the last round's model puts it now if ``model_every`` skipped it, so the
        final model's CID can be fetched as it is.
        """
        try:
            await self._settle()
            await self._store_last_model()
        finally:
            tasks = [*self._tasks, *self._fetcher.clear()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=5.0)
            self._tasks = []
            if self._slicing is not None:
                await self._slicing.aclose()

    # ------------------------------------------------------------------ the round

    async def run_round(self, gradient: GradientLike, *, weight: int = 1) -> AgreedRoundResult:
        """Contribute ``gradient`` (computed on :attr:`model`) to round :attr:`round`.

        Raises
        ------
        QuorumNotReached
            If no roster with ``min_peers`` contributions was adopted by ``round_timeout``.
        RoundMismatch
            If another roster peer announced a different record (this peer has advanced to its
            own result; call :meth:`resync`).
        """
        board, r = self.board, self.round
        if int(weight) < 1:
            raise InvalidGradient(f"weight must be a positive integer, got {weight}")
        started = time.monotonic()
        board.advance(r)
        self._announcer.withdraw("roster")  # the last round's, re-announced until now
        own_values = np.array(gradient, dtype=np.float32).reshape(-1)
        if own_values.size != self.model.size or not np.isfinite(own_values).all():
            raise InvalidGradient(f"gradient must be {self.model.size} finite values")
        # Announce as soon as the CID is known, and before the put starts: the daemon serves
        # the blocks once the put lands (bitswap answers wants for blocks added later), and the
        # announcement is not queued behind 4·d bytes of put on this daemon and this event loop
        # (measured: it reached the others 60-130 ms after posting when it raced the put).
        self._check_done(r - 1)
        await self._settle(keep=1)  # the last round's blocks may still be on their way
        encoded = await encode_gradient(own_values, chunk_bytes=self.config.chunk_bytes)
        contribution = encoded.cid
        message = self._message("contrib", r, contribution, base=self.model_cid, weight=int(weight))
        await self._announcer.post_now("contrib", message.encode())
        stored = asyncio.ensure_future(self._held(encoded.store(self.store)))
        self._own = (contribution, stored)
        try:
            result = await self._run_round(r, own_values, contribution, int(weight), started)
        except BaseException:
            await asyncio.wait([stored])
            if not stored.cancelled():
                stored.exception()  # retrieved: the round's own error is the one raised
            raise
        await stored  # a failed put is this round's error
        return result

    async def _run_round(
        self, r: int, own_values: FloatArray, contribution: CID, weight: int, started: float
    ) -> AgreedRoundResult:
        board, config = self.board, self.config
        own = (contribution, int(weight))
        self._fetcher.known(contribution, own_values)
        logger.debug("round %d: contributed after %.3fs", r, time.monotonic() - started)
        ranking = coordinator_ranking(self.session, self.genesis, r, config.members)
        rank = ranking.index(self.peer_id)
        close_at = started + config.collect_timeout + rank * config.takeover_timeout
        deadline = started + config.round_timeout
        members, quorum = (
            set(config.members) - self.excluded,
            effective_quorum(config, self.excluded),
        )
        rejected: dict[str, str] = {}
        tried: set[bytes] = set()
        derived: bytes | None = None  # the coordinator's roster, derived here before heard
        while True:
            event = board.changed
            state = board.state(r)
            for peer, c in state.contributions.items():
                if bytes(c.base) == bytes(self.model_cid) and peer not in rejected:
                    self._fetch(c.cid)
            adopted = await self._try_rosters(r, ranking, rejected, tried)
            if adopted is not None:
                break
            if quorum == len(members) and not state.rosters:
                # min_peers = all: the only roster any coordinator may publish is the complete
                # one, so a peer holding every member's contribution derives it without waiting.
                ready = self._ready(r, own, rejected)
                if set(ready) == members:
                    if rank == 0:
                        await self._publish_roster(r, ready)
                    else:
                        derived = bytes(self._derive_roster(r, ranking[0], ready))
                    continue
            if not state.rosters or all(bytes(c) in tried for c in state.rosters.values()):
                ready = self._ready(r, own, rejected)
                complete = set(ready) == members  # every member but proven liars
                if (rank == 0 and complete) or (
                    time.monotonic() >= close_at and len(ready) >= quorum
                ):
                    await self._publish_roster(r, ready)
                    continue
            if time.monotonic() >= deadline:
                raise QuorumNotReached(r, len(self._ready(r, own, rejected)), quorum)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), _TICK)
        roster_cid, roster, model = adopted
        if bytes(roster_cid) != derived:
            self._announcer.withdraw("contrib")  # a published roster settled the contributions
        # else nobody has published it yet: the peers that lost this contribution's messages
        # learn it only from these re-announcements (until the next round's, or forever in a
        # reduce-scatter round, which waits for their slices: seen across processes).
        logger.debug("round %d: adopted %s after %.3fs", r, roster_cid, time.monotonic() - started)
        model, sliced = await self._sliced(r, roster_cid, roster, model, own_values, rejected)
        return await self._finish(r, roster_cid, roster, model, rejected, started, sliced)

    async def _finish(
        self,
        r: int,
        roster_cid: CID,
        roster: Roster,
        model: FloatArray,
        rejected: dict[str, str],
        started: float,
        sliced: ReduceScatterResult | None = None,
    ) -> AgreedRoundResult:
        base = self.model_cid
        roster_block = self._rosters[bytes(roster_cid)][1]
        self._rosters.clear()
        encoded = await encode_gradient(model)
        result = encoded.cid
        rule, state, stores = self.config.rule, None, [encoded]
        if rule is not None and self._adopted_state is not None:
            stores.append(await encode_gradient(self._adopted_state))
            state = stores[-1].cid
        slices = None if sliced is None else tuple(sliced.records)
        frauds = tuple(sliced.frauds) if sliced is not None and sliced.frauds else None
        excluded = self.excluded | (sliced.liars if sliced is not None else set())
        stored = self.config.stores_model(r)
        record = AgreedRecord(
            self.session, self.genesis, r, self.head, base, roster_cid, result,
            float(self.config.learning_rate), None if rule is None else rule.label(r), state,
            slices, frauds, tuple(sorted(excluded)) or None, stored,
        ).to_block()  # fmt: skip
        record_cid = record.cid
        await self._post("done", self._message("done", r, result, record=record_cid))
        # Stored off the critical path (settled before the next round, resync or close): the
        # roster (pinned here too: the record links it), the record, and on the model's
        # holders the model and rule state (every model_every-th round: a put of 4·d bytes
        # costs the daemon ~19 ms of CPU at d = 1M, the largest part of an agreed round's
        # extra cost over the runner's on a loaded machine; issue 13's ratio).
        holders = model_holders(
            self.session, self.genesis, r, self.config.members, roster.peers,
            self.config.model_replicas,
        )  # fmt: skip
        held = stores if stored and self.peer_id in holders else []
        self._holds_head = self.peer_id in holders  # an unstored last model is put at close
        storing = self._store_round(roster_block, result, held, record, roster, r, self._own)
        self._pending.append(asyncio.ensure_future(storing))
        self.round, self.model, self.model_cid, self.head = r + 1, model, result, record_cid
        self.excluded = frozenset(excluded)  # the record's: no later roster may list them
        self.rule_state, self._adopted_state = self._adopted_state, None
        self.history[bytes(record_cid)] = r
        self._fetcher.retain(self._next_fetches())  # the next round's, already on their way
        others = [p for p in roster.peers if p != self.peer_id]
        logger.debug("round %d: done after %.3fs", r, time.monotonic() - started)
        confirmed, theirs = await self._await_done(r, record_cid, others)
        self._check_done(r, settle_ties=False)
        rejected.update({p: f"announced record {cid}" for p, cid in theirs.items()})
        unconfirmed = tuple(p for p in others if p not in confirmed)
        return AgreedRoundResult(
            round=r,
            base=base,
            model=result,
            record=record_cid,
            roster_cid=roster_cid,
            roster=roster,
            included=self.peer_id in roster.peers,
            absent=tuple(p for p in self.config.members if p not in roster.peers),
            confirmed=tuple(sorted(confirmed)),
            unconfirmed=unconfirmed,
            matched=not unconfirmed,
            rejected=rejected,
            seconds=time.monotonic() - started,
            **slice_report(sliced, self.aggregation_reason),
            model_stored=stored,
        )

    def _check_done(self, r: int, *, settle_ties: bool = True) -> None:
        """Raise ``RoundMismatch`` if round ``r``'s ``done`` messages outvote this peer's record.

        Peers that announced another record while this one's wins (most votes, then smallest
        CID, as :meth:`resync` chooses) are the ones that must resync; they are not an error here.
        Without ``settle_ties`` (right after this peer's own ``done``, when the others' may still
        be on their way) only a record with strictly more votes raises; a tie is settled by CID
        at the next check, when the next round starts.
        """
        if self.head is None or r < 0:
            return
        done = self.board.state(r).done
        theirs = {p: h for p, h in done.items() if bytes(h.record) != bytes(self.head)}
        if theirs:
            heads = {**done, self.peer_id: Head(r, self.model_cid, self.head)}
            best = best_head(heads.values())
            votes = Counter(bytes(h.record) for h in heads.values())
            if best is None or bytes(best.record) == bytes(self.head):
                return
            if not settle_ties and votes[bytes(best.record)] <= votes[bytes(self.head)]:
                return
            raise RoundMismatch(r, str(self.head), {p: str(h.record) for p, h in theirs.items()})

    async def _await_done(
        self, r: int, record: CID, others: list[str]
    ) -> tuple[set[str], dict[str, str]]:
        done = self.board.state(r).done

        if self.config.done_timeout > 0:
            await self.board.wait_until(
                lambda: all(p in done for p in others), self.config.done_timeout
            )
        confirmed = {p for p, h in done.items() if bytes(h.record) == bytes(record)}
        theirs = {p: str(h.record) for p, h in done.items() if bytes(h.record) != bytes(record)}
        return confirmed, theirs

    # ------------------------------------------------------------------ catching up

    async def resync(self, *, timeout: float = 10.0, grace: float | None = None) -> ResyncResult:
        """Adopt the latest agreed head the other members announce, by CID.

        Waits until every other member's head is heard, or one is heard and ``grace`` seconds
        (default two announce intervals) have passed, or ``timeout``. The best head has the
        highest round, then the most peers behind it, then the smallest record CID. Its chain
        is walked back to a record this peer already followed (or the genesis) and checked
        (links, rounds, genesis, and the proven liars: :func:`~.agreed_history.check_exclusions`,
        whose ``excluded`` the peer then applies to its rosters); then the head's model is
        fetched (or rebuilt from the last stored one, or this peer's, by re-aggregating the
        rounds since: ``AgreedConfig.model_every``) and adopted.

        Raises
        ------
        GenesisMismatch, RoundVerificationFailed
            If the chain is not a valid chain of this session.
        """
        await self._settle()
        grace = 2 * self.config.announce_interval if grace is None else grace
        others = [p for p in self.config.members if p != self.peer_id]
        heads = await self.board.gather_heads(others, grace=grace, timeout=timeout)
        if self.head is not None:
            heads[self.peer_id] = Head(self.round - 1, self.model_cid, self.head)
        best = best_head(heads.values())
        if best is None or bytes(best.record) == bytes(self.head or b""):
            return ResyncResult(False, self.round, self.model_cid, self.head)
        chain, model, state = await load_head(
            self.store, best.record, session=self.session, genesis=self.genesis,
            history=self.history, length=self.model.size, timeout=self.config.fetch_timeout,
            rule=self.config.rule, known={bytes(self.model_cid): (self.model, self.rule_state)},
            max_rebuild=self.config.model_every,  # an honest chain stores a model that often
        )  # fmt: skip
        excluded = await check_exclusions(self.store, chain)  # fraud records are peers' data
        self.rule_state = state  # the custom rule resumes from the head's state
        self.model = np.array(model, np.float32).reshape(-1)
        self.model_cid, self.head, self.round = chain[-1][1].result, best.record, best.round + 1
        self._holds_head = False
        self.excluded = excluded
        for cid, record in chain:
            self.history[bytes(cid)] = record.round
        self.board.advance(self.round)
        await self._post("done", self._message("done", best.round, best.result, record=best.record))
        logger.info("%s resynced to round %d (%s)", self.peer_id, self.round, best.record)
        return ResyncResult(True, self.round, self.model_cid, self.head, tuple(c for c, _ in chain))

    async def linger(self, *, timeout: float, grace: float | None = None) -> set[str]:
        """Announce the head until every member has announced the same round's, then ``grace`` s.

        The others may not have heard this peer's head yet: it is re-announced from the first
        interval again and for ``grace`` seconds more (default ``max_announce_interval`` +
        ``announce_interval``). Returns the members heard within ``timeout`` (this one included).
        """
        await self._settle()
        members, last = set(self.config.members), self.round - 1
        if self.head is not None:
            await self._post("done", self._message("done", last, self.model_cid, record=self.head))

        def finished() -> set[str]:
            heads = self.board.heads
            return {p for p, h in heads.items() if h.round >= last} | {self.peer_id}

        if await self.board.wait_until(lambda: finished() >= members, timeout):
            extra = self.config.max_announce_interval + self.config.announce_interval
            await asyncio.sleep(extra if grace is None else grace)  # keep announcing our head
        return finished()
