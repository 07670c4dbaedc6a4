"""Gradient verification: shape, finiteness, z-score outliers, norms and a cross-peer check.

:class:`GradientVerifier` is the seed's stateless API (seed-api §4.7). :func:`cross_peer_check`
goes beyond it: it compares every peer's contribution with the coordinate-wise median of all
contributions and reports, per peer, why it looks anomalous (too long, or pointing away).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .._types import FloatArray, GradientLike
from ..errors import ConfigError, InvalidGradient, OutlierDetected, ShapeMismatch
from .robust import clip_to_norm, coordinate_median, l2_norm, stack_gradients

__all__ = ["GradientVerifier", "PeerAnomaly", "check_finite", "cross_peer_check"]

_FINITE_BLOCK = 1 << 18  # values per finiteness check: a 256 KiB boolean temporary, not d bytes


def check_finite(values: FloatArray, what: str = "gradient", offset: int = 0) -> None:
    """Raise ``InvalidGradient`` naming the first NaN or ±Inf in ``values``.

    Checked block by block, so a d = 10⁹ gradient needs no d-byte boolean temporary.

    Parameters
    ----------
    values
        Flat float array.
    what
        What the values are, for the message (e.g. ``"gradient of peer X"``).
    offset
        Index of ``values[0]`` in the whole gradient, for the reported index.
    """
    for start in range(0, values.size, _FINITE_BLOCK):
        block = values[start : start + _FINITE_BLOCK]
        if not np.isfinite(block).all():
            index = start + int(np.flatnonzero(~np.isfinite(block))[0])
            raise InvalidGradient(
                f"Non-finite value in {what} at index {offset + index}: {values[index]}"
            )


def _vector(values: GradientLike) -> FloatArray:
    return np.asarray(values, dtype=np.float32).reshape(-1)


class GradientVerifier:
    """The seed's stateless checks on one gradient vector (seed-api §4.7)."""

    @staticmethod
    def verify_shape(gradient: GradientLike, expected_shape: Sequence[int]) -> None:
        """Check that ``len(gradient) == prod(expected_shape)`` (so ``[4]`` and ``[2, 2]`` agree).

        Raises
        ------
        ShapeMismatch
            ``expected=expected_shape``, ``actual=[len(gradient)]``.
        """
        size = _vector(gradient).size
        if size != math.prod(int(d) for d in expected_shape):
            raise ShapeMismatch(list(expected_shape), [size])

    @staticmethod
    def detect_outliers(gradient: GradientLike, std_threshold: float) -> None:
        """Flag the first value whose population z-score is strictly above ``std_threshold``.

        ``z = |v - mean| / std`` with ``std`` over n (not n - 1). An empty or constant gradient
        passes (its z-scores are NaN). This looks *within* one vector; compare peers with
        :func:`cross_peer_check`.

        Raises
        ------
        OutlierDetected
            With the first offending index and value.
        """
        values = _vector(gradient)
        if values.size == 0:
            return
        wide = values.astype(np.float64)
        center = wide.mean()
        spread = wide.std()
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.abs(wide - center) / spread
        hits = np.flatnonzero(z > std_threshold)
        if hits.size:
            index = int(hits[0])
            raise OutlierDetected(index, float(values[index]))

    @staticmethod
    def verify_finite(gradient: GradientLike) -> None:
        """Check that no value is NaN or infinite.

        Raises
        ------
        InvalidGradient
            ``"Non-finite value at index {i}: {v}"`` for the first one.
        """
        values = _vector(gradient)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            index = int(bad[0])
            raise InvalidGradient(f"Non-finite value at index {index}: {values[index]}")

    @staticmethod
    def l2_norm(gradient: GradientLike) -> float:
        """Return ``sqrt(Σ v²)`` (accumulated in float64, rounded to float32)."""
        return l2_norm(_vector(gradient), "seed")

    @staticmethod
    def clip_by_norm(gradient: GradientLike, max_norm: float) -> FloatArray:
        """Scale the gradient down to L2 norm ``max_norm`` if it is longer.

        A writeable float32 NumPy array is modified in place and returned; anything else is
        converted to a new float32 array first. The rule is
        :func:`~gradfed_ipfs.tensor.robust.clip_to_norm` with the seed's float32 norm.

        Raises
        ------
        InvalidGradient
            If ``max_norm`` is negative or not finite (the seed had no guard).
        """
        if isinstance(gradient, np.ndarray) and gradient.dtype == np.float32:
            values: FloatArray = gradient if gradient.flags.writeable else gradient.copy()
        else:
            values = np.array(gradient, dtype=np.float32)
        return clip_to_norm(
            values,
            max_norm,
            in_place=True,
            allow_zero=True,
            reject_non_finite=False,
            precision="seed",
        )

    @staticmethod
    def cross_peer_check(
        contributions: Mapping[str, GradientLike],
        *,
        max_norm_ratio: float = 3.0,
        min_cosine: float = 0.0,
    ) -> list[PeerAnomaly]:
        """Compare peers with their coordinate-wise median; see :func:`cross_peer_check`."""
        return cross_peer_check(contributions, max_norm_ratio=max_norm_ratio, min_cosine=min_cosine)


