"""``RoundRunner``: one federated round over IPFS, end to end.

A round on one node:

1. commit the local gradient (a raw block, or a chunked DAG when large) to the local daemon;
2. announce its CID on the session topic, re-publishing until the round closes (so a late
   subscriber still learns it), after waiting until pubsub shows other subscribers;
3. collect other peers' announcements of this round and fetch each announced gradient as soon
   as it is announced, concurrently, through the local daemon (bitswap brings the blocks);
   every block is re-hashed, decoded and checked (length, finiteness) on arrival;
4. stop when ``min_peers`` peer gradients are in, or the collection deadline has passed and no
   fetch is in flight; each fetch is bounded by ``fetch_timeout``, so a peer that announces but
   never serves its blocks is excluded and reported in ``RoundStats.missing_clients``;
5. aggregate (holding or streaming accumulator) and close the round; with ``dp``, client-level
   DP-FedAvg instead (:mod:`gradfed_ipfs.federated.round.dp`): clip each contribution, equal
   weights, Gaussian noise, the release charged to the RDP accountant and ε reported.

With ``secure=`` (a :class:`~gradfed_ipfs.federated.round.secagg.SecureRoundConfig`),
:meth:`RoundRunner.run_round` runs a SecAgg round instead (through this node's store and gossip
transport), central DP on the secure sum when ``dp`` is set too; see
:mod:`gradfed_ipfs.federated.round.secure`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from multiformats import CID

from ..._types import CIDLike, FloatArray, GradientLike
from ...errors import (
    BlockCorrupt,
    BlockStoreError,
    DecodeError,
    GradientError,
    InvalidGradient,
)
from ...formats.announcement import Announcement
from ...storage.base import BlockStore
from ...tensor.aggregation import as_float32_vector
from ..privacy.mechanisms import DifferentialPrivacy
from .accumulator import DistributedGradientAccumulator
from .config import AccumulatorConfig
from .dp import HasContributions, check_dp_round, dp_round_aggregate
from .gossip import GossipModelSync
from .secagg import RandBytes, SecureRoundConfig
from .secure import run_runner_secure_round
from .stats import RoundStats

__all__ = ["GradientAccumulator", "RoundConfig", "RoundResult", "RoundRunner"]

logger = logging.getLogger("gradfed_ipfs.federated")


class GradientAccumulator(Protocol):
    """What the runner needs from an accumulator (holding or streaming)."""

    async def commit_local(
        self, gradient: GradientLike, store: BlockStore, *, num_samples: int | None = None
    ) -> CID:
        """Store the local gradient and return its CID."""
        ...

    async def add_peer_gradient(
        self, peer_id: str, cid: CIDLike, store: BlockStore, *, num_samples: int | None = None
    ) -> None:
        """Fetch, verify and take in one peer's gradient."""
        ...

    def aggregate(self) -> FloatArray:
        """Return the aggregate of the local and peer gradients."""
        ...


@dataclass(frozen=True)
class RoundConfig:
    """Timing and size settings of a round.

    Attributes
    ----------
    min_peers
        Peer gradients (besides the local one) to wait for.
    collect_timeout
        Seconds after the commit during which announcements are collected.
    fetch_timeout
        Seconds one peer's whole gradient may take to arrive; then the peer is excluded.
    subscriber_timeout
        Seconds to wait until pubsub shows ``min_peers`` subscribers before announcing.
    republish_interval
        Seconds between re-publications of the local announcement.
    max_republish
        Most publications of the local announcement per round.
    max_peers
        Most peer gradients taken in (further announcers are ignored).
    """

    min_peers: int = 1
    collect_timeout: float = 60.0
    fetch_timeout: float = 60.0
    subscriber_timeout: float = 10.0
    republish_interval: float = 1.0
    max_republish: int = 120
    max_peers: int = 64

    def __post_init__(self) -> None:
        if self.min_peers < 0 or self.max_peers < 1 or self.max_republish < 1:
            raise InvalidGradient("min_peers must be >= 0, max_peers and max_republish >= 1")
        for name in ("collect_timeout", "fetch_timeout", "republish_interval"):
            if not getattr(self, name) > 0:
                raise InvalidGradient(f"{name} must be > 0 seconds")


