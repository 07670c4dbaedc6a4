"""Differential privacy for gradients: mechanisms and client-level DP-FedAvg (seed §6.2-6.4).

What changed from the seed (seed-api §12, items 2-3):

* Gaussian noise is Gaussian and Laplace noise is Laplace, drawn from a ``numpy.random.Generator``
  the caller seeds (an int or a Generator). ``rng=None`` seeds from OS entropy, the only choice fit
  for a real release: whoever knows a fixed seed can subtract the noise.
* The budget is checked *before* the gradient is touched; a refused call raises
  :class:`~gradfed_ipfs.errors.PrivacyBudgetExhausted` and leaves the gradient unchanged.
* Accounting (``AccountingMode.RDP``, the default) composes every release in an RDP accountant
  from ``dp_accounting`` (:mod:`.accountant`) and refuses a release that
  would push the spent ε at the budget's δ over the budget. The noise multiplier is either given
  or calibrated by ``dp_accounting`` so that ``planned_releases`` releases (100, the seed's
  figure) exactly fit the budget. ``AccountingMode.LEGACY`` keeps the seed's flat ε/100 per call;
  it is *not* a privacy guarantee and exists for compatibility only.
* ``apply_dp_sgd`` calibrates the noise to ``clip_norm`` (the seed used the constructor's
  sensitivity), and :meth:`DifferentialPrivacy.dp_fedavg` is client-level DP-FedAvg
  (McMahan et al. 2018, https://arxiv.org/abs/1710.06963): clip each contribution to C, add
  N(0, (zC)^2) to the sum.
* :meth:`DifferentialPrivacy.calculate_noise_multiplier` keeps the classic Dwork-Roth formula
  ``Δ·sqrt(2 ln(1.25/δ))/ε`` (valid only for ε < 1) and offers the analytic Gaussian calibration
  of Balle & Wang 2018 (https://arxiv.org/abs/1805.06530, via ``dp_accounting``), which
  ``Calibration.AUTO`` uses for ε >= 1.
* Errors: the seed raised ``InvalidGradient`` for an exhausted budget; we raise
  ``PrivacyBudgetExhausted`` (a ``FederatedError`` and ``ValueError``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, MutableSequence
from enum import Enum
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
from numpy.typing import NDArray

from ..._types import FloatArray, GradientLike
from ...errors import ConfigError, InvalidGradient, NoContributions, PrivacyBudgetExhausted
from ...tensor.robust import clip_to_norm
from .accountant import (
    REL_TOL,
    PrivacyBudget,
    RdpPrivacyAccountant,
    _dp,
    check_privacy_params,
    laplace_event,
    subsampled_gaussian_event,
)

if TYPE_CHECKING:
    import dp_accounting

__all__ = [
    "AccountingMode",
    "Calibration",
    "DPMechanism",
    "DifferentialPrivacy",
    "MutableGradient",
    "clip_l2_norm",
    "dp_noised_sum",
]

MutableGradient: TypeAlias = NDArray[np.floating] | MutableSequence[float]
"""A gradient DP can noise in place: a writeable float NumPy array or a list of floats."""


class DPMechanism(Enum):
    """The noise distribution (seed ``Gaussian | Laplacian``)."""

    GAUSSIAN = "gaussian"
    LAPLACIAN = "laplacian"
    # The seed's spellings, as aliases.
    Gaussian = "gaussian"
    Laplacian = "laplacian"


class AccountingMode(Enum):
    """How releases are charged to the budget."""

    RDP = "rdp"
    """Compose each release in the RDP accountant; refuse when ε(δ) would exceed the budget."""
    LEGACY = "legacy"
    """The seed's flat ε/100 per call (not a privacy guarantee; compatibility only)."""


class Calibration(Enum):
    """How a single-release Gaussian sigma is derived from (ε, δ)."""

    CLASSIC = "classic"
    """Dwork-Roth ``Δ·sqrt(2 ln(1.25/δ))/ε``; valid for ε < 1 only (the seed's formula)."""
    ANALYTIC = "analytic"
    """Balle & Wang 2018 analytic Gaussian mechanism (exact for every ε)."""
    AUTO = "auto"
    """``CLASSIC`` for ε < 1, ``ANALYTIC`` for ε >= 1."""


