from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import stats  # type: ignore[import-untyped]

from gradfed_ipfs import ConfigError, InvalidGradient, PrivacyBudgetExhausted
from gradfed_ipfs.federated.privacy.accountant import (
    PrivacyBudget,
    RdpPrivacyAccountant,
    laplace_event,
    subsampled_gaussian_event,
)
from gradfed_ipfs.federated.privacy.mechanisms import (
    AccountingMode,
    Calibration,
    DifferentialPrivacy,
    DPMechanism,
    clip_l2_norm,
    dp_noised_sum,
)

N_KS = 100_000


def dp_accounting_epsilon(event: dp_accounting.DpEvent, count: int, delta: float) -> float:
    acc = rdp.RdpAccountant()
    acc.compose(event, count)
    return float(acc.get_epsilon(delta))


# ---------------------------------------------------------------- budget


# Seed §11 test_privacy_budget (error class is PrivacyBudgetExhausted, not InvalidGradient)
def test_privacy_budget_seed_example() -> None:
    budget = PrivacyBudget(1.0, 1e-5)
    budget.consume(0.5)
    assert budget.remaining_epsilon == pytest.approx(0.5)
    assert budget.remaining_fraction() == pytest.approx(0.5)
    budget.consume(0.5)
    assert budget.is_exhausted()
    with pytest.raises(PrivacyBudgetExhausted, match="Insufficient privacy budget"):
        budget.consume(0.1)
    assert budget.spent() == (1.0, 0.0)  # pure-ε ledger spends no δ


@pytest.mark.parametrize(("eps", "delta"), [(0.0, 1e-5), (-1.0, 1e-5), (1.0, 0.0), (1.0, 1.0)])
def test_budget_validates(eps: float, delta: float) -> None:
    # Fixed defect: the seed accepted ε <= 0 and δ outside (0, 1).
    with pytest.raises(ConfigError):
        PrivacyBudget(eps, delta)


def test_accountant_matches_dp_accounting_reference() -> None:
    # Acceptance: q = 0.01, sigma = 1.1, 1000 steps, δ = 1e-5 -> about 1.71.
    expected = dp_accounting_epsilon(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 1000, 1e-5
    )
    acc = RdpPrivacyAccountant()
    acc.compose(subsampled_gaussian_event(1.1, 0.01), 1000)
    assert acc.epsilon(1e-5) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(1.71, abs=0.01)
    budget = PrivacyBudget(2.0, 1e-5, accountant=acc)
    eps, delta = budget.spent()
    assert eps == pytest.approx(expected)
    assert delta == 1e-5
    assert budget.remaining_epsilon == pytest.approx(2.0 - expected)


def test_accountant_composes_laplace_and_gaussian() -> None:
    acc = RdpPrivacyAccountant()
    assert acc.epsilon(1e-5) == 0.0
    assert acc.delta(1.0) == 0.0
    acc.compose(laplace_event(2.0), 3)
    acc.compose(subsampled_gaussian_event(4.0, 1.0))
    expected = dp_accounting_epsilon(
        dp_accounting.ComposedDpEvent(
            [
                dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(2.0), 3),
                dp_accounting.GaussianDpEvent(4.0),
            ]
        ),
        1,
        1e-6,
    )
    assert acc.epsilon(1e-6) == pytest.approx(expected)
    assert len(acc.events) == 2
    assert acc.delta(acc.epsilon(1e-6)) == pytest.approx(1e-6, rel=1e-3)
    # The ledger re-composes to the same answer.
    assert dp_accounting_epsilon(acc.ledger(), 1, 1e-6) == pytest.approx(expected)


def test_epsilon_if_does_not_mutate() -> None:
    acc = RdpPrivacyAccountant()
    event = subsampled_gaussian_event(1.0, 0.1)
    before = acc.epsilon_if(event, 1e-5, 10)
    assert acc.is_empty
    acc.compose(event, 10)
    assert acc.epsilon(1e-5) == pytest.approx(before)
    with pytest.raises(InvalidGradient):
        acc.compose(event, 0)
    with pytest.raises(ConfigError):
        subsampled_gaussian_event(1.0, 1.5)


def test_rounds_remaining_is_tight() -> None:
    acc = RdpPrivacyAccountant()
    acc.compose(subsampled_gaussian_event(1.1, 0.01), 200)
    budget = PrivacyBudget(1.5, 1e-5, accountant=acc)
    k = budget.rounds_remaining(1.1, 0.01)
    event = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1))
    assert k > 0
    assert dp_accounting_epsilon(event, 200 + k, 1e-5) <= 1.5 * (1 + 1e-9)
    assert dp_accounting_epsilon(event, 200 + k + 1, 1e-5) > 1.5
    assert PrivacyBudget(0.01, 1e-5, accountant=RdpPrivacyAccountant()).rounds_remaining(0.5) == 0