@dataclass
class RoundResult:
    """What a round produced.

    Attributes
    ----------
    round_id
        The round.
    local_cid
        CID of this node's committed gradient.
    aggregate
        The aggregate (float32, length d). In a SecAgg round (``secure=``), only the aggregator
        has it (the survivors' mean); on a pure client it is an *empty* float32 array (length
        0): the protocol publishes no sum to clients.
    stats
        Participants (local included), missing peers, duration, rejected contributions.
    contributors
        Peer ID → CID of every peer gradient taken in (SecAgg, on the aggregator: of every
        other survivor's masked block; ``local_cid`` is then this node's masked block).
    failures
        Peer ID → why its gradient was not taken in.
    drops
        Announcement drops by reason (see :class:`~gradfed_ipfs.AnnouncementFilter`).
    """

    round_id: int
    local_cid: CID
    aggregate: FloatArray
    stats: RoundStats
    contributors: dict[str, CID] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)


class RoundRunner:
    """Runs rounds for one node: its block store (daemon) and its gossip endpoint.

    Parameters
    ----------
    store
        This node's block store (for Kubo, its own daemon).
    gossip
        This node's gossip endpoint (its ``local_peer_id`` is this node's peer ID).
    config
        Round settings.
    accumulator_factory
        Builds a fresh accumulator per round (default: a holding
        :class:`~gradfed_ipfs.DistributedGradientAccumulator` with FedAvg);
        pass one returning a :class:`~gradfed_ipfs.federated.round.streaming.StreamingAccumulator`
        for constant memory (not with ``dp``: DP clips each contribution, so it needs them held).
    dp
        Client-level DP-FedAvg for every round (McMahan et al. 2018): ``dp.sensitivity`` is the
        clip norm C and ``dp``'s Gaussian noise multiplier z; each contribution is clipped to C,
        averaged with *equal* weights (announced sample counts are ignored: FedAvg's weights
        would let one client's term exceed C and void the sensitivity bound), and
        N(0, (zC/n)²) noise is added per coordinate. A round that the budget cannot afford
        raises :class:`~gradfed_ipfs.errors.PrivacyBudgetExhausted` before anything is committed
        or announced. The budget is cumulative over this runner's rounds; ``RoundStats`` reports
        the (ε, δ) spent so far. See :mod:`gradfed_ipfs.federated.round.dp` for what ε covers.
        With ``secure=`` rounds: central DP on the secure sum instead (each client clips to C
        before masking; the aggregator noises the unmasked sum and is charged; see
        :mod:`gradfed_ipfs.federated.round.secure`).
    randbytes
        Cryptographic randomness of this node's SecAgg client role (default ``os.urandom``).
    """

    def __init__(
        self,
        store: BlockStore,
        gossip: GossipModelSync,
        config: RoundConfig | None = None,
        *,
        accumulator_factory: Callable[[], GradientAccumulator] | None = None,
        dp: DifferentialPrivacy | None = None,
        randbytes: RandBytes = os.urandom,
    ) -> None:
        self.store = store
        self.dp = dp
        self.randbytes = randbytes
        self.gossip = gossip
        self.config = config if config is not None else RoundConfig()
        self._factory = accumulator_factory or self._default_accumulator
        # Announcements for rounds this node has not reached yet (peer → announcement per
        # round). A node one round behind would otherwise discard them, and their
        # re-publications as duplicates, and miss those peers for a whole round.
        self._deferred: dict[int, dict[str, Announcement]] = {}
        self._deferred_count = 0
        # The previous round's announcer keeps re-publishing after this node closed the round,
        # until the next round starts: slower peers that lost the first copies still learn it.
        self._lingering: asyncio.Task[int] | None = None

    MAX_DEFERRED = 4096
    """Most future-round announcements held (later ones are dropped as ``deferred_overflow``)."""

    def defer(self, announcement: Announcement) -> None:
        """Hold an announcement for a future round until :meth:`run_round` reaches it."""
        held = self._deferred.setdefault(announcement.round, {})
        if announcement.peer_id in held:
            return
        if self._deferred_count >= self.MAX_DEFERRED:
            self.gossip.drops["deferred_overflow"] += 1
            return
        held[announcement.peer_id] = announcement
        self._deferred_count += 1

    def _take_deferred(self, round_id: int) -> list[Announcement]:
        """Return the held announcements of ``round_id``; forget those of earlier rounds."""
        for old in [r for r in self._deferred if r < round_id]:
            self.gossip.drops["other_round"] += len(self._deferred[old])
            self._deferred_count -= len(self._deferred.pop(old))
        taken = list(self._deferred.pop(round_id, {}).values())
        self._deferred_count -= len(taken)
        return taken

    async def aclose(self) -> None:
        """Stop re-publishing the last round's announcement."""
        await self._stop_lingering()

    async def _stop_lingering(self) -> None:
        task, self._lingering = self._lingering, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _default_accumulator(self) -> GradientAccumulator:
        return DistributedGradientAccumulator(
            self.gossip.session_id,
            AccumulatorConfig(max_peers=self.config.max_peers, timeout=self.config.fetch_timeout),
            local_peer_id=self.gossip.local_peer_id,
        )

    async def run_round(
        self,
        round_id: int,
        gradient: GradientLike,
        *,
        num_samples: int | None = None,
        expected_peers: list[str] | None = None,
        secure: SecureRoundConfig | None = None,
    ) -> RoundResult:
        """Commit, announce, collect, fetch, verify and aggregate one round.

        Parameters
        ----------
        round_id
            The round number (≥ 0); only announcements of this round count.
        gradient
            The local gradient.
        num_samples
            Local samples behind it (FedAvg weight), announced to the others.
        expected_peers
            Peers expected in the round; those that never announce are reported missing too.
        secure
            Run this round with secure aggregation instead: this node must be one of
            ``secure.clients`` and ``secure.round_id`` must equal ``round_id``; ``num_samples``
            and ``expected_peers`` are unused (equal weights; the roster is ``secure.clients``).
            ``stats.dropped_clients`` lists the clients that shared keys but were not summed.

        Returns
        -------
        RoundResult
            The aggregate and the round's stats.
        """
        cfg = self.config
        started = time.monotonic()
        await self._stop_lingering()
        if secure is not None:
            return await self._run_secure(round_id, gradient, secure)
        values = as_float32_vector(gradient)
        accumulator = self._factory()
        if self.dp is not None:  # refuse before the gradient leaves this node
            check_dp_round(self.dp, accumulator)
        await self.gossip.start()
        local_cid = await accumulator.commit_local(values, self.store, num_samples=num_samples)
        announcement = self.gossip.make_announcement(
            local_cid, round_id, num_samples=num_samples, length=int(values.size)
        )
        await self.gossip.wait_for_peers(cfg.min_peers, timeout=cfg.subscriber_timeout)
        closed = asyncio.Event()
        announcer = asyncio.create_task(
            self.gossip.announce_until(
                announcement, closed, interval=cfg.republish_interval, max_count=cfg.max_republish
            )
        )
        state = _RoundState(round_id, int(values.size), accumulator, self)
        for early in self._take_deferred(round_id):
            state.start_fetch(early)
        try:
            await state.collect(time.monotonic() + cfg.collect_timeout)
            epsilon: float | None = None
            delta: float | None = None
            aggregate: FloatArray
            if self.dp is not None:
                held: HasContributions = accumulator  # type: ignore[assignment]  # checked above
                aggregate, epsilon, delta = dp_round_aggregate(self.dp, held)
            else:
                # A streaming accumulator finalizes in place (no second d-array); not reused.
                finish = getattr(accumulator, "finalize", None) or accumulator.aggregate
                aggregate = finish()
        except BaseException:
            closed.set()
            raise
        finally:
            for task in state.fetches.values():
                task.cancel()
            await asyncio.gather(*state.fetches.values(), return_exceptions=True)
            if closed.is_set():
                await asyncio.gather(announcer, return_exceptions=True)
            else:
                self._lingering = announcer  # bounded by max_republish; stopped by next round
        never_announced = set(expected_peers or []) - set(state.announced)
        stats = RoundStats(
            round_id=round_id,
            participants=1 + len(state.contributors),
            missing_clients=sorted(state.missing | never_announced),
            duration_ms=int((time.monotonic() - started) * 1000),
            epsilon_spent=epsilon,
            delta_spent=delta,
            dropped_clients=sorted(state.missing),
            rejected_contributions=state.rejected,
        )
        logger.info(
            "round %d: %d peers in, missing %s, rejected %d",
            round_id,
            len(state.contributors),
            stats.missing_clients,
            state.rejected,
        )
        return RoundResult(
            round_id,
            local_cid,
            aggregate,
            stats,
            state.contributors,
            state.failures,
            dict(self.gossip.drops),
        )

    async def _run_secure(
        self, round_id: int, gradient: GradientLike, secure: SecureRoundConfig
    ) -> RoundResult:
        if secure.round_id != round_id:
            raise InvalidGradient(f"secure.round_id {secure.round_id} != round_id {round_id}")
        outcome = await run_runner_secure_round(
            self.store,
            self.gossip.transport,
            secure,
            gradient,
            dp=self.dp,
            randbytes=self.randbytes,
        )
        logger.info(
            "secure round %d: %d summed, dropped %s",
            round_id,
            outcome.stats.participants,
            outcome.stats.dropped_clients,
        )
        return RoundResult(
            round_id,
            outcome.local_cid,
            outcome.aggregate,
            outcome.stats,
            outcome.contributors,
            {},
            outcome.drops,
        )


