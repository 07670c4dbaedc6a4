from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradfed_ipfs import DifferentialPrivacy
from gradfed_ipfs.errors import (
    ClientNotFound,
    FederatedDimensionMismatch,
    FederatedError,
    InvalidGradient,
    NoContributions,
    NotStarted,
)
from gradfed_ipfs.federated.secagg.simulation import run_secure_aggregation
from gradfed_ipfs.seed import ClientInfo, ClientState, ConvergenceDetector, ModelSyncProtocol
from gradfed_ipfs.seed.rounds import (
    PLACEHOLDER_MODEL_CID,
    FederatedRound,
    ModelUpdate,
    RoundStats,
)
from tests.helpers import FakeClock

MODEL = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"


def state(info: ClientInfo) -> ClientState:
    # A call defeats mypy's narrowing of ``info.state`` across the transitions.
    return info.state


# ---------------------------------------------------------------- clients


def test_client_state_enum_and_seed_aliases() -> None:
    assert ClientState["Idle"] is ClientState.IDLE
    assert ClientState["Training"] is ClientState("training")
    assert len(set(ClientState)) == 4  # aliases are the same members


# Seed §11 test_client_info: Idle -> Training -> Completed -> Failed is a legal path.
def test_client_info_seed_path() -> None:
    info = ClientInfo("alice", 100)
    assert state(info) is ClientState.IDLE
    info.start_training()
    assert state(info) is ClientState.TRAINING
    info.complete_training()
    assert state(info) is ClientState.COMPLETED
    info.mark_failed()
    assert state(info) is ClientState.FAILED
    assert (info.client_id, info.sample_count) == ("alice", 100)
    assert info.last_update > 0


def test_client_info_rejects_illegal_transitions() -> None:
    # Fixed defect: the seed allowed any -> any; completing without training is refused.
    info = ClientInfo("bob", 1)
    with pytest.raises(FederatedError, match="IDLE -> COMPLETED"):
        info.complete_training()
    assert state(info) is ClientState.IDLE
    info.start_training()
    with pytest.raises(FederatedError):
        info.start_training()
    info.mark_failed()
    info.reset()
    assert state(info) is ClientState.IDLE
    with pytest.raises(InvalidGradient):
        ClientInfo("x", -1)


# ---------------------------------------------------------------- legacy round


# Seed §11 test_federated_round
def test_legacy_round_completion() -> None:
    rnd = FederatedRound(0, MODEL, 5)
    assert not rnd.is_complete()
    for _ in range(5):
        rnd.mark_client_completed()
    assert rnd.is_complete()
    assert rnd.duration() is None
    rnd.complete([1.0, 2.0])
    np.testing.assert_array_equal(rnd.aggregated_gradient, np.array([1, 2], dtype=np.float32))
    assert rnd.end_time is not None
    duration = rnd.duration()
    assert duration is not None
    assert duration >= 0


def test_legacy_round_is_not_started() -> None:
    # Fixed defect: contributions to a round that was never started raise NotStarted.
    rnd = FederatedRound(0, MODEL, 2)
    with pytest.raises(NotStarted):
        rnd.record_contribution("a", [1.0])
    with pytest.raises(NotStarted):
        rnd.aggregate()
    with pytest.raises(NotStarted):
        rnd.missing_clients()
    stats = rnd.stats()
    assert stats.participants == 0
    assert stats.missing_clients == []


# ---------------------------------------------------------------- session round


# Seed §11 test_federated_round_complete
def test_session_round_complete() -> None:
    rnd = FederatedRound.start(1, ["alice", "bob", "carol"])
    assert rnd.global_model == PLACEHOLDER_MODEL_CID
    assert rnd.client_count == 3
    for cid in ("alice", "bob", "carol"):
        assert not rnd.is_complete()
        rnd.record_contribution(cid, [1.0, 2.0])
    assert rnd.is_complete()


# Seed §11 test_federated_round_missing_client
def test_session_round_missing_clients() -> None:
    rnd = FederatedRound.start(1, ["alice", "bob", "carol"])
    rnd.record_contribution("alice", [1.0])
    stats = rnd.stats()
    assert stats.missing_clients == ["bob", "carol"]
    assert stats.participants == 1
    assert stats.round_id == 1


# Seed §11 test_federated_aggregate_fedavg
def test_session_round_fedavg_equal_weights() -> None:
    rnd = FederatedRound.start(0, ["a", "b", "c"])
    rnd.record_contribution("a", [1.0, 2.0, 3.0])
    rnd.record_contribution("b", [3.0, 4.0, 5.0])
    rnd.record_contribution("c", [5.0, 6.0, 7.0])
    np.testing.assert_allclose(rnd.aggregate(), [3.0, 4.0, 5.0], atol=1e-6)