def test_budget_charge_refuses_without_composing() -> None:
    budget = PrivacyBudget(1.0, 1e-5, accountant=RdpPrivacyAccountant())
    big = subsampled_gaussian_event(0.5, 1.0)
    assert not budget.can_afford(big)
    with pytest.raises(PrivacyBudgetExhausted):
        budget.charge(big)
    assert budget.spent() == (0.0, 0.0)
    small = subsampled_gaussian_event(20.0, 1.0)
    budget.charge(small)
    assert 0 < budget.spent()[0] < 1.0


# ---------------------------------------------------------------- noise distributions


@pytest.mark.parametrize("mode", [AccountingMode.RDP, AccountingMode.LEGACY])
def test_gaussian_noise_passes_ks_at_requested_sigma(mode: AccountingMode) -> None:
    dp = DifferentialPrivacy(1e6, 1e-5, 2.0, accounting=mode, noise_multiplier=1.5, rng=11)
    sigma = dp.noise_multiplier(DPMechanism.GAUSSIAN) * 2.0
    grad = np.zeros(N_KS, dtype=np.float64)
    dp.add_gaussian_noise(grad)
    assert stats.kstest(grad, "norm", args=(0.0, sigma)).pvalue > 0.01
    # The test can fail: the same sample is rejected at a 5% larger sigma and as uniform.
    assert stats.kstest(grad, "norm", args=(0.0, sigma * 1.05)).pvalue < 0.01
    half_width = sigma * np.sqrt(3)
    assert stats.kstest(grad, "uniform", args=(-half_width, 2 * half_width)).pvalue < 0.01


def test_laplace_noise_passes_ks_at_requested_scale() -> None:
    dp = DifferentialPrivacy(1e6, 1e-5, 0.5, DPMechanism.LAPLACIAN, noise_multiplier=3.0, rng=12)
    grad = np.zeros(N_KS, dtype=np.float64)
    dp.add_laplacian_noise(grad)
    assert stats.kstest(grad, "laplace", args=(0.0, 1.5)).pvalue > 0.01
    assert stats.kstest(grad, "laplace", args=(0.0, 1.6)).pvalue < 0.01
    assert stats.kstest(grad, "norm", args=(0.0, 1.5 * np.sqrt(2))).pvalue < 0.01


def test_same_seed_same_noise_and_os_entropy_differs() -> None:
    a, b = np.zeros(8), np.zeros(8)
    DifferentialPrivacy(10, 1e-5, 1.0, rng=5).add_gaussian_noise(a)
    DifferentialPrivacy(10, 1e-5, 1.0, rng=5).add_gaussian_noise(b)
    np.testing.assert_array_equal(a, b)
    c, d = np.zeros(8), np.zeros(8)
    DifferentialPrivacy(10, 1e-5, 1.0, noise_multiplier=1.0).add_gaussian_noise(c)
    DifferentialPrivacy(10, 1e-5, 1.0, noise_multiplier=1.0).add_gaussian_noise(d)
    assert not np.array_equal(c, d)


# ---------------------------------------------------------------- budgeted releases


# Seed §11 test_differential_privacy_gaussian / _laplacian
@pytest.mark.parametrize("mechanism", [DPMechanism.Gaussian, DPMechanism.Laplacian])
def test_noise_changes_vector_and_spends(mechanism: DPMechanism) -> None:
    dp = DifferentialPrivacy(1.0, 1e-5, 1.0, mechanism, rng=1)
    grad = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    dp.apply_dp_sgd(grad, 10.0)
    assert not np.array_equal(grad, [1.0, 2.0, 3.0])
    assert np.all(np.isfinite(grad))
    assert grad.dtype == np.float32
    assert dp.remaining_budget() < 1.0


# Seed §11 test_privacy_budget_exhaustion, legacy flat ε/100 accounting
def test_legacy_budget_exhaustion_after_about_100_calls() -> None:
    dp = DifferentialPrivacy(1.0, 1e-5, 1.0, accounting=AccountingMode.LEGACY, rng=2)
    grad = np.zeros(4)
    successes = 0
    for _ in range(200):
        try:
            dp.add_gaussian_noise(grad)
        except PrivacyBudgetExhausted:
            break
        successes += 1
    assert 90 <= successes <= 110
    assert dp.remaining_budget() < 0.02
    assert dp.is_budget_exhausted()
    assert dp.rounds_remaining() == 0


