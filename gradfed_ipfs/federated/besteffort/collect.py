"""Collecting one round's contributions: announcements in, fetches out, every peer accounted for.

:class:`Collection` is one round in progress on one node; :class:`FutureRounds` holds
announcements of rounds this node has not reached yet. A peer's outcome is one of: taken in
(a contributor), *slow* (its blocks were arriving but it was cut off: too slow for its announced
size, stalled, or still in flight when the round closed; see :mod:`.liveness`), *dropped* (none
of its blocks arrived: not found, daemon error, or nothing by the round's deadline) or
*rejected* (its bytes were bad: anything a decoder or a check raised on them, counted by reason).
A peer's data never fails the round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from typing import Protocol

from multiformats import CID

from ...errors import (
    BlockCorrupt,
    BlockStoreError,
    BlockTimeout,
    DecodeError,
    GradfedError,
    GradientError,
)
from ...formats.announcement import Announcement
from ...storage.base import BlockStore
from ..accumulate.accumulator import PEER_DATA_ERRORS, GradientAccumulator
from .config import RoundConfig
from .gossip import GossipModelSync
from .liveness import FetchWatch, ProgressStore, verdict
from .throughput import ThroughputMeter

__all__ = ["CollectingNode", "Collection", "FutureRounds", "classify", "describe"]

logger = logging.getLogger("gradfed_ipfs.federated")


class CollectingNode(Protocol):
    """What a :class:`Collection` uses of its node (a :class:`~.runner.RoundRunner`)."""

    store: BlockStore
    gossip: GossipModelSync
    config: RoundConfig
    future: FutureRounds
    throughput: ThroughputMeter | None


class FutureRounds:
    """Announcements for rounds this node has not reached yet, capped in total and per peer.

    A node one round behind would otherwise discard them (and their re-publications as
    duplicates) and miss those peers for a whole round. The per-peer cap keeps one peer that
    floods far-future rounds (10⁹ + i) from pushing honest early announcements out.

    Parameters
    ----------
    drops
        Where refusals are counted (``deferred_overflow``, ``deferred_peer_overflow``).
    max_total, max_per_peer
        Most announcements held in all, and from one peer.
    """

    def __init__(self, drops: Counter[str], *, max_total: int, max_per_peer: int) -> None:
        self.drops = drops
        self.max_total = max_total
        self.max_per_peer = max_per_peer
        self._held: dict[int, dict[str, Announcement]] = {}
        self._per_peer: Counter[str] = Counter()

    def __len__(self) -> int:
        return sum(self._per_peer.values())

    def hold(self, announcement: Announcement) -> None:
        """Hold an announcement until its round is taken (first one per peer and round)."""
        held = self._held.setdefault(announcement.round, {})
        peer = announcement.peer_id
        if peer in held:
            return
        if self._per_peer[peer] >= self.max_per_peer:
            self.drops["deferred_peer_overflow"] += 1
        elif len(self) >= self.max_total:
            self.drops["deferred_overflow"] += 1
        else:
            held[peer] = announcement
            self._per_peer[peer] += 1
        if not held:
            del self._held[announcement.round]

    def take(self, round_id: int) -> list[Announcement]:
        """Return the held announcements of ``round_id``; forget those of earlier rounds."""
        for old in [r for r in self._held if r < round_id]:
            self.drops["other_round"] += len(self._release(old))
        return self._release(round_id)

    def _release(self, round_id: int) -> list[Announcement]:
        taken = list(self._held.pop(round_id, {}).values())
        for announcement in taken:
            self._per_peer[announcement.peer_id] -= 1
        self._per_peer += Counter()  # drop zero counts
        return taken


def classify(exc: BaseException) -> str:
    """Return ``rejected`` if a fetch failed on the peer's bytes, else ``dropped``.

    Bad bytes (corrupt, undecodable, wrong length, NaN, or anything else a decoder raised) are
    ``rejected``; a gradient that did not arrive (timeout, not found, daemon errors) ``dropped``.
    """
    if isinstance(exc, BlockCorrupt | DecodeError | GradientError):
        return "rejected"
    if isinstance(exc, TimeoutError | BlockStoreError | GradfedError):
        return "dropped"
    return "rejected"  # a foreign error from a decoder: the peer's bytes, never the round


def describe(exc: BaseException) -> str:
    """Return ``"<Class>: <message>"``, a sentence even when the error carries no message."""
    text = str(exc).strip()
    if not text:
        text = "timed out" if isinstance(exc, TimeoutError) else "raised without a message"
    return f"{type(exc).__name__}: {text}"


async def _stop(listener: asyncio.Future[Announcement | None]) -> Announcement | None:
    """Cancel a ``next_announcement`` wait and return what it took, if anything.

    A cancelled wait may still have taken an announcement (Python 3.11's ``wait_for`` returns
    the inner result when cancelled after it finished); it is marked seen by the filter, so
    dropping it here would lose that peer for the round (every re-publication a ``duplicate``).
    """
    listener.cancel()
    await asyncio.wait([listener])  # not ``await listener``: that would swallow our own cancel
    return None if listener.cancelled() else listener.result()


class Collection:
    """The bookkeeping of one round in progress on one node.

    Parameters
    ----------
    round_id
        The round.
    length
        The local gradient's length d (announcements of another length are rejected).
    accumulator
        Where fetched gradients go.
    runner
        The node (its store, gossip, config and future-round buffer).
    expected
        Peers the round waits for (until the deadline) beyond ``min_peers``.
    """

    def __init__(
        self,
        round_id: int,
        length: int,
        accumulator: GradientAccumulator,
        runner: CollectingNode,
        expected: set[str],
    ) -> None:
        self.round_id = round_id
        self.length = length
        self.accumulator = accumulator
        self.runner = runner
        self.expected = expected
        self.announced: dict[str, Announcement] = {}
        self.fetches: dict[str, asyncio.Task[None]] = {}
        self.contributors: dict[str, CID] = {}
        self.failures: dict[str, str] = {}
        self.dropped: set[str] = set()
        self.slow: set[str] = set()
        self.watches: dict[str, FetchWatch] = {}
        self.rejected: dict[str, str] = {}
        self.rejections: Counter[str] = Counter()
        self.throughput: dict[str, float] = {}

    def enough(self) -> bool:
        """Whether ``min_peers`` are in and every expected peer has been settled."""
        settled = set(self.contributors) | set(self.failures)
        return len(self.contributors) >= self.runner.config.min_peers and self.expected <= settled

    async def collect(self, deadline: float) -> None:
        """Take announcements and finished fetches until :meth:`enough`, with liveness.

        Announcements are taken until ``deadline``. Each fetch runs under
        :func:`~gradfed_ipfs.federated.besteffort.liveness.verdict`: cut off when too slow for its
        announced size, stalled, or still empty at the deadline; one whose blocks keep arriving
        goes on past the deadline. Once :meth:`enough`, fetches still in flight may run on
        until the deadline, not past it (a straggler costs at most the round's deadline).
        """
        gossip = self.runner.gossip
        while True:
            await self._enforce(deadline)
            now = time.monotonic()
            if self.enough() or (now >= deadline and not self.fetches):
                break
            waiters: set[asyncio.Future[object]] = {*self.fetches.values()}  # type: ignore[arg-type]
            listener = None
            if now < deadline:
                listener = asyncio.ensure_future(gossip.next_announcement(deadline - now))
                waiters.add(listener)  # type: ignore[arg-type]
            wake = min([deadline, *(w.next_check(deadline) for w in self.watches.values())])
            await asyncio.wait(
                waiters, timeout=max(0.0, wake - now) + 0.001, return_when=asyncio.FIRST_COMPLETED
            )
            if listener is not None and (found := await _stop(listener)) is not None:
                self.start_fetch(found)
            self._settle_done()
        while self.fetches and (now := time.monotonic()) < deadline:  # stragglers
            wake = min([deadline, *(w.next_check(deadline) for w in self.watches.values())])
            await asyncio.wait(
                list(self.fetches.values()),
                timeout=max(0.0, wake - now) + 0.001,
                return_when=asyncio.FIRST_COMPLETED,
            )
            self._settle_done()
            await self._enforce(deadline)
        for peer in list(self.fetches):
            await self._cut_off(peer, "still fetching at the round's deadline")

    async def _enforce(self, deadline: float) -> None:
        """Cut off every fetch whose :func:`verdict` says so."""
        self._settle_done()
        now = time.monotonic()
        for peer, watch in list(self.watches.items()):
            if peer in self.fetches and (why := verdict(watch, now, deadline)) is not None:
                await self._cut_off(peer, why)

    async def _cut_off(self, peer: str, why: str) -> None:
        """Cancel a fetch in flight: ``slow`` if some of its blocks arrived, else ``dropped``."""
        task = self.fetches.pop(peer)
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        watch = self.watches[peer]
        received, now = watch.progress.received, time.monotonic()
        if now - watch.progress.last < watch.stall_timeout:  # cut off while sending
            self._measure(peer, now)
        if received and "bytes" not in why:
            why = f"{why} after {received} of ~{watch.nbytes} bytes"
        self._fail(peer, "slow" if received else "dropped", why)

    def start_fetch(self, found: Announcement) -> None:
        """Start fetching an announced gradient, unless the announcement is unusable."""
        gossip, cfg = self.runner.gossip, self.runner.config
        if found.round > self.round_id:
            self.runner.future.hold(found)
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
            self._fail(
                found.peer_id, "rejected", f"announced length {found.length} != {self.length}"
            )
            return

        nbytes = 4 * found.length
        progress = ProgressStore(self.runner.store)
        meter = self.runner.throughput
        rate = meter.planning_rate(found.peer_id) if meter is not None else None
        self.watches[found.peer_id] = FetchWatch(
            progress, nbytes, cfg.fetch_deadline(nbytes, rate), cfg.stall_timeout
        )

        async def fetch() -> None:  # the coroutine is created only once the task runs
            await self.accumulator.add(
                found.peer_id, found.cid, progress, num_samples=found.num_samples
            )

        self.fetches[found.peer_id] = asyncio.create_task(fetch(), name=f"fetch-{found.peer_id}")

    def _settle_done(self) -> None:
        for peer, task in list(self.fetches.items()):
            if task.done():
                del self.fetches[peer]
                self._settle(peer, task)

    def _settle(self, peer: str, task: asyncio.Task[None]) -> None:
        """Record a finished fetch: a contribution, a dropped peer or a rejected gradient."""
        if task.cancelled():
            self._fail(peer, "dropped", "fetch cancelled")
            return
        exc = task.exception()
        if exc is None:
            self.contributors[peer] = self.announced[peer].cid
            self._measure(peer, self.watches[peer].progress.last)
            return
        if not isinstance(exc, Exception):
            raise exc  # KeyboardInterrupt, SystemExit: not the peer's doing
        if not isinstance(exc, (GradfedError, TimeoutError, *PEER_DATA_ERRORS)):
            logger.warning("peer %s: unexpected %r while fetching", peer, exc, exc_info=exc)
        if isinstance(exc, BlockTimeout) and exc.peer is None:
            exc.peer = peer
        kind = classify(exc)
        if (
            kind == "dropped"
            and isinstance(exc, TimeoutError)
            and self.watches[peer].progress.received
        ):
            kind = "slow"  # its blocks were arriving: slow, not missing
        self._fail(peer, kind, describe(exc), type(exc).__name__)

    def _measure(self, peer: str, end: float) -> None:
        """Record the rate of ``peer``'s fetch, from its start to ``end``, in the runner's meter."""
        progress, meter = self.watches[peer].progress, self.runner.throughput
        if meter is not None:
            rate = meter.record(peer, progress.received, end - progress.started)
            if rate is not None:
                self.throughput[peer] = rate

    def _fail(self, peer: str, kind: str, why: str, reason: str = "announced_length") -> None:
        self.failures[peer] = why
        if kind == "dropped":
            self.dropped.add(peer)
        elif kind == "slow":
            self.slow.add(peer)
        else:
            self.rejected[peer] = why
            self.rejections[reason] += 1
        logger.info("peer %s excluded (%s): %s", peer, kind, why)
