from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gradfed_ipfs.errors import ConfigError, InvalidGradient, OutlierDetected, ShapeMismatch
from gradfed_ipfs.tensor.verification import GradientVerifier, cross_peer_check

V = GradientVerifier


# ---------------------------------------------------------------- seed §11


def test_gradient_verification() -> None:
    gradient = [1.0, 2.0, 3.0, 4.0]
    V.verify_shape(gradient, [4])
    V.verify_shape(gradient, [2, 2])
    with pytest.raises(ShapeMismatch) as info:
        V.verify_shape(gradient, [5])
    assert (info.value.expected, info.value.actual) == ([5], [4])
    V.verify_finite(gradient)
    with pytest.raises(InvalidGradient, match="Non-finite value at index 1: nan"):
        V.verify_finite([1.0, float("nan"), float("inf")])


def test_gradient_clipping() -> None:
    gradient = np.array([3.0, 4.0], dtype=np.float32)
    clipped = V.clip_by_norm(gradient, 2.5)
    assert clipped is gradient  # in place
    assert V.l2_norm(gradient) == pytest.approx(2.5)
    untouched = V.clip_by_norm([0.3, 0.4], 1.0)
    np.testing.assert_allclose(untouched, [0.3, 0.4])
    np.testing.assert_array_equal(V.clip_by_norm([0.0, 0.0], 0.0), [0, 0])
    with pytest.raises(InvalidGradient):
        V.clip_by_norm([1.0], -1.0)


def test_l2_norm() -> None:
    assert V.l2_norm([3, 4]) == 5.0
    assert V.l2_norm([]) == 0.0


# ---------------------------------------------------------------- outliers


def test_detect_outliers_population_z_strict() -> None:
    # mean 0, population std 1: z of ±1 is exactly 1, so threshold 1 does not fire (strict >)
    V.detect_outliers([1, -1, 1, -1], 1.0)
    with pytest.raises(OutlierDetected) as info:
        V.detect_outliers([1, -1, 1, -1], 0.99)
    assert (info.value.index, info.value.value) == (0, 1.0)
    # the first hit is reported
    values = [0.0] * 20 + [50.0, -60.0]
    with pytest.raises(OutlierDetected) as info:
        V.detect_outliers(values, 3.0)
    assert info.value.index == 20


def test_detect_outliers_empty_and_constant_pass() -> None:
    V.detect_outliers([], 0.0)
    V.detect_outliers([2.0, 2.0, 2.0], 0.0)


@given(hnp.arrays(np.float32, st.integers(1, 100), elements=st.floats(-1e3, 1e3, width=32)))
def test_clip_by_norm_bounds_norm(values: np.ndarray) -> None:
    clipped = V.clip_by_norm(values.copy(), 1.0)
    assert V.l2_norm(clipped) <= 1.0 + 1e-5


# ---------------------------------------------------------------- cross-peer check


def test_cross_peer_check_flags_scaled_and_flipped() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(size=50).astype(np.float32)
    contributions = {f"h{i}": base + 0.05 * rng.normal(size=50) for i in range(6)}
    contributions["scaled"] = 100 * base
    contributions["flipped"] = -base
    anomalies = cross_peer_check(contributions)
    assert [a.peer_id for a in anomalies] == ["flipped", "scaled"]
    flipped, scaled = anomalies
    assert "cosine" in flipped.reason
    assert flipped.cosine < -0.9
    assert "norm" in scaled.reason
    assert scaled.norm_ratio > 50
    assert V.cross_peer_check({k: v for k, v in contributions.items() if k[0] == "h"}) == []


def test_cross_peer_check_validates() -> None:
    with pytest.raises(ConfigError):
        cross_peer_check({"a": [1.0]}, max_norm_ratio=0)
    with pytest.raises(ConfigError):
        cross_peer_check({"a": [1.0]}, min_cosine=2)
    with pytest.raises(ShapeMismatch):
        cross_peer_check({"a": [1.0], "b": [1.0, 2.0]})


def test_check_finite_names_the_first_bad_index_across_blocks() -> None:
    from gradfed_ipfs.tensor.verification import check_finite

    values = np.zeros(600_000, dtype=np.float32)
    check_finite(values, "ok")
    values[500_001] = np.inf
    values[550_000] = np.nan
    with pytest.raises(InvalidGradient, match=r"in chunk at index 500011: inf"):
        check_finite(values, "chunk", offset=10)
