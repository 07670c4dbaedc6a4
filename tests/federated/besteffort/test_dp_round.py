"""Client-level DP-FedAvg in ``RoundRunner`` rounds: in memory, and one round over Kubo."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import dp_accounting
import numpy as np
import pytest

from gradfed_ipfs import (
    ConfigError,
    DifferentialPrivacy,
    InvalidGradient,
    MemoryPubsubBus,
    PrivacyBudgetExhausted,
)
from gradfed_ipfs.federated.accumulate import StreamingAccumulator
from gradfed_ipfs.federated.besteffort import GossipModelSync, RoundConfig, RoundRunner
from gradfed_ipfs.federated.privacy import AccountingMode
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.seed import BackwardPassConfig
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore

DELTA = 1e-5

FAST = RoundConfig(
    min_peers=2,
    collect_timeout=5.0,
    fetch_timeout=1.0,
    subscriber_timeout=1.0,
    republish_interval=0.02,
)


def make_dp(seed: int, *, z: float, clip: float, epsilon: float = 1e6) -> DifferentialPrivacy:
    return DifferentialPrivacy(epsilon, DELTA, clip, noise_multiplier=z, rng=seed)


def reference_epsilon(z: float, rounds: int) -> float:
    """ε after ``rounds`` Gaussian releases at multiplier z, straight from dp_accounting."""
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(z), rounds)
    return float(accountant.get_epsilon(DELTA))


def reference_dp_mean(grads: dict[str, np.ndarray], clip: float, z: float, seed: int) -> np.ndarray:
    """Clip each (sorted by id), sum in float64, add N(0, (zC)^2) from ``seed``, divide by n."""
    total = np.zeros(next(iter(grads.values())).size, dtype=np.float64)
    for peer in sorted(grads):
        vec = grads[peer].astype(np.float64)
        total += vec * min(1.0, clip / float(np.linalg.norm(vec)))
    total += np.random.default_rng(seed).normal(0.0, z * clip, size=total.size)
    return (total.astype(np.float32) / np.float32(len(grads))).astype(np.float32)


def memory_runners(
    names: list[str], session: str, dps: list[DifferentialPrivacy], config: RoundConfig = FAST
) -> tuple[MemoryBlockStore, list[GossipModelSync], list[RoundRunner]]:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    gossips = [GossipModelSync(n, bus.endpoint(n), session_id=session) for n in names]
    runners = [
        RoundRunner(store, g, replace(config, dp=dp)) for g, dp in zip(gossips, dps, strict=True)
    ]
    return store, gossips, runners


async def close_all(runners: list[RoundRunner], gossips: list[GossipModelSync]) -> None:
    for runner in runners:
        await runner.aclose()
    for gossip in gossips:
        await gossip.aclose()


async def test_dp_round_noise_has_scale_z_c_over_n_and_is_reproducible() -> None:
    # Prepare: norms below C, so clipping is a no-op and the residual is pure noise.
    d, clip, z = 20_000, 50.0, 1.3
    rng = np.random.default_rng(7)
    grads = {n: rng.standard_normal(d).astype(np.float32) * 0.1 for n in ("a", "b", "c")}
    dps = [make_dp(seed, z=z, clip=clip) for seed in (11, 12, 13)]
    _, gossips, runners = memory_runners(list(grads), "dp-noise", dps)
    # Execute
    results = await asyncio.gather(
        *(r.run_round(0, grads[n], num_samples=5) for r, n in zip(runners, grads, strict=True))
    )
    # Assert: each node's aggregate is the clipped mean plus its own seeded N(0, (zC/3)^2).
    clean = np.mean([grads[n].astype(np.float64) for n in sorted(grads)], axis=0)
    for result, seed in zip(results, (11, 12, 13), strict=True):
        assert len(result.participants) == 3
        expected = reference_dp_mean(grads, clip, z, seed)
        np.testing.assert_allclose(result.aggregate, expected, rtol=1e-6, atol=1e-5)
        residual = result.aggregate.astype(np.float64) - clean
        assert abs(residual.mean()) < 4 * z * clip / 3 / np.sqrt(d)
        assert residual.std() == pytest.approx(z * clip / 3, rel=0.03)
    await close_all(runners, gossips)


async def test_dp_round_clips_each_contribution_and_ignores_sample_counts() -> None:
    # Prepare: norms 10, 100, 0.5 against C = 1; a small noise multiplier.
    d, clip, z = 64, 1.0, 0.01
    units = np.eye(d, dtype=np.float32)
    grads = {"a": units[0] * 10, "b": units[1] * 100, "c": units[2] * 0.5}
    dps = [make_dp(seed, z=z, clip=clip) for seed in (1, 2, 3)]
    _, gossips, runners = memory_runners(list(grads), "dp-clip", dps)
    # Execute: wildly different sample counts, which plain FedAvg would use as weights.
    results = await asyncio.gather(
        *(
            r.run_round(0, grads[n], num_samples=count)
            for r, n, count in zip(runners, grads, (1, 1000, 10), strict=True)
        )
    )
    # Assert: the equal-weight mean of the clipped vectors (1, 1 and 0.5 on three axes).
    expected = (units[0] + units[1] + units[2] * 0.5) / 3
    for result, seed in zip(results, (1, 2, 3), strict=True):
        np.testing.assert_allclose(result.aggregate, expected, atol=6 * z * clip / 3)
        exact = reference_dp_mean(grads, clip, z, seed)
        np.testing.assert_allclose(result.aggregate, exact, rtol=1e-6, atol=1e-7)
    await close_all(runners, gossips)


async def test_dp_epsilon_grows_over_rounds_and_matches_the_accountant() -> None:
    z, clip = 1.1, 1.0
    dps = [make_dp(seed, z=z, clip=clip, epsilon=50.0) for seed in (5, 6, 7)]
    _, gossips, runners = memory_runners(["a", "b", "c"], "dp-eps", dps)
    grads = [np.full(32, v, dtype=np.float32) for v in (0.1, 0.2, 0.3)]
    spent = []
    for round_id in range(3):
        results = await asyncio.gather(
            *(r.run_round(round_id, g) for r, g in zip(runners, grads, strict=True))
        )
        for result, dp in zip(results, dps, strict=True):
            assert result.epsilon == dp.spent()[0]
            assert result.delta == DELTA
            assert len(result.participants) == 3
        spent.append(results[0].epsilon)
        assert spent[-1] == pytest.approx(reference_epsilon(z, round_id + 1), rel=1e-9)
    assert spent[0] < spent[1] < spent[2]
    assert len(dps[0].budget.accountant.events) == 3  # type: ignore[union-attr]
    await close_all(runners, gossips)


async def test_round_beyond_the_budget_is_refused_before_anything_is_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: a budget that fits exactly two rounds at z = 2.
    z, clip = 2.0, 1.0
    budget = reference_epsilon(z, 2) * (1 + 1e-6)
    assert reference_epsilon(z, 3) > budget
    dps = [make_dp(seed, z=z, clip=clip, epsilon=budget) for seed in (1, 2)]
    config = replace(FAST, min_peers=1)
    store, gossips, runners = memory_runners(["a", "b"], "dp-refuse", dps, config)
    grads = [np.full(16, v, dtype=np.float32) for v in (0.5, -0.5)]
    for round_id in range(2):
        await asyncio.gather(
            *(r.run_round(round_id, g) for r, g in zip(runners, grads, strict=True))
        )
    blocks_before = len(store.blocks)
    spent_before = dps[0].spent()
    announced: list[int] = []
    original = gossips[0].make_announcement
    monkeypatch.setattr(
        gossips[0], "make_announcement", lambda *a, **k: announced.append(1) or original(*a, **k)
    )
    # Execute / Assert: the third round raises, stores and charges nothing.
    with pytest.raises(PrivacyBudgetExhausted):
        await runners[0].run_round(2, np.full(16, 123.0, dtype=np.float32))
    assert len(store.blocks) == blocks_before
    assert dps[0].spent() == spent_before
    assert len(dps[0].budget.accountant.events) == 2  # type: ignore[union-attr]
    assert announced == []
    await close_all(runners, gossips)


async def test_dp_round_needs_rdp_accounting_and_a_holding_accumulator() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    gossip = GossipModelSync("a", bus.endpoint("a"), session_id="dp-bad")

    def streaming() -> StreamingAccumulator:
        return StreamingAccumulator("dp-bad", BackwardPassConfig(), local_peer_id="a")

    legacy = DifferentialPrivacy(1.0, DELTA, 1.0, accounting=AccountingMode.LEGACY, rng=0)
    grad = np.ones(4, dtype=np.float32)
    with pytest.raises(InvalidGradient, match="RDP accounting"):
        await RoundRunner(store, gossip, replace(FAST, dp=legacy)).run_round(0, grad)
    dp = make_dp(0, z=1, clip=1)
    runner = RoundRunner(store, gossip, replace(FAST, dp=dp), accumulator_factory=streaming)
    with pytest.raises(InvalidGradient, match="StreamingAccumulator"):
        await runner.run_round(0, grad)
    with pytest.raises(ConfigError, match="cannot be streaming"):
        replace(FAST, dp=dp, streaming=True)
    assert store.blocks == {}
    await gossip.aclose()


# ---------------------------------------------------------------------------- acceptance


@pytest.mark.kubo
async def test_dp_round_over_three_kubo_nodes_reports_its_epsilon(kubo_swarm3) -> None:  # type: ignore[no-untyped-def]
    """A client-level DP-FedAvg round end to end over Kubo (issue 5 acceptance)."""
    d, clip, z = 1_000, 1.0, 1.1
    session = "dp-fedavg-kubo"
    rng = np.random.default_rng(2026)
    grads = {n.peer_id: rng.standard_normal(d).astype(np.float32) for n in kubo_swarm3}
    seeds = [101, 102, 103]
    dps = [make_dp(seed, z=z, clip=clip, epsilon=10.0) for seed in seeds]
    stores = [KuboBlockStore(n.api_url, timeout=30.0) for n in kubo_swarm3]
    transports = [KuboPubsub(n.api_url) for n in kubo_swarm3]
    gossips = [
        GossipModelSync(n.peer_id, t, session_id=session)
        for n, t in zip(kubo_swarm3, transports, strict=True)
    ]
    config = RoundConfig(
        min_peers=2, collect_timeout=60.0, fetch_timeout=30.0, subscriber_timeout=30.0
    )
    runners = [
        RoundRunner(s, g, replace(config, dp=dp))
        for s, g, dp in zip(stores, gossips, dps, strict=True)
    ]
    try:
        results = await asyncio.gather(
            *(
                runner.run_round(0, grads[node.peer_id], num_samples=10)
                for runner, node in zip(runners, kubo_swarm3, strict=True)
            )
        )
        expected_epsilon = reference_epsilon(z, 1)
        for node, result, seed in zip(kubo_swarm3, results, seeds, strict=True):
            assert set(result.contributors) == set(grads) - {node.peer_id}
            assert len(result.participants) == 3
            assert result.epsilon == pytest.approx(expected_epsilon, rel=1e-9)
            assert result.delta == DELTA
            # Norms are about sqrt(d) >> C: every contribution was clipped, then noised.
            expected = reference_dp_mean(grads, clip, z, seed)
            np.testing.assert_allclose(result.aggregate, expected, rtol=1e-6, atol=1e-6)
    finally:
        for runner in runners:
            await runner.aclose()
        for gossip in gossips:
            await gossip.aclose()
        for closable in [*stores, *transports]:
            await closable.aclose()
