"""Rényi-DP privacy accounting, delegated to Google's ``dp_accounting`` package, and the budget.

:class:`RdpPrivacyAccountant` is a thin, typed wrapper over
``dp_accounting.rdp.RdpAccountant`` (Mironov 2017; Mironov, Talwar & Zhang 2019 for the
Poisson-subsampled Gaussian). No RDP formula is written here: we only build ``DpEvent`` objects,
compose them and ask the library for (ε, δ). What the wrapper adds:

* typed helpers for the three events the federated code releases: Gaussian, Poisson-subsampled
  Gaussian and Laplace;
* "what if" queries that never mutate (:meth:`~RdpPrivacyAccountant.epsilon_if`), so a caller
  can refuse a release *before* touching any data;
* :meth:`~RdpPrivacyAccountant.rounds_remaining`: how many more releases of one event fit into
  an (ε, δ) budget.

:class:`PrivacyBudget` (seed §6.2) holds the (ε, δ) budget: the seed's pure-ε ``consume`` ledger
plus an optional accountant, and refuses a release before it happens.

Noise multipliers are always relative to the L2 (Gaussian) or L1 (Laplace) sensitivity: the
noise standard deviation (or Laplace scale) divided by the sensitivity.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from ...errors import ConfigError, InvalidGradient, PrivacyBudgetExhausted

if TYPE_CHECKING:
    import dp_accounting

__all__ = [
    "REL_TOL",
    "PrivacyBudget",
    "RdpPrivacyAccountant",
    "check_privacy_params",
    "gaussian_event",
    "laplace_event",
    "subsampled_gaussian_event",
]

REL_TOL = 1e-9
"""Relative slack on budget checks, so that spending exactly the remainder survives rounding."""

# Enough to answer "how many rounds" for any practical run without an unbounded search.
_MAX_ROUNDS = 1 << 40


def _dp() -> ModuleType:
    # Deferred: importing dp_accounting pulls in scipy and the PLD code (about 2 s), which
    # ``import gradfed_ipfs`` should not pay for when no privacy accounting is used.
    return importlib.import_module("dp_accounting")


def gaussian_event(noise_multiplier: float) -> dp_accounting.DpEvent:
    """Return the event of one Gaussian release.

    Parameters
    ----------
    noise_multiplier
        Noise standard deviation divided by the L2 sensitivity (> 0).

    Returns
    -------
    dp_accounting.DpEvent
        A ``GaussianDpEvent``.
    """
    _check_positive("noise_multiplier", noise_multiplier)
    return _dp().GaussianDpEvent(noise_multiplier)


def subsampled_gaussian_event(
    noise_multiplier: float, sampling_rate: float
) -> dp_accounting.DpEvent:
    """Return the event of one Gaussian release on a Poisson sample of rate ``sampling_rate``.

    Parameters
    ----------
    noise_multiplier
        Noise standard deviation divided by the L2 sensitivity (> 0).
    sampling_rate
        Probability ``q`` in ``(0, 1]`` that each record (or client) is in the sample; ``q = 1``
        gives the plain Gaussian event.

    Returns
    -------
    dp_accounting.DpEvent
        A ``PoissonSampledDpEvent`` wrapping a ``GaussianDpEvent`` (or the latter alone at q = 1).
    """
    if not 0.0 < sampling_rate <= 1.0:
        raise ConfigError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
    inner = gaussian_event(noise_multiplier)
    if sampling_rate == 1.0:
        return inner
    return _dp().PoissonSampledDpEvent(sampling_rate, inner)


def laplace_event(noise_multiplier: float) -> dp_accounting.DpEvent:
    """Return the event of one Laplace release (pure ε-DP with ε = 1 / noise_multiplier).

    Parameters
    ----------
    noise_multiplier
        Laplace scale ``b`` divided by the L1 sensitivity (> 0).

    Returns
    -------
    dp_accounting.DpEvent
        A ``LaplaceDpEvent``.
    """
    _check_positive("noise_multiplier", noise_multiplier)
    return _dp().LaplaceDpEvent(noise_multiplier)


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be finite and > 0, got {value}")


def _check_delta(delta: float) -> None:
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {delta}")


def check_privacy_params(epsilon: float, delta: float) -> None:
    """Raise ``ConfigError`` unless ``epsilon > 0`` is finite and ``0 < delta < 1``."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"epsilon must be finite and > 0, got {epsilon}")
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {delta}")


