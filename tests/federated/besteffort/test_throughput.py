"""Measured per-peer throughput: a peer slower than ``min_throughput`` gets a longer deadline.

The meter's arithmetic is checked by hand; the round test reuses the liveness tests' paced
in-memory store (blocks arrive one at a time, ``pace`` seconds apart).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gradfed_ipfs import ConfigError, MemoryPubsubBus
from gradfed_ipfs.federated.besteffort import RoundConfig, RoundRunner, ThroughputMeter
from gradfed_ipfs.federated.besteffort.collect import Collection
from gradfed_ipfs.federated.besteffort.liveness import FetchWatch, ProgressStore
from gradfed_ipfs.storage import MemoryBlockStore
from tests.federated.besteffort.test_liveness import LIVE, NBYTES, N, PacedStore, chunked
from tests.federated.besteffort.test_runner import nodes

# ------------------------------------------------------------------ the meter


def test_first_sample_is_the_rate_then_an_ewma() -> None:
    meter = ThroughputMeter(min_bytes=0)
    assert meter.rate("b") is None
    assert meter.planning_rate("b") is None
    assert meter.record("b", 1_000_000, 1.0) == 1e6
    assert meter.rate("b") == 1e6
    assert meter.record("b", 1_000_000, 2.0) == 0.5e6
    assert meter.rate("b") == pytest.approx(0.7 * 1e6 + 0.3 * 0.5e6)
    assert meter.planning_rate("b") == pytest.approx(0.5 * 0.85e6)
    assert meter.rates() == {"b": pytest.approx(0.85e6)}


def test_one_fast_outlier_never_raises_the_planned_rate_above_the_last_estimate() -> None:
    meter = ThroughputMeter(min_bytes=0)
    meter.record("b", 1_000_000, 1.0)
    # Execute: one transfer 1000x faster (e.g. the blocks were already cached).
    meter.record("b", 1_000_000, 0.001)
    # Assert: counted as 3x at most: 0.7 * 1e6 + 0.3 * 3e6, planned with half of it.
    assert meter.rate("b") == pytest.approx(1.6e6)
    planned = meter.planning_rate("b")
    assert planned is not None
    assert planned < 1e6


def test_one_slow_outlier_moves_the_estimate_by_at_most_one_minus_alpha() -> None:
    meter = ThroughputMeter(min_bytes=0)
    meter.record("b", 1_000_000, 1.0)
    meter.record("b", 1_000_000, 1000.0)  # 1 kB/s once
    assert meter.rate("b") == pytest.approx(0.7e6 + 0.3e3)


def test_a_lasting_change_is_followed_within_a_few_rounds() -> None:
    meter = ThroughputMeter(min_bytes=0)
    meter.record("b", 1_000_000, 1.0)
    for _ in range(10):
        meter.record("b", 1_000_000, 0.1)  # now 10 MB/s for good
    rate = meter.rate("b")
    assert rate is not None
    assert 0.9e7 < rate <= 1e7


@pytest.mark.parametrize(
    ("nbytes", "seconds"),
    [
        (100_000, 1.0),
        (262_143, 0.001),
        (1_000_000, 0.0),
        (1_000_000, -1.0),
        (1_000_000, math.inf),
        (1_000_000, math.nan),
    ],
)
def test_tiny_transfers_and_meaningless_durations_are_not_samples(
    nbytes: int, seconds: float
) -> None:
    meter = ThroughputMeter()  # min_bytes 256 KiB: smaller fetches are mostly latency
    assert meter.record("b", nbytes, seconds) is None
    assert meter.rate("b") is None


def test_the_peer_measured_longest_ago_is_forgotten_first() -> None:
    meter = ThroughputMeter(min_bytes=0, max_peers=2)
    meter.record("a", 10, 1.0)
    meter.record("b", 20, 1.0)
    meter.record("a", 10, 1.0)  # a is now the most recent
    meter.record("c", 30, 1.0)
    assert sorted(meter.rates()) == ["a", "c"]


def test_meter_settings_are_checked() -> None:
    for bad in (
        {"alpha": 0.0},
        {"max_jump": 0.5},
        {"safety": 1.5},
        {"min_bytes": -1},
        {"max_peers": 0},
    ):
        with pytest.raises(ConfigError):
            ThroughputMeter(**bad)


# ------------------------------------------------------------------ the deadline


@pytest.mark.parametrize("rate", [None, 0.0, -5.0, math.nan, 1.0, 5e5, 1e6, 2e6, 1e12, math.inf])
@pytest.mark.parametrize("nbytes", [0, 1_000, 40_000_000])
def test_a_measured_rate_never_shortens_the_configured_deadline(
    rate: float | None, nbytes: int
) -> None:
    config = RoundConfig(fetch_timeout=10.0, min_throughput=1e6, max_fetch_deadline=120.0)
    floor = config.fetch_deadline(nbytes)
    allowed = config.fetch_deadline(nbytes, rate)
    assert floor <= allowed <= max(floor, 120.0)


def test_a_peer_slower_than_min_throughput_gets_a_proportionally_longer_deadline() -> None:
    config = RoundConfig(fetch_timeout=10.0, min_throughput=1e6, max_fetch_deadline=200.0)
    assert config.fetch_deadline(40_000_000) == 50.0
    assert config.fetch_deadline(40_000_000, rate=0.5e6) == 90.0
    assert config.fetch_deadline(40_000_000, rate=0.25e6) == 170.0
    assert config.fetch_deadline(40_000_000, rate=0.1e6) == 200.0  # capped
    assert config.fetch_deadline(40_000_000, rate=4e6) == 50.0  # faster: the floor
    # A cap below the configured deadline never shortens it.
    assert replace(config, max_fetch_deadline=30.0).fetch_deadline(40_000_000, 0.1e6) == 50.0
    with pytest.raises(ConfigError, match="max_fetch_deadline"):
        RoundConfig(max_fetch_deadline=0.0)


def test_the_switch_turns_the_meter_off() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    (a,) = nodes(bus, ["a"], "switch")
    assert isinstance(RoundRunner(store, a, RoundConfig()).throughput, ThroughputMeter)
    assert RoundRunner(store, a, RoundConfig(measure_throughput=False)).throughput is None


# ------------------------------------------------------------------ what a round records


async def cut_off_after(seconds_since_last_block: float) -> tuple[Collection, ThroughputMeter]:
    """Cut off a fetch that got 1 MB in its 2 s, its last block ``seconds_since_…`` ago."""
    meter = ThroughputMeter()
    runner: Any = SimpleNamespace(throughput=meter, config=LIVE)
    unused: Any = None  # no fetch runs: the accumulator is never called
    state = Collection(0, N, accumulator=unused, runner=runner, expected={"b"})
    progress = ProgressStore(MemoryBlockStore())
    now = time.monotonic()
    progress.started, progress.last = now - 2.0, now - seconds_since_last_block
    progress.received = 1_000_000
    state.watches["b"] = FetchWatch(progress, 2_000_000, allowed=2.0, stall_timeout=1.0)
    state.fetches["b"] = asyncio.create_task(asyncio.Event().wait())
    await state._cut_off("b", "too slow")
    return state, meter


async def test_a_fetch_cut_off_while_sending_is_measured_a_stalled_one_is_not() -> None:
    sending, meter = await cut_off_after(0.1)
    assert sending.slow == {"b"}
    assert 0.4e6 < sending.throughput["b"] <= 0.5e6  # 1 MB over (at least) its 2 s
    assert meter.rate("b") == sending.throughput["b"]
    stalled, meter = await cut_off_after(1.5)
    assert stalled.slow == {"b"}
    assert (stalled.throughput, meter.rates()) == ({}, {})


async def test_a_slow_peer_measured_in_one_round_is_waited_for_in_the_next() -> None:
    # Prepare: b's 8 chunks arrive 0.1 s apart (~0.8 s, ~0.65 MB/s); the configured deadline
    # is 0.3 s + ~0.52 MB / 2 MB/s = ~0.56 s, so a fixed deadline cuts b off every round.
    store = PacedStore(pace=0.1)
    config = replace(LIVE, min_peers=0, min_throughput=2e6)
    bus = MemoryPubsubBus()
    a, b = nodes(bus, ["a", "b"], "measured")
    runner = RoundRunner(store, a, config)
    results, elapsed = [], []
    try:
        for round_id in (0, 1):
            cid, chunks, values = await chunked(store, 10 + round_id)
            store.paced.update(chunks)
            closed = asyncio.Event()
            announcement = b.make_announcement(cid, round_id, length=N)
            announcer = asyncio.create_task(b.announce_until(announcement, closed, interval=0.02))
            started = time.monotonic()
            try:
                results.append(
                    await runner.run_round(
                        round_id, np.zeros(N, dtype=np.float32), expected_peers=["b"]
                    )
                )
            finally:
                elapsed.append(time.monotonic() - started)
                closed.set()
                await announcer
    finally:
        await runner.aclose()
        for g in (a, b):
            await g.aclose()
    first, second = results
    # Assert: round 0 cut b off at the configured deadline but measured it while sending...
    assert first.slow == ["b"]
    assert first.participants == ["a"]
    assert first.failures["b"].startswith("too slow:")
    assert 0 < first.throughput["b"] < config.min_throughput
    # ...so round 1 planned b's fetch with half its rate, and b is in, past the fixed deadline.
    assert second.participants == ["a", "b"]
    assert (second.slow, second.dropped) == ([], [])
    np.testing.assert_allclose(second.aggregate, values / 2, rtol=1e-6)
    assert elapsed[1] > config.fetch_deadline(NBYTES)
    assert 0 < second.throughput["b"] < config.min_throughput
    assert runner.throughput is not None
    assert set(runner.throughput.rates()) == {"b"}
