"""Byzantine-robust aggregation math on plain arrays (the strategies live in ``aggregation``).

Each function takes a sequence of N equal-length float32 vectors (one per peer, in the
caller's order: strategies pass sorted peer-ID order) and is vectorised over coordinates.

- :func:`coordinate_median`: Yin et al., 2018, "Byzantine-Robust Distributed Learning:
  Towards Optimal Statistical Rates", https://arxiv.org/abs/1803.01498.
- :func:`trimmed_mean`: the same paper's coordinate-wise β-trimmed mean.
- :func:`krum_scores` / :func:`multikrum_select`: Blanchard et al., 2017, "Machine Learning
  with Adversaries: Byzantine Tolerant Gradient Descent", https://arxiv.org/abs/1703.02757.
- :func:`clip_to_norm`: norm bounding (Sun et al., 2019, "Can You Really Backdoor Federated
  Learning?", https://arxiv.org/abs/1911.07963).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from .._types import FloatArray
from ..errors import EmptyGradientSet, InvalidGradient, ShapeMismatch

__all__ = [
    "clip_gradient_norm",
    "clip_to_norm",
    "coordinate_median",
    "krum_scores",
    "l2_norm",
    "multikrum_select",
    "NormPrecision",
    "pairwise_sq_distances",
    "stack_gradients",
    "trimmed_mean",
]


def stack_gradients(gradients: Sequence[FloatArray]) -> NDArray[np.float32]:
    """Stack N equal-length vectors into an ``(N, d)`` float32 matrix.

    Raises
    ------
    EmptyGradientSet
        If there are none.
    ShapeMismatch
        If a length differs from the first's (``expected=[len0]``, ``actual=[len_i]``).
    """
    if not gradients:
        raise EmptyGradientSet()
    length = np.asarray(gradients[0]).size
    for gradient in gradients[1:]:
        if np.asarray(gradient).size != length:
            raise ShapeMismatch([length], [np.asarray(gradient).size])
    return np.stack([np.asarray(g, dtype=np.float32).reshape(-1) for g in gradients])


def coordinate_median(gradients: Sequence[FloatArray]) -> FloatArray:
    """Return the coordinate-wise median (mean of the two middle values when N is even).

    Breakdown point 1/2: fewer than N/2 arbitrary peers cannot move any coordinate outside
    the range of the honest values.
    """
    stacked = stack_gradients(gradients)
    count = stacked.shape[0]
    # A column sort is ~3x faster than np.median's partition along the strided axis.
    ordered = np.sort(stacked, axis=0)
    if count % 2:
        return np.ascontiguousarray(ordered[count // 2])
    low: NDArray[np.float64] = ordered[count // 2 - 1].astype(np.float64)
    return np.asarray((low + ordered[count // 2]) / 2, dtype=np.float32)


def trimmed_mean(gradients: Sequence[FloatArray], beta: float) -> FloatArray:
    """Return the coordinate-wise β-trimmed mean.

    In each coordinate the ``t = floor(beta·N)`` largest and ``t`` smallest values are dropped
    and the remaining ``N - 2t`` are averaged (in float64). Tolerates up to ``t`` arbitrary
    peers per coordinate.

    Parameters
    ----------
    gradients
        N equal-length vectors.
    beta
        Fraction trimmed at each end, ``0 <= beta < 0.5``.

    Raises
    ------
    InvalidGradient
        If ``beta`` is outside ``[0, 0.5)``.
    """
    if not 0.0 <= beta < 0.5:
        raise InvalidGradient(f"trimmed-mean beta must be in [0, 0.5), got {beta}")
    stacked = stack_gradients(gradients)
    count = stacked.shape[0]
    trim = math.floor(beta * count)
    kept = stacked if trim == 0 else np.sort(stacked, axis=0)[trim : count - trim]
    return np.asarray(np.mean(kept, axis=0, dtype=np.float64), dtype=np.float32)


def pairwise_sq_distances(gradients: Sequence[FloatArray]) -> NDArray[np.float64]:
    """Return the ``(N, N)`` squared Euclidean distances via the Gram identity.

    ``‖a - b‖² = ‖a‖² + ‖b‖² - 2·a·b``, computed in float64 with one matrix product; rounding
    can make it slightly negative, so it is clamped at zero and the diagonal is set to zero.
    """
    stacked = stack_gradients(gradients).astype(np.float64)
    gram = stacked @ stacked.T
    norms = np.diag(gram)
    distances = norms[:, None] + norms[None, :] - 2.0 * gram
    np.maximum(distances, 0.0, out=distances)
    np.fill_diagonal(distances, 0.0)
    return distances


def krum_scores(gradients: Sequence[FloatArray], f: int) -> NDArray[np.float64]:
    """Return each peer's Krum score: the sum of its ``N - f - 2`` smallest squared distances.

    Blanchard et al. prove the guarantee for ``N > 2f + 2``; this function only needs
    ``N - f - 2 >= 1``.

    Parameters
    ----------
    gradients
        N equal-length vectors.
    f
        Assumed number of Byzantine peers, ``>= 0``.

    Raises
    ------
    InvalidGradient
        If ``f < 0`` or ``N <= f + 2``.
    """
    if f < 0:
        raise InvalidGradient(f"f must be >= 0, got {f}")
    count = len(gradients)
    neighbours = count - f - 2
    if count and neighbours < 1:
        raise InvalidGradient(f"Krum needs more than f + 2 = {f + 2} peers, got {count}")
    distances = pairwise_sq_distances(gradients)
    # Exclude each peer's zero distance to itself, then sum its nearest neighbours.
    np.fill_diagonal(distances, np.inf)
    nearest = np.partition(distances, neighbours - 1, axis=1)[:, :neighbours]
    scores: NDArray[np.float64] = nearest.sum(axis=1)
    return scores


def multikrum_select(gradients: Sequence[FloatArray], f: int, m: int) -> NDArray[np.int64]:
    """Return the positions (ascending) of the ``m`` peers with the lowest Krum scores.

    Ties go to the lower position. ``m`` is capped at N.

    Raises
    ------
    InvalidGradient
        If ``m < 1``, or as :func:`krum_scores`.
    """
    if m < 1:
        raise InvalidGradient(f"m must be >= 1, got {m}")
    scores = krum_scores(gradients, f)
    chosen = np.argsort(scores, kind="stable")[: min(m, scores.size)]
    return np.sort(chosen).astype(np.int64)


NormPrecision = Literal["fast", "float64", "seed"]
"""How :func:`l2_norm` sums squares: ``"fast"`` one float32 BLAS pass (about 5x faster than
float64 on float32 input), redone in float64 only if it overflows; ``"float64"`` accumulated in
float64; ``"seed"`` accumulated in float64 and the result rounded to float32 (the seed's
``l2_norm -> f32``)."""


def l2_norm(gradient: NDArray[Any], precision: NormPrecision = "fast") -> float:
    """Return the L2 norm ``sqrt(Σ v²)`` of an array of any shape: the ONE norm.

    Parameters
    ----------
    gradient
        Float values, any shape.
    precision
        See :data:`NormPrecision`.
    """
    flat = gradient.reshape(-1)
    if precision == "fast":
        with np.errstate(over="ignore"):
            squares = float(np.dot(flat, flat))
        if math.isfinite(squares):
            return math.sqrt(squares)
    wide = flat.astype(np.float64, copy=False)
    norm = math.sqrt(float(np.dot(wide, wide)))
    return float(np.float32(norm)) if precision == "seed" else norm


def clip_to_norm(
    gradient: NDArray[Any],
    max_norm: float,
    *,
    in_place: bool = False,
    allow_zero: bool = False,
    reject_non_finite: bool = True,
    precision: NormPrecision = "fast",
) -> NDArray[Any]:
    """Scale ``gradient`` down to L2 norm ``max_norm`` if it is longer: the ONE clip.

    Within the bound (``norm <= max_norm``, or a NaN norm when non-finite values are allowed)
    the gradient is returned as it is, with no copy. The scale ``max_norm / norm`` is cast to
    the array's float dtype before multiplying. Every clip in the package is this function:

    ======================================== ========= ========= ========== =========
    caller                                   in place  max 0 ok  non-finite precision
    ======================================== ========= ========= ========== =========
    ``clip_to_norm`` (``NormBounded``)       no        no        raises     fast
    :func:`clip_gradient_norm` (seed)        yes       yes       passes     float64
    ``mechanisms.clip_l2_norm`` (DP)         no        no        passes     float64
    ``GradientVerifier.clip_by_norm`` (seed) yes [1]_  yes       passes     seed
    ======================================== ========= ========= ========== =========

    .. [1] a writeable float32 array; anything else is first copied to float32 by the façade.

    Parameters
    ----------
    gradient
        Float values, any shape; modified only when ``in_place``.
    max_norm
        The bound: finite and ``> 0`` (``>= 0`` with ``allow_zero``).
    in_place
        Scale ``gradient`` itself and return it; otherwise a longer gradient is returned as a
        new array of the same dtype.
    allow_zero
        Accept ``max_norm == 0`` (everything is scaled to zero).
    reject_non_finite
        Raise on a NaN/Inf value; otherwise a NaN norm leaves the gradient unchanged and an
        infinite one scales it by zero.
    precision
        How the norm is computed, see :data:`NormPrecision`.

    Returns
    -------
    numpy.ndarray
        ``gradient`` (unchanged or scaled in place) or a scaled copy; same shape and dtype.

    Raises
    ------
    InvalidGradient
        If ``max_norm`` is out of range, or (with ``reject_non_finite``) a value is not finite.
    """
    bound = "finite and >= 0" if allow_zero else "finite and > 0"
    if not (math.isfinite(max_norm) and (max_norm >= 0 if allow_zero else max_norm > 0)):
        raise InvalidGradient(f"max_norm must be {bound}, got {max_norm}")
    norm = l2_norm(gradient, precision)
    if reject_non_finite and not math.isfinite(norm):
        raise InvalidGradient("cannot clip a gradient with non-finite values")
    if not norm > max_norm:
        return gradient
    scale = (gradient.dtype.type if gradient.dtype.kind == "f" else np.float64)(max_norm / norm)
    if in_place:
        gradient *= scale
        return gradient
    return gradient * scale


def clip_gradient_norm(gradient: FloatArray, max_norm: float) -> FloatArray:
    """Scale ``gradient`` in place so its L2 norm is at most ``max_norm``; return it.

    The seed's ``clip_gradient_norm`` (float64 norm, ``max_norm == 0`` allowed). Unchanged when
    the norm is already within the bound (or zero). A ``max_norm`` that is negative or not
    finite raises ``InvalidGradient`` (the seed did not guard this).
    """
    return clip_to_norm(
        gradient,
        max_norm,
        in_place=True,
        allow_zero=True,
        reject_non_finite=False,
        precision="float64",
    )