class RdpPrivacyAccountant:
    """Composes DP events and converts the total to (ε, δ) with ``dp_accounting``'s RDP accountant.

    Parameters
    ----------
    orders
        RDP orders to track; ``None`` uses ``dp_accounting``'s default grid.
    """

    def __init__(self, orders: Sequence[float] | None = None) -> None:
        self._accountant = _dp().rdp.RdpAccountant(orders=None if orders is None else list(orders))
        self._events: list[tuple[dp_accounting.DpEvent, int]] = []
        self._unit_cache: dict[str, NDArray[np.float64]] = {}

    @property
    def events(self) -> list[tuple[dp_accounting.DpEvent, int]]:
        """The composed events with their counts, oldest first (a copy)."""
        return list(self._events)

    @property
    def is_empty(self) -> bool:
        """Whether nothing has been composed yet (nothing spent)."""
        return not self._events

    def ledger(self) -> dp_accounting.DpEvent:
        """Return everything composed so far as one ``ComposedDpEvent``."""
        return _dp().ComposedDpEvent([_dp().SelfComposedDpEvent(e, n) for e, n in self._events])

    def _check_supported(self, event: dp_accounting.DpEvent) -> None:
        if not self._accountant.supports(event):
            raise InvalidGradient(f"the RDP accountant cannot account for {event!r}")

    def compose(self, event: dp_accounting.DpEvent, count: int = 1) -> None:
        """Record ``count`` releases of ``event``.

        Parameters
        ----------
        event
            A ``dp_accounting.DpEvent`` the RDP accountant supports.
        count
            Number of releases (>= 1).
        """
        if count < 1:
            raise InvalidGradient(f"count must be >= 1, got {count}")
        self._check_supported(event)
        self._accountant.compose(event, count)
        self._events.append((event, count))

    def epsilon(self, delta: float) -> float:
        """Return the ε spent so far at target ``delta`` (0 when nothing was released).

        Parameters
        ----------
        delta
            Target δ in ``(0, 1)``.

        Returns
        -------
        float
            The smallest ε over the RDP orders (dp_accounting's conversion).
        """
        _check_delta(delta)
        if self.is_empty:
            return 0.0
        return float(self._accountant.get_epsilon(delta))

    def delta(self, epsilon: float) -> float:
        """Return the δ spent so far at target ``epsilon`` (0 when nothing was released).

        Parameters
        ----------
        epsilon
            Target ε (>= 0).

        Returns
        -------
        float
            The δ of the composition at that ε.
        """
        if self.is_empty:
            return 0.0
        return float(self._accountant.get_delta(epsilon))

    def epsilon_if(self, event: dp_accounting.DpEvent, delta: float, count: int = 1) -> float:
        """Return the ε that would be spent after ``count`` more ``event`` releases; no mutation.

        Parameters
        ----------
        event
            The release being considered.
        delta
            Target δ in ``(0, 1)``.
        count
            Number of releases (>= 1).

        Returns
        -------
        float
            The hypothetical total ε.
        """
        _check_delta(delta)
        if count < 1:
            raise InvalidGradient(f"count must be >= 1, got {count}")
        self._check_supported(event)
        # RDP composes by adding the per-order values; dp_accounting computes one release's
        # vector (cached, the subsampled Gaussian costs ~0.1 s) and converts the total to ε.
        total = self._accountant.rdp + count * self._unit_rdp(event)
        return float(_dp().rdp.compute_epsilon(self._accountant.orders, total, delta)[0])

    def _unit_rdp(self, event: dp_accounting.DpEvent) -> NDArray[np.float64]:
        key = repr(event)  # DpEvents are attrs classes with a faithful repr
        cached = self._unit_cache.get(key)
        if cached is None:
            fresh = _dp().rdp.RdpAccountant(orders=list(self._accountant.orders))
            fresh.compose(event, 1)
            cached = np.asarray(fresh.rdp, dtype=np.float64)
            self._unit_cache[key] = cached
        return cached

    def rounds_remaining(
        self, event: dp_accounting.DpEvent, epsilon_budget: float, delta: float
    ) -> int:
        """Return how many more releases of ``event`` fit in the (ε, δ) budget.

        Parameters
        ----------
        event
            One round's release, e.g. :func:`subsampled_gaussian_event` ``(sigma, q)``.
        epsilon_budget
            Total ε allowed (> 0).
        delta
            Target δ in ``(0, 1)``.

        Returns
        -------
        int
            The largest ``k >= 0`` with ``epsilon_if(event, delta, k) <= epsilon_budget``
            (0 if not even one fits), capped at 2**40.
        """
        _check_positive("epsilon_budget", epsilon_budget)
        _check_delta(delta)
        if self.epsilon_if(event, delta, 1) > epsilon_budget:
            return 0
        # ε grows monotonically with the count: gallop up, then bisect.
        low, high = 1, 2
        while high <= _MAX_ROUNDS and self.epsilon_if(event, delta, high) <= epsilon_budget:
            low, high = high, high * 2
        if high > _MAX_ROUNDS:
            return _MAX_ROUNDS
        while high - low > 1:
            mid = (low + high) // 2
            if self.epsilon_if(event, delta, mid) <= epsilon_budget:
                low = mid
            else:
                high = mid
        return low


