"""Gradient compression, the seed's stateless API (seed-api §4.5), on arrays (pure NumPy).

:class:`GradientCompressor` (top-k, threshold, random-k, int8) and the sparsification helpers
here are what the codecs in :mod:`.codecs` (``Codec``, ``CODECS``, ``ErrorFeedback``) are built
on, as hivemind's ``compression`` package layers its codecs over plain functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np
from numpy.typing import NDArray

from .._types import FloatArray, GradientLike
from ..errors import InvalidCompressionRatio
from .types import (
    QuantizedGradient,
    SparseGradient,
    SparseQuantizedGradient,
)

__all__ = ["GradientCompressor", "top_k_indices"]

_EPS32: Final = float(np.finfo(np.float32).eps)


def _flat(values: GradientLike) -> FloatArray:
    return np.ascontiguousarray(values, dtype=np.float32).reshape(-1)


def _dims(values: FloatArray, shape: Sequence[int] | None) -> list[int]:
    return [values.size] if shape is None else [int(d) for d in shape]


def _rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def _float_tolerance(values: FloatArray) -> float:
    """Return a few float32 ulps of the largest magnitude (rounding slack for bounds)."""
    if values.size == 0:
        return 0.0
    return 8.0 * _EPS32 * float(np.max(np.abs(values)))


def top_k_indices(values: FloatArray, k: int) -> NDArray[np.int64]:
    """Return the ascending positions of the ``k`` largest ``|values|``, ties to lower index.

    NaN magnitudes rank below every number. Runs ``np.abs``, ``np.argpartition`` and one
    counting pass; the tie fix-up runs only when the k-th magnitude is tied across the cut.

    Parameters
    ----------
    values
        Flat float32 array of length n.
    k
        Number of positions, ``0 <= k <= n``.
    """
    n = values.size
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    if k >= n:
        return np.arange(n, dtype=np.int64)
    magnitude = np.abs(values)
    chosen = np.argpartition(magnitude, n - k)[n - k :]
    if np.isnan(magnitude[chosen]).any():  # NumPy ranks NaN largest; we rank it smallest
        magnitude = np.nan_to_num(magnitude, nan=-1.0)
        chosen = np.argpartition(magnitude, n - k)[n - k :]
    cut = magnitude[chosen].min()
    if np.count_nonzero(magnitude >= cut) == k:
        return np.sort(chosen).astype(np.int64, copy=False)
    above = np.flatnonzero(magnitude > cut)
    tied = np.flatnonzero(magnitude == cut)
    picked = np.concatenate([above, tied[: k - above.size]])
    return np.sort(picked).astype(np.int64, copy=False)


class GradientCompressor:
    """The seed's stateless compressor (seed-api §4.5), with seeding, exact-k and int4 added."""

    @staticmethod
    def top_k(values: GradientLike, shape: Sequence[int] | None, k: int) -> SparseGradient:
        """Keep the ``k`` entries of largest magnitude.

        Error: zero on the kept entries; each dropped entry is at most the (k+1)-th largest
        magnitude. Indices are returned in ascending order (the seed used magnitude order);
        values keep their sign; ties keep the lower index.

        Parameters
        ----------
        values
            Gradient values (flattened row-major).
        shape
            Dense shape recorded on the result (default ``[len(values)]``).
        k
            Entries to keep, ``1 <= k <= len(values)``.

        Raises
        ------
        InvalidCompressionRatio
            With ratio ``k/len`` if ``k == 0`` or ``k > len``.
        """
        flat = _flat(values)
        if k <= 0 or k > flat.size:
            raise InvalidCompressionRatio(k / flat.size if flat.size else math.inf)
        indices = top_k_indices(flat, k)
        return SparseGradient(indices, flat[indices], _dims(flat, shape))

    @staticmethod
    def threshold(
        values: GradientLike, shape: Sequence[int] | None, threshold: float
    ) -> SparseGradient:
        """Keep entries with ``|v| >= threshold`` (inclusive, index order; NaN never kept).

        Error: each dropped entry has magnitude below ``threshold``.
        """
        flat = _flat(values)
        indices = np.flatnonzero(np.abs(flat) >= np.float32(threshold)).astype(np.int64)
        return SparseGradient(indices, flat[indices], _dims(flat, shape))

    @staticmethod
    def quantize(
        values: GradientLike, shape: Sequence[int] | None = None, bits: int = 8
    ) -> QuantizedGradient:
        """Min/max affine quantization, see :meth:`QuantizedGradient.from_dense`."""
        flat = _flat(values)
        return QuantizedGradient.from_dense(flat, _dims(flat, shape), bits)

    @staticmethod
    def random_sparsification(
        values: GradientLike,
        shape: Sequence[int] | None,
        keep_ratio: float,
        rng: np.random.Generator | int | None = None,
        *,
        exact: bool = False,
    ) -> SparseGradient:
        """Keep a random subset, rescaled so the result is an unbiased estimate of the input.

        Seed mode (``exact=False``): each entry is kept independently with probability
        ``keep_ratio`` and divided by it. Exact mode: exactly ``k = max(1, round(p·n))``
        distinct entries, uniformly, multiplied by ``n/k``. Error per entry: ``|v|`` if dropped,
        ``|v|·(1/p - 1)`` if kept; the expectation of the result equals the input.

        Parameters
        ----------
        values, shape
            As :meth:`top_k`.
        keep_ratio
            Fraction to keep, in ``(0, 1]``.
        rng
            A ``np.random.Generator`` (advanced in place), an int seed, or ``None`` for fresh
            OS entropy (non-deterministic, as the seed).
        exact
            Keep exactly ``k`` entries instead of ``Binomial(n, p)``.

        Raises
        ------
        InvalidCompressionRatio
            Unless ``0 < keep_ratio <= 1``.
        """
        if not 0.0 < keep_ratio <= 1.0:
            raise InvalidCompressionRatio(keep_ratio)
        flat = _flat(values)
        generator = _rng(rng)
        n = flat.size
        if exact:
            k = min(n, max(1, round(keep_ratio * n))) if n else 0
            indices = np.sort(generator.choice(n, size=k, replace=False)).astype(np.int64)
            kept = flat[indices] * np.float32(n / k) if k else flat[indices]
        else:
            indices = np.flatnonzero(generator.random(n) < keep_ratio).astype(np.int64)
            kept = flat[indices] / np.float32(keep_ratio)
        return SparseGradient(indices, kept, _dims(flat, shape))

    @staticmethod
    def top_k_quantized(
        values: GradientLike, shape: Sequence[int] | None, k: int, bits: int = 8
    ) -> SparseQuantizedGradient:
        """Top-k, then quantize the kept values (min/max over the kept values only).

        Error: dropped entries as :meth:`top_k`; kept entries within ``scale/2`` with
        ``scale = (max_kept - min_kept)/(2**bits - 1)``.
        """
        sparse = GradientCompressor.top_k(values, shape, k)
        quantized = QuantizedGradient.from_dense(sparse.values, [sparse.values.size], bits)
        return SparseQuantizedGradient(sparse.indices, quantized, sparse.shape)