def test_sample_counts_weight_fedavg() -> None:
    # Fixed defect: ClientInfo.sample_count now weights FedAvg (100 vs 300 samples).
    rnd = FederatedRound.start(0, [ClientInfo("a", 100), ClientInfo("b", 300)])
    rnd.record_contribution("a", [0.0, 0.0])
    rnd.record_contribution("b", [2.0, 4.0])
    np.testing.assert_allclose(rnd.aggregate(), [1.5, 3.0], atol=1e-6)
    # A per-contribution count overrides the client's.
    rnd.record_contribution("a", [0.0, 0.0], sample_count=300)
    np.testing.assert_allclose(rnd.aggregate(), [1.0, 2.0], atol=1e-6)


def test_stranger_contribution_raises_and_is_counted() -> None:
    # Fixed defect: the seed included strangers in the average.
    rnd = FederatedRound.start(0, ["a"])
    rnd.record_contribution("a", [1.0])
    with pytest.raises(ClientNotFound, match="mallory"):
        rnd.record_contribution("mallory", [1000.0])
    np.testing.assert_allclose(rnd.aggregate(), [1.0])
    assert rnd.stats().rejected_contributions == 1


def test_aggregate_errors() -> None:
    rnd = FederatedRound.start(0, ["a", "b"])
    with pytest.raises(NoContributions):
        rnd.aggregate()
    rnd.record_contribution("a", [1.0, 2.0])
    rnd.record_contribution("b", [1.0])
    with pytest.raises(FederatedDimensionMismatch):
        rnd.aggregate()
    with pytest.raises(InvalidGradient):
        rnd.record_contribution("a", [float("nan")])
    with pytest.raises(InvalidGradient):
        FederatedRound.start(0, [])
    with pytest.raises(InvalidGradient):
        FederatedRound.start(0, ["a", "a"])


def test_resubmission_counts_once() -> None:
    rnd = FederatedRound.start(0, ["a", "b"])
    rnd.record_contribution("a", [1.0])
    rnd.record_contribution("a", [3.0])
    rnd.record_contribution("b", [5.0])
    assert rnd.stats().participants == 2
    np.testing.assert_allclose(rnd.aggregate(), [4.0])


def test_stats_duration_and_converged_from_detector() -> None:
    clock = FakeClock()
    rnd = FederatedRound.start(3, ["a"], clock=clock)
    clock.now += 1.25
    det = ConvergenceDetector(2, 0.01)
    assert rnd.stats(det).converged is False
    det.add_loss(1.0)
    det.add_loss(1.0)
    stats = rnd.stats(det)
    # Fixed defect: converged reflects the detector (the seed always said False).
    assert stats.converged is True
    assert stats.duration_ms == 1250


def test_aggregate_with_client_level_dp_records_spend() -> None:
    dp = DifferentialPrivacy(8.0, 1e-5, 1.0, noise_multiplier=1.0, rng=3)
    rnd = FederatedRound.start(0, ["a", "b", "c", "d"])
    for i, cid in enumerate("abcd"):
        rnd.record_contribution(cid, np.full(1000, float(i)), sample_count=10 * (i + 1))
    result = rnd.aggregate(dp)
    # Clipped to norm 1 each: sum of unit-norm vectors of value 1/sqrt(1000) (three of them).
    clipped_mean = 3 / np.sqrt(1000) / 4
    noise_std = 1.0 / 4
    assert abs(float(result.mean()) - clipped_mean) < 5 * noise_std / np.sqrt(1000)
    assert float(result.std()) == pytest.approx(noise_std, rel=0.1)
    stats = rnd.stats()
    assert stats.epsilon_spent is not None
    assert stats.epsilon_spent > 0
    assert stats.delta_spent == 1e-5


# ---------------------------------------------------------------- JSON


def test_federated_round_json_round_trip() -> None:
    rnd = FederatedRound.start(7, [ClientInfo("a", 5), "b"], global_model=MODEL)
    rnd.record_contribution("a", [1.0])
    rnd.complete([0.1, -2.5, 3.0e-8])
    data = json.loads(rnd.to_json())
    assert data["global_model"] == MODEL
    assert "contributions" not in data
    back = FederatedRound.from_json(rnd.to_json())
    assert back.to_dict() == rnd.to_dict()
    np.testing.assert_array_equal(back.aggregated_gradient, rnd.aggregated_gradient)
    assert back.is_started
    assert back.contributions == {}


def test_federated_round_json_defaults() -> None:
    legacy = FederatedRound(2, MODEL, 4)
    data = legacy.to_dict()
    del data["round_id"], data["expected_clients"], data["sample_counts"]
    back = FederatedRound.from_dict(data)
    assert back.round_id == 0
    assert back.expected_clients == []
    assert not back.is_started
    with pytest.raises(FederatedError):
        FederatedRound.from_json("[1, 2]")
    with pytest.raises(FederatedError):
        FederatedRound.from_json('{"round_num": 1}')


