"""The training rule: deterministic sampling, hostile metric tails, rule state in the record."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs import AgreedConfig, AgreedSession
from gradfed_ipfs.errors import ConfigError, RoundVerificationFailed
from gradfed_ipfs.federated.agreed.history import (
    load_record,
    load_result,
    model_cid,
    verify_agreed_history,
)
from gradfed_ipfs.formats.agreed.roster import AgreedRecord, Roster
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore
from gradfed_ipfs.training import (
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedYogi,
    Strategy,
    TrainingRule,
    VectorLayout,
    robust_mean,
)
from gradfed_ipfs.training.sampling import round_seed, sample_peers, sample_size

PEERS = ("peer-a", "peer-b", "peer-c")
GENESIS = CID.decode("bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy")
FAST = {
    "collect_timeout": 1.0,
    "takeover_timeout": 0.5,
    "round_timeout": 8.0,
    "done_timeout": 1.0,
    "announce_interval": 0.02,
    "fetch_timeout": 2.0,
}
LAYOUT = VectorLayout(2, fit_metrics=("acc",), eval_metrics=("acc",))


def rule(strategy: Strategy | None = None, fraction: float = 1.0, rounds: int = 5) -> TrainingRule:
    return TrainingRule(
        strategy or FedAvg(), LAYOUT, PEERS, fraction=fraction, min_fit=1, fit_rounds=rounds,
        config=lambda r: {"lr": 0.1},
    )  # fmt: skip


def test_sample_is_deterministic_sized_and_changes_with_the_round() -> None:
    assert sample_size(10, 0.3, 1) == 3
    assert sample_size(10, 0.01, 2) == 2
    assert sample_size(3, 1.0, 5) == 3
    members = [f"p{i}" for i in range(10)]
    seeds = [round_seed("s", GENESIS, r, GENESIS) for r in range(20)]
    samples = [sample_peers(seed, members, 0.3) for seed in seeds]
    assert all(len(s) == 3 and set(s) <= set(members) for s in samples)
    assert samples[0] == sample_peers(seeds[0], list(reversed(members)), 0.3)  # order-free
    assert len(set(samples)) > 5  # the sample moves from round to round


def roster_of(entries: list[tuple[str, int]]) -> Roster:
    ready = {p: (GENESIS, w) for p, w in entries}
    return Roster.new("s", GENESIS, 0, GENESIS, PEERS[0], PEERS, ready)


def test_rule_aggregates_sampled_trainers_and_summarizes_metrics() -> None:
    r = rule()
    a = LAYOUT.contribution(np.array([2, 0], np.float32), fit_samples=1, fit_metrics={"acc": 0.5},
                            eval_samples=1, eval_loss=1.0, eval_metrics={"acc": 0.2})  # fmt: skip
    b = LAYOUT.contribution(np.array([0, 4], np.float32), fit_samples=3, fit_metrics={"acc": 0.9},
                            eval_samples=3, eval_loss=3.0, eval_metrics={"acc": 0.6})  # fmt: skip
    model = LAYOUT.genesis(np.array([1, 2], np.float32))
    new, state = r.apply(model, roster_of([("peer-a", 1), ("peer-b", 3)]), [a, b], 1.0, None)
    np.testing.assert_array_equal(LAYOUT.split(new)[0], [1.5, 5])
    summary = LAYOUT.summary(new)
    assert (summary.results, summary.fit_samples, summary.eval_samples) == (2, 4, 4)
    assert summary.eval_loss == pytest.approx(2.5)  # (1·1 + 3·3) / 4
    assert summary.fit_metrics["acc"] == pytest.approx(0.8)  # (0.5 + 2.7) / 4
    assert summary.eval_metrics["acc"] == pytest.approx(0.5)
    assert state is None


def test_hostile_tails_are_ignored_not_fatal() -> None:
    r = rule()
    honest = LAYOUT.contribution(np.array([1, 1], np.float32), fit_samples=2, eval_samples=2)
    nan_tail = honest.copy()
    nan_tail[-1] = np.nan
    negative = honest.copy()
    negative[LAYOUT.params + 2] = -5  # eval_samples
    lying_weight = honest.copy()  # roster weight 7, tail says 2 samples
    bad_flag = honest.copy()
    bad_flag[LAYOUT.params] = 0.5
    vectors = [honest, nan_tail, negative, lying_weight, bad_flag]
    peers = [("peer-a", 2), ("peer-b", 2), ("peer-c", 2), ("peer-d", 7), ("peer-e", 2)]
    roster = Roster.new("s", GENESIS, 0, GENESIS, "peer-a", tuple(p for p, _ in peers),
                        {p: (GENESIS, w) for p, w in peers})  # fmt: skip
    wide = TrainingRule(FedAvg(), LAYOUT, [p for p, _ in peers], fraction=1.0, min_fit=1,
                        fit_rounds=5, config=lambda _: {})  # fmt: skip
    fits, _, evaluations = wide.split_roster(roster, vectors)
    assert [f.peer for f in fits] == ["peer-a"]
    assert len(evaluations) == 2  # the honest one and the one whose weight lied (its eval is fine)
    new, _ = r.apply(
        LAYOUT.genesis(np.zeros(2, np.float32)), roster_of([("peer-a", 2)]), [honest], 1.0, None
    )
    np.testing.assert_array_equal(LAYOUT.split(new)[0], [1, 1])


def test_unsampled_peer_claiming_to_train_is_not_aggregated() -> None:
    r = rule(fraction=0.3)  # ceil(0.9) = one trainer per round
    sample = r.sampled("s", GENESIS, 0, GENESIS)
    assert len(sample) == 1
    outsider = next(p for p in PEERS if p not in sample)
    vector = LAYOUT.contribution(np.array([9, 9], np.float32), fit_samples=1)
    fits, _, _ = r.split_roster(roster_of([(outsider, 1)]), [vector])
    assert fits == []
    assert r.sampled("s", GENESIS, 5, GENESIS) == ()  # evaluation rounds: nobody trains


def test_label_names_strategy_and_config_cid() -> None:
    label = rule().label(0)
    assert label.startswith("fedavg fraction=1 min_fit=1 rounds=5 config=bafyrei")
    assert rule().config(0) == {"server_round": 1, "lr": 0.1}


@pytest.fixture
async def store() -> AsyncIterator[MemoryBlockStore]:
    async with MemoryBlockStore() as s:
        yield s


def contribution(peer: int, r: int) -> np.ndarray:
    update = np.random.default_rng([peer, r]).standard_normal(2).astype(np.float32)
    return LAYOUT.contribution(update, fit_samples=1 + peer, eval_samples=1, eval_loss=0.5)


OPTIMIZERS = {
    "fedavgm": lambda: FedAvgM(server_momentum=0.9),
    "fedadagrad": FedAdagrad,
    "fedadam": FedAdam,
    "fedyogi": FedYogi,
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
async def test_optimizer_state_rides_in_the_record_and_a_late_peer_resumes_it(
    store: MemoryBlockStore, name: str
) -> None:
    make = OPTIMIZERS[name]
    bus = MemoryPubsubBus()
    genesis_vector = LAYOUT.genesis(np.array([1, -1], np.float32))
    genesis = await AgreedSession.commit_genesis(store, genesis_vector)
    config = AgreedConfig(members=PEERS, min_peers=2, rule=rule(make()), **FAST)  # type: ignore[arg-type]
    sessions = [AgreedSession(store, bus.endpoint(p), "s", genesis, config) for p in PEERS]
    for s in sessions[:2]:
        await s.start(genesis_vector)
    try:
        for r in range(3):
            results = await asyncio.gather(
                *(s.run_round(contribution(i, r), weight=1 + i) for i, s in enumerate(sessions[:2]))
            )
            assert results[0].record == results[1].record
        record = await load_record(store, sessions[0].head)  # type: ignore[arg-type]
        assert isinstance(record, AgreedRecord)
        assert record.rule is not None
        assert record.rule.startswith(f"{name} ")
        assert record.state is not None
        assert not record.model_stored  # model_every: model and state are rebuilt with the rule
        with pytest.raises(RoundVerificationFailed, match="pass it"):
            await load_result(store, record)
        _, state = await load_result(store, record, rule(make()))  # type: ignore[arg-type]
        assert state is not None
        assert bytes(await model_cid(state)) == bytes(record.state)
        np.testing.assert_array_equal(state, sessions[0].rule_state)  # type: ignore[arg-type]
        assert state[0] == 3  # three optimizer steps
        late = sessions[2]
        await late.start(genesis_vector)
        synced = await late.resync(timeout=5.0)
        assert synced.changed
        assert late.round == 3
        np.testing.assert_array_equal(late.rule_state, state)  # type: ignore[arg-type]
        results = await asyncio.gather(
            *(s.run_round(contribution(i, 3), weight=1 + i) for i, s in enumerate(sessions))
        )
        assert len({str(res.record) for res in results}) == 1  # the resumed state agrees
        head = sessions[0].head
        records = await verify_agreed_history(
            store,
            head,
            keys=bus.keys,
            session="s",
            genesis=genesis,
            rule=rule(make()),  # type: ignore[arg-type]
        )
        assert len(records) == 4
        with pytest.raises(RoundVerificationFailed):  # a default-rule verifier needs the rule
            await verify_agreed_history(store, head, keys=bus.keys, session="s", genesis=genesis)  # type: ignore[arg-type]
        with pytest.raises(RoundVerificationFailed):  # another rule does not reproduce the records
            await verify_agreed_history(
                store,
                head,
                keys=bus.keys,
                session="s",
                genesis=genesis,
                rule=rule(FedAvg()),  # type: ignore[arg-type]
            )
    finally:
        for s in sessions:
            await s.aclose()


def test_settings_are_config_errors() -> None:
    from gradfed_ipfs.errors import ConfigError
    from gradfed_ipfs.training import FederationConfig, QFedAvg

    with pytest.raises(ConfigError):
        sample_size(3, 0.0, 1)
    with pytest.raises(ConfigError):
        sample_size(3, 0.5, 0)
    with pytest.raises(ConfigError):
        FederationConfig(rounds=0)
    with pytest.raises(ConfigError):
        VectorLayout(2, fit_metrics=("a", "a"))
    with pytest.raises(ConfigError):
        QFedAvg(q=-1.0)


def test_robust_mean_keeps_any_minority_of_liars_within_the_honest_range() -> None:
    assert robust_mean([]) == 0.0
    assert robust_mean([(1, 1.0), (3, 3.0)]) == pytest.approx(2.5)  # two: Flower's weighted mean
    assert robust_mean([(5, 0.2), (1, 0.9), (2**20, -1e19)]) == 0.2  # three: the median
    four = robust_mean([(10, 0.4), (30, 0.6), (2**20, 1e19), (20, 0.5)])
    assert four == pytest.approx((20 * 0.5 + 30 * 0.6) / 50)  # the two middle, by samples
    honest = [(7, 0.3), (9, 0.35), (11, 0.4)]
    for liars in ([(2**20, 1e19)] * 2, [(2**20, -1e19), (1, 1e19)]):
        assert 0.3 <= robust_mean(honest + liars) <= 0.4
    assert robust_mean(list(reversed(honest))) == robust_mean(honest)  # order-free


def test_a_count_above_the_sessions_cap_reads_as_nothing() -> None:
    layout = VectorLayout(2, eval_metrics=("acc",), max_samples=100)
    ok = layout.contribution(None, eval_samples=100, eval_loss=1.0, eval_metrics={"acc": 0.5})
    big = layout.contribution(None, eval_samples=101, eval_loss=1.0, eval_metrics={"acc": 0.5})
    assert layout.read_tail(layout.split(ok)[1]).eval_samples == 100
    nothing = layout.read_tail(layout.split(big)[1])
    assert (nothing.fit, nothing.eval_samples, nothing.eval_metrics) == (False, 0, {})
    with pytest.raises(ConfigError, match="max_samples"):
        VectorLayout(2, max_samples=2**25)
