"""Each strategy on a hand-worked case (as Flower's strategy tests do); optimizer state codec."""

from __future__ import annotations

import numpy as np
import pytest

from gradfed_ipfs import ConfigError, InvalidGradient
from gradfed_ipfs.tensor import (
    Bulyan,
    Krum,
    Median,
    MultiKrum,
    OptimizerState,
    TrimmedMean,
    fedprox_gradient,
)
from gradfed_ipfs.training import (
    DiLoCo,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedProx,
    FedYogi,
    FitResult,
    QFedAvg,
    Robust,
    SparseLoCo,
    Strategy,
)
from gradfed_ipfs.training.strategy import decode_optimizer_state, encode_optimizer_state


def f32(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def fits(*updates: tuple[list[float], int, float | None]) -> list[FitResult]:
    return [
        FitResult(f"p{i}", np.array(u, np.float32), w, loss)
        for i, (u, w, loss) in enumerate(updates)
    ]


def step(
    strategy: Strategy, params: np.ndarray, results: list[FitResult], state: object = None
) -> tuple[np.ndarray, np.ndarray | None]:
    return strategy.aggregate(params, results, 1.0, state)  # type: ignore[arg-type]


def test_fedavg_is_the_sample_weighted_mean() -> None:
    # (1·[2, 0] + 3·[0, 4]) / 4 = [0.5, 3]
    new, state = step(FedAvg(), f32(1, 2), fits(([2, 0], 1, None), ([0, 4], 3, None)))
    np.testing.assert_array_equal(new, f32(1.5, 5))
    assert state is None


def test_fedavg_server_learning_rate_scales_the_mean() -> None:
    new, _ = FedAvg().aggregate(f32(1, 2), fits(([2, 0], 1, None), ([0, 4], 3, None)), 0.5, None)
    np.testing.assert_array_equal(new, f32(1.25, 3.5))


def test_fedprox_sends_mu_and_its_client_term_is_mu_times_drift() -> None:
    strategy = FedProx(proximal_mu=0.5)
    assert strategy.fit_config(3) == {"proximal_mu": 0.5}
    # g + μ (w - w0) = 1 + 0.5 (2 - 1) = 1.5
    np.testing.assert_array_equal(fedprox_gradient(f32(1), f32(2), f32(1), 0.5), f32(1.5))
    new, _ = step(strategy, f32(0), fits(([1], 1, None), ([3], 1, None)))
    np.testing.assert_array_equal(new, f32(2))
    with pytest.raises(ConfigError):
        FedProx(proximal_mu=-1.0)


def test_fedavgm_momentum_accumulates_across_rounds() -> None:
    strategy = FedAvgM(server_learning_rate=1.0, server_momentum=0.5)
    x1, s1 = step(
        strategy,
        f32(0),
        fits(
            ([1], 1, None),
        ),
    )
    np.testing.assert_array_equal(x1, f32(1))  # v = 1
    x2, s2 = step(
        strategy,
        x1,
        fits(
            ([1], 1, None),
        ),
        s1,
    )
    np.testing.assert_array_equal(x2, f32(2.5))  # v = 0.5·1 + 1 = 1.5
    assert s2 is not None
    np.testing.assert_array_equal(s2, f32(2, 1.5))  # [step, v]


def test_fedadagrad_first_step() -> None:
    # m = Δ = 2 (β₁ = 0), v = Δ² = 4, x += η m / (√v + τ) = 0.1 · 2 / 2
    new, state = step(
        FedAdagrad(eta=0.1),
        f32(0),
        fits(
            ([2], 1, None),
        ),
    )
    np.testing.assert_allclose(new, f32(0.1), rtol=1e-6)
    assert state is not None
    assert state[0] == 1


def test_fedadam_first_step_is_bias_corrected() -> None:
    # m = 0.1·2 = 0.2, v = 0.01·4 = 0.04, η' = 0.1·√0.01/0.1 = 0.1 -> x += 0.1·0.2/0.2
    new, state = step(
        FedAdam(eta=0.1),
        f32(0),
        fits(
            ([2], 1, None),
        ),
    )
    np.testing.assert_allclose(new, f32(0.1), rtol=1e-6)
    assert state is not None
    np.testing.assert_allclose(state, f32(1, 0.2, 0.04), rtol=1e-6)  # [step, m, v]


def test_fedyogi_first_step() -> None:
    # m = 0.2, v = 0 - 0.01·4·sign(0 - 4) = 0.04, x += 0.01 · 0.2 / (0.2 + 1e-3)
    new, _ = step(
        FedYogi(),
        f32(0),
        fits(
            ([2], 1, None),
        ),
    )
    np.testing.assert_allclose(new, f32(0.01 * 0.2 / 0.201), rtol=1e-6)


def test_qfedavg_hand_worked() -> None:
    # q = 0: the plain mean of the updates, whatever the weights
    new, _ = step(
        QFedAvg(q=0.0, client_learning_rate=0.5), f32(0), fits(([2], 1, 1.0), ([4], 9, 1.0))
    )
    np.testing.assert_allclose(new, f32(3), rtol=1e-6)
    # q = 1, L = 2, Δ = 1, F = (1, 3): Δw = -2, h = (4 + 2, 4 + 6); update = (2 + 6) / 16
    new, _ = step(
        QFedAvg(q=1.0, client_learning_rate=0.5), f32(0), fits(([1], 1, 1.0), ([1], 1, 3.0))
    )
    np.testing.assert_allclose(new, f32(0.5), rtol=1e-6)
    # no losses (all zero): the model stays
    new, _ = step(
        QFedAvg(),
        f32(7),
        fits(
            ([1], 1, 0.0),
        ),
    )
    np.testing.assert_array_equal(new, f32(7))


@pytest.mark.parametrize(
    ("rule", "updates", "expected"),
    [
        (Median(), [[1], [5], [100]], 5.0),
        (TrimmedMean(beta=0.34), [[1], [2], [100]], 2.0),  # one trimmed at each end
        (Krum(f=0), [[0], [1], [10]], 0.0),  # scores 1, 1, 81: the lowest index wins the tie
        (MultiKrum(f=0, m=2), [[0], [1], [10]], 0.5),  # the two most central, averaged
        (Bulyan(f=0), [[1], [2], [6]], 3.0),  # f = 0: every gradient, every value
    ],
)
def test_robust_rules(rule: object, updates: list[list[float]], expected: float) -> None:
    results = fits(*((u, 1, None) for u in updates))
    new, state = step(Robust(rule), f32(10), results)  # type: ignore[arg-type]
    np.testing.assert_allclose(new, f32(10 + expected), rtol=1e-6)
    assert state is None


def test_robust_name_names_the_rule() -> None:
    assert Robust(Bulyan(f=1)).name == "robust-bulyan"
    assert FedAdam().name == "fedadam"
    assert FedAvgM().name == "fedavgm"


def test_optimizer_state_codec_round_trips_and_refuses_other_lengths() -> None:
    strategy = FedAdam()
    state = OptimizerState(3, {"m": f32(1, 2), "v": f32(3, 4)})
    vector = encode_optimizer_state(strategy.optimizer, state)
    np.testing.assert_array_equal(vector, f32(3, 1, 2, 3, 4))
    back = decode_optimizer_state(strategy.optimizer, vector, 2)
    assert back is not None
    assert back.step == 3
    np.testing.assert_array_equal(back.arrays["v"], f32(3, 4))
    with pytest.raises(InvalidGradient):
        decode_optimizer_state(strategy.optimizer, vector, 3)
    with pytest.raises(InvalidGradient):
        decode_optimizer_state(strategy.optimizer, f32(-1, 1, 2, 3, 4), 2)


def test_diloco_is_nesterov_on_the_weighted_mean_with_opendilocos_defaults() -> None:
    strategy = DiLoCo()
    assert strategy.name == "diloco"
    assert (strategy.optimizer.learning_rate, strategy.optimizer.momentum) == (0.7, 0.9)  # type: ignore[attr-defined]
    # Δ = (1·[2] + 3·[-2]) / 4 = [-1]. Step 1: v = -1, x = 1 + 0.7·(-1 + 0.9·-1) = -0.33.
    results = fits(([2], 1, None), ([-2], 3, None))
    x1, s1 = step(strategy, f32(1), results)
    np.testing.assert_allclose(x1, f32(1 - 0.7 * 1.9), rtol=1e-6)
    np.testing.assert_array_equal(s1, f32(1, -1))  # [step, v]
    # Step 2, same Δ: v = 0.9·-1 - 1 = -1.9; x += 0.7·(-1 + 0.9·-1.9).
    x2, s2 = step(strategy, x1, results, s1)
    np.testing.assert_allclose(x2, x1 - 0.7 * (1 + 0.9 * 1.9), rtol=1e-6)
    np.testing.assert_allclose(s2, f32(2, -1.9), rtol=1e-6)
    with pytest.raises(ConfigError):
        DiLoCo(momentum=1.0)


def test_sparseloco_is_the_scaled_mean_without_state_and_fedavgs_bits_at_1() -> None:
    results = fits(([2, 0], 1, None), ([0, 4], 3, None))
    new, state = step(SparseLoCo(outer_lr=0.5), f32(1, 2), results)
    np.testing.assert_array_equal(new, f32(1.25, 3.5))
    assert state is None
    rng = np.random.default_rng(3)
    params = rng.standard_normal(64).astype(np.float32)
    many = [FitResult(f"p{i}", rng.standard_normal(64).astype(np.float32), i + 1) for i in range(3)]
    plain, _ = FedAvg().aggregate(params, many, 0.3, None)
    sparse, _ = SparseLoCo().aggregate(params, many, 0.3, None)
    assert plain.tobytes() == sparse.tobytes()
    assert SparseLoCo().name == "sparseloco"
    with pytest.raises(ConfigError):
        SparseLoCo(outer_lr=0.0)