def test_round_stats_and_model_update_json() -> None:
    stats = RoundStats(1, 3, ["x"], 20, True, 1.5, 1e-5, ["y"], 2)
    assert RoundStats.from_json(stats.to_json()) == stats
    minimal = RoundStats.from_json(
        '{"round_id": 1, "participants": 2, "missing_clients": [], "duration_ms": 5}'
    )
    assert minimal.converged is False
    assert minimal.epsilon_spent is None
    update = ModelUpdate.new("peer", MODEL, 4)
    assert update.timestamp_ms > 1_600_000_000_000
    assert ModelUpdate.from_json(update.to_json()) == update
    with pytest.raises(FederatedError):
        ModelUpdate.from_json("not json")
    with pytest.raises(InvalidGradient):
        ModelUpdate.new("peer", MODEL, -1)


@settings(derandomize=True, deadline=None, max_examples=50)
@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=20),
    st.integers(min_value=0, max_value=2**31),
)
def test_round_json_property(values: list[float], round_id: int) -> None:
    rnd = FederatedRound.start(round_id, ["p"])
    rnd.complete(values)
    back = FederatedRound.from_json(rnd.to_json())
    np.testing.assert_array_equal(back.aggregated_gradient, np.asarray(values, np.float32))
    assert back.round_id == round_id


@settings(derandomize=True, deadline=None, max_examples=50)
@given(st.lists(st.integers(min_value=0, max_value=1000), min_size=1, max_size=6))
def test_fedavg_is_within_contribution_range(counts: list[int]) -> None:
    ids = [f"c{i}" for i in range(len(counts))]
    rnd = FederatedRound.start(0, [ClientInfo(c, n) for c, n in zip(ids, counts, strict=True)])
    for i, cid in enumerate(ids):
        rnd.record_contribution(cid, [float(i)])
    value = float(rnd.aggregate()[0])
    assert -1e-5 <= value <= len(ids) - 1 + 1e-5


# ---------------------------------------------------------------- ModelSyncProtocol


# Seed §11 test_model_sync_protocol
def test_model_sync_protocol() -> None:
    sync = ModelSyncProtocol(10, 3, 3, 0.01)
    assert sync.start_round(MODEL, 5) == 0
    assert sync.current_round() == 1
    assert sync.total_rounds() == 1
    sync.complete_round(0, [1.0, 2.0], 1.0)
    assert sync.latest_loss() == 1.0
    rnd = sync.get_round(0)
    assert rnd is not None
    np.testing.assert_array_equal(rnd.aggregated_gradient, [1.0, 2.0])
    assert sync.get_round(5) is None
    assert sync.max_rounds() == 10


# Seed §11 test_model_sync_protocol_convergence
def test_model_sync_protocol_convergence() -> None:
    sync = ModelSyncProtocol(10, 2, 3, 0.01)
    for loss in (1.0, 0.999, 0.998):
        idx = sync.start_round(MODEL, 2)
        assert sync.should_continue() or idx == 2
        sync.complete_round(idx, [0.0], loss)
    assert sync.has_converged()
    assert not sync.should_continue()
    assert sync.stats(2).converged


# Seed §11 test_model_sync_protocol_max_rounds and _min_clients
def test_model_sync_protocol_limits() -> None:
    sync = ModelSyncProtocol(2, 1, 3, 0.01)
    sync.start_round(MODEL, 1)
    sync.start_round(MODEL, 1)
    with pytest.raises(InvalidGradient, match="Maximum rounds reached: 2"):
        sync.start_round(MODEL, 1)
    sync = ModelSyncProtocol(10, 5, 3, 0.01)
    with pytest.raises(InvalidGradient, match="Not enough clients: need 5, got 3"):
        sync.start_round(MODEL, 3)
    assert sync.start_round(MODEL, 5) == 0


def test_model_sync_protocol_complete_errors() -> None:
    sync = ModelSyncProtocol(3, 1, 3, 0.01)
    with pytest.raises(InvalidGradient, match="Invalid round number: 0"):
        sync.complete_round(0, [1.0], 1.0)
    sync.start_round(MODEL, 1)
    sync.complete_round(0, [1.0], 1.0)
    # Fixed defect: completing twice no longer feeds the loss to the detector twice.
    with pytest.raises(InvalidGradient, match="already completed"):
        sync.complete_round(0, [1.0], 1.0)
    assert sync.convergence.history() == [1.0]


def test_record_secure_result_reports_dropped_clients() -> None:
    inputs = {c: np.full(4, float(i)) for i, c in enumerate(["a", "b", "c", "d", "e"])}
    result = run_secure_aggregation(
        inputs, 3, drop_before_masking={"b", "d"}, randbytes=np.random.default_rng(0).bytes
    )
    rnd = FederatedRound.start(0, list(inputs))
    mean = rnd.record_secure_result(result)
    np.testing.assert_allclose(mean, np.full(4, (0.0 + 2.0 + 4.0) / 3), atol=1e-6)
    assert rnd.stats().dropped_clients == ["b", "d"]
    with pytest.raises(ClientNotFound):
        FederatedRound.start(0, ["a"]).record_secure_result(result)
    with pytest.raises(NotStarted):
        FederatedRound(0, MODEL, 1).record_secure_result(result)