def clip_l2_norm(vector: NDArray[np.float64], max_norm: float) -> NDArray[np.float64]:
    """Return ``vector`` scaled down to L2 norm ``max_norm`` if it is longer (else unchanged).

    :func:`~gradfed_ipfs.tensor.robust.clip_to_norm` with a float64 norm, as a copy.

    Parameters
    ----------
    vector
        Any shape.
    max_norm
        Largest allowed L2 norm (> 0).

    Returns
    -------
    numpy.ndarray
        Same shape and dtype.
    """
    return clip_to_norm(vector, max_norm, reject_non_finite=False, precision="float64")


def dp_noised_sum(
    contributions: Mapping[str, GradientLike],
    clip_norm: float,
    noise_multiplier: float,
    rng: np.random.Generator,
) -> FloatArray:
    """Clip each contribution to ``clip_norm``, sum them and add N(0, (z·C)²) per coordinate.

    Pure DP-FedAvg math (McMahan et al. 2018); it charges no budget.

    Parameters
    ----------
    contributions
        One vector of shape ``(d,)`` per client id; summed in sorted id order.
    clip_norm
        C, the per-client L2 bound and hence the sum's sensitivity.
    noise_multiplier
        z, the noise std relative to C (>= 0).
    rng
        Source of the noise.

    Returns
    -------
    FloatArray
        The noised sum, shape ``(d,)``, float32.
    """
    if not contributions:
        raise NoContributions()
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise InvalidGradient(f"noise_multiplier must be finite and >= 0, got {noise_multiplier}")
    ids = sorted(contributions)
    vectors = [_finite_f64(contributions[cid]).reshape(-1) for cid in ids]
    length = vectors[0].shape[0]
    total = np.zeros(length, dtype=np.float64)
    for cid, vec in zip(ids, vectors, strict=True):
        if vec.shape[0] != length:
            raise InvalidGradient(f"contribution {cid} has length {vec.shape[0]}, not {length}")
        total += clip_l2_norm(vec, clip_norm)
    total += rng.normal(0.0, noise_multiplier * clip_norm, size=length)
    return total.astype(np.float32)