class _RoundState:
    """The bookkeeping of one round in progress on one node."""

    def __init__(
        self, round_id: int, length: int, accumulator: GradientAccumulator, runner: RoundRunner
    ) -> None:
        self.round_id = round_id
        self.length = length
        self.accumulator = accumulator
        self.runner = runner
        self.announced: dict[str, Announcement] = {}
        self.fetches: dict[str, asyncio.Task[None]] = {}
        self.contributors: dict[str, CID] = {}
        self.failures: dict[str, str] = {}
        self.missing: set[str] = set()
        self.rejected = 0

    async def collect(self, deadline: float) -> None:
        """Take announcements and finished fetches until ``min_peers`` or the deadline."""
        gossip, cfg = self.runner.gossip, self.runner.config
        while len(self.contributors) < cfg.min_peers:
            remaining = deadline - time.monotonic()
            if remaining <= 0 and not self.fetches:
                break
            waiters: set[asyncio.Future[object]] = {*self.fetches.values()}  # type: ignore[arg-type]
            listener: asyncio.Future[Announcement | None] | None = None
            if remaining > 0:
                listener = asyncio.ensure_future(gossip.next_announcement(remaining))
                waiters.add(listener)  # type: ignore[arg-type]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if listener is not None:
                if not listener.done():
                    listener.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await listener
                elif (found := listener.result()) is not None:
                    self.start_fetch(found)
            for peer, task in list(self.fetches.items()):
                if task.done():
                    self.settle(peer, task)
        for peer, task in list(self.fetches.items()):  # stragglers, each bounded by fetch_timeout
            with contextlib.suppress(Exception):
                await task
            self.settle(peer, task)

    def start_fetch(self, found: Announcement) -> None:
        """Start fetching an announced gradient, unless the announcement is unusable."""
        gossip, cfg = self.runner.gossip, self.runner.config
        if found.round > self.round_id:
            self.runner.defer(found)
            return
        if found.round != self.round_id:
            gossip.drops["other_round"] += 1
            return
        if found.peer_id in self.announced:
            return
        if len(self.announced) >= cfg.max_peers:
            gossip.drops["over_max_peers"] += 1
            return
        self.announced[found.peer_id] = found
        if found.length != self.length:
            self.failures[found.peer_id] = f"announced length {found.length} != {self.length}"
            self.rejected += 1
            return

        async def fetch() -> None:  # the coroutine is created only once the task runs
            await asyncio.wait_for(
                self.accumulator.add_peer_gradient(
                    found.peer_id, found.cid, self.runner.store, num_samples=found.num_samples
                ),
                cfg.fetch_timeout,
            )

        self.fetches[found.peer_id] = asyncio.create_task(fetch(), name=f"fetch-{found.peer_id}")

    def settle(self, peer: str, task: asyncio.Task[None]) -> None:
        """Record a finished fetch: a contribution, a missing peer or a rejected gradient."""
        del self.fetches[peer]
        outcome = _outcome(task)
        if outcome is None:
            self.contributors[peer] = self.announced[peer].cid
            return
        kind, why = outcome
        self.failures[peer] = why
        if kind == "missing":
            self.missing.add(peer)
        else:
            self.rejected += 1
        logger.info("peer %s excluded (%s): %s", peer, kind, why)


def _outcome(task: asyncio.Task[None]) -> tuple[str, str] | None:
    """Classify a finished fetch: None when it succeeded, else (``missing``|``rejected``, why).

    A gradient that proved bad (corrupt bytes, undecodable, wrong length, NaN) is ``rejected``;
    one that did not arrive (timeout, not found, daemon errors) is ``missing``.
    """
    exc = task.exception()
    if exc is None:
        return None
    if isinstance(exc, BlockCorrupt | DecodeError | GradientError):
        return ("rejected", f"{type(exc).__name__}: {exc}")
    if isinstance(exc, TimeoutError | BlockStoreError):
        return ("missing", f"{type(exc).__name__}: {exc}")
    raise exc
