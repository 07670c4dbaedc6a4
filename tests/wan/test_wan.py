"""Rounds and fetches over an emulated wide-area network (issue 18), ``GRADFED_WAN=1`` only.

One network for the module (``scripts/wan/setup.sh``: 3 peer namespaces behind a router,
100 Mbit/s per direction, TCP, every daemon configured with the project's
:data:`~gradfed_ipfs.kubo.WAN_TUNING`), re-shaped in place per test and always torn down. Every
client is its own process in a peer namespace (``benchmarks/bench_wan.py``'s workers); rounds
use ``RoundConfig``'s default deadlines (they scale with the announced size).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks import bench_wan
from gradfed_ipfs.kubo import WAN_TUNING
from tests.wan.profile import wan_skip_reason

pytestmark = pytest.mark.skipif(wan_skip_reason() is not None, reason=wan_skip_reason() or "")


@pytest.fixture(scope="module")
def network() -> Iterator[dict[str, Any]]:
    tuning = [arg for key, value in WAN_TUNING.config() for arg in ("-K", f"{key}={value}")]
    with bench_wan.wan("-n", "3", "-d", "75", "-r", "100mbit", *tuning) as state:
        yield state


def shape(delay_ms: int, loss_pct: float) -> dict[str, Any]:
    bench_wan.run_script("shape", "-d", str(delay_ms), "-l", str(loss_pct))
    return bench_wan.read_state()


def test_fetch_at_rtt_150_ms_reaches_0_8_of_raw_tcp(network: dict[str, Any]) -> None:
    state = shape(75, 0)
    link = bench_wan.measure_link(state, 40_000_000)
    fetch = bench_wan.measure_fetch(state, 10_000_000, reps=2, timeout=300.0)
    assert 140 < link["rtt_ms"] < 170, link  # the emulator does what it says
    assert fetch["mb_s"] >= 0.8 * link["mb_s"], (fetch, link)


@pytest.mark.parametrize(("delay_ms", "loss_pct", "d"), [(75, 0, 1_000_000), (25, 2, 250_000)])
def test_rounds_keep_every_peer(
    network: dict[str, Any], delay_ms: int, loss_pct: float, d: int
) -> None:
    state = shape(delay_ms, loss_pct)
    rounds = bench_wan.measure_round(state, d, rounds=2, timeout=300.0)
    assert "error" not in rounds, rounds
    assert rounds["participants"] == [3, 3], rounds
    assert rounds["agree"] == [True, True], rounds
    assert rounds["failures"] == [], rounds
