from __future__ import annotations

import numpy as np
import pytest

from gradfed_ipfs import MemoryBlockStore
from gradfed_ipfs.errors import (
    DimensionMismatch,
    EmptyGradients,
    InvalidGradient,
    NodeNotFound,
    PeerNotFound,
)
from gradfed_ipfs.formats import decode_gradient
from gradfed_ipfs.seed import (
    AggregationMethod,
    BackwardPassConfig,
    BackwardPassStats,
    BackwardPassStep,
    BackwardStepStatus,
    LegacyBackwardPassCoordinator,
    StepCoordinator,
    clip_gradient_norm,
    federated_average,
)
from gradfed_ipfs.tensor import Contribution
from tests.helpers import FakeClock

# ----------------------------------------------------------------------- seed §11 cases


def test_schedule_and_receive_gradient() -> None:
    coord = StepCoordinator()
    coord.schedule_step("layer1", "matmul", ["p1", "p2"])
    assert coord.next_ready_step() is None
    coord.receive_gradient("layer1", "p1", "cid1")
    coord.receive_gradient("layer1", "p2", "cid2")
    step = coord.next_ready_step()
    assert step is not None
    assert step.node_id == "layer1"
    assert step.peer_contributions["p1"] == BackwardStepStatus.GradientReceived("cid1")


def test_receive_gradient_unknown_node() -> None:
    coord = StepCoordinator()
    with pytest.raises(NodeNotFound, match="Node not found in backward pass schedule: nope"):
        coord.receive_gradient("nope", "p1", "c")


def test_receive_gradient_unknown_peer() -> None:
    coord = StepCoordinator()
    coord.schedule_step("layer1", "matmul", ["p1"])
    with pytest.raises(PeerNotFound, match="Peer not found in step: p9"):
        coord.receive_gradient("layer1", "p9", "c")


def test_federated_average() -> None:
    np.testing.assert_array_equal(federated_average([[1, 2, 3], [3, 4, 5]]), [2, 3, 4])
    np.testing.assert_array_equal(federated_average([[1.5, 2]]), [1.5, 2])
    with pytest.raises(EmptyGradients):
        federated_average([])
    with pytest.raises(DimensionMismatch):
        federated_average([[1, 2], [1, 2, 3]])


def test_gradient_clipping() -> None:
    g = np.array([3.0, 4.0], np.float32)
    clip_gradient_norm(g, 1.0)
    assert np.linalg.norm(g) == pytest.approx(1.0, abs=1e-6)
    small = np.array([0.3, 0.4], np.float32)
    clip_gradient_norm(small, 1.0)
    np.testing.assert_array_equal(small, np.array([0.3, 0.4], np.float32))


def test_apply_gradient_with_lr() -> None:
    coord = StepCoordinator().with_learning_rate(0.1)
    params = np.array([1.0, 2.0, 3.0], np.float32)
    out = coord.apply_gradient(params, [0.5, 1.0, 1.5])
    assert out is params
    np.testing.assert_allclose(params, [0.95, 1.90, 2.85], rtol=1e-6)


def test_apply_gradient_keeps_shape_in_place() -> None:
    coord = StepCoordinator().with_learning_rate(1.0)
    params = np.ones((2, 2), np.float32)[:, :1]  # non-contiguous view
    coord.apply_gradient(params, [1.0, 2.0])
    np.testing.assert_array_equal(params, [[0.0], [-1.0]])


def test_apply_gradient_dimension_mismatch() -> None:
    with pytest.raises(DimensionMismatch):
        StepCoordinator().apply_gradient(np.zeros(3, np.float32), [1.0, 2.0])


def test_backward_pass_stats() -> None:
    coord = StepCoordinator()
    coord.schedule_step("l1", "matmul", ["p1", "p2"])
    coord.schedule_step("l2", "relu", ["p1", "p2"])
    stats = coord.stats()
    assert stats == BackwardPassStats(
        total_steps=2, completed_steps=0, pending_steps=2, participating_peers=2
    )