def test_rdp_calibration_fits_planned_releases() -> None:
    dp = DifferentialPrivacy(1.0, 1e-5, 1.0, rng=3, planned_releases=100)
    assert dp.rounds_remaining() == 100
    grad = np.zeros(4)
    for _ in range(100):
        dp.add_gaussian_noise(grad)
    eps, delta = dp.spent()
    assert 0.99 <= eps <= 1.0 + 1e-9
    assert delta == 1e-5
    assert dp.is_budget_exhausted()
    reference = dp_accounting_epsilon(
        dp_accounting.GaussianDpEvent(dp.noise_multiplier()), 100, 1e-5
    )
    assert eps == pytest.approx(reference)


def test_rdp_spend_equals_dp_accounting_for_subsampled_releases() -> None:
    dp = DifferentialPrivacy(5.0, 1e-5, 1.0, noise_multiplier=1.1, sampling_rate=0.01, rng=4)
    grad = np.zeros(3)
    for _ in range(20):
        dp.add_gaussian_noise(grad)
    event = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1))
    assert dp.spent()[0] == pytest.approx(dp_accounting_epsilon(event, 20, 1e-5))


@pytest.mark.parametrize("as_list", [False, True])
def test_refusal_leaves_gradient_and_budget_unchanged(as_list: bool) -> None:
    # Fixed defect: the seed noised the gradient first and failed the budget check after.
    dp = DifferentialPrivacy(1.0, 1e-5, 1.0, rng=6, planned_releases=2)
    for _ in range(2):
        dp.add_gaussian_noise(np.zeros(2))
    spent = dp.spent()
    original = [1.0, 2.0, 3.0]
    grad: list[float] | np.ndarray = list(original) if as_list else np.array(original)
    for call in (dp.add_gaussian_noise, lambda g: dp.apply_dp_sgd(g, 1.0)):
        with pytest.raises(PrivacyBudgetExhausted):
            call(grad)
        assert list(grad) == original
    with pytest.raises(PrivacyBudgetExhausted):
        dp.dp_fedavg({"a": np.ones(3)})
    assert dp.spent() == spent


def test_apply_dp_sgd_noise_scales_with_clip_norm() -> None:
    # Fixed defect: the seed calibrated to the constructor's sensitivity, not clip_norm.
    dp = DifferentialPrivacy(1e6, 1e-5, 7.0, noise_multiplier=2.0, rng=7)
    grad = np.zeros(N_KS)
    dp.apply_dp_sgd(grad, 0.25)
    assert float(grad.std()) == pytest.approx(0.5, rel=0.02)


# Seed §11 test_dp_sgd
def test_dp_sgd_clips_before_noise() -> None:
    dp = DifferentialPrivacy(1e12, 1e-5, 1.0, noise_multiplier=1e-5, rng=8)
    grad = np.array([3.0, 4.0, 5.0, 6.0], dtype=np.float32)
    dp.apply_dp_sgd(grad, 5.0)
    assert float(np.linalg.norm(grad)) == pytest.approx(5.0, rel=1e-4)


def test_input_validation() -> None:
    dp = DifferentialPrivacy(1.0, 1e-5, 1.0, rng=9)
    with pytest.raises(InvalidGradient):
        dp.add_gaussian_noise(np.array([1, 2], dtype=np.int64))
    ro = np.zeros(2)
    ro.flags.writeable = False
    with pytest.raises(InvalidGradient):
        dp.add_gaussian_noise(ro)
    with pytest.raises(InvalidGradient):
        dp.add_gaussian_noise(np.array([np.nan]))
    assert dp.spent() == (0.0, 0.0)
    for kwargs in ({"sensitivity": 0.0}, {"sampling_rate": 0.0}, {"noise_multiplier": -1.0}):
        args = {"epsilon": 1.0, "delta": 1e-5, "sensitivity": 1.0} | kwargs
        with pytest.raises(ConfigError):
            DifferentialPrivacy(**args)  # type: ignore[arg-type]
    lap = DifferentialPrivacy(1.0, 1e-5, 1.0, DPMechanism.LAPLACIAN, sampling_rate=0.5)
    with pytest.raises(InvalidGradient, match="subsampled Laplace"):
        lap.add_laplacian_noise(np.zeros(2))


# ---------------------------------------------------------------- DP-FedAvg


def test_dp_fedavg_clips_each_contribution() -> None:
    dp = DifferentialPrivacy(1e12, 1e-5, 1.0, noise_multiplier=1e-5, rng=10)
    out = dp.dp_fedavg({"a": [3.0, 4.0], "b": [0.0, 0.5]})
    np.testing.assert_allclose(out, [0.3, 0.65], atol=1e-4)
    out = dp.dp_fedavg({"a": [3.0, 4.0]}, clip_norm=2.5, expected_clients=5)
    np.testing.assert_allclose(out, [0.3, 0.4], atol=1e-4)
    assert dp.spent()[0] > 0


