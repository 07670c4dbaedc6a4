"""Progress-based liveness of one peer's fetch: slow is not missing, stalled is cut off.

A fetch is watched through a :class:`ProgressStore` (the node's store, counting the bytes of
every block that arrives). :func:`verdict` decides, at any instant, whether it may go on:

- it may take ``RoundConfig.fetch_deadline(nbytes, rate)`` seconds in all (``fetch_timeout``
  plus the announced size over ``min_throughput``, or over the peer's rate measured in earlier
  rounds when that is slower; see :mod:`.throughput`): a peer slower than that is *too slow*;
- it is *stalled* when no block arrived for ``stall_timeout`` seconds (from its start, before
  the first block);
- at the round's deadline, a fetch that has received nothing is cut off (the peer never
  answered), while one that is receiving goes on within the two bounds above.

A peer cut off after some of its bytes arrived is reported *slow*; one cut off with none, or
whose store said the blocks are not there, *dropped* (see :class:`RoundResult`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ..._types import CIDLike
from ...storage.base import UNSET, Block, BlockStore, StoreWrapper, Unset

__all__ = ["FetchWatch", "ProgressStore", "verdict"]


class ProgressStore(StoreWrapper):
    """A :class:`BlockStore` view of ``store`` that records when blocks arrive and how many bytes.

    Parameters
    ----------
    store
        The node's block store (every call is passed through).
    clock
        Monotonic seconds (``time.monotonic``; tests may pass their own).

    Attributes
    ----------
    started, last
        Clock readings at creation and at the last block's arrival (``started`` before any).
    received
        Bytes of the blocks that arrived so far.
    """

    def __init__(self, store: BlockStore, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(store)
        self.clock = clock
        self.started = self.last = clock()
        self.received = 0

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        """Get through the store; count the block's bytes when it arrives."""
        block = await self.store.get(cid, timeout=timeout)
        self.received += len(block.data)
        self.last = self.clock()
        return block


@dataclass
class FetchWatch:
    """What :func:`verdict` needs about one fetch.

    Attributes
    ----------
    progress
        The fetch's store view (bytes received, last arrival).
    nbytes
        Announced size of the gradient (4 bytes per float32 value).
    allowed
        Seconds the whole fetch may take (``RoundConfig.fetch_deadline(nbytes, rate)``).
    stall_timeout
        Seconds without a block after which the fetch is stalled.
    """

    progress: ProgressStore
    nbytes: int
    allowed: float
    stall_timeout: float

    def next_check(self, round_deadline: float) -> float:
        """Return the clock reading at which :func:`verdict` may next change its answer."""
        p = self.progress
        due = min(p.started + self.allowed, p.last + self.stall_timeout)
        return min(due, round_deadline) if p.received == 0 else due


def verdict(watch: FetchWatch, now: float, round_deadline: float) -> str | None:
    """Return why the fetch must be cut off at ``now`` (a sentence), or ``None`` to go on."""
    p = watch.progress
    got = f"{p.received} of ~{watch.nbytes} bytes"
    if now >= p.started + watch.allowed and p.received == 0:
        return f"no block arrived in {now - p.started:.1f} s (its fetch deadline)"
    if now >= p.started + watch.allowed:
        return (
            f"too slow: {got} in {now - p.started:.1f} s, allowed {watch.allowed:.1f} s "
            "for its announced size"
        )
    if now >= p.last + watch.stall_timeout:
        return f"stalled: no block for {now - p.last:.1f} s after {got}"
    if p.received == 0 and now >= round_deadline:
        return "still fetching at the round's deadline: no block arrived"
    return None
