"""Server optimizers, FedProx and q-FedAvg on small cases worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from gradfed_ipfs import ConfigError, InvalidGradient
from gradfed_ipfs.errors import ShapeMismatch
from gradfed_ipfs.tensor import (
    OptimizerState,
    ServerAdagrad,
    ServerAdam,
    ServerMomentum,
    ServerNesterov,
    ServerYogi,
    fedprox_gradient,
    qfedavg_update,
)
from gradfed_ipfs.tensor.fedopt import (
    decode_optimizer_state,
    encode_optimizer_state,
    optimizer_round,
)


def test_fedavgm_without_momentum_is_fedavg() -> None:
    model, _ = ServerMomentum().step([1.0, 2.0], [0.5, -0.5])
    np.testing.assert_array_equal(model, np.array([1.5, 1.5], dtype=np.float32))


def test_fedavgm_momentum_accumulates_over_rounds() -> None:
    # Prepare: beta = 0.5, eta = 1.  Round 1: v = [1, 2]; round 2: v = 0.5*[1, 2] + [1, 0].
    opt = ServerMomentum(server_learning_rate=1.0, server_momentum=0.5)
    # Execute
    x1, s1 = opt.step([0.0, 0.0], [1.0, 2.0])
    x2, s2 = opt.step(x1, [1.0, 0.0], s1)
    # Assert
    np.testing.assert_allclose(x1, [1.0, 2.0])
    np.testing.assert_allclose(x2, [2.5, 3.0])
    np.testing.assert_allclose(s2.arrays["v"], [1.5, 1.0])
    assert s2.step == 2


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_nesterov_two_equal_steps_look_ahead(momentum: float) -> None:
    # Step 1: v = Δ, x = η (1 + μ) Δ.  Step 2: v = (1 + μ) Δ, x += η (Δ + μ (1 + μ) Δ).
    opt = ServerNesterov(learning_rate=0.5, momentum=momentum)
    delta = np.array([1.0, -2.0], np.float32)
    x1, s1 = opt.step([0.0, 0.0], delta)
    x2, s2 = opt.step(x1, delta, s1)
    np.testing.assert_array_equal(x1, 0.5 * (1 + momentum) * delta)
    np.testing.assert_array_equal(s2.arrays["v"], (1 + momentum) * delta)
    np.testing.assert_array_equal(x2, x1 + 0.5 * (1 + momentum * (1 + momentum)) * delta)
    assert s2.step == 2
    assert opt.state_names == ("v",)


def test_fedadagrad_two_steps() -> None:
    opt = ServerAdagrad(eta=0.1)
    x1, s1 = opt.step([0.0, 0.0], [2.0, -1.0])
    np.testing.assert_allclose(x1, [0.1, -0.1], rtol=1e-6)
    x2, _ = opt.step(x1, [2.0, -1.0], s1)  # v = [8, 2]
    np.testing.assert_allclose(x2 - x1, [2 / np.sqrt(8) * 0.1, -1 / np.sqrt(2) * 0.1], rtol=1e-5)


def test_fedadam_first_step_is_eta_times_sign() -> None:
    # m = 0.1*delta, v = 0.01*delta^2, bias-corrected step 0.1*sqrt(0.01)/0.1 = 0.1.
    model, state = ServerAdam(eta=0.1).step([0.0, 0.0], [2.0, -1.0])
    np.testing.assert_allclose(model, [0.1, -0.1], rtol=1e-6)
    np.testing.assert_allclose(state.arrays["m"], [0.2, -0.1], rtol=1e-6)
    np.testing.assert_allclose(state.arrays["v"], [0.04, 0.01], rtol=1e-6)


def test_fedyogi_first_step() -> None:
    # v = 0 - 0.01*[4, 1]*sign(0 - [4, 1]) = [0.04, 0.01]; step 0.01*m/(sqrt(v)+1e-3).
    model, _ = ServerYogi().step([0.0, 0.0], [2.0, -1.0])
    np.testing.assert_allclose(model, [0.01 * 0.2 / 0.201, -0.01 * 0.1 / 0.101], rtol=1e-5)


@pytest.mark.parametrize(
    "opt", [ServerMomentum(server_momentum=0.9), ServerAdagrad(), ServerAdam(), ServerYogi()]
)
def test_state_round_trips_and_gives_the_same_next_step(
    opt: ServerMomentum | ServerAdagrad | ServerAdam | ServerYogi,
) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal(64).astype(np.float32)
    x, state = opt.step(x, rng.standard_normal(64).astype(np.float32))
    restored = OptimizerState.from_dict(state.to_dict(), 64)
    delta = rng.standard_normal(64).astype(np.float32)
    a, sa = opt.step(x, delta, state)
    b, sb = opt.step(x, delta, restored)
    np.testing.assert_array_equal(a, b)
    assert sa.to_dict() == sb.to_dict()


def test_inputs_are_not_modified_and_bad_updates_refused() -> None:
    model = np.ones(3, dtype=np.float32)
    update = np.full(3, 0.5, dtype=np.float32)
    ServerAdam().step(model, update)
    np.testing.assert_array_equal(model, np.ones(3))
    with pytest.raises(InvalidGradient, match="NaN or Inf"):
        ServerAdam().step(model, [np.nan, 0.0, 0.0])
    with pytest.raises(ShapeMismatch):
        ServerAdam().step(model, [1.0, 2.0])
    _, state = ServerAdam().step(model, update)
    with pytest.raises(ShapeMismatch):
        ServerAdam().step(np.ones(4), np.ones(4), state)


def test_bad_settings_and_state_are_refused() -> None:
    with pytest.raises(ConfigError):
        ServerMomentum(server_momentum=1.0)
    with pytest.raises(ConfigError):
        ServerAdam(eta=0.0)
    with pytest.raises(ConfigError, match="momentum"):
        ServerNesterov(momentum=1.0)
    with pytest.raises(ConfigError, match="learning_rate"):
        ServerNesterov(learning_rate=float("nan"))
    with pytest.raises(InvalidGradient, match="expected 8"):
        OptimizerState.from_dict({"step": 1, "arrays": {"m": b"\0" * 4}}, 2)
    with pytest.raises(InvalidGradient):
        OptimizerState.from_dict({"step": -1, "arrays": {}}, 2)


def test_fedprox_gradient_adds_the_proximal_pull() -> None:
    out = fedprox_gradient([1.0, 1.0], [2.0, 0.0], [1.0, 1.0], mu=0.5)
    np.testing.assert_allclose(out, [1.5, 0.5])
    with pytest.raises(InvalidGradient):
        fedprox_gradient([1.0], [1.0], [1.0], mu=-1.0)


def test_qfedavg_q0_is_the_mean_and_q1_weights_by_loss() -> None:
    np.testing.assert_allclose(
        qfedavg_update([[1.0, 0.0], [0.0, 1.0]], [1.0, 3.0], q=0.0, lipschitz=1.0), [0.5, 0.5]
    )
    # q = 1, L = 1: numerator [-1, -3], h = [2, 4]; update = [1, 3] / 6.
    np.testing.assert_allclose(
        qfedavg_update([[1.0, 0.0], [0.0, 1.0]], [1.0, 3.0], q=1.0, lipschitz=1.0),
        [1 / 6, 3 / 6],
        rtol=1e-6,
    )
    with pytest.raises(InvalidGradient):
        qfedavg_update([[1.0]], [1.0, 2.0], q=1.0, lipschitz=1.0)


def test_the_state_codec_packs_each_optimizers_arrays_in_its_order() -> None:
    nesterov = ServerNesterov()
    _, state = nesterov.step([0.0, 0.0], [1.0, 2.0])
    vector = encode_optimizer_state(nesterov, state)
    np.testing.assert_array_equal(vector, np.array([1, 1, 2], np.float32))  # [step, v]
    back = decode_optimizer_state(nesterov, vector, 2)
    assert back is not None
    assert back.step == 1
    np.testing.assert_array_equal(back.arrays["v"], state.arrays["v"])
    assert ServerAdam.state_names == ("m", "v")
    assert ServerMomentum.state_names == ("v",)
    with pytest.raises(InvalidGradient, match="lacks"):
        encode_optimizer_state(ServerAdam(), state)  # no "m"
    with pytest.raises(InvalidGradient, match="does not fit"):
        decode_optimizer_state(ServerAdam(), vector, 2)


def test_optimizer_round_is_the_step_on_the_scaled_weighted_mean() -> None:
    updates = [np.array([2.0, 0.0], np.float32), np.array([0.0, 4.0], np.float32)]
    params = np.array([1.0, 1.0], np.float32)
    moved, vector = optimizer_round(ServerNesterov(), params, updates, [1, 3], 0.5, None)
    expected, state = ServerNesterov().step(params, np.array([0.25, 1.5], np.float32))
    np.testing.assert_array_equal(moved, expected)
    np.testing.assert_array_equal(vector, encode_optimizer_state(ServerNesterov(), state))