@dataclass(frozen=True)
class PeerAnomaly:
    """A contribution that :func:`cross_peer_check` flags.

    Attributes
    ----------
    peer_id
        The contributing peer.
    reason
        Human-readable reason(s), e.g. ``"norm 112.0x the median's"``.
    norm_ratio
        ``‖g‖ / ‖median‖`` (``inf`` when the median is zero and ``g`` is not).
    cosine
        Cosine similarity of ``g`` to the median, or NaN when either is zero.
    """

    peer_id: str
    reason: str
    norm_ratio: float
    cosine: float


def cross_peer_check(
    contributions: Mapping[str, GradientLike],
    *,
    max_norm_ratio: float = 3.0,
    min_cosine: float = 0.0,
) -> list[PeerAnomaly]:
    """Flag contributions whose norm or direction departs from the coordinate-wise median.

    The median ``m`` of all N contributions is robust to fewer than N/2 bad peers, so it serves
    as the reference. A peer ``g`` is flagged when ``‖g‖ > max_norm_ratio·‖m‖`` (a scaled
    update) or ``cos(g, m) < min_cosine`` (a flipped or unrelated update).

    Parameters
    ----------
    contributions
        Peer ID → gradient, all the same length.
    max_norm_ratio
        Largest accepted ``‖g‖/‖m‖``, ``> 0``.
    min_cosine
        Smallest accepted cosine similarity, in ``[-1, 1]``.

    Returns
    -------
    list[PeerAnomaly]
        The flagged peers, in sorted peer-ID order (empty when all look consistent).

    Raises
    ------
    EmptyGradientSet, ShapeMismatch
        If there are no contributions or their lengths differ.
    ConfigError
        If a setting is out of range.
    """
    if not max_norm_ratio > 0:
        raise ConfigError(f"max_norm_ratio must be > 0, got {max_norm_ratio}")
    if not -1.0 <= min_cosine <= 1.0:
        raise ConfigError(f"min_cosine must be in [-1, 1], got {min_cosine}")
    peers = sorted(contributions)
    stacked = stack_gradients([_vector(contributions[p]) for p in peers]).astype(np.float64)
    median = coordinate_median(list(stacked.astype(np.float32))).astype(np.float64)
    median_norm = l2_norm(median, "float64")
    norms = np.linalg.norm(stacked, axis=1)  # l2_norm of each row, vectorised
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = norms / median_norm if median_norm else np.where(norms > 0, np.inf, 1.0)
        cosines = (stacked @ median) / (norms * median_norm)
    anomalies = []
    for i, peer in enumerate(peers):
        reasons = []
        if ratios[i] > max_norm_ratio:
            reasons.append(f"norm {ratios[i]:.1f}x the median's (limit {max_norm_ratio:g}x)")
        if cosines[i] < min_cosine:
            reasons.append(f"cosine {cosines[i]:.3f} to the median (limit {min_cosine:g})")
        if reasons:
            anomalies.append(
                PeerAnomaly(peer, "; ".join(reasons), float(ratios[i]), float(cosines[i]))
            )
    return anomalies
