"""Issue 8, scenario 6 (reduced): simulated peers over the session's Kubo daemons.

``benchmarks/bench_load.py`` runs the full load (32 peers over 4 daemons, 5 rounds of 1M
floats, and the scaling over peers and d); this runs the same code with 6 peers over the
3-daemon session swarm, 2 rounds of 300k floats (two chunks each).
"""

from __future__ import annotations

import random

import pytest

from benchmarks.bench_load import run_load

pytestmark = pytest.mark.kubo


async def test_load_every_peer_aggregate_equals_reference(kubo_swarm3) -> None:  # type: ignore[no-untyped-def]
    result = await run_load(
        list(kubo_swarm3),
        peers=6,
        rounds=2,
        d=300_000,
        session=f"load-{random.Random(6).randrange(1 << 30)}",
        timeout=60.0,
    )
    print(result.summary())
    assert len(result.peer_latencies) == 12
    assert result.max_error < 1e-5
    # Every peer fetched every other peer's gradient once per round.
    assert result.rpc_bytes == 2 * 6 * 5 * 4 * 300_000
    # Gradients hosted on other daemons crossed bitswap at least once per daemon pair.
    assert result.bitswap_bytes > 0
