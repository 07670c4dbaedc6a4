"""Region-aware averaging with the crate's test vectors."""

from __future__ import annotations

import numpy as np
import pytest

from gradfed_ipfs.errors import DimensionMismatch, EmptyGradients, InvalidGradient
from gradfed_ipfs.tensor import (
    combine_region_means,
    federated_average_by_region,
    federated_average_in_regions,
    hierarchical_federated_average,
    region_mean,
)

TAGGED = [("eu", [0.0, 0.0]), ("us", [4.0, 4.0]), ("eu", [2.0, 2.0])]


def test_by_region_means_each_region_in_sorted_order() -> None:
    result = federated_average_by_region(TAGGED)
    assert list(result) == ["eu", "us"]
    np.testing.assert_array_equal(result["eu"], [1.0, 1.0])
    np.testing.assert_array_equal(result["us"], [4.0, 4.0])
    assert result["eu"].dtype == np.float32


def test_in_regions_keeps_data_in_allowed_regions_only() -> None:
    np.testing.assert_array_equal(federated_average_in_regions(TAGGED, ["eu"]), [1.0, 1.0])
    with pytest.raises(EmptyGradients):
        federated_average_in_regions(TAGGED, ["ap"])


def test_hierarchical_weighs_regions_equally() -> None:
    # Region means [1, 1] and [4, 4]: 2.5, where the flat mean of the three would be 2.
    np.testing.assert_array_equal(hierarchical_federated_average(TAGGED), [2.5, 2.5])


def test_empty_and_mismatched_inputs() -> None:
    with pytest.raises(EmptyGradients):
        federated_average_by_region([])
    with pytest.raises(EmptyGradients):
        hierarchical_federated_average([])
    with pytest.raises(DimensionMismatch):
        federated_average_by_region([("eu", [1.0]), ("us", [1.0, 2.0])])


def test_region_mean_is_the_float64_weighted_mean_rounded_once() -> None:
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal(257).astype(np.float32) for _ in range(3)]
    weights = [1, 2, 5]
    expected = sum((w / 8) * r.astype(np.float64) for w, r in zip(weights, rows, strict=True))
    np.testing.assert_array_equal(region_mean(rows, weights), expected.astype(np.float32))
    np.testing.assert_array_equal(region_mean(rows), region_mean(rows, [1, 1, 1]))
    with pytest.raises(EmptyGradients):
        region_mean([])
    with pytest.raises(InvalidGradient):
        region_mean(rows, [1, 0, 1])


def test_hierarchical_is_combine_of_region_means_in_sorted_order() -> None:
    rng = np.random.default_rng(4)
    tagged = [(r, rng.standard_normal(64).astype(np.float32)) for r in "bab"]
    means = federated_average_by_region(tagged)
    np.testing.assert_array_equal(
        hierarchical_federated_average(tagged), region_mean([means["a"], means["b"]])
    )
    # Weighted by region sizes (2 b, 1 a): the flat mean up to float32 rounding.
    weighted = combine_region_means(means, {"a": 1, "b": 2})
    flat = federated_average_in_regions(tagged, ["a", "b"])
    np.testing.assert_allclose(weighted, flat, rtol=0, atol=1e-6)