class PrivacyBudget:
    """An (ε, δ) budget with a pure-ε ledger (seed ``consume``) and an optional RDP accountant.

    Spent ε is the ledger's total plus the accountant's ε at this budget's δ; adding them is
    basic composition of a pure-ε and an (ε, δ) guarantee, so the sum is a valid bound.

    Parameters
    ----------
    epsilon
        Total ε allowed (> 0).
    delta
        Target δ in ``(0, 1)``: the δ at which the accountant's ε is reported.
    accountant
        The RDP accountant releases are composed in; ``None`` for a ledger-only budget.
    """

    def __init__(
        self, epsilon: float, delta: float, *, accountant: RdpPrivacyAccountant | None = None
    ) -> None:
        check_privacy_params(epsilon, delta)
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.accountant = accountant
        self._ledger = 0.0

    @property
    def spent_epsilon(self) -> float:
        """ε spent so far: ledger plus accountant (at ``delta``)."""
        rdp_eps = 0.0 if self.accountant is None else self.accountant.epsilon(self.delta)
        return self._ledger + rdp_eps

    @property
    def remaining_epsilon(self) -> float:
        """ε left, never below zero."""
        return max(0.0, self.epsilon - self.spent_epsilon)

    def spent(self) -> tuple[float, float]:
        """Return the (ε, δ) spent so far; δ is 0 until an (ε, δ) event has been composed."""
        used_delta = 0.0 if self.accountant is None or self.accountant.is_empty else self.delta
        return self.spent_epsilon, used_delta

    def within_budget(self, total_epsilon: float) -> bool:
        """Return whether a total spend of ``total_epsilon`` stays within ``epsilon``."""
        return total_epsilon <= self.epsilon * (1.0 + REL_TOL)

    def consume(self, epsilon_used: float) -> None:
        """Charge ``epsilon_used`` to the pure-ε ledger (seed semantics).

        Parameters
        ----------
        epsilon_used
            ε to charge (>= 0); exactly the remainder is allowed.
        """
        if not (math.isfinite(epsilon_used) and epsilon_used >= 0):
            raise InvalidGradient(f"epsilon_used must be finite and >= 0, got {epsilon_used}")
        remaining = self.remaining_epsilon
        if not self.within_budget(self.spent_epsilon + epsilon_used):
            raise PrivacyBudgetExhausted(
                f"Insufficient privacy budget: need {epsilon_used}, have {remaining}"
            )
        self._ledger += epsilon_used

    def epsilon_after(self, event: dp_accounting.DpEvent, count: int = 1) -> float:
        """Return the ε that would be spent after ``count`` releases of ``event``; no mutation.

        Parameters
        ----------
        event
            The release being considered.
        count
            Number of releases.

        Returns
        -------
        float
            Hypothetical total ε.
        """
        if self.accountant is None:
            raise InvalidGradient("this budget has no RDP accountant")
        return self._ledger + self.accountant.epsilon_if(event, self.delta, count)

    def can_afford(self, event: dp_accounting.DpEvent, count: int = 1) -> bool:
        """Return whether ``count`` releases of ``event`` fit in the budget.

        Parameters
        ----------
        event
            The release being considered.
        count
            Number of releases.

        Returns
        -------
        bool
            ``epsilon_after(event, count) <= epsilon``.
        """
        return self.within_budget(self.epsilon_after(event, count))

    def charge(self, event: dp_accounting.DpEvent, count: int = 1) -> None:
        """Compose ``count`` releases of ``event``, or refuse without changing anything.

        Parameters
        ----------
        event
            The release.
        count
            Number of releases.
        """
        after = self.epsilon_after(event, count)
        if not self.within_budget(after):
            raise PrivacyBudgetExhausted(
                f"Privacy budget exhausted: release would spend epsilon={after:.4g} "
                f"of {self.epsilon:g} at delta={self.delta:g}"
            )
        if self.accountant is not None:
            self.accountant.compose(event, count)

    def rounds_remaining(self, noise_multiplier: float, sampling_rate: float = 1.0) -> int:
        """Return how many more subsampled-Gaussian rounds at (sigma, q) fit in the budget.

        Parameters
        ----------
        noise_multiplier
            sigma relative to the sensitivity.
        sampling_rate
            Poisson sampling rate q in ``(0, 1]``.

        Returns
        -------
        int
            Number of rounds (0 if none fits).
        """
        if self.accountant is None:
            raise InvalidGradient("this budget has no RDP accountant")
        left = self.epsilon - self._ledger
        if left <= 0:
            return 0
        event = subsampled_gaussian_event(noise_multiplier, sampling_rate)
        return self.accountant.rounds_remaining(event, left * (1.0 + REL_TOL), self.delta)

    def is_exhausted(self) -> bool:
        """Return whether no ε is left."""
        return self.remaining_epsilon <= 0.0

    def remaining_fraction(self) -> float:
        """Return ``remaining_epsilon / epsilon``."""
        return self.remaining_epsilon / self.epsilon
