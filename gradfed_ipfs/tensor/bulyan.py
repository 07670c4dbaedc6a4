"""Bulyan: Krum selection, then a per-coordinate mean of the values nearest the median.

El Mhamdi et al. 2018, https://arxiv.org/abs/1802.07927.
Bulyan first picks ``θ = N - 2f`` gradients by applying Krum repeatedly (each pick leaves the
pool), then, per coordinate, averages the ``β = θ - 2f`` selected values closest to their
median. It needs ``N >= 4f + 3``. Pure NumPy, float32 in and out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .._types import FloatArray
from ..errors import EmptyGradientSet, InvalidGradient
from .aggregation import AggregationStrategy, Contribution
from .robust import krum_scores, stack_gradients

__all__ = ["Bulyan", "bulyan"]


def bulyan(gradients: Sequence[FloatArray], f: int) -> FloatArray:
    """Return the Bulyan aggregate of ``N`` gradients of shape ``(d,)`` tolerating ``f``.

    Raises
    ------
    EmptyGradientSet
        If there are no gradients.
    InvalidGradient
        If ``f < 0`` or ``N < 4f + 3``.
    ShapeMismatch
        If lengths differ.
    """
    if not gradients:
        raise EmptyGradientSet()
    n = len(gradients)
    if f < 0 or n < 4 * f + 3:
        raise InvalidGradient(f"Bulyan needs N >= 4f + 3 with f >= 0; got N={n}, f={f}")
    stacked = stack_gradients(gradients)
    pool = list(range(n))
    selected: list[int] = []
    theta = n - 2 * f
    while len(selected) < theta:
        # Krum over the remaining pool. Its guarantee needs pool > 2f + 2, which N >= 4f + 3
        # keeps until the last picks; there f shrinks so Krum still has a neighbour to score,
        # and a pool of two is symmetric (the lower index wins, as argmin would).
        if len(pool) <= 2:
            best = pool[0]
        else:
            scores = krum_scores([stacked[i] for i in pool], min(f, len(pool) - 3))
            best = pool[int(np.argmin(scores))]
        selected.append(best)
        pool.remove(best)
    chosen = stacked[sorted(selected)].astype(np.float64)
    beta = theta - 2 * f
    median = np.median(chosen, axis=0)
    # Per coordinate, the beta values nearest the median (stable sort: ties by row order).
    nearest = np.argsort(np.abs(chosen - median), axis=0, kind="stable")[:beta]
    result: FloatArray = np.take_along_axis(chosen, nearest, axis=0).mean(axis=0).astype(np.float32)
    return result


@dataclass(frozen=True)
class Bulyan(AggregationStrategy):
    """Bulyan over the peers in sorted peer-ID order; see :func:`bulyan`.

    Parameters
    ----------
    f
        Number of Byzantine peers tolerated, ``>= 0``; needs ``N >= 4f + 3`` peers.
    """

    f: int = 1

    def __post_init__(self) -> None:
        if self.f < 0:
            raise InvalidGradient(f"f must be >= 0, got {self.f}")

    def aggregate(self, contributions: Mapping[str, Contribution]) -> FloatArray:
        """Return the Bulyan aggregate (sample counts are not used)."""
        return bulyan([contributions[p].values for p in sorted(contributions)], self.f)
