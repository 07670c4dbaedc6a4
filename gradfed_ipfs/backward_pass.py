"""Backward-pass helpers of the seed (seed-api §5): FedAvg, norm clipping and configuration.

The step-level coordinator of the seed (``LegacyBackwardPassCoordinator``) builds on these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ._types import FloatArray, GradientLike
from .errors import DimensionMismatch, EmptyGradients, InvalidGradient, ShapeMismatch
from .tensor.aggregation import AggregationMethod, AggregationStrategy, FedAvg, as_float32_vector
from .tensor.aggregation import mean as _mean

__all__ = [
    "AggregationMethod",
    "BackwardPassConfig",
    "clip_gradient_norm",
    "federated_average",
]


@dataclass
class BackwardPassConfig:
    """Settings of a backward pass / gradient accumulation session.

    Attributes
    ----------
    max_peers
        Most peers whose gradients are accepted (default 8); further peers are refused.
    aggregation
        The aggregation rule (default ``AggregationMethod.FedAvg()``).
    timeout
        Seconds to wait for peers' gradients (default 60.0); fetches and steps are bounded by it.
    gradient_clipping
        L2 max norm applied to the aggregate, or ``None`` for no clipping.
    """

    max_peers: int = 8
    aggregation: AggregationStrategy = field(default_factory=FedAvg)
    timeout: float = 60.0
    gradient_clipping: float | None = None

    def __post_init__(self) -> None:
        if self.max_peers < 1:
            raise InvalidGradient(f"max_peers must be >= 1, got {self.max_peers}")
        if not self.timeout > 0:
            raise InvalidGradient(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.gradient_clipping is not None and not self.gradient_clipping >= 0:
            raise InvalidGradient(f"gradient_clipping must be >= 0, got {self.gradient_clipping}")
        if not isinstance(self.aggregation, AggregationStrategy):
            raise InvalidGradient(
                f"aggregation must be an AggregationMethod, got {self.aggregation!r}"
            )


def federated_average(gradients: Sequence[GradientLike]) -> FloatArray:
    """Unweighted element-wise mean of the gradients (the seed's ``federated_average``).

    Raises
    ------
    EmptyGradients
        If ``gradients`` is empty.
    DimensionMismatch
        If lengths differ.
    """
    if len(gradients) == 0:
        raise EmptyGradients()
    vectors = [as_float32_vector(g) for g in gradients]
    if len(vectors) == 1:
        return vectors[0].copy()
    try:
        return _mean(vectors)
    except ShapeMismatch as exc:
        raise DimensionMismatch(exc.expected, exc.actual) from None


def clip_gradient_norm(gradient: FloatArray, max_norm: float) -> FloatArray:
    """Scale ``gradient`` in place so its L2 norm is at most ``max_norm``; return it.

    Unchanged when the norm is already within the bound (or zero). A ``max_norm`` that is
    negative or not finite raises ``InvalidGradient`` (the seed did not guard this).
    """
    if not (max_norm >= 0 and np.isfinite(max_norm)):
        raise InvalidGradient(f"max_norm must be a finite number >= 0, got {max_norm}")
    norm = float(np.linalg.norm(gradient.astype(np.float64, copy=False)))
    if norm > max_norm:
        gradient *= np.float32(max_norm / norm)
    return gradient
