"""Which of a round's contributions are fetched and verified, kept up to date as they come.

The roster step asks at every board change whether enough contributions are ready. Walking
every contribution each time costs O(N) a wake-up, so O(N²) a round per member (at N = 256
members over 8 daemons the roster phase did not end in 25 minutes). :class:`ReadyTracker`
reads only what changed: the contributions added to the board since its last look (a round's
board only adds them) and the fetches that finished since (their done callbacks queue them).
Its count decides *when* the roster step looks; what a roster lists is still computed in full
from the board, once (``RosterPhase._ready``), so a tracker that lags can only delay a roster.
"""

from __future__ import annotations

import asyncio
import itertools

from multiformats import CID

from ...._types import FloatArray
from ...exchange.fetcher import ContributionFetcher, is_transient
from ..context import RoundContext
from .coordinator import Contribution

__all__ = ["Entry", "ReadyTracker"]

Entry = tuple[CID, int, bytes | None]
"""A contribution as a roster lists it: CID, weight and its owner's signature."""


class ReadyTracker:
    """A round's contributions on its base whose fetch verified (:attr:`ready`).

    Same rules as a full walk: this peer's own entry counts, proven liars and entries above
    ``max_weight`` never do (the latter are put in ``ctx.rejected``), a contribution whose
    fetch failed for good is rejected, one that failed transiently is fetched again at each
    :meth:`update`. Contributions of peers already rejected are not fetched (but count once a
    fetch started elsewhere, e.g. a roster's, verifies them).

    Parameters
    ----------
    ctx
        The round.
    contributions
        The board's contributions of the round (read, never changed; only ever added to).
    fetcher
        The session's contribution fetcher.
    """

    def __init__(
        self,
        ctx: RoundContext,
        contributions: dict[str, Contribution],
        fetcher: ContributionFetcher,
    ) -> None:
        self._ctx, self._contributions, self._fetcher = ctx, contributions, fetcher
        self._base, self._d = bytes(ctx.base), ctx.d
        self.reset()

    def reset(self) -> None:
        """Forget what was taken in and walk the board again at the next :meth:`update`.

        For a board whose entries changed rather than grew (a full walk disagreed).
        """
        self._seen: set[str] = set()  # board peers looked at
        self._entries: dict[str, Entry] = {}
        self._tasks: dict[str, asyncio.Task[FloatArray]] = {}  # the fetch each peer waits on
        self._finished: list[str] = []  # peers whose fetch finished since the last update
        self.retry: set[str] = set()  # failed transiently: fetched again at the next update
        self._unstarted: set[str] = set()  # rejected when seen: counted if fetched elsewhere
        self.ready: dict[str, Entry] = {}
        own = self._ctx.own
        self._see(self._ctx.peer, (own.cid, own.weight, own.signature))

    def update(self) -> None:
        """Take in the contributions added and the fetches finished since the last call."""
        new = len(self._contributions) - len(self._seen)
        if new > 0:
            added = list(itertools.islice(reversed(self._contributions.items()), new))
            if any(peer in self._seen for peer, _ in added):  # not only added to: look again
                self.reset()
                added = list(self._contributions.items())
            for peer, heard in reversed(added):
                self._seen.add(peer)
                if bytes(heard.base) == self._base:
                    self._see(peer, (heard.cid, heard.weight, heard.signature))
        finished, self._finished = self._finished, []
        for peer in finished:
            self._settle(peer)
        for peer in list(self.retry):
            self.retry.discard(peer)
            if peer not in self._ctx.rejected:
                self._track(peer, self._fetcher.fetch(self._entries[peer][0], self._d))
        for peer in list(self._unstarted):
            task = self._fetcher.get(self._entries[peer][0])
            if task is not None:
                self._unstarted.discard(peer)
                self._track(peer, task)

    def _see(self, peer: str, entry: Entry) -> None:
        ctx = self._ctx
        if peer in ctx.excluded:  # proven liars (this one too): no roster may list them
            return
        weight, most = entry[1], ctx.config.max_weight
        if weight > most:  # no roster may list it either
            ctx.rejected[peer] = f"weight {weight} > max_weight {most}"
            return
        self._entries[peer] = entry
        if peer in ctx.rejected:
            self._unstarted.add(peer)
        else:
            self._track(peer, self._fetcher.fetch(entry[0], self._d))

    def _track(self, peer: str, task: asyncio.Task[FloatArray]) -> None:
        if self._tasks.get(peer) is task and not task.done():
            return  # its callback is set
        self._tasks[peer] = task
        if task.done():
            self._settle(peer)
            return

        def finished(done: asyncio.Task[FloatArray]) -> None:
            if self._tasks.get(peer) is done:  # not a fetch replaced since
                self._finished.append(peer)

        task.add_done_callback(finished)

    def _settle(self, peer: str) -> None:
        task, entry = self._tasks[peer], self._entries[peer]
        if not task.cancelled() and task.exception() is None:
            self.ready[peer] = entry
            return
        self.ready.pop(peer, None)
        if is_transient(task):
            self.retry.add(peer)
        else:
            self._ctx.rejected[peer] = f"contribution {entry[0]}: {task.exception()}"
