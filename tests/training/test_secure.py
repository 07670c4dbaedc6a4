"""SecAgg as a training-API wrapper: same agreed model as FedAvg, no update ever in the clear."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs.errors import ConfigError, RoundVerificationFailed
from gradfed_ipfs.federated.agreed.history import verify_agreed_history
from gradfed_ipfs.federated.agreed.session import AgreedConfig
from gradfed_ipfs.federated.privacy.mechanisms import DifferentialPrivacy
from gradfed_ipfs.federated.secagg import FixedPoint
from gradfed_ipfs.federated.secagg_round.peer import SecureRoundPeer
from gradfed_ipfs.formats.agreed.roster import Roster
from gradfed_ipfs.kubo import KuboPubsub, MemoryPubsubBus
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore, fetch_gradient
from gradfed_ipfs.storage.base import BlockStore
from gradfed_ipfs.tensor import Median
from gradfed_ipfs.training import (
    Client,
    DiLoCo,
    FedAdam,
    FedAvg,
    FederationConfig,
    History,
    LocalDP,
    Peer,
    QFedAvg,
    Robust,
    SecAggSettings,
    SparseLoCo,
    Strategy,
    TrainingRule,
    VectorAdapter,
    VectorLayout,
    run_simulation,
)
from gradfed_ipfs.training.secure import (
    SecAgg,
    SecureFit,
    SecureTrainingRule,
    secure_aggregator,
    secure_contribution,
)
from gradfed_ipfs.training.simulation import SIMULATION_TIMING
from tests.conftest import KuboNode
from tests.helpers import MEMORY_KEYS

D = 24
ROUNDS = 2
SAMPLES = (10, 20, 50)  # unequal: an unweighted mean would be far from FedAvg's
rng = np.random.default_rng(17)
UPDATES = rng.normal(0.0, 0.5, (ROUNDS, len(SAMPLES), D)).astype(np.float32)
FIT_ACC = (0.25, 0.5, 1.0)
INITIAL = np.linspace(-1.0, 1.0, D, dtype=np.float32)
FAST_SETTINGS = SecAggSettings(phase_timeout=10.0, mask_timeout=5.0, response_timeout=5.0,
                               view_timeout=5.0)  # fmt: skip
FAST_SECAGG: dict[str, Any] = {"settings": FAST_SETTINGS, "republish_interval": 0.1,
                               "subscriber_timeout": 0.5}  # fmt: skip


def client(i: int) -> Client[Any]:
    """Peer ``i`` returns a fixed update per round (so both runs see the same inputs)."""

    def train(model: Any, config: dict[str, Any]) -> tuple[Any, int, dict[str, float]]:
        r = int(config["server_round"]) - 1
        return UPDATES[r, i].copy(), SAMPLES[i], {"acc": FIT_ACC[i]}

    def evaluate(model: Any, config: dict[str, Any]) -> tuple[float, int, dict[str, float]]:
        return float(np.abs(model).mean()), 5, {}

    return Client(train=train, evaluate=evaluate, returns="update")


async def run_peers(
    strategy: Callable[[], Strategy],
    *,
    stores: Sequence[BlockStore] | None = None,
    transports: Sequence[Any] | None = None,
    members: Sequence[str] | None = None,
    timing: dict[str, float] | None = None,
    rounds: int = ROUNDS,
    fraction: float = 1.0,
    clients: Callable[[int], Client[Any]] = client,
    privacy: Callable[[int], LocalDP] | None = None,
    out: list[Peer[Any]] | None = None,
) -> list[History]:
    """Run 3 peers (memory bus and one shared store unless given) for ``rounds`` rounds."""
    config: FederationConfig[Any] = FederationConfig(
        rounds=rounds, fraction=fraction, fit_metrics=("acc",)
    )
    if members is None:
        bus = MemoryPubsubBus()
        members = tuple(f"peer-{i}" for i in range(3))
        transports = [bus.endpoint(p) for p in members]
    assert stores is not None
    assert transports is not None
    agreed = AgreedConfig(members=tuple(members), **{**SIMULATION_TIMING, **(timing or {})})
    peers = [
        Peer(store=stores[i], pubsub=transports[i], client=clients(i), adapter=VectorAdapter(),
             initial_model=INITIAL, config=config, agreed=agreed, strategy=strategy(),
             session="secure-test", privacy=None if privacy is None else privacy(i))
        for i in range(3)
    ]  # fmt: skip
    if out is not None:
        out.extend(peers)
    return list(await asyncio.wait_for(asyncio.gather(*(p.run() for p in peers)), 90.0))


def fedavg_reference(
    rounds: int = ROUNDS,
    drop: dict[int, int] | None = None,
    trainers: Sequence[Sequence[int]] | None = None,
) -> np.ndarray:
    """FedAvg by hand in float64; ``drop`` maps a round to the peer left out of it."""
    x = INITIAL.astype(np.float64)
    for r in range(rounds):
        keep = [i for i in range(3) if (drop or {}).get(r) != i]
        if trainers is not None:
            keep = [i for i in keep if i in trainers[r]]
        n = np.array([SAMPLES[i] for i in keep], np.float64)
        x = x + (n[:, None] * UPDATES[r, keep].astype(np.float64)).sum(0) / n.sum()
    return x


def quantisation_bound(clients: int = 3, max_weight: int = 1000) -> float:
    """Largest |secure - FedAvg| after ``ROUNDS`` rounds, per coordinate.

    Per round: each of the k masked values ``w·Δ`` is rounded to ``1/scale`` (≤ k/(2·scale)
    in the sum), divided by ``W = N/max_weight``; decoding the sum and the mean to float32 adds
    ≤ 2⁻²⁴·|mean| each, and each side's new float32 model ≤ 2⁻²⁴·|x|.
    """
    scale = FixedPoint(clients, 8.0, 32).scale
    weight = min(SAMPLES) * 2 / max_weight  # the smallest W of any round (two survivors)
    mean = float(np.abs(UPDATES).max())
    x = float(np.abs(INITIAL).max()) + ROUNDS * mean
    per_round = clients / (2 * scale * weight) + 2**-23 * mean + 2**-23 * x
    return ROUNDS * per_round


def check_agreed(histories: list[History]) -> None:
    finals = {h.entries[-1].model for h in histories}
    records = {h.entries[-1].record for h in histories}
    assert len(finals) == 1, finals
    assert len(records) == 1, records


async def final_params(store: BlockStore, history: History) -> np.ndarray:
    vector = await fetch_gradient(store, history.entries[-1].model)
    return np.asarray(vector, np.float32)[:D]


async def test_secagg_fedavg_is_fedavg_up_to_fixed_point_and_no_block_holds_an_update() -> None:
    # Prepare: the same clients under SecAgg(FedAvg()) and under FedAvg().
    peers: list[Peer[Any]] = []
    async with MemoryBlockStore() as secure_store, MemoryBlockStore() as plain_store:
        secure = await run_peers(
            lambda: SecAgg(FedAvg(), **FAST_SECAGG), stores=[secure_store] * 3, out=peers
        )
        plain = await run_peers(FedAvg, stores=[plain_store] * 3)
        got = await final_params(secure_store, secure[0])
        want = await final_params(plain_store, plain[0])
        # A third party re-runs every round from the blocks (the secure mean is an input).
        head, genesis = secure[0].entries[-1].record, secure[0].genesis
        records = await verify_agreed_history(
            secure_store,
            head,
            keys=MEMORY_KEYS,
            session="secure-test",
            genesis=genesis,
            rule=peers[0].rule,
        )
        with pytest.raises(RoundVerificationFailed):  # the plain rule does not reproduce them
            await verify_agreed_history(
                secure_store,
                head,
                keys=MEMORY_KEYS,
                session="secure-test",
                genesis=genesis,
                rule=plain_rule(),
            )
        # Every block of both runs (contributions, SecAgg messages, models, records): plain
        # FedAvg publishes every update; under SecAgg none is in any block (the masked vectors
        # are sealed to the aggregator, and it contributes only the mean).
        assert contains_update(plain_store) == {(r, i) for r in range(ROUNDS) for i in range(3)}
        assert contains_update(secure_store) == set()
    # Assert: every peer agrees; the model is FedAvg's up to the quantisation bound.
    check_agreed(secure)
    check_agreed(plain)
    bound = quantisation_bound()
    assert 0 < bound < 1e-5
    np.testing.assert_allclose(want, fedavg_reference(), atol=1e-6)
    assert float(np.abs(got - want).max()) <= bound
    assert float(np.abs(got - fedavg_reference()).max()) <= bound + 1e-6
    pairs = zip(secure[0].entries[:ROUNDS], plain[0].entries[:ROUNDS], strict=True)
    for entry, plain_entry in pairs:
        assert entry.secure == ["peer-0", "peer-1", "peer-2"]
        assert (entry.results, entry.failures) == (3, 0)
        assert entry.fit_samples == plain_entry.fit_samples == sum(SAMPLES)
        # In the clear the fit metric is robust_mean's median; under SecAgg it is summed with
        # the update, so it is the sample-weighted mean (bounded by clip_range, not robust).
        assert plain_entry.fit_metrics["acc"] == pytest.approx(FIT_ACC[1])
        weighted = sum(n * a for n, a in zip(SAMPLES, FIT_ACC, strict=True)) / sum(SAMPLES)
        assert entry.fit_metrics["acc"] == pytest.approx(weighted, abs=1e-6)
        assert entry.eval_loss == pytest.approx(plain_entry.eval_loss, abs=1e-5)
    assert secure[0].strategy.startswith("secagg-fedavg")
    assert len(records) == ROUNDS + 1
    assert all(r.rule is not None and "clip_range=8 ring_bits=32" in r.rule for r in records)
    assert plain[0].entries[0].secure is None


def plain_rule() -> TrainingRule:
    layout = VectorLayout(D, fit_metrics=("acc",), secure=("peer-0", "peer-1", "peer-2"))
    return TrainingRule(
        FedAvg(), layout, layout.secure, fraction=1.0, min_fit=1, fit_rounds=ROUNDS,
        config=lambda r: {},
    )  # fmt: skip


def contains_update(store: MemoryBlockStore) -> set[tuple[int, int]]:
    """(round, peer) of every update whose float32 bytes appear in some stored block."""
    found = set()
    for _cid, data in store.blocks.values():
        for r in range(ROUNDS):
            for i in range(3):
                if UPDATES[r, i, :8].tobytes() in data:
                    found.add((r, i))
    return found


@pytest.mark.parametrize(
    ("strategy", "reason"),
    [(QFedAvg(), "qfedavg needs each client's update or loss"),
     (Robust(Median()), "robust-median needs each client's update or loss")],
)  # fmt: skip
def test_non_linear_strategies_are_refused(strategy: Strategy, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        SecAgg(strategy)


def test_a_sample_too_small_for_secagg_is_refused() -> None:
    bus = MemoryPubsubBus()
    members = ("a", "b", "c")
    with pytest.raises(ConfigError, match="threshold"):
        Peer(store=MemoryBlockStore(), pubsub=bus.endpoint("a"), client=client(0),
             adapter=VectorAdapter(), initial_model=INITIAL,
             config=FederationConfig(rounds=1, fraction=0.3), agreed=AgreedConfig(members),
             strategy=SecAgg(FedAvg()))  # fmt: skip
    with pytest.raises(ConfigError, match="threshold"):
        SecAgg(FedAvg(), threshold=4).threshold_for(3)
    assert SecAgg(FedAvg()).threshold_for(3) == 2


async def test_a_client_dropping_after_its_keys_leaves_the_survivors_mean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: in round 0 one client that is not the aggregator dies after sharing its keys.
    original = SecureRoundPeer.send_masked
    dropped: list[str] = []

    async def send_masked(self: SecureRoundPeer, gradient: Any) -> Any:
        cfg = self.config
        victim = next(c for c in cfg.clients if c != cfg.aggregator)
        if self.peer_id == victim and not dropped:
            dropped.append(victim)
            raise ConnectionError("simulated crash after the keys")
        return await original(self, gradient)

    monkeypatch.setattr(SecureRoundPeer, "send_masked", send_masked)
    secagg = {**FAST_SECAGG, "settings": replace(FAST_SETTINGS, mask_timeout=1.5)}
    async with MemoryBlockStore() as store:
        histories = await run_peers(
            lambda: SecAgg(FedAvg(), threshold=2, **secagg),
            stores=[store] * 3,
        )
        got = await final_params(store, histories[0])
    # Assert: every peer ends on the same model; round 0 summed the two survivors only.
    check_agreed(histories)
    victim = dropped[0]
    first = histories[0].entries[0]
    assert first.secure == sorted({"peer-0", "peer-1", "peer-2"} - {victim})
    assert (first.results, first.failures) == (2, 1)
    assert first.fit_samples == sum(SAMPLES) - SAMPLES[int(victim[-1])]
    assert histories[0].entries[1].secure == ["peer-0", "peer-1", "peer-2"]
    want = fedavg_reference(drop={0: int(victim[-1])})
    assert float(np.abs(got - want).max()) <= quantisation_bound() + 1e-6


async def test_a_failed_training_is_summed_as_zero_and_counted_as_a_failure() -> None:
    # Prepare: peer 1's train raises in round 0; it still masks (zeros), or the keys would lack.
    def flaky(i: int) -> Client[Any]:
        inner = client(i)

        def train(model: Any, config: dict[str, Any]) -> Any:
            if i == 1 and config["server_round"] == 1:
                raise RuntimeError("out of memory")
            return inner.train(model, config)

        return Client(train=train, evaluate=inner.evaluate, returns="update")

    async with MemoryBlockStore() as store:
        histories = await run_peers(
            lambda: SecAgg(FedAvg(), **FAST_SECAGG), stores=[store] * 3, clients=flaky
        )
        got = await final_params(store, histories[0])
    # Assert: summed (all three survivors) but 2 results and 1 failure; FedAvg of the others.
    check_agreed(histories)
    first = histories[0].entries[0]
    assert first.secure == ["peer-0", "peer-1", "peer-2"]
    assert (first.results, first.failures, first.fit_samples) == (2, 1, SAMPLES[0] + SAMPLES[2])
    assert float(np.abs(got - fedavg_reference(drop={0: 1})).max()) <= quantisation_bound() + 1e-6


async def test_only_the_sampled_peers_are_secagg_clients() -> None:
    # Prepare: fraction 0.6 of 3 peers samples 2 per round; the third only evaluates.
    async with MemoryBlockStore() as store:
        histories = await run_peers(
            lambda: SecAgg(FedAvg(), **FAST_SECAGG), stores=[store] * 3, fraction=0.6
        )
        got = await final_params(store, histories[0])
    # Assert: the secure sum is the sample's; the model is FedAvg over each round's sample.
    check_agreed(histories)
    entries = histories[0].entries[:ROUNDS]
    trainers = [[int(p[-1]) for p in e.sampled] for e in entries]
    assert all(len(t) == 2 for t in trainers)
    assert [e.secure for e in entries] == [e.sampled for e in entries]
    assert [e.eval_samples for e in entries] == [15] * ROUNDS  # everyone evaluates
    want = fedavg_reference(trainers=trainers)
    assert float(np.abs(got - want).max()) <= quantisation_bound() + 1e-6


async def test_local_dp_noises_each_update_before_it_is_masked() -> None:
    def privacy(i: int) -> LocalDP:
        return LocalDP(DifferentialPrivacy(50.0, 1e-5, 1.0, noise_multiplier=0.5, rng=i), 5.0)

    async with MemoryBlockStore() as store:
        histories = await run_peers(
            lambda: SecAgg(FedAvg(), **FAST_SECAGG), stores=[store] * 3, rounds=1, privacy=privacy
        )
        got = await final_params(store, histories[0])
    check_agreed(histories)
    first = histories[0].entries[0]
    assert (first.results, first.secure) == (3, ["peer-0", "peer-1", "peer-2"])
    assert first.epsilon is not None
    assert first.epsilon > 0
    assert float(np.abs(got - fedavg_reference(rounds=1)).max()) > 100 * quantisation_bound()


async def test_central_dp_noises_the_clipped_sum_and_stops_at_the_budget() -> None:
    # Prepare: C = 0.1, z = 0.05; the budget affords exactly one release of the secure sum.
    z, clip = 0.05, 0.1
    probe = DifferentialPrivacy(1e6, 1e-5, clip, noise_multiplier=z)
    one = [probe.budget.charge(probe.release_event()) or probe.spent()[0] for _ in range(2)]

    def secagg(i: int) -> SecAgg:
        dp = DifferentialPrivacy(sum(one) / 2, 1e-5, clip, noise_multiplier=z, rng=i)
        return SecAgg(FedAvg(), central_dp=dp, **FAST_SECAGG)

    made = iter(range(3))
    async with MemoryBlockStore() as store:
        histories = await run_peers(  # every model stored: round 1's is read by its CID
            lambda: secagg(next(made)), stores=[store] * 3, timing={"model_every": 1}
        )
        first = histories[0].entries[0]
        after_first = np.asarray(await fetch_gradient(store, first.model), np.float32)[:D]
        got = await final_params(store, histories[0])
    # Assert: round 1 released a noised mean of the clipped updates; round 2 was refused by the
    # aggregator's budget on every peer alike (no results, model unchanged); ε is the session's.
    check_agreed(histories)
    n = np.array(SAMPLES, np.float64)
    u = UPDATES[0].astype(np.float64)
    clipped = u * np.minimum(1.0, clip / np.linalg.norm(u, axis=1))[:, None]
    want = INITIAL + (n[:, None] * clipped).sum(0) / n.sum()
    noise_std = z * clip / (n.sum() / 1000)  # z·C on the sum, divided by W
    measured = float(np.std(after_first - want))  # unclipped, it would be 0.33
    assert 0.5 * noise_std < measured < 2 * noise_std, measured
    assert (first.results, histories[0].entries[1].results) == (3, 0)
    np.testing.assert_array_equal(got, after_first)
    for history in histories:
        assert [e.epsilon for e in history.entries] == [pytest.approx(one[0])] * (ROUNDS + 1)


async def test_run_simulation_refuses_one_shared_central_dp_accountant() -> None:
    dp = DifferentialPrivacy(10.0, 1e-5, 0.1, noise_multiplier=1.0)
    with pytest.raises(ConfigError, match="factory"):
        await run_simulation(
            [client(i) for i in range(3)], adapter=VectorAdapter(), initial_model=INITIAL,
            config=FederationConfig(rounds=1), strategy=SecAgg(FedAvg(), central_dp=dp),
        )  # fmt: skip


@pytest.mark.kubo
async def test_secagg_fedadam_over_three_kubo_daemons(kubo_swarm3: list[KuboNode]) -> None:
    # Prepare: one peer beside each daemon; blocks and messages travel by bitswap and pubsub.
    stores = [KuboBlockStore(n.api_url, timeout=15.0) for n in kubo_swarm3]
    transports = [KuboPubsub(n.api_url) for n in kubo_swarm3]
    timing = {"collect_timeout": 20.0, "round_timeout": 60.0, "announce_interval": 0.2,
              "max_announce_interval": 1.0, "fetch_timeout": 15.0}  # fmt: skip
    secagg = {"settings": replace(FAST_SETTINGS, phase_timeout=20.0, mask_timeout=10.0),
              "subscriber_timeout": 5.0, "republish_interval": 0.3}  # fmt: skip
    try:
        histories = await run_peers(
            lambda: SecAgg(FedAdam(), **secagg),
            stores=stores, transports=transports,
            members=[n.peer_id for n in kubo_swarm3], timing=timing, rounds=1,
        )  # fmt: skip
    finally:
        for t in transports:
            await t.aclose()
        for s in stores:
            await s.aclose()
    # Assert: the same model and record CIDs on every peer, every client in every secure sum.
    check_agreed(histories)
    ids = sorted(n.peer_id for n in kubo_swarm3)
    for history in histories:
        assert [e.secure for e in history.entries] == [ids, []]  # then the final evaluation
        assert [e.results for e in history.entries] == [3, 0]
        assert history.strategy.startswith("secagg-fedadam")


# ---------------------------------------------------------------- the rule, on hand-made rosters

MEMBERS = ("peer-a", "peer-b", "peer-c")
GENESIS = CID.decode("bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy")
LAYOUT = VectorLayout(2, fit_metrics=("acc",), secure=MEMBERS)


def secure_rule(central_dp: bool = True) -> SecureTrainingRule:
    dp = DifferentialPrivacy(10.0, 1e-5, 1.0, noise_multiplier=1.0) if central_dp else None
    return SecureTrainingRule(
        SecAgg(FedAvg(), central_dp=dp), LAYOUT, MEMBERS, fraction=1.0, min_fit=1, fit_rounds=3,
        config=lambda r: {},
    )  # fmt: skip


def apply(
    vectors: dict[str, tuple[np.ndarray, int]], *, central_dp: bool = True
) -> tuple[np.ndarray, Any]:
    ready = {p: (GENESIS, w) for p, (_v, w) in vectors.items()}
    roster = Roster.new("s", GENESIS, 0, GENESIS, MEMBERS[0], MEMBERS, ready)
    model = LAYOUT.genesis(np.array([1.0, 2.0], np.float32))
    gradients = [vectors[e.peer][0] for e in roster.entries]
    new, _ = secure_rule(central_dp).apply(model, roster, gradients, 1.0, None)
    return LAYOUT.split(new)[0], LAYOUT.summary(new)


def test_without_central_dp_the_rule_takes_the_fit_a_majority_of_the_sample_claims() -> None:
    # Prepare: the aggregator claims a made-up mean; the two other survivors recomputed the sum
    # from its release and claim the true one (with their own evaluations).
    aggregator = secure_aggregator("s", GENESIS, 0, MEMBERS)
    true = SecureFit(np.array([0.5, -1.0], np.float32), 30, 3, {"acc": 0.75}, MEMBERS)
    lie = SecureFit(np.array([5.0, 5.0], np.float32), 30, 3, {"acc": 0.75}, MEMBERS)
    vectors = {p: (secure_contribution(LAYOUT, true, eval_samples=2, eval_loss=1.0), 30)
               for p in MEMBERS}  # fmt: skip
    vectors[aggregator] = (secure_contribution(LAYOUT, lie, eval_samples=2, eval_loss=1.0), 30)
    # Execute, then again with only one verifier beside the liar (no majority for either).
    params, summary = apply(vectors, central_dp=False)
    other = next(p for p in MEMBERS if p != aggregator)
    vectors[other] = (LAYOUT.contribution(None, eval_samples=2, eval_loss=1.0), 2)
    alone, nothing = apply(vectors, central_dp=False)
    # Assert: the true mean is taken, the survivors and results are the verifiers'; without a
    # majority there is no fit (the model stays) and every evaluation still counts.
    np.testing.assert_array_equal(params, [1.5, 1.0])
    assert (summary.results, summary.fit_samples, summary.secure) == (3, 30, MEMBERS)
    assert summary.eval_samples == 6
    np.testing.assert_array_equal(alone, [1.0, 2.0])
    assert (nothing.results, nothing.secure, nothing.eval_samples) == (0, (), 6)


def test_with_central_dp_the_rule_takes_only_the_aggregators_secure_mean() -> None:
    # Prepare: the aggregator's secure mean over all three, and a peer that claims a plain fit.
    aggregator = secure_aggregator("s", GENESIS, 0, MEMBERS)
    other = next(p for p in MEMBERS if p != aggregator)
    fit = SecureFit(np.array([0.5, -1.0], np.float32), 30, 3, {"acc": 0.75}, MEMBERS)
    cheat = LAYOUT.contribution(np.array([100.0, 100.0], np.float32), fit_samples=7)
    vectors = {p: (LAYOUT.contribution(None, eval_samples=2, eval_loss=1.0), 2) for p in MEMBERS}
    vectors[aggregator] = (secure_contribution(LAYOUT, fit, eval_samples=2, eval_loss=1.0), 30)
    vectors[other] = (cheat, 7)
    # Execute
    params, summary = apply(vectors)
    # Assert: x + mean; 3 results of 30 samples; the survivors are in the agreed tail.
    np.testing.assert_array_equal(params, [1.5, 1.0])
    assert (summary.results, summary.fit_samples, summary.secure) == (3, 30, MEMBERS)
    assert summary.fit_metrics == {"acc": 0.75}
    assert summary.eval_samples == 4  # the cheat's tail has no evaluation; the others count


@pytest.mark.parametrize("flaw", ["results", "flags", "weight", "nan"])
def test_an_implausible_secure_tail_is_no_fit_never_a_failed_round(flaw: str) -> None:
    aggregator = secure_aggregator("s", GENESIS, 0, MEMBERS)
    fit = SecureFit(np.array([0.5, -1.0], np.float32), 30, 3, {"acc": 0.75}, MEMBERS)
    vector, weight = secure_contribution(LAYOUT, fit), 30
    if flaw == "results":
        vector[LAYOUT.params] = 4  # more results than survivors
    elif flaw == "flags":
        vector[-1] = 0.5
    elif flaw == "weight":
        weight = 31
    else:
        vector[0] = np.nan
    vectors = {p: (LAYOUT.contribution(None), 1) for p in MEMBERS}
    vectors[aggregator] = (vector, weight)
    params, summary = apply(vectors)
    np.testing.assert_array_equal(params, [1.0, 2.0])
    assert (summary.results, summary.secure) == (0, ())


def test_secagg_wraps_the_outer_optimizers_of_diloco_and_sparseloco() -> None:
    for inner in (DiLoCo(), SparseLoCo()):
        assert SecAgg(inner).strategy is inner
