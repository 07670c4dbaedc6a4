"""Aggregation math and strategies: FedAvg, Sum, Mean, WeightedMean and robust rules.

Plain functions on arrays hold the math (one home per formula); strategies are small frozen
objects with one ``aggregate`` method, in the style of Flower's strategies. Contributions are
always a mapping keyed by peer ID and are processed in sorted peer-ID order, so weights can never
follow dict order (the seed's WeightedMean bug).

Robust strategies (:class:`Median`, :class:`TrimmedMean`, :class:`MultiKrum`, :class:`Krum`,
:class:`NormBounded`) delegate to the plain functions of :mod:`gradfed_ipfs.tensor.robust`,
re-exported here. :class:`GradientAggregator` is the seed's stateless list-based API.

All arithmetic is float32 in, float32 out; sums are accumulated in float64 where that costs no
extra pass, because d can be 10⁷ to 10⁹ and float32 accumulation drifts.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .._types import FloatArray, GradientLike
from ..errors import ConfigError, EmptyGradientSet, InvalidGradient, ShapeMismatch
from .kernels import weighted_sum
from .robust import (
    clip_to_norm,
    coordinate_median,
    krum_scores,
    multikrum_select,
    pairwise_sq_distances,
    trimmed_mean,
)

__all__ = [
    "AggregationMethod",
    "AggregationStrategy",
    "Contribution",
    "SampleWeightedMean",
    "GradientAggregator",
    "Krum",
    "Mean",
    "Median",
    "MultiKrum",
    "NormBounded",
    "Sum",
    "TrimmedMean",
    "WeightedMean",
    "as_float32_vector",
    "check_same_length",
    "clip_to_norm",
    "coordinate_median",
    "fedavg",
    "gradient_sum",
    "krum_scores",
    "mean",
    "method_name",
    "multikrum_select",
    "pairwise_sq_distances",
    "trimmed_mean",
    "weighted_mean",
]


def as_float32_vector(values: GradientLike) -> FloatArray:
    """Return ``values`` as a flat float32 array (no copy when it already is one)."""
    return np.asarray(values, dtype=np.float32).reshape(-1)


@dataclass(frozen=True)
class Contribution:
    """One peer's gradient and how many samples produced it.

    Attributes
    ----------
    values
        Flat float32 gradient of length d.
    num_samples
        Local training samples behind it (FedAvg weight); ``None`` when unknown.
    """

    values: FloatArray
    num_samples: int | None = None

    @classmethod
    def of(cls, values: GradientLike, num_samples: int | None = None) -> Contribution:
        """Build a contribution from any array-like, converting to flat float32."""
        if num_samples is not None and num_samples < 0:
            raise InvalidGradient(f"num_samples must be >= 0, got {num_samples}")
        return cls(as_float32_vector(values), num_samples)


def check_same_length(gradients: Sequence[FloatArray]) -> int:
    """Return the common length of ``gradients``.

    Raises
    ------
    EmptyGradientSet
        If there are none.
    ShapeMismatch
        If any length differs from the first's (``expected=[len0]``, ``actual=[len_i]``).
    """
    if not gradients:
        raise EmptyGradientSet()
    length = gradients[0].size
    for gradient in gradients[1:]:
        if gradient.size != length:
            raise ShapeMismatch([length], [gradient.size])
    return length


def gradient_sum(gradients: Sequence[FloatArray]) -> FloatArray:
    """Element-wise sum of equal-length float32 vectors (accumulated in float64)."""
    length = check_same_length(gradients)
    total = np.zeros(length, dtype=np.float64)
    for gradient in gradients:
        total += gradient
    return total.astype(np.float32)


def mean(gradients: Sequence[FloatArray]) -> FloatArray:
    """Element-wise unweighted mean of equal-length float32 vectors."""
    count = len(gradients)
    total = gradient_sum(gradients)
    total /= np.float32(count)
    return total


def weighted_mean(gradients: Sequence[FloatArray], weights: Sequence[float]) -> FloatArray:
    """Return ``Σ_g w_g·g / Σ w`` for equal-length vectors.

    Weights are normalised by their sum (negative weights are accepted, as in the seed).

    Raises
    ------
    EmptyGradientSet, ShapeMismatch
        See :func:`check_same_length`.
    InvalidGradient
        If the counts differ, a weight is not finite, or the weights sum to zero.
    """
    if not gradients:
        raise EmptyGradientSet()
    if len(gradients) != len(weights):
        raise InvalidGradient(f"Gradient count {len(gradients)} != weight count {len(weights)}")
    check_same_length(gradients)
    w = np.asarray(weights, dtype=np.float64)
    if not np.all(np.isfinite(w)):
        raise InvalidGradient(f"weights must be finite, got {list(weights)}")
    total_weight = float(w.sum())
    if total_weight == 0.0:
        raise InvalidGradient("Sum of weights is zero")
    if len(gradients) == 1:
        return gradients[0].astype(np.float32, copy=True)
    # One pass over the N·d inputs, summed block by block in cache by BLAS saxpy: close to a
    # `w @ X` over a pre-stacked matrix (see benchmarks/bench_aggregate.py).
    return weighted_sum(gradients, w / total_weight)


def fedavg(contributions: Mapping[str, Contribution]) -> FloatArray:
    """Federated averaging: mean weighted by ``num_samples``, in sorted peer-ID order.

    Contributions without a sample count weigh as the mean count of those that have one; when no
    contribution has a positive count the result is the unweighted mean (the seed's FedAvg).

    Raises
    ------
    EmptyGradientSet, ShapeMismatch
        See :func:`check_same_length`.
    """
    if not contributions:
        raise EmptyGradientSet()
    peers = sorted(contributions)
    gradients = [contributions[p].values for p in peers]
    counts = [contributions[p].num_samples for p in peers]
    known = [c for c in counts if c is not None]
    if not known or sum(known) == 0:
        return mean(gradients)
    fill = sum(known) / len(known)
    return weighted_mean(gradients, [float(fill if c is None else c) for c in counts])


class AggregationStrategy(ABC):
    """An aggregation rule: one method that turns peer contributions into one gradient.

    Subclasses are frozen dataclasses holding only the rule's settings, validated up front.
    """

    @abstractmethod
    def aggregate(self, contributions: Mapping[str, Contribution]) -> FloatArray:
        """Combine contributions into one gradient.

        Parameters
        ----------
        contributions
            Peer ID → contribution; every value has the same length d.

        Returns
        -------
        FloatArray
            The aggregate, float32 of length d.

        Raises
        ------
        EmptyGradientSet
            If ``contributions`` is empty.
        ShapeMismatch
            If lengths differ.
        """


@dataclass(frozen=True)
class Sum(AggregationStrategy):
    """Element-wise sum of all contributions."""

    def aggregate(self, contributions: Mapping[str, Contribution]) -> FloatArray:
        """Sum the contributions (sorted peer-ID order)."""
        return gradient_sum([contributions[p].values for p in sorted(contributions)])


@dataclass(frozen=True)
class Mean(AggregationStrategy):
    """Unweighted element-wise mean."""

    def aggregate(self, contributions: Mapping[str, Contribution]) -> FloatArray:
        """Average the contributions with equal weights."""
        return mean([contributions[p].values for p in sorted(contributions)])


@dataclass(frozen=True)
class WeightedMean(AggregationStrategy):
    """Mean with explicit weights.

    Parameters
    ----------
    weights
        Either a mapping peer ID → weight (preferred: unambiguous), or a sequence of weights in
        sorted peer-ID order of the contributions (the seed's positional form, made
        deterministic).
    """

    weights: Mapping[str, float] | Sequence[float] = field(default_factory=dict)

    def aggregate(self, contributions: Mapping[str, Contribution]) -> FloatArray:
        """Weighted mean; raises ``InvalidGradient`` on missing or miscounted weights."""
        peers = sorted(contributions)
        if isinstance(self.weights, Mapping):
            missing = [p for p in peers if p not in self.weights]
            if missing:
                raise InvalidGradient(f"no weight for peers {missing}")
            weights = [float(self.weights[p]) for p in peers]
        else:
            weights = [float(w) for w in self.weights]
        return weighted_mean([contributions[p].values for p in peers], weights)


@dataclass(frozen=True)
class SampleWeightedMean(AggregationStrategy):
    """FedAvg's aggregation: the mean weighted by sample counts (McMahan et al., 2017).

    Round records and the seed call it ``FedAvg`` (``AggregationMethod.FedAvg``); the training
    strategy of that name is :class:`gradfed_ipfs.training.FedAvg`. Without sample counts it is
    the unweighted mean, as the seed's ``FedAvg``.
    See https://arxiv.org/abs/1602.05629.
    """

    def aggregate(self, contributions: Mapping[str, Contribution]) -> FloatArray:
        """Sample-weighted mean; see :func:`fedavg`."""
        return fedavg(contributions)


def _in_peer_order(contributions: Mapping[str, Contribution]) -> list[FloatArray]:
    return [contributions[p].values for p in sorted(contributions)]


@dataclass(frozen=True)
class Median(AggregationStrategy):
    """Coordinate-wise median (Yin et al., 2018, https://arxiv.org/abs/1803.01498).

    Ignores sample counts. Robust to fewer than half the peers being arbitrary.
    """

    def aggregate(self, contributions: Mapping[str, Contribution]) -> FloatArray:
        """Return the coordinate-wise median; see :func:`coordinate_median`."""
        return coordinate_median(_in_peer_order(contributions))


@dataclass(frozen=True)
class TrimmedMean(AggregationStrategy):
    """Coordinate-wise β-trimmed mean (Yin et al., 2018, https://arxiv.org/abs/1803.01498).

    Parameters
    ----------
    beta
        Fraction of values dropped at each end of every coordinate, in ``[0, 0.5)``;
        ``floor(beta·N)`` peers are trimmed on each side.
    """

    beta: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 <= self.beta < 0.5:
            raise ConfigError(f"trimmed-mean beta must be in [0, 0.5), got {self.beta}")

    def aggregate(self, contributions: Mapping[str, Contribution]) -> FloatArray:
        """Return the trimmed mean; see :func:`trimmed_mean`."""
        return trimmed_mean(_in_peer_order(contributions), self.beta)


@dataclass(frozen=True)
class MultiKrum(AggregationStrategy):
    """Multi-Krum (Blanchard et al., 2017, https://arxiv.org/abs/1703.02757).

    Scores every peer by the summed squared distance to its ``N - f - 2`` nearest peers,
    keeps the ``m`` lowest-scoring peers and FedAvg-averages them (sample-weighted when counts
    are known). The guarantee needs ``N > 2f + 2``.

    Parameters
    ----------
    f
        Number of Byzantine peers tolerated, ``>= 0``.
    m
        Peers selected, ``>= 1`` (capped at N).
    """

    f: int = 1
    m: int = 1

    def __post_init__(self) -> None:
        if self.f < 0:
            raise ConfigError(f"f must be >= 0, got {self.f}")
        if self.m < 1:
            raise ConfigError(f"m must be >= 1, got {self.m}")

    def select(self, contributions: Mapping[str, Contribution]) -> list[str]:
        """Return the sorted peer IDs that Multi-Krum keeps."""
        peers = sorted(contributions)
        chosen = multikrum_select([contributions[p].values for p in peers], self.f, self.m)
        return [peers[i] for i in chosen]

    def aggregate(self, contributions: Mapping[str, Contribution]) -> FloatArray:
        """Average the selected contributions; see :func:`krum_scores`."""
        if not contributions:
            raise EmptyGradientSet()
        return fedavg({p: contributions[p] for p in self.select(contributions)})


@dataclass(frozen=True)
class Krum(MultiKrum):
    """Krum: :class:`MultiKrum` with ``m = 1``, returning the single most central gradient.

    Blanchard et al., 2017, https://arxiv.org/abs/1703.02757.

    Parameters
    ----------
    f
        Number of Byzantine peers tolerated, ``>= 0``.
    """

    m: int = field(default=1, init=False)


@dataclass(frozen=True)
class NormBounded(AggregationStrategy):
    """Clip each contribution to L2 norm ``max_norm``, then delegate to ``inner``.

    Norm bounding (Sun et al., 2019, https://arxiv.org/abs/1911.07963) limits how far any one
    peer can move the aggregate: with FedAvg over N equal-weight peers, by ``max_norm/N``.

    Parameters
    ----------
    inner
        The rule applied to the clipped contributions (default :class:`SampleWeightedMean`).
    max_norm
        L2 bound per contribution, finite and ``> 0``.
    """

    inner: AggregationStrategy = field(default_factory=lambda: SampleWeightedMean())
    max_norm: float = 5.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_norm) and self.max_norm > 0):
            raise ConfigError(f"max_norm must be finite and > 0, got {self.max_norm}")
        if not isinstance(self.inner, AggregationStrategy):
            raise ConfigError(f"inner must be an AggregationStrategy, got {self.inner!r}")

    def aggregate(self, contributions: Mapping[str, Contribution]) -> FloatArray:
        """Clip every contribution (keeping its sample count), then run ``inner``."""
        clipped = {
            peer: Contribution(clip_to_norm(c.values, self.max_norm), c.num_samples)
            for peer, c in contributions.items()
        }
        return self.inner.aggregate(clipped)


class GradientAggregator:
    """The seed's stateless list-based aggregator (seed-api §4.6)."""

    @staticmethod
    def average(gradients: Sequence[GradientLike]) -> FloatArray:
        """Return the element-wise mean as the seed computes it: ``Σ g/n`` in float32, list order.

        Bit for bit the crate's result; :func:`mean` (float64 accumulation) is the native one.

        Raises
        ------
        EmptyGradientSet
            If ``gradients`` is empty.
        ShapeMismatch
            If a length differs from the first's.
        """
        vectors = [as_float32_vector(g) for g in gradients]
        result = np.zeros(check_same_length(vectors), dtype=np.float32)
        count = np.float32(len(vectors))
        for vector in vectors:
            result += vector / count
        return result

    @staticmethod
    def weighted_average(gradients: Sequence[GradientLike], weights: Sequence[float]) -> FloatArray:
        """Return ``Σ_g g·(w_g / Σw)`` as the seed computes it, in float32 and list order.

        The weight sum is a float32 sum in list order, so weights such as ``[0.1, 0.2, -0.3]``
        or ``[1e8, 1, -1e8]`` sum to zero and are refused, as in the crate. Negative weights are
        accepted. Fix over the seed: a NaN or infinite weight is refused (the crate returned NaN).

        Raises
        ------
        EmptyGradientSet, ShapeMismatch
            As :meth:`average`.
        InvalidGradient
            ``"Gradient count X != weight count Y"``, ``"Sum of weights is zero"``, or a weight
            that is not finite.
        """
        vectors = [as_float32_vector(g) for g in gradients]
        if not vectors:
            raise EmptyGradientSet()
        if len(vectors) != len(weights):
            raise InvalidGradient(f"Gradient count {len(vectors)} != weight count {len(weights)}")
        length = check_same_length(vectors)
        w = np.asarray(weights, dtype=np.float32).reshape(-1)
        if not np.all(np.isfinite(w)):
            raise InvalidGradient(f"weights must be finite, got {list(weights)}")
        total = np.float32(np.add.accumulate(w)[-1])  # float32, in order, as Rust's sum()
        if total == 0:
            raise InvalidGradient("Sum of weights is zero")
        result = np.zeros(length, dtype=np.float32)
        for vector, weight in zip(vectors, w, strict=True):
            result += vector * (weight / total)
        return result

    @staticmethod
    def apply_momentum(
        current: GradientLike, previous_momentum: GradientLike, momentum_factor: float
    ) -> FloatArray:
        """Return ``β·m_prev + g`` (heavy ball without dampening), float32.

        Raises
        ------
        ShapeMismatch
            ``expected=[len(previous)]``, ``actual=[len(current)]`` if lengths differ.
        """
        gradient = as_float32_vector(current)
        previous = as_float32_vector(previous_momentum)
        if gradient.size != previous.size:
            raise ShapeMismatch([previous.size], [gradient.size])
        result: FloatArray = np.float32(momentum_factor) * previous + gradient
        return result


class AggregationMethod:
    """The seed's ``AggregationMethod`` enum, as a namespace of strategy classes.

    ``AggregationMethod.FedAvg()`` is a :class:`SampleWeightedMean` strategy, and so on; any
    :class:`AggregationStrategy` instance is accepted wherever a method is expected. Beyond the
    seed: ``Median``, ``TrimmedMean``, ``Krum``, ``MultiKrum`` and ``NormBounded``.
    """

    Sum = Sum
    Mean = Mean
    WeightedMean = WeightedMean
    FedAvg = SampleWeightedMean
    Median = Median
    TrimmedMean = TrimmedMean
    Krum = Krum
    MultiKrum = MultiKrum
    NormBounded = NormBounded


_METHOD_NAMES: dict[type, str] = {
    cls: name for name, cls in vars(AggregationMethod).items() if isinstance(cls, type)
}


def method_name(strategy: AggregationStrategy) -> str | None:
    """Return the name round records give ``strategy``'s rule (``AggregationMethod``'s), if any.

    The names are the seed's: a :class:`SampleWeightedMean` is recorded as ``"FedAvg"``.
    """
    return _METHOD_NAMES.get(type(strategy))
