"""Convergence detection for federated training (seed-api §6.9).

Two independent detectors share one object, as in the seed:

* **Legacy mode** (``add_loss`` / ``has_converged``):
  a sliding window of the last ``window_size`` losses is converged when its coefficient of
  variation (population std / |mean|) is below ``threshold``.
* **EMA/plateau mode** (:meth:`ConvergenceDetector.update`): the mean absolute change between
  consecutive losses in the window is the "gradient norm"; once it stays below ``threshold`` for
  ``patience`` consecutive updates, training has converged. The exponential moving average is
  kept for reporting (:meth:`~ConvergenceDetector.smoothed_loss`) and, as in the seed, does not
  take part in the decision.

:meth:`ConvergenceDetector.converged` answers for whichever mode has been fed; ``RoundStats``
uses it so that ``converged`` reflects the detector (the seed always reported ``False``).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass

from ..errors import ConfigError, InvalidGradient

__all__ = ["ConvergenceConfig", "ConvergenceDetector"]

# The seed's "gradient norm" before two losses exist is f32::MAX.
_F32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class ConvergenceConfig:
    """Settings of the EMA/plateau detector (seed defaults).

    Parameters
    ----------
    threshold
        A mean absolute loss change below this counts as a plateau update (loss units).
    window_size
        Number of recent losses kept (>= 1).
    smoothing
        EMA factor ``s`` in ``ema = s * ema + (1 - s) * loss``; in ``[0, 1]``.
    patience
        Consecutive plateau updates needed to declare convergence (>= 1).
    """

    threshold: float = 1e-4
    window_size: int = 10
    smoothing: float = 0.9
    patience: int = 3

    def __post_init__(self) -> None:
        if self.window_size < 1:
            raise ConfigError(f"window_size must be >= 1, got {self.window_size}")
        if self.patience < 1:
            raise ConfigError(f"patience must be >= 1, got {self.patience}")
        if not 0.0 <= self.smoothing <= 1.0:
            raise ConfigError(f"smoothing must be in [0, 1], got {self.smoothing}")
        if not math.isfinite(self.threshold) or self.threshold < 0:
            raise ConfigError(f"threshold must be finite and >= 0, got {self.threshold}")


class ConvergenceDetector:
    """Detects a converged loss curve (legacy CV mode and EMA/plateau mode).

    Parameters
    ----------
    window_size
        Number of recent losses the legacy test looks at (>= 1).
    threshold
        Coefficient-of-variation threshold of the legacy test (dimensionless).
    """

    def __init__(self, window_size: int, threshold: float) -> None:
        if window_size < 1:
            raise ConfigError(f"window_size must be >= 1, got {window_size}")
        self.window_size = window_size
        self.threshold = float(threshold)
        self._config: ConvergenceConfig | None = None
        self._history: deque[float] = deque(maxlen=window_size)
        self._ema: float | None = None
        self._window: deque[float] = deque()
        self._plateau = 0

    @classmethod
    def with_config(cls, config: ConvergenceConfig) -> ConvergenceDetector:
        """Build an EMA/plateau detector; the legacy window and threshold come from ``config``.

        Parameters
        ----------
        config
            The EMA/plateau settings.

        Returns
        -------
        ConvergenceDetector
            A detector whose :meth:`update` uses ``config``.
        """
        detector = cls(config.window_size, config.threshold)
        detector._config = config
        return detector

    # ------------------------------------------------------------------ legacy mode

    def add_loss(self, loss: float) -> None:
        """Append a loss to the legacy window, keeping only the last ``window_size``.

        Parameters
        ----------
        loss
            The round's loss (finite).
        """
        if not math.isfinite(loss):
            raise InvalidGradient(f"loss must be finite, got {loss}")
        self._history.append(float(loss))

    def has_converged(self) -> bool:
        """Return whether the legacy window's coefficient of variation is below the threshold.

        Returns
        -------
        bool
            ``False`` until the window is full; ``True`` when |mean| < 1e-10 or
            ``std / |mean| < threshold`` (population std).
        """
        if len(self._history) < self.window_size:
            return False
        values = list(self._history)
        mean = math.fsum(values) / len(values)
        if abs(mean) < 1e-10:
            return True
        variance = math.fsum((v - mean) ** 2 for v in values) / len(values)
        return math.sqrt(variance) / abs(mean) < self.threshold

    def latest_loss(self) -> float | None:
        """Return the most recent legacy loss, or ``None`` if there is none."""
        return self._history[-1] if self._history else None

    def history(self) -> list[float]:
        """Return the legacy window, oldest first (a copy)."""
        return list(self._history)

    # ------------------------------------------------------------------ EMA / plateau mode

    def _effective_config(self) -> ConvergenceConfig:
        # The seed: a detector built with ``new`` uses the default config in ``update``.
        return self._config if self._config is not None else ConvergenceConfig()

    def update(self, loss: float) -> bool:
        """Feed one loss to the EMA/plateau detector.

        Parameters
        ----------
        loss
            The round's loss (finite).

        Returns
        -------
        bool
            ``True`` once the plateau has lasted ``patience`` consecutive updates.
        """
        if not math.isfinite(loss):
            raise InvalidGradient(f"loss must be finite, got {loss}")
        config = self._effective_config()
        loss = float(loss)
        s = config.smoothing
        self._ema = loss if self._ema is None else s * self._ema + (1.0 - s) * loss
        if len(self._window) >= config.window_size:
            self._window.popleft()
        self._window.append(loss)
        self._plateau = self._plateau + 1 if self.gradient_norm() < config.threshold else 0
        return self._plateau >= config.patience

    def smoothed_loss(self) -> float:
        """Return the EMA of the losses fed to :meth:`update` (NaN before the first)."""
        return math.nan if self._ema is None else self._ema

    def gradient_norm(self) -> float:
        """Return the mean |Δloss| over consecutive window entries (f32 max if < 2 losses)."""
        if len(self._window) < 2:
            return _F32_MAX
        values = list(self._window)
        diffs = [abs(b - a) for a, b in itertools.pairwise(values)]
        return math.fsum(diffs) / len(diffs)

    def plateau_rounds(self) -> int:
        """Return the number of consecutive plateau updates so far."""
        return self._plateau

    def config(self) -> ConvergenceConfig | None:
        """Return the EMA config, or ``None`` for a detector built with the constructor."""
        return self._config

    # ------------------------------------------------------------------ both

    def converged(self) -> bool:
        """Return whether either mode reports convergence (what ``RoundStats`` shows).

        Returns
        -------
        bool
            ``has_converged()`` or ``plateau_rounds() >= patience``.
        """
        return self.has_converged() or self._plateau >= self._effective_config().patience

    def reset(self) -> None:
        """Clear the state of both modes (settings are kept)."""
        self._history.clear()
        self._ema = None
        self._window.clear()
        self._plateau = 0
