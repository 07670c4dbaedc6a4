from __future__ import annotations

import numpy as np
import pytest

from gradfed_ipfs.errors import EmptyGradientSet, InvalidGradient, ShapeMismatch
from gradfed_ipfs.tensor import (
    AggregationMethod,
    AggregationStrategy,
    Contribution,
    GradientAggregator,
    Mean,
    SampleWeightedMean,
    Sum,
    WeightedMean,
)

# ---------------------------------------------------------------- seed §11


def test_gradient_averaging() -> None:
    result = GradientAggregator.average([[1, 2, 3], [3, 4, 5]])
    np.testing.assert_array_equal(result, [2, 3, 4])
    assert result.dtype == np.float32


def test_weighted_averaging() -> None:
    result = GradientAggregator.weighted_average([[1, 2, 3], [3, 4, 5]], [0.25, 0.75])
    np.testing.assert_allclose(result, [2.5, 3.5, 4.5], rtol=1e-6)


def test_momentum() -> None:
    result = GradientAggregator.apply_momentum([1, 2, 3], [0.5, 1, 1.5], 0.9)
    np.testing.assert_allclose(result, [1.45, 2.9, 4.35], rtol=1e-6)


def test_aggregator_errors() -> None:
    with pytest.raises(EmptyGradientSet):
        GradientAggregator.average([])
    with pytest.raises(ShapeMismatch) as info:
        GradientAggregator.average([[1, 2], [1, 2, 3]])
    assert (info.value.expected, info.value.actual) == ([2], [3])
    with pytest.raises(EmptyGradientSet):
        GradientAggregator.weighted_average([], [])
    with pytest.raises(InvalidGradient, match="Gradient count 2 != weight count 1"):
        GradientAggregator.weighted_average([[1], [2]], [1.0])
    with pytest.raises(InvalidGradient, match="Sum of weights is zero"):
        GradientAggregator.weighted_average([[1], [2]], [1.0, -1.0])
    with pytest.raises(ShapeMismatch) as info:
        GradientAggregator.apply_momentum([1, 2, 3], [1, 2], 0.9)
    assert (info.value.expected, info.value.actual) == ([2], [3])


def test_negative_weights_accepted() -> None:
    result = GradientAggregator.weighted_average([[1.0], [3.0]], [2.0, -1.0])
    np.testing.assert_allclose(result, [-1.0])


# ---------------------------------------------------------------- existing strategies


def contributions(
    *rows: list[float], counts: list[int | None] | None = None
) -> dict[str, Contribution]:
    counts = counts or [None] * len(rows)
    pairs = enumerate(zip(rows, counts, strict=True))
    return {f"peer-{i}": Contribution.of(row, n) for i, (row, n) in pairs}


def test_sum_mean_weighted_fedavg() -> None:
    c = contributions([1, 2], [3, 4])
    np.testing.assert_array_equal(Sum().aggregate(c), [4, 6])
    np.testing.assert_array_equal(Mean().aggregate(c), [2, 3])
    weighted = WeightedMean({"peer-0": 1.0, "peer-1": 3.0})
    np.testing.assert_allclose(weighted.aggregate(contributions([0.0], [4.0])), [3.0])
    fed = contributions([0, 0], [2, 4], counts=[100, 300])
    np.testing.assert_allclose(SampleWeightedMean().aggregate(fed), [1.5, 3.0])


def test_namespace_lists_every_strategy() -> None:
    names = [
        "Sum",
        "Mean",
        "WeightedMean",
        "FedAvg",
        "Median",
        "TrimmedMean",
        "Krum",
        "MultiKrum",
        "NormBounded",
    ]
    for name in names:
        strategy = getattr(AggregationMethod, name)
        assert issubclass(strategy, AggregationStrategy)