def _finite_f64(gradient: GradientLike) -> NDArray[np.float64]:
    values = np.array(gradient, dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise InvalidGradient("gradient contains NaN or Inf")
    return values


def _read(gradient: MutableGradient) -> NDArray[np.float64]:
    if isinstance(gradient, np.ndarray):
        if not np.issubdtype(gradient.dtype, np.floating):
            raise InvalidGradient(f"gradient must have a float dtype, got {gradient.dtype}")
        if not gradient.flags.writeable:
            raise InvalidGradient("gradient array is read-only")
    return _finite_f64(gradient)


def _write(gradient: MutableGradient, values: NDArray[np.float64]) -> None:
    if isinstance(gradient, np.ndarray):
        gradient[...] = values.astype(gradient.dtype)
    else:
        gradient[:] = [float(v) for v in values.reshape(-1)]


class DifferentialPrivacy:
    """Budgeted Gaussian / Laplace noise for gradients, with RDP accounting.

    Parameters
    ----------
    epsilon, delta
        The total privacy budget (ε > 0, δ in (0, 1)).
    sensitivity
        L2 (Gaussian) or L1 (Laplace) sensitivity Δ of one release (> 0).
    mechanism
        The mechanism :meth:`apply_dp_sgd` uses.
    accounting
        ``RDP`` (default) or the seed's ``LEGACY`` flat ε/100 per call.
    noise_multiplier
        Noise std (Laplace scale) divided by Δ, in either mode. ``None`` calibrates it with
        ``dp_accounting`` so that ``planned_releases`` releases spend exactly the budget
        (RDP mode), or to one release of the whole (ε, δ) (legacy mode, as in the seed).
    sampling_rate
        RDP mode, Gaussian only: Poisson sampling rate q of each release (1 = no sampling).
    planned_releases
        Releases the calibrated noise multiplier is sized for (default 100, like the seed).
    calibration
        How single-release sigma follows from (ε, δ) in legacy mode and the ``*_sens`` helpers.
    rng
        A Generator, an int seed, or ``None`` for OS entropy.
    """

    def __init__(  # noqa: PLR0913 - public constructor: keyword-only DP settings
        self,
        epsilon: float,
        delta: float,
        sensitivity: float,
        mechanism: DPMechanism = DPMechanism.GAUSSIAN,
        *,
        accounting: AccountingMode = AccountingMode.RDP,
        noise_multiplier: float | None = None,
        sampling_rate: float = 1.0,
        planned_releases: int = 100,
        calibration: Calibration = Calibration.AUTO,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        check_privacy_params(epsilon, delta)
        if not (math.isfinite(sensitivity) and sensitivity > 0):
            raise ConfigError(f"sensitivity must be finite and > 0, got {sensitivity}")
        if not 0.0 < sampling_rate <= 1.0:
            raise ConfigError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
        if planned_releases < 1:
            raise ConfigError(f"planned_releases must be >= 1, got {planned_releases}")
        if noise_multiplier is not None and not (
            math.isfinite(noise_multiplier) and noise_multiplier > 0
        ):
            raise ConfigError(f"noise_multiplier must be finite and > 0, got {noise_multiplier}")
        self.sensitivity = float(sensitivity)
        self.mechanism = mechanism
        self.accounting = accounting
        self.sampling_rate = float(sampling_rate)
        self.planned_releases = planned_releases
        self.calibration = calibration
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        accountant = RdpPrivacyAccountant() if accounting is AccountingMode.RDP else None
        self.budget = PrivacyBudget(epsilon, delta, accountant=accountant)
        self._multipliers: dict[DPMechanism, float] = {}
        if noise_multiplier is not None:
            self._multipliers = dict.fromkeys(DPMechanism, float(noise_multiplier))

    # ------------------------------------------------------------------ calibration

    @staticmethod
    def calculate_noise_multiplier(
        epsilon: float,
        delta: float,
        sensitivity: float,
        calibration: Calibration = Calibration.CLASSIC,
    ) -> float:
        """Return the Gaussian sigma for one (ε, δ)-DP release of sensitivity Δ.

        Parameters
        ----------
        epsilon, delta
            The target guarantee.
        sensitivity
            L2 sensitivity Δ.
        calibration
            ``CLASSIC`` (the seed's formula; default), ``ANALYTIC`` or ``AUTO``.

        Returns
        -------
        float
            sigma in gradient units. Classic at ε=1, δ=1e-5, Δ=1 is about 4.8448.
        """
        check_privacy_params(epsilon, delta)
        use_analytic = calibration is Calibration.ANALYTIC or (
            calibration is Calibration.AUTO and epsilon >= 1.0
        )
        if use_analytic:
            return float(_dp().get_sigma_gaussian(epsilon, delta)) * sensitivity
        return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon

    def noise_multiplier(self, mechanism: DPMechanism | None = None) -> float:
        """Return the noise multiplier (std or Laplace scale over Δ) used for ``mechanism``.

        Parameters
        ----------
        mechanism
            Defaults to the configured mechanism.

        Returns
        -------
        float
            RDP mode: given or calibrated for ``planned_releases``. Legacy mode: the
            single-release value for the whole (ε, δ), as in the seed.
        """
        mech = self.mechanism if mechanism is None else mechanism
        if mech not in self._multipliers:
            self._multipliers[mech] = self._calibrate(mech)
        return self._multipliers[mech]

    def _calibrate(self, mech: DPMechanism) -> float:
        eps, delta = self.budget.epsilon, self.budget.delta
        if self.accounting is AccountingMode.LEGACY:
            if mech is DPMechanism.LAPLACIAN:
                return 1.0 / eps
            return self.calculate_noise_multiplier(eps, delta, 1.0, self.calibration)
        releases = self.planned_releases

        def make_event(z: float) -> dp_accounting.DpEvent:
            return _dp().SelfComposedDpEvent(self._event(mech, z), releases)

        return float(
            _dp().calibrate_dp_mechanism(
                _dp().rdp.RdpAccountant,
                make_event,
                eps,
                delta,
                bracket_interval=_dp().LowerEndpointAndGuess(1e-6, 1.0),
            )
        )

    def _event(self, mech: DPMechanism, z: float) -> dp_accounting.DpEvent:
        if mech is DPMechanism.LAPLACIAN:
            if self.sampling_rate != 1.0:
                raise InvalidGradient("the RDP accountant has no subsampled Laplace bound")
            return laplace_event(z)
        return subsampled_gaussian_event(z, self.sampling_rate)

    def release_event(self, mechanism: DPMechanism | None = None) -> dp_accounting.DpEvent:
        """Return the ``dp_accounting`` event one release of ``mechanism`` is charged as.

        Parameters
        ----------
        mechanism
            Defaults to the configured mechanism.

        Returns
        -------
        dp_accounting.DpEvent
            Gaussian (Poisson-subsampled when q < 1) or Laplace.
        """
        mech = self.mechanism if mechanism is None else mechanism
        return self._event(mech, self.noise_multiplier(mech))

    # ------------------------------------------------------------------ charging

    def _reserve(self, mech: DPMechanism) -> Callable[[], None]:
        """Check the budget for one release and return the commit; raise if it does not fit."""
        if self.accounting is AccountingMode.LEGACY:
            cost = self.budget.epsilon / 100.0
            if self.budget.is_exhausted() or not self.budget.within_budget(
                self.budget.spent_epsilon + cost
            ):
                raise PrivacyBudgetExhausted("Privacy budget exhausted")
            return lambda: self.budget.consume(cost)
        event = self.release_event(mech)
        if not self.budget.can_afford(event):
            raise PrivacyBudgetExhausted(
                f"Privacy budget exhausted: one more {mech.value} release would exceed "
                f"epsilon={self.budget.epsilon:g} at delta={self.budget.delta:g}"
            )
        return lambda: self.budget.charge(event)

    def _noise(self, mech: DPMechanism, scale: float, size: int) -> NDArray[np.float64]:
        if mech is DPMechanism.LAPLACIAN:
            return self.rng.laplace(0.0, scale, size=size)
        return self.rng.normal(0.0, scale, size=size)

    def _release(self, gradient: MutableGradient, mech: DPMechanism, clip: float | None) -> None:
        values = _read(gradient)  # validates before anything is charged or changed
        commit = self._reserve(mech)
        sensitivity = self.sensitivity if clip is None else clip
        if clip is not None:
            values = clip_l2_norm(values, clip)
        scale = self.noise_multiplier(mech) * sensitivity
        noised = values + self._noise(mech, scale, values.size).reshape(values.shape)
        commit()
        _write(gradient, noised)

    # ------------------------------------------------------------------ budgeted API

    def add_gaussian_noise(self, gradient: MutableGradient) -> None:
        """Add N(0, (z·Δ)²) noise in place and charge one Gaussian release.

        Parameters
        ----------
        gradient
            Noised in place; unchanged if the budget refuses.
        """
        self._release(gradient, DPMechanism.GAUSSIAN, None)

    def add_laplacian_noise(self, gradient: MutableGradient) -> None:
        """Add Laplace(0, z·Δ) noise in place and charge one Laplace release.

        Parameters
        ----------
        gradient
            Noised in place; unchanged if the budget refuses.
        """
        self._release(gradient, DPMechanism.LAPLACIAN, None)

    def apply_dp_sgd(self, gradient: MutableGradient, clip_norm: float) -> None:
        """Clip to ``clip_norm`` then add the configured mechanism's noise scaled to ``clip_norm``.

        Parameters
        ----------
        gradient
            Clipped and noised in place; unchanged if the budget refuses.
        clip_norm
            L2 bound C; the noise std is ``z·C`` (the seed wrongly used Δ).
        """
        if not (math.isfinite(clip_norm) and clip_norm > 0):
            raise InvalidGradient(f"clip_norm must be finite and > 0, got {clip_norm}")
        self._release(gradient, self.mechanism, clip_norm)

    def dp_fedavg(
        self,
        contributions: Mapping[str, GradientLike],
        *,
        clip_norm: float | None = None,
        expected_clients: int | None = None,
    ) -> FloatArray:
        """Client-level DP-FedAvg: clip, sum, add N(0, (zC)²), divide; charges one round.

        Parameters
        ----------
        contributions
            One update of shape ``(d,)`` per client id.
        clip_norm
            C; defaults to ``sensitivity``.
        expected_clients
            The fixed denominator (McMahan et al.'s ``qW``); defaults to the number of
            contributions. A fixed denominator keeps the sensitivity of the mean at C / n.

        Returns
        -------
        FloatArray
            The private mean, shape ``(d,)``, float32.
        """
        if not contributions:
            raise NoContributions()
        clip = self.sensitivity if clip_norm is None else float(clip_norm)
        denominator = len(contributions) if expected_clients is None else expected_clients
        if denominator < 1:
            raise InvalidGradient(f"expected_clients must be >= 1, got {denominator}")
        for grad in contributions.values():
            _finite_f64(grad)
        commit = self._reserve(DPMechanism.GAUSSIAN)
        total = dp_noised_sum(
            contributions, clip, self.noise_multiplier(DPMechanism.GAUSSIAN), self.rng
        )
        commit()
        return (total / np.float32(denominator)).astype(np.float32)

    # ------------------------------------------------------------------ queries

    def remaining_budget(self) -> float:
        """Return the ε left."""
        return self.budget.remaining_epsilon

    def is_budget_exhausted(self) -> bool:
        """Return whether no further release of the configured mechanism fits."""
        if self.budget.is_exhausted():
            return True
        try:
            self._reserve(self.mechanism)
        except PrivacyBudgetExhausted:
            return True
        return False

    def get_privacy_params(self) -> tuple[float, float]:
        """Return the total budget (ε, δ)."""
        return self.budget.epsilon, self.budget.delta

    def spent(self) -> tuple[float, float]:
        """Return the (ε, δ) spent so far (see :meth:`PrivacyBudget.spent`)."""
        return self.budget.spent()

    def rounds_remaining(
        self, noise_multiplier: float | None = None, sampling_rate: float | None = None
    ) -> int:
        """Return how many more Gaussian releases at (sigma, q) fit in the budget.

        Parameters
        ----------
        noise_multiplier
            sigma over Δ; defaults to the configured Gaussian multiplier.
        sampling_rate
            q; defaults to the configured rate.

        Returns
        -------
        int
            Number of releases. Legacy mode: ``floor(remaining / (ε/100))``.
        """
        if self.accounting is AccountingMode.LEGACY:
            per_call = self.budget.epsilon / 100.0
            return int(self.budget.remaining_epsilon / per_call * (1.0 + REL_TOL))
        z = (
            self.noise_multiplier(DPMechanism.GAUSSIAN)
            if noise_multiplier is None
            else noise_multiplier
        )
        q = self.sampling_rate if sampling_rate is None else sampling_rate
        return self.budget.rounds_remaining(z, q)

    # ------------------------------------------------------------------ stateless (seed 0.2.0)

    def add_gaussian_noise_sens(self, gradient: MutableGradient, sensitivity: float) -> None:
        """Add Gaussian noise calibrated to the budget's (ε, δ) and ``sensitivity``; no charge.

        Parameters
        ----------
        gradient
            Noised in place.
        sensitivity
            L2 sensitivity; sigma comes from :meth:`calculate_noise_multiplier` with
            ``self.calibration``.
        """
        values = _read(gradient)
        eps, delta = self.get_privacy_params()
        sigma = self.calculate_noise_multiplier(eps, delta, sensitivity, self.calibration)
        _write(gradient, values + self.rng.normal(0.0, sigma, size=values.shape))

    def add_laplace_noise_sens(self, gradient: MutableGradient, sensitivity: float) -> None:
        """Add Laplace(0, sensitivity/ε) noise; no charge.

        Parameters
        ----------
        gradient
            Noised in place.
        sensitivity
            L1 sensitivity.
        """
        values = _read(gradient)
        scale = sensitivity / self.budget.epsilon
        _write(gradient, values + self.rng.laplace(0.0, scale, size=values.shape))

    def clip_l2(self, gradient: MutableGradient, max_norm: float) -> None:
        """Scale ``gradient`` in place down to L2 norm ``max_norm`` if it is longer.

        Parameters
        ----------
        gradient
            Clipped in place.
        max_norm
            The bound (> 0).
        """
        _write(gradient, clip_l2_norm(_read(gradient), max_norm))

    def remaining_budget_after(self, rounds_used: int) -> float:
        """Return the seed's legacy schedule ``max(0, ε - rounds_used·ε/100)``.

        Parameters
        ----------
        rounds_used
            Calls made so far.

        Returns
        -------
        float
            ε left under flat ε/100 accounting.
        """
        eps = self.budget.epsilon
        return max(0.0, eps - rounds_used * eps / 100.0)

    def is_exhausted_after(self, rounds_used: int) -> bool:
        """Return ``remaining_budget_after(rounds_used) <= 0`` (ε=1: False at 99, True at 100).

        Parameters
        ----------
        rounds_used
            Calls made so far.

        Returns
        -------
        bool
            Whether the legacy schedule is exhausted.
        """
        return self.remaining_budget_after(rounds_used) <= 0.0
