"""``RoundRunner``: one federated round over IPFS, end to end, with DP and SecAgg as options.

A round on one node, configured by one :class:`~gradfed_ipfs.federated.besteffort.RoundConfig`:

1. commit the local gradient (a raw block, or a chunked DAG when large) to the local daemon;
2. announce its CID on the session topic, re-publishing until the round closes (so a late
   subscriber still learns it), after waiting until pubsub shows other subscribers;
3. collect other peers' announcements of this round and fetch each announced gradient as soon
   as it is announced, concurrently, through the local daemon (bitswap brings the blocks);
   every block is re-hashed, decoded and checked (length, finiteness) on arrival, and whatever
   a peer's bytes make a decoder raise rejects that peer, never the round
   (:mod:`gradfed_ipfs.federated.besteffort.collect`);
4. stop when ``min_peers`` peer gradients and every expected peer are in, or at the round's
   deadline (``collect_timeout`` after the commit); a peer that announces but never serves its
   blocks costs at most the deadline, while a fetch whose blocks keep arriving goes on past it,
   within a deadline scaled by its announced size (``RoundConfig.fetch_deadline``, longer for
   a peer measured slower in earlier rounds: :attr:`RoundRunner.throughput`) and unless it
   stalls (``stall_timeout``); such peers cut off are reported ``slow``, not ``dropped``
   (:mod:`gradfed_ipfs.federated.besteffort.liveness`); a round with fewer than ``min_peers`` by
   then raises :class:`~gradfed_ipfs.errors.InsufficientPeers`;
5. aggregate (holding or, with ``streaming``, streaming accumulator) and close the round.

Options, the way Flower wraps a strategy: ``dp`` turns the aggregate into client-level
DP-FedAvg (:mod:`gradfed_ipfs.federated.besteffort.dp`); ``secure`` runs the round with secure
aggregation instead (:mod:`gradfed_ipfs.federated.besteffort.secure`), central DP on the secure sum
when ``dp`` is set too. Every round returns the one
:class:`~gradfed_ipfs.federated.besteffort.result.RoundResult`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable

from ..._types import FloatArray, GradientLike
from ...errors import InsufficientPeers
from ...formats.announcement import Announcement
from ...storage.base import BlockStore
from ...tensor.aggregation import as_float32_vector
from ..accumulate.accumulator import DistributedGradientAccumulator, GradientAccumulator
from ..accumulate.streaming import StreamingAccumulator
from ..secagg_round.peer import RandBytes
from .collect import Collection, FutureRounds
from .config import RoundConfig
from .dp import check_dp_round, dp_round_aggregate
from .gossip import GossipModelSync
from .result import RoundResult
from .secure import run_secure
from .throughput import ThroughputMeter

__all__ = ["RoundRunner"]

logger = logging.getLogger("gradfed_ipfs.federated")


class RoundRunner:
    """Runs rounds for one node: its block store (daemon) and its gossip endpoint.

    Parameters
    ----------
    store
        This node's block store (for Kubo, its own daemon).
    gossip
        This node's gossip endpoint (its ``local_peer_id`` is this node's peer ID).
    config
        The rounds' settings, options included (``dp``, ``secure``, ``streaming``).
    accumulator_factory
        Builds a fresh accumulator per round, for settings a ``RoundConfig`` does not hold
        (a chunk size, a float64 running sum); default: the holding or (``streaming``)
        streaming accumulator with :meth:`RoundConfig.accumulator_config`.
    randbytes
        Cryptographic randomness of this node's SecAgg client role (default ``os.urandom``).

    Attributes
    ----------
    throughput
        Per-peer transfer rates measured over this runner's rounds, which lengthen a slow
        peer's next fetch deadline; ``None`` without ``RoundConfig.measure_throughput``.
        Replace it to tune the meter.
    """

    MAX_DEFERRED = 4096
    """Most future-round announcements held (later ones are dropped as ``deferred_overflow``)."""

    MAX_DEFERRED_PER_PEER = 8
    """Most future-round announcements held from one peer (``deferred_peer_overflow``)."""

    def __init__(
        self,
        store: BlockStore,
        gossip: GossipModelSync,
        config: RoundConfig | None = None,
        *,
        accumulator_factory: Callable[[], GradientAccumulator] | None = None,
        randbytes: RandBytes = os.urandom,
    ) -> None:
        self.store = store
        self.randbytes = randbytes
        self.gossip = gossip
        self.config = config if config is not None else RoundConfig()
        self._factory = accumulator_factory or self._default_accumulator
        self.throughput = ThroughputMeter() if self.config.measure_throughput else None
        self.future = FutureRounds(
            gossip.drops, max_total=self.MAX_DEFERRED, max_per_peer=self.MAX_DEFERRED_PER_PEER
        )
        # The previous round's announcer keeps re-publishing after this node closed the round,
        # until the next round starts: slower peers that lost the first copies still learn it.
        self._lingering: asyncio.Task[int] | None = None

    def defer(self, announcement: Announcement) -> None:
        """Hold an announcement for a future round until :meth:`run_round` reaches it."""
        self.future.hold(announcement)

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
        kind = StreamingAccumulator if self.config.streaming else DistributedGradientAccumulator
        return kind(
            self.gossip.session_id,
            self.config.accumulator_config(),
            local_peer_id=self.gossip.local_peer_id,
        )

    async def run_round(
        self,
        round_id: int,
        gradient: GradientLike,
        *,
        num_samples: int | None = None,
        expected_peers: list[str] | None = None,
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
            Peers expected in the round: collection waits for each of them (until the
            deadline) beyond ``min_peers``; those that never announce are reported ``absent``.
            Unused with ``secure`` (the roster is ``secure.clients``; equal weights).

        Returns
        -------
        RoundResult
            The aggregate and who was in the round.

        Raises
        ------
        InsufficientPeers
            If fewer than ``min_peers`` peer gradients were taken in by the deadline.
        PrivacyBudgetExhausted
            With ``dp``, before anything is committed, if the release does not fit the budget.
        """
        await self._stop_lingering()
        if self.config.secure is not None:
            return await run_secure(
                self.store, self.gossip, self.config, round_id, gradient, randbytes=self.randbytes
            )
        return await self._run_plain(round_id, gradient, num_samples, expected_peers or [])

    async def _run_plain(
        self,
        round_id: int,
        gradient: GradientLike,
        num_samples: int | None,
        expected_peers: list[str],
    ) -> RoundResult:
        cfg, dp = self.config, self.config.dp
        started = time.monotonic()
        values = as_float32_vector(gradient)
        accumulator = self._factory()
        if dp is not None:  # refuse before the gradient leaves this node
            check_dp_round(dp, accumulator)
        await self.gossip.start()
        local_cid = await accumulator.commit_local(values, self.store, num_samples=num_samples)
        announcement = self.gossip.make_announcement(
            local_cid, round_id, num_samples=num_samples, length=int(values.size)
        )
        await self.gossip.wait_for_peers(cfg.min_peers, timeout=cfg.subscriber_timeout)
        deadline = time.monotonic() + cfg.collect_timeout
        closed = asyncio.Event()
        announcer = asyncio.create_task(
            self.gossip.announce_until(
                announcement, closed, interval=cfg.republish_interval, max_count=cfg.max_republish
            )
        )
        expected = set(expected_peers) - {self.gossip.local_peer_id}
        state = Collection(round_id, int(values.size), accumulator, self, expected)
        for early in self.future.take(round_id):
            state.start_fetch(early)
        epsilon: float | None = None
        delta: float | None = None
        try:
            await state.collect(deadline)
            absent = sorted(expected - set(state.announced))
            if len(state.contributors) < cfg.min_peers:
                raise InsufficientPeers(
                    round_id,
                    cfg.min_peers,
                    len(state.contributors),
                    sorted({*absent, *state.dropped, *state.slow}),
                    state.failures,
                )
            aggregate: FloatArray
            if dp is not None:
                aggregate, epsilon, delta = dp_round_aggregate(dp, accumulator)
            else:
                aggregate = accumulator.finalize()
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
        me = self.gossip.local_peer_id
        result = RoundResult(
            round_id,
            local_cid,
            aggregate,
            participants=sorted([me, *state.contributors]),
            contributors=state.contributors,
            expected=sorted(expected),
            absent=absent,
            dropped=sorted(state.dropped),
            slow=sorted(state.slow),
            rejected=state.rejected,
            rejections=dict(state.rejections),
            failures=state.failures,
            clipped_weights=dict(accumulator.clipped_weights),
            epsilon=epsilon,
            delta=delta,
            duration_ms=int((time.monotonic() - started) * 1000),
            drops=dict(self.gossip.drops),
            throughput=state.throughput,
        )
        logger.info(
            "round %d: %d peers in, missing %s, rejected %d",
            round_id,
            len(state.contributors),
            result.missing,
            len(state.rejected),
        )
        return result
