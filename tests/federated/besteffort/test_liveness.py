"""Deadlines that scale with the work: slow-but-alive peers stay in, stalled ones are cut off.

In memory: one shared block store whose chosen blocks arrive one at a time with a delay (as a
bitswap peer sends them), stall, or never come; a pubsub bus; node "a" runs the round.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from gradfed_ipfs import ConfigError, MemoryPubsubBus
from gradfed_ipfs.federated.besteffort import RoundConfig, RoundRunner
from gradfed_ipfs.federated.besteffort.collect import describe
from gradfed_ipfs.federated.besteffort.liveness import FetchWatch, ProgressStore, verdict
from gradfed_ipfs.storage import UNSET, Block, MemoryBlockStore
from gradfed_ipfs.storage.dag import fetch_manifest, put_gradient, values_per_chunk
from tests.federated.besteffort.test_runner import nodes
from tests.helpers import FakeClock as Clock

CHUNK = 65_536
N = 8 * values_per_chunk(CHUNK)  # eight chunks per gradient
NBYTES = 4 * N

LIVE = RoundConfig(
    min_peers=1,
    collect_timeout=0.3,
    fetch_timeout=0.3,
    stall_timeout=1.5,
    min_throughput=1_000.0,  # allowed: 0.3 s + 2 MB / 1 kB/s, i.e. no size limit here
    subscriber_timeout=0.1,
    republish_interval=0.02,
)


class PacedStore(MemoryBlockStore):
    """A shared 'network': paced blocks arrive one at a time, ``pace`` s apart; some never."""

    def __init__(self, pace: float) -> None:
        super().__init__()
        self.pace = pace
        self.paced: set[bytes] = set()
        self.never: set[bytes] = set()
        self._wire = asyncio.Lock()  # the serving peer sends one block at a time

    async def get(self, cid: Any, *, timeout: Any = UNSET) -> Block:
        key = bytes(cid)
        if key in self.never:
            await asyncio.Event().wait()
        if key in self.paced:
            async with self._wire:
                await asyncio.sleep(self.pace)  # emulated transfer time of one block
        return await super().get(cid)


async def chunked(store: PacedStore, seed: int) -> tuple[Any, list[bytes], np.ndarray]:
    """Put a seeded eight-chunk gradient; return its CID, its chunk CIDs and the values."""
    values = np.random.default_rng(seed).standard_normal(N).astype(np.float32)
    cid = await put_gradient(store, values, chunk_bytes=CHUNK)
    manifest = await fetch_manifest(store, cid)
    return cid, [bytes(ref.cid) for ref in manifest.chunks], values


async def run_with_announcers(
    store: PacedStore, config: RoundConfig, peers: dict[str, Any], expected: list[str]
) -> tuple[Any, float]:
    """Node "a" runs round 0 while each of ``peers`` (name -> CID) keeps announcing."""
    bus = MemoryPubsubBus()
    a, *others = nodes(bus, ["a", *peers], "live")
    closed = asyncio.Event()
    announcers = [
        asyncio.create_task(
            g.announce_until(g.make_announcement(cid, 0, length=N), closed, interval=0.02)
        )
        for g, cid in zip(others, peers.values(), strict=True)
    ]
    started = time.monotonic()
    try:
        result = await RoundRunner(store, a, config).run_round(
            0, np.zeros(N, dtype=np.float32), expected_peers=expected
        )
    finally:
        closed.set()
        await asyncio.gather(*announcers)
        for g in (a, *others):
            await g.aclose()
    return result, time.monotonic() - started


async def test_a_peer_whose_blocks_keep_arriving_is_not_cut_off_by_fixed_timeouts() -> None:
    # Prepare: b's 8 chunks arrive 0.15 s apart (1.2 s in all): past collect_timeout and
    # fetch_timeout (0.3 s), each gap well inside stall_timeout (1.5 s).
    store = PacedStore(pace=0.15)
    cid, chunks, values = await chunked(store, 1)
    store.paced.update(chunks)
    # Execute
    result, elapsed = await run_with_announcers(store, LIVE, {"b": cid}, ["b"])
    # Assert: b is in (FedAvg of zeros and b), nobody slow or dropped, and it did take > 1 s.
    assert result.participants == ["a", "b"]
    assert (result.slow, result.dropped, result.failures) == ([], [], {})
    np.testing.assert_allclose(result.aggregate, values / 2, rtol=1e-6)
    assert elapsed > 8 * 0.15


async def test_stalled_peer_is_slow_and_silent_peer_is_dropped_separately() -> None:
    # Prepare: b is fast; c serves its manifest and first chunk, then nothing; ghost serves
    # nothing at all.
    store = PacedStore(pace=0.0)
    b_cid, _, b_values = await chunked(store, 2)
    c_cid, c_chunks, _ = await chunked(store, 3)
    ghost_cid, _, _ = await chunked(store, 4)
    store.never.update(c_chunks[1:])
    store.never.add(bytes(ghost_cid))
    config = replace(LIVE, stall_timeout=0.5)
    # Execute
    peers = {"b": b_cid, "c": c_cid, "ghost": ghost_cid}
    result, elapsed = await run_with_announcers(store, config, peers, ["b", "c", "ghost"])
    # Assert: c excluded for slowness (bytes had arrived), ghost for never answering.
    assert result.participants == ["a", "b"]
    assert result.slow == ["c"]
    assert result.dropped == ["ghost"]
    assert result.missing == ["c", "ghost"]
    assert result.failures["c"].startswith("stalled: no block for")
    assert "no block arrived" in result.failures["ghost"]
    assert sorted(result.stats.dropped_clients) == ["c", "ghost"]
    np.testing.assert_allclose(result.aggregate, b_values / 2, rtol=1e-6)
    assert elapsed < 60.0  # cut by the 0.5 s stall timeout, not its ~2000 s fetch deadline


async def test_peer_slower_than_min_throughput_for_its_size_is_reported_slow() -> None:
    # Prepare: b needs ~1.2 s; its deadline is 0.3 s + 2 MiB / 4 MB/s = ~0.82 s.
    store = PacedStore(pace=0.15)
    cid, chunks, _ = await chunked(store, 5)
    store.paced.update(chunks)
    config = replace(LIVE, min_peers=0, min_throughput=4e6)
    # Execute
    result, _ = await run_with_announcers(store, config, {"b": cid}, ["b"])
    # Assert
    assert result.slow == ["b"]
    assert result.dropped == []
    assert result.failures["b"].startswith("too slow:")
    assert result.participants == ["a"]


# ------------------------------------------------------------------ the pure parts


def test_fetch_deadline_grows_with_the_announced_size() -> None:
    config = RoundConfig(fetch_timeout=10.0, min_throughput=1e6)
    assert config.fetch_deadline(0) == 10.0
    assert config.fetch_deadline(40_000_000) == 50.0
    with pytest.raises(ConfigError, match="min_throughput"):
        RoundConfig(min_throughput=0.0)
    with pytest.raises(ConfigError, match="stall_timeout"):
        RoundConfig(stall_timeout=-1.0)


def watch(clock: Clock, *, received: int, last: float) -> FetchWatch:
    progress = ProgressStore(MemoryBlockStore(), clock)
    progress.received, progress.last = received, last
    return FetchWatch(progress, nbytes=1000, allowed=50.0, stall_timeout=10.0)


@pytest.mark.parametrize(
    ("now", "received", "last", "round_deadline", "expected"),
    [
        (105.0, 0, 100.0, 200.0, None),  # just started
        (130.0, 500, 125.0, 120.0, None),  # past the round's deadline but receiving
        (108.0, 0, 100.0, 105.0, "still fetching at the round's deadline"),  # never answered
        (136.0, 500, 125.0, 200.0, "stalled: no block for 11.0 s after 500 of ~1000 bytes"),
        (150.0, 900, 149.0, 200.0, "too slow: 900 of ~1000 bytes in 50.0 s"),
        (150.0, 0, 149.0, 200.0, "no block arrived in 50.0 s"),
    ],
)
def test_verdict(
    now: float, received: int, last: float, round_deadline: float, expected: str | None
) -> None:
    clock = Clock()
    w = watch(clock, received=received, last=last)
    why = verdict(w, now, round_deadline)
    if expected is None:
        assert why is None
    else:
        assert why is not None
        assert why.startswith(expected)


def test_next_check_is_the_earliest_instant_the_verdict_can_change() -> None:
    clock = Clock()
    assert watch(clock, received=0, last=100.0).next_check(105.0) == 105.0  # round deadline
    assert watch(clock, received=10, last=120.0).next_check(105.0) == 130.0  # stall
    assert watch(clock, received=10, last=145.0).next_check(105.0) == 150.0  # size deadline


async def test_progress_store_counts_arrived_bytes_and_their_time() -> None:
    clock, store = Clock(), MemoryBlockStore()
    block = Block.new(b"x" * 100)
    await store.put(block)
    progress = ProgressStore(store, clock)
    clock.now = 107.0
    assert (await progress.get(block.cid)).data == block.data
    assert (progress.received, progress.started, progress.last) == (100, 100.0, 107.0)


def test_failure_texts_are_never_empty() -> None:
    assert describe(TimeoutError()) == "TimeoutError: timed out"
    assert describe(RuntimeError("")) == "RuntimeError: raised without a message"
    assert describe(ValueError("bad length")) == "ValueError: bad length"