def test_aggregation_methods() -> None:
    coord = StepCoordinator(BackwardPassConfig(aggregation=AggregationMethod.Sum()))
    result = coord.aggregate_gradients("n", [("p1", [1, 2]), ("p2", [3, 4])])
    np.testing.assert_array_equal(result, [4, 6])


def test_aggregation_weighted_mean() -> None:
    method = AggregationMethod.WeightedMean(weights=[1.0, 3.0])
    coord = StepCoordinator(BackwardPassConfig(aggregation=method))
    result = coord.aggregate_gradients("n", [("p1", [0.0]), ("p2", [4.0])])
    np.testing.assert_allclose(result, [3.0])


def test_weighted_mean_maps_weights_by_sorted_peer_id() -> None:
    # The seed used list order; ours maps positional weights to sorted peer IDs.
    method = AggregationMethod.WeightedMean(weights=[1.0, 3.0])
    coord = StepCoordinator(BackwardPassConfig(aggregation=method))
    result = coord.aggregate_gradients("n", [("p2", [4.0]), ("p1", [0.0])])
    np.testing.assert_allclose(result, [3.0])
    by_id = AggregationMethod.WeightedMean(weights={"p1": 3.0, "p2": 1.0})
    coord = StepCoordinator(BackwardPassConfig(aggregation=by_id))
    np.testing.assert_allclose(coord.aggregate_gradients("n", {"p1": [0.0], "p2": [4.0]}), [1.0])


def test_fedavg_uses_sample_counts() -> None:
    coord = StepCoordinator()
    result = coord.aggregate_gradients(
        "n", {"a": Contribution.of([0.0, 0.0], 100), "b": Contribution.of([2.0, 4.0], 300)}
    )
    np.testing.assert_allclose(result, [1.5, 3.0])


def test_aggregation_with_clipping() -> None:
    coord = StepCoordinator(
        BackwardPassConfig(aggregation=AggregationMethod.Mean(), gradient_clipping=1.0)
    )
    result = coord.aggregate_gradients("n", [("p1", [3.0, 4.0])])
    assert np.linalg.norm(result) == pytest.approx(1.0, abs=1e-6)
    assert coord.accumulation_buffer["n"] is result


def test_aggregate_errors() -> None:
    coord = StepCoordinator(BackwardPassConfig(max_peers=2))
    with pytest.raises(EmptyGradients):
        coord.aggregate_gradients("n", [])
    with pytest.raises(DimensionMismatch):
        coord.aggregate_gradients("n", [("a", [1.0]), ("b", [1.0, 2.0])])
    with pytest.raises(InvalidGradient, match="twice"):
        coord.aggregate_gradients("n", [("a", [1.0]), ("a", [2.0])])
    with pytest.raises(InvalidGradient, match="max_peers"):
        coord.aggregate_gradients("n", [("a", [1.0]), ("b", [1.0]), ("c", [1.0])])
    coord.schedule_step("s", "op", ["a"])
    with pytest.raises(PeerNotFound):
        coord.aggregate_gradients("s", [("zz", [1.0])])


def test_aggregate_marks_received_peers_aggregated() -> None:
    coord = StepCoordinator()
    coord.schedule_step("n", "matmul", ["p1", "p2"])
    coord.receive_gradient("n", "p1", "c1")
    coord.receive_gradient("n", "p2", "c2")
    coord.aggregate_gradients("n", [("p1", [1.0, 2.0]), ("p2", [3.0, 4.0])])
    step = coord.steps[0]
    assert all(s == BackwardStepStatus.Aggregated() for s in step.peer_contributions.values())
    stats = coord.stats()
    assert stats.completed_steps == 1
    assert stats.pending_steps == 0
    assert stats.total_gradient_bytes == 8
    # An aggregated step still counts as ready, as in the seed.
    assert coord.next_ready_step() is step


