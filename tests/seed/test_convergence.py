from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradfed_ipfs import ConfigError, InvalidGradient
from gradfed_ipfs.seed import ConvergenceConfig, ConvergenceDetector


def test_config_defaults_match_seed() -> None:
    cfg = ConvergenceConfig()
    assert (cfg.threshold, cfg.window_size, cfg.smoothing, cfg.patience) == (1e-4, 10, 0.9, 3)


@pytest.mark.parametrize(
    "kwargs", [{"window_size": 0}, {"patience": 0}, {"smoothing": 1.5}, {"threshold": -1.0}]
)
def test_config_rejects_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        ConvergenceConfig(**kwargs)  # type: ignore[arg-type]


# Seed §11 test_convergence_detector
def test_legacy_converges_on_small_cv() -> None:
    det = ConvergenceDetector(3, 0.01)
    for loss in (1.0, 0.99, 0.98):
        det.add_loss(loss)
    assert det.has_converged()
    assert det.converged()
    assert det.latest_loss() == 0.98
    assert len(det.history()) == 3
    det.reset()
    assert det.history() == []
    assert det.latest_loss() is None
    assert not det.has_converged()


# Seed §11 test_convergence_detector_not_converged
def test_legacy_not_converged_on_large_cv() -> None:
    det = ConvergenceDetector(3, 0.01)
    for loss in (1.0, 0.5, 1.5):
        det.add_loss(loss)
    assert not det.has_converged()


def test_legacy_needs_full_window_and_keeps_last() -> None:
    det = ConvergenceDetector(3, 0.01)
    det.add_loss(1.0)
    det.add_loss(1.0)
    assert not det.has_converged()
    for loss in (5.0, 1.0, 1.0, 1.0):
        det.add_loss(loss)
    assert det.history() == [1.0, 1.0, 1.0]
    assert det.has_converged()


def test_legacy_zero_mean_counts_as_converged() -> None:
    det = ConvergenceDetector(2, 0.01)
    det.add_loss(0.0)
    det.add_loss(0.0)
    assert det.has_converged()


def test_legacy_cv_value_is_population_std() -> None:
    # [1.0, 0.99, 0.98]: CV = 0.008165/0.99 = 0.00825 -> converged at 0.0083, not at 0.0082.
    for thr, expected in ((0.0083, True), (0.0082, False)):
        det = ConvergenceDetector(3, thr)
        for loss in (1.0, 0.99, 0.98):
            det.add_loss(loss)
        assert det.has_converged() is expected


# Seed §11 test_convergence_detector_converges
def test_ema_converges() -> None:
    det = ConvergenceDetector.with_config(
        ConvergenceConfig(threshold=0.01, window_size=4, smoothing=0.9, patience=3)
    )
    results = [det.update(x) for x in (10.0, 5.0, 2.0, 1.0, 0.5)]
    assert not any(results)
    results += [det.update(0.5 - 0.001 * i) for i in range(12)]
    assert results[-1]
    assert det.converged()
    # The plateau starts once the window holds only the slow tail; the first True needs patience.
    first = results.index(True)
    assert det.plateau_rounds() >= 3
    assert first >= 5 + 2


# Seed §11 test_convergence_detector_no_convergence
def test_ema_alternating_never_converges() -> None:
    det = ConvergenceDetector.with_config(ConvergenceConfig(threshold=0.01, window_size=5))
    assert not any(det.update(float(i % 2)) for i in range(50))
    assert det.plateau_rounds() == 0
    assert not det.converged()


# Seed §11 test_convergence_detector_plateau
def test_ema_plateau_counter() -> None:
    det = ConvergenceDetector.with_config(ConvergenceConfig(threshold=0.1, window_size=4))
    for _ in range(10):
        det.update(0.5)
    assert det.plateau_rounds() >= 3
    assert det.plateau_rounds() == 9  # the first update has no difference yet


def test_ema_smoothed_loss_and_norm() -> None:
    det = ConvergenceDetector.with_config(ConvergenceConfig(smoothing=0.5, window_size=3))
    assert math.isnan(det.smoothed_loss())
    assert det.gradient_norm() > 1e38
    det.update(4.0)
    det.update(2.0)
    assert det.smoothed_loss() == pytest.approx(3.0)
    assert det.gradient_norm() == pytest.approx(2.0)
    det.update(2.0)
    det.update(3.0)  # window is now [2, 2, 3]
    assert det.gradient_norm() == pytest.approx(0.5)
    det.reset()
    assert math.isnan(det.smoothed_loss())
    assert det.plateau_rounds() == 0


def test_update_on_plain_detector_uses_default_config() -> None:
    det = ConvergenceDetector(3, 0.5)
    assert det.config() is None
    for _ in range(4):
        det.update(1.0)
    # default threshold 1e-4, patience 3: three zero-change updates reach patience
    assert det.plateau_rounds() == 3
    assert det.converged()
    assert not det.has_converged()  # legacy window untouched


def test_non_finite_loss_rejected() -> None:
    det = ConvergenceDetector(3, 0.01)
    with pytest.raises(InvalidGradient):
        det.add_loss(math.nan)
    with pytest.raises(InvalidGradient):
        det.update(math.inf)


@settings(derandomize=True, deadline=None)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=40))
def test_plateau_count_is_bounded_by_updates(losses: list[float]) -> None:
    det = ConvergenceDetector.with_config(ConvergenceConfig(threshold=1.0, window_size=4))
    for i, loss in enumerate(losses):
        det.update(loss)
        assert 0 <= det.plateau_rounds() <= i
    assert len(det.history()) == 0


@settings(derandomize=True, deadline=None)
@given(st.floats(min_value=0.1, max_value=1e3), st.integers(min_value=2, max_value=8))
def test_constant_losses_always_converge(value: float, window: int) -> None:
    det = ConvergenceDetector(window, 1e-6)
    for _ in range(window):
        det.add_loss(value)
    assert det.has_converged()