def test_dp_noised_sum_noise_std() -> None:
    rng = np.random.default_rng(13)
    contributions = {"a": np.zeros(N_KS), "b": np.zeros(N_KS)}
    total = dp_noised_sum(contributions, 2.0, 1.5, rng)
    assert stats.kstest(total.astype(np.float64), "norm", args=(0.0, 3.0)).pvalue > 0.01
    with pytest.raises(InvalidGradient):
        dp_noised_sum({"a": np.zeros(2), "b": np.zeros(3)}, 1.0, 1.0, rng)


# ---------------------------------------------------------------- calibration


# Seed §11 test_noise_multiplier_calculation
def test_classic_noise_multiplier_matches_seed() -> None:
    calc = DifferentialPrivacy.calculate_noise_multiplier
    assert calc(1.0, 1e-5, 1.0) == pytest.approx(4.8448, abs=1e-4)
    assert calc(10.0, 1e-5, 1.0) == pytest.approx(0.48448, abs=1e-5)
    assert 0 < calc(1.0, 1e-5, 1.0) < 10
    assert calc(10.0, 1e-5, 1.0) < calc(1.0, 1e-5, 1.0)


@pytest.mark.parametrize("eps", [1.0, 2.0, 8.0])
def test_analytic_calibration_is_exact(eps: float) -> None:
    calc = DifferentialPrivacy.calculate_noise_multiplier
    sigma = calc(eps, 1e-5, 2.0, Calibration.ANALYTIC)
    # sigma/Δ gives exactly (ε, δ) by the analytic Gaussian mechanism.
    assert dp_accounting.get_epsilon_gaussian(sigma / 2.0, 1e-5) == pytest.approx(eps, rel=1e-6)
    assert calc(eps, 1e-5, 2.0, Calibration.AUTO) == sigma
    assert calc(0.5, 1e-5, 2.0, Calibration.AUTO) == calc(0.5, 1e-5, 2.0)


# ---------------------------------------------------------------- stateless helpers


# Seed §11 test_dp_gaussian_noise_scale (asserts the configured calibration's sigma exactly)
def test_gaussian_noise_sens_scale_and_no_spend() -> None:
    dp = DifferentialPrivacy(1.0, 1e-5, 1.0, calibration=Calibration.CLASSIC, rng=14)
    grad = np.zeros(N_KS)
    dp.add_gaussian_noise_sens(grad, 1.0)
    assert stats.kstest(grad, "norm", args=(0.0, 4.8448)).pvalue > 0.01
    assert dp.remaining_budget() == 1.0
    lap = np.zeros(N_KS)
    dp.add_laplace_noise_sens(lap, 2.0)
    assert stats.kstest(lap, "laplace", args=(0.0, 2.0)).pvalue > 0.01
    assert dp.spent() == (0.0, 0.0)


# Seed §11 test_dp_clip_l2_norm and test_dp_budget_exhaustion
def test_clip_l2_and_legacy_schedule() -> None:
    dp = DifferentialPrivacy(1.0, 1e-5, 1.0, rng=15)
    grad = [3.0, 4.0]
    dp.clip_l2(grad, 2.5)
    assert float(np.linalg.norm(grad)) == pytest.approx(2.5, abs=1e-4)
    small = np.array([0.3, 0.4])
    dp.clip_l2(small, 2.5)
    np.testing.assert_array_equal(small, [0.3, 0.4])
    assert not dp.is_exhausted_after(99)
    assert dp.is_exhausted_after(100)
    assert dp.is_exhausted_after(200)
    assert dp.remaining_budget_after(50) == pytest.approx(0.5)
    assert dp.get_privacy_params() == (1.0, 1e-5)


@settings(derandomize=True, deadline=None, max_examples=60)
@given(
    hnp.arrays(np.float64, st.integers(1, 30), elements=st.floats(-1e6, 1e6)),
    st.floats(1e-3, 1e3),
)
def test_clip_l2_norm_property(vector: np.ndarray, max_norm: float) -> None:
    clipped = clip_l2_norm(vector, max_norm)
    norm = float(np.linalg.norm(vector))
    assert float(np.linalg.norm(clipped)) <= max(max_norm * (1 + 1e-9), 0.0) or norm <= max_norm
    if norm <= max_norm:
        np.testing.assert_array_equal(clipped, vector)
    else:
        np.testing.assert_allclose(clipped * (norm / max_norm), vector, rtol=1e-9, atol=1e-9)