def test_step_completion_tracking() -> None:
    step = BackwardPassStep.new("n", "op")
    for peer in ("a", "b", "c"):
        step.add_peer(peer)
    step.record_gradient_received("a", "c1")
    step.record_gradient_received("b", "c2")
    assert not step.is_complete()
    assert step.received_count() == 2
    step.record_gradient_failed("c", "crash")
    assert step.is_complete()
    assert step.failed_count() == 1
    assert not step.ready_to_aggregate()


def test_step_ready_to_aggregate_all_received() -> None:
    step = BackwardPassStep.new("n", "op")
    assert step.is_complete()  # vacuous
    assert not step.ready_to_aggregate()
    step.add_peer("a")
    step.add_peer("b")
    step.request("a")
    assert step.peer_contributions["a"] == BackwardStepStatus.GradientRequested("a")
    step.record_gradient_received("a", "c1")
    step.record_gradient_received("b", "c2")
    step.add_peer("a")  # no effect on an existing peer
    assert step.ready_to_aggregate()


def test_alias() -> None:
    assert LegacyBackwardPassCoordinator is StepCoordinator
    assert StepCoordinator().learning_rate == pytest.approx(0.01)


# ----------------------------------------------------------------------- fixes


def test_timeout_marks_waiting_peers_failed() -> None:
    clock = FakeClock()
    coord = StepCoordinator(BackwardPassConfig(timeout=10.0), clock=clock)
    coord.schedule_step("n", "matmul", ["p1", "p2", "p3"])
    coord.receive_gradient("n", "p1", "c1")
    clock.now += 9.999
    assert coord.check_timeouts() == {}
    assert coord.stats().pending_steps == 1
    clock.now += 0.001
    stats = coord.stats()
    assert stats.failed_steps == 1
    assert stats.pending_steps == 0
    step = coord.steps[0]
    assert isinstance(step.peer_contributions["p2"], BackwardStepStatus.Failed)
    assert "timed out" in step.peer_contributions["p3"].reason  # type: ignore[attr-defined]
    assert step.peer_contributions["p1"] == BackwardStepStatus.GradientReceived("c1")
    assert step.is_complete()
    assert coord.next_ready_step() is None
    # A late gradient does not revive the peer.
    late = coord.receive_gradient("n", "p2", "c2")
    assert isinstance(late, BackwardStepStatus.Failed)


def test_check_timeouts_reports_each_peer_once() -> None:
    clock = FakeClock()
    coord = StepCoordinator(BackwardPassConfig(timeout=1.0), clock=clock)
    coord.schedule_step("a", "op", ["p1"])
    clock.now += 0.5
    coord.schedule_step("b", "op", ["p2"])
    clock.now += 0.5
    assert coord.check_timeouts() == {"a": ["p1"]}
    clock.now += 0.5
    assert coord.check_timeouts() == {"b": ["p2"]}
    assert coord.check_timeouts() == {}


def test_max_peers_enforced_on_schedule() -> None:
    coord = StepCoordinator(BackwardPassConfig(max_peers=2))
    with pytest.raises(InvalidGradient, match="max_peers"):
        coord.schedule_step("n", "op", ["a", "b", "c"])
    coord.schedule_step("n", "op", ["a", "b", "a"])  # duplicates count once
    assert coord.stats().participating_peers == 2


async def test_commit_aggregate_sets_cid() -> None:
    store = MemoryBlockStore()
    coord = StepCoordinator()
    coord.schedule_step("layer1", "matmul", ["p1"])
    with pytest.raises(NodeNotFound):
        await coord.commit_aggregate("layer1", store)
    coord.receive_gradient("layer1", "p1", "c1")
    agg = coord.aggregate_gradients("layer1", [("p1", [1.0, 2.0, 3.0])])
    cid = await coord.commit_aggregate("layer1", store)
    assert coord.steps[0].aggregated_gradient_cid == str(cid)
    assert str(cid).startswith("bafkrei")
    decoded = decode_gradient((await store.get(cid)).data)
    np.testing.assert_array_equal(decoded.values, agg)
    assert decoded.layer == "layer1"
    assert await store.is_pinned(cid)
