"""The seed crate's answers on the cases issue 12 lists, as plain tests (no cargo needed).

``test_crate_oracle.py`` asks the crate itself; these pin the same answers so they hold where the
oracle cannot be built.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradfed_ipfs._fmt import rust_display
from gradfed_ipfs.errors import InvalidCompressionRatio, InvalidGradient, OutlierDetected
from gradfed_ipfs.seed import (
    ComputationGraphStore,
    ComputationNode,
    ConvergenceConfig,
    ConvergenceDetector,
    GradientAggregator,
    GradientCompressor,
    GradientVerifier,
    QuantizedGradient,
    SparseGradient,
    federated_average,
)


@pytest.mark.parametrize(
    ("value", "bits", "text"),
    [
        (math.nan, 32, "NaN"),
        (math.inf, 32, "inf"),
        (-math.inf, 64, "-inf"),
        (10.0, 32, "10"),
        (-0.0, 32, "-0"),
        (4 / 3, 32, "1.3333334"),
        (4 / 3, 64, "1.3333333333333333"),
        (0.1, 32, "0.1"),
        (1e20, 32, "100000000000000000000"),
        (1e-7, 64, "0.0000001"),
        (-288948.625, 32, "-288948.63"),  # a tie: Rust rounds away from zero
        (float(np.finfo(np.float32).max), 32, "340282350000000000000000000000000000000"),
    ],
)
def test_rust_display(value: float, bits: int, text: str) -> None:
    assert rust_display(value, 32 if bits == 32 else 64) == text


def test_quantize_compares_the_range_in_float32() -> None:
    q = QuantizedGradient.from_dense(np.array([0.0, 1e-8], dtype=np.float32), [2])
    assert q.quantized_values.tolist() == [-128, 127]
    assert q.scale == pytest.approx(float(np.float32(1e-8)) / 255)


def test_detect_outliers_in_float32() -> None:
    GradientVerifier.detect_outliers([0, 0, 0, 0, 0.1], 2.0)  # z is exactly 2 in float32
    GradientVerifier.detect_outliers([0, 0, 0, 0, 1e20], 1.9)  # the squares overflow
    with pytest.raises(OutlierDetected, match=r"^Outlier detected at index 3: value 100$"):
        GradientVerifier.detect_outliers([1, 2, 3, 100], 1.5)


@pytest.mark.parametrize("weights", [[0.1, 0.2, -0.3], [1e8, 1, -1e8]])
def test_weighted_average_sums_weights_in_float32(weights: list[float]) -> None:
    with pytest.raises(InvalidGradient, match="Sum of weights is zero"):
        GradientAggregator.weighted_average([[1, 2], [3, 4], [5, 6]], weights)


def test_averages_are_the_crates_float32_sums() -> None:
    gradients = [np.array([0.1, 1e8], np.float32), np.array([0.2, 1.0], np.float32)] * 3
    expected = np.zeros(2, np.float32)
    for g in gradients:
        expected += g / np.float32(len(gradients))
    np.testing.assert_array_equal(GradientAggregator.average(gradients), expected)
    np.testing.assert_array_equal(federated_average(gradients), expected)


def test_ema_window_mean_is_float32() -> None:
    detector = ConvergenceDetector.with_config(ConvergenceConfig(0.1, 3, 0.9, 2))
    assert [detector.update(loss) for loss in (0.06, 0.0, 0.14)] == [False, False, False]
    assert detector.plateau_rounds() == 0
    assert detector.gradient_norm() == float(np.float32(0.1))  # not below the threshold


def test_top_k_of_nothing_has_ratio_nan() -> None:
    with pytest.raises(InvalidCompressionRatio, match=r"^Invalid compression ratio: NaN$") as info:
        GradientCompressor.top_k([], [0], 0)
    assert math.isnan(info.value.ratio)
    with pytest.raises(InvalidCompressionRatio, match=r"^Invalid compression ratio: 0$"):
        GradientCompressor.top_k([1.0], [1], 0)


def test_sparsity_ratio_of_a_zero_size_shape() -> None:
    assert math.isnan(SparseGradient([], [], [0]).sparsity_ratio())
    assert SparseGradient([0], [1.0], [0]).sparsity_ratio() == -math.inf


def test_provenance_chain_on_a_diamond_is_the_crates() -> None:
    graph = ComputationGraphStore()
    for node_id, inputs, output in [("A", [], "a"), ("B", ["a"], "b"), ("C", ["a"], "c"),
                                    ("D", ["b", "c"], "d")]:  # fmt: skip
        graph.add_node(ComputationNode(node_id, "op", inputs, output))
    assert [n.id for n in graph.provenance_chain("d")] == ["B", "A", "C", "D"]
