"""``RoundRunner`` with SecAgg switched on, alone and with central DP on the secure sum.

In memory each node has its own block store (a miss is served from the others', like bitswap)
and its own pubsub endpoint; one round runs over three Kubo nodes.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gradfed_ipfs import DifferentialPrivacy, MemoryPubsubBus, PrivacyBudgetExhausted
from gradfed_ipfs.errors import SecureAggregationError
from gradfed_ipfs.federated.besteffort import (
    GossipModelSync,
    RoundConfig,
    RoundResult,
    RoundRunner,
    SecureOptions,
)
from gradfed_ipfs.federated.besteffort.secure import protocol_config
from gradfed_ipfs.federated.secagg import FixedPoint
from gradfed_ipfs.federated.secagg_round import SecAggSettings
from gradfed_ipfs.federated.secagg_round.peer import SecureRoundPeer
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore
from tests.federated.besteffort.test_dp_round import DELTA, make_dp, reference_epsilon
from tests.federated.secagg.test_secure_aggregation import rb, tolerance
from tests.federated.secagg_round.test_round import RecordingStore

D = 2_000
SESSION = "private-sess"
CLIP, Z = 1.0, 1.1
ROUND = 4


def secure_config(clients: list[str], threshold: int, **timing: float) -> RoundConfig:
    options = SecureOptions(tuple(clients), clients[0], threshold, SecAggSettings(**timing))  # type: ignore[arg-type]
    return RoundConfig(secure=options, republish_interval=0.02, subscriber_timeout=1.0)


def memory_nodes(
    names: list[str], dps: list[DifferentialPrivacy | None], cfg: RoundConfig
) -> tuple[MemoryPubsubBus, dict[str, RecordingStore], dict[str, RoundRunner]]:
    bus = MemoryPubsubBus()
    backing = {n: MemoryBlockStore() for n in names}
    stores = {n: RecordingStore(backing[n], [backing[o] for o in names if o != n]) for n in names}
    runners = {
        n: RoundRunner(
            stores[n],  # type: ignore[arg-type]
            GossipModelSync(n, bus.endpoint(n), session_id=SESSION),
            replace(cfg, dp=dp),
            randbytes=rb(40 + i),
        )
        for i, (n, dp) in enumerate(zip(names, dps, strict=True))
    }
    return bus, stores, runners


async def run_all(
    runners: dict[str, RoundRunner], grads: dict[str, np.ndarray]
) -> dict[str, RoundResult]:
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(r.run_round(ROUND, grads[n]) for n, r in runners.items())),
            15.0,
        )
    finally:
        for runner in runners.values():
            await runner.aclose()
            await runner.gossip.aclose()
    return dict(zip(runners, results, strict=True))


def clipped(vector: np.ndarray, clip: float) -> np.ndarray:
    vec = vector.astype(np.float64)
    return (vec * min(1.0, clip / float(np.linalg.norm(vec)))).astype(np.float32)


async def test_secure_round_via_runner_gives_the_plain_mean() -> None:
    names = [f"peer-{i}" for i in range(3)]
    rng = np.random.default_rng(1)
    grads = {n: rng.normal(0.0, 1.0, D).astype(np.float32) for n in names}
    _, stores, runners = memory_nodes(names, [None] * 3, secure_config(names, 2))
    results = await run_all(runners, grads)

    agg = results["peer-0"]
    exact = np.sum([g.astype(np.float64) for g in grads.values()], axis=0)
    assert agg.aggregate.dtype == np.float32
    assert agg.aggregate.shape == (D,)
    assert np.all(
        np.abs(agg.aggregate * 3 - exact) <= 3 * tolerance(FixedPoint(3, 8.0, 32), 3, exact)
    )
    assert len(agg.participants) == 3
    assert agg.dropped == []
    assert agg.epsilon is None
    assert sorted(agg.contributors) == ["peer-1", "peer-2"]
    for name in ("peer-1", "peer-2"):  # pure clients: no sum is published to them
        assert results[name].aggregate.shape == (0,)
        assert len(results[name].participants) == 1
    for name, result in results.items():  # local_cid is the node's masked block, not its vector
        block = await stores[name].own.get(result.local_cid)
        assert grads[name].astype("<f4").tobytes()[:32] not in block.data


async def test_secure_round_via_runner_reports_the_dropped_peer() -> None:
    names = [f"peer-{i}" for i in range(4)]
    rng = np.random.default_rng(2)
    grads = {n: rng.normal(0.0, 1.0, D).astype(np.float32) for n in names}
    cfg = secure_config(names, 3, mask_timeout=0.5, response_timeout=1.0)
    bus, stores, runners = memory_nodes(names[:3], [None] * 3, cfg)
    leaver_store = RecordingStore(MemoryBlockStore(), [s.own for s in stores.values()])
    for store in stores.values():
        store.network.append(leaver_store.own)
    leaver = SecureRoundPeer(
        leaver_store,  # type: ignore[arg-type]
        bus.endpoint("peer-3"),
        protocol_config(cfg, SESSION, ROUND, D),
        randbytes=rb(9),
    )

    async def leave() -> None:  # shares its keys, then vanishes before masking
        await leaver.start()
        await leaver.share_keys()
        await leaver.aclose()

    results, _ = await asyncio.gather(run_all(runners, grads), leave())
    agg = results["peer-0"]
    assert agg.dropped == ["peer-3"]
    assert agg.missing == ["peer-3"]
    assert len(agg.participants) == 3
    exact = np.sum([grads[n].astype(np.float64) for n in names[:3]], axis=0)
    assert np.all(
        np.abs(agg.aggregate * 3 - exact) <= 3 * tolerance(FixedPoint(4, 8.0, 32), 3, exact)
    )


async def test_dp_secure_round_clips_before_masking_noises_the_sum_and_reports_epsilon() -> None:
    names = [f"peer-{i}" for i in range(3)]
    rng = np.random.default_rng(3)
    grads = {n: rng.normal(0.0, 0.01, D).astype(np.float32) for n in names}
    grads["peer-2"] = (grads["peer-2"] * 1e5).astype(np.float32)  # norm ~ 4500 >> C
    dps = [make_dp(100 + i, z=Z, clip=CLIP, epsilon=10.0) for i in range(3)]
    _, _, runners = memory_nodes(names, list(dps), secure_config(names, 2))
    results = await run_all(runners, grads)

    agg = results["peer-0"]
    clipped_sum = np.sum([clipped(g, CLIP).astype(np.float64) for g in grads.values()], axis=0)
    noise = np.random.default_rng(100).normal(0.0, Z * CLIP, size=D)  # the aggregator's dp rng
    expected = (clipped_sum + noise) / 3
    # Clipping: the huge client counts for at most C; unclipped its term alone would be ~1e3.
    step = tolerance(FixedPoint(3, 8.0, 32), 3, clipped_sum)
    assert np.all(np.abs(agg.aggregate - expected) <= step / 3 + np.abs(expected) * 2.0**-22)
    # Noise: std of (release - clipped mean) is zC/n.
    residual = agg.aggregate.astype(np.float64) - clipped_sum / 3
    assert float(np.std(residual)) == pytest.approx(Z * CLIP / 3, rel=0.1)
    assert abs(float(np.mean(residual))) < 5 * Z * CLIP / 3 / np.sqrt(D)
    # Accounting: one Gaussian release at z, charged to the aggregator only.
    assert agg.epsilon == pytest.approx(reference_epsilon(Z, 1), rel=1e-9)
    assert agg.delta == DELTA
    assert agg.dropped == []
    assert dps[0].spent()[0] == agg.epsilon
    for i in (1, 2):
        assert results[names[i]].epsilon is None
        assert dps[i].spent() == (0.0, 0.0)


async def test_dp_secure_round_over_budget_is_refused_before_anything_is_released() -> None:
    names = [f"peer-{i}" for i in range(3)]
    rng = np.random.default_rng(4)
    grads = {n: rng.normal(0.0, 1.0, D).astype(np.float32) for n in names}
    # z = 0.5 costs far more than epsilon = 0.5 in one release.
    dps = [make_dp(200 + i, z=0.5, clip=CLIP, epsilon=0.5) for i in range(3)]
    cfg = secure_config(names, 2, phase_timeout=0.3)
    _, stores, runners = memory_nodes(names, list(dps), cfg)
    try:
        outcomes = await asyncio.gather(
            *(r.run_round(ROUND, grads[n]) for n, r in runners.items()),
            return_exceptions=True,
        )
    finally:
        for runner in runners.values():
            await runner.aclose()
            await runner.gossip.aclose()
    assert isinstance(outcomes[0], PrivacyBudgetExhausted)
    assert all(isinstance(o, SecureAggregationError) for o in outcomes[1:])
    assert stores["peer-0"].stored == []  # the aggregator posted nothing, not even its keys
    assert all(not any(b.startswith(b"ARROW1") for b in s.stored) for s in stores.values())
    assert dps[0].spent() == (0.0, 0.0)


@pytest.mark.kubo
async def test_dp_secure_round_over_three_kubo_nodes_reports_epsilon(
    kubo_swarm3, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    ids = [n.peer_id for n in kubo_swarm3]
    session = f"dp-secagg-{tmp_path.name}"
    options = SecureOptions(tuple(ids), ids[0], 2, SecAggSettings(phase_timeout=15.0))
    rng = np.random.default_rng(5)
    grads = {p: rng.normal(0.0, 1.0, D).astype(np.float32) for p in ids}  # norms ~45 >> C
    dps = [make_dp(300 + i, z=Z, clip=CLIP, epsilon=10.0) for i in range(3)]
    stores = [KuboBlockStore(n.api_url, timeout=15.0) for n in kubo_swarm3]
    transports = [KuboPubsub(n.api_url) for n in kubo_swarm3]
    runners = [
        RoundRunner(
            s,
            GossipModelSync(p, t, session_id=session),
            RoundConfig(secure=options, dp=dp, republish_interval=0.3),
            randbytes=rb(i),
        )
        for i, (p, s, t, dp) in enumerate(zip(ids, stores, transports, dps, strict=True))
    ]
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(r.run_round(0, grads[p]) for p, r in zip(ids, runners, strict=True))),
            120.0,  # above the secure phases' 15 s deadlines added up: a stuck phase names itself
        )
        agg = results[0]
        assert agg.epsilon == pytest.approx(reference_epsilon(Z, 1), rel=1e-9)
        assert agg.delta == DELTA
        assert len(agg.participants) == 3
        assert agg.dropped == []
        clipped_sum = np.sum([clipped(g, CLIP).astype(np.float64) for g in grads.values()], axis=0)
        noise = np.random.default_rng(300).normal(0.0, Z * CLIP, size=D)
        np.testing.assert_allclose(agg.aggregate, (clipped_sum + noise) / 3, atol=1e-5)
        assert [r.aggregate.shape for r in results[1:]] == [(0,), (0,)]
    finally:
        for runner in runners:
            await runner.aclose()
            await runner.gossip.aclose()
        for closable in [*stores, *transports]:
            await closable.aclose()
