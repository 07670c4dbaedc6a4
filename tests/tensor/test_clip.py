"""One clip and one norm (``tensor.robust``) behind every façade, each keeping its own rules."""

from __future__ import annotations

from collections.abc import Callable
from unittest import mock

import numpy as np
import pytest

from gradfed_ipfs.errors import InvalidGradient
from gradfed_ipfs.federated.privacy.mechanisms import DifferentialPrivacy, clip_l2_norm
from gradfed_ipfs.seed import clip_gradient_norm as seed_clip_gradient_norm
from gradfed_ipfs.tensor import robust
from gradfed_ipfs.tensor.robust import clip_gradient_norm, clip_to_norm, l2_norm
from gradfed_ipfs.tensor.verification import GradientVerifier


def test_l2_norm_precisions() -> None:
    # Prepare: a norm whose float64 value is not a float32.
    values = np.array([1.0, 1.0, 1.0], np.float32)
    exact = float(np.sqrt(3.0))
    # Execute / Assert
    assert l2_norm(values, "float64") == exact
    assert l2_norm(values, "seed") == float(np.float32(exact)) != exact
    assert l2_norm(values) == pytest.approx(exact, rel=1e-7)
    assert l2_norm(np.zeros((2, 3), np.float32)) == 0.0
    assert GradientVerifier.l2_norm([1, 1, 1]) == float(np.float32(exact))


def test_fast_norm_falls_back_to_float64_on_overflow() -> None:
    big = np.full(4, 3e38, np.float32)
    assert l2_norm(big) == pytest.approx(6e38)


def test_clip_to_norm_copies_and_refuses_zero_and_non_finite() -> None:
    grad = np.array([3, 4], np.float32)
    out = clip_to_norm(grad, 2.5)
    np.testing.assert_allclose(out, [1.5, 2.0])
    np.testing.assert_array_equal(grad, [3, 4])  # a copy
    with pytest.raises(InvalidGradient, match="> 0"):
        clip_to_norm(grad, 0.0)
    with pytest.raises(InvalidGradient, match="non-finite"):
        clip_to_norm(np.array([np.nan, 1], np.float32), 1.0)


def test_clip_gradient_norm_is_in_place_and_allows_zero() -> None:
    assert seed_clip_gradient_norm is clip_gradient_norm
    grad = np.array([3, 4], np.float32)
    assert clip_gradient_norm(grad, 1.0) is grad
    assert float(np.linalg.norm(grad)) == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_array_equal(clip_gradient_norm(grad, 0.0), [0, 0])
    nan = np.array([np.nan, 1], np.float32)
    assert clip_gradient_norm(nan, 1.0) is nan  # passes non-finite values through
    with pytest.raises(InvalidGradient, match=">= 0"):
        clip_gradient_norm(grad, -1.0)


def test_dp_clip_l2_norm_copies_float64_and_refuses_zero() -> None:
    vector = np.array([3.0, 4.0])
    out = clip_l2_norm(vector, 2.5)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, vector * (2.5 / 5.0))
    np.testing.assert_array_equal(vector, [3.0, 4.0])
    small = np.array([0.3, 0.4])
    assert clip_l2_norm(small, 2.5) is small
    with pytest.raises(InvalidGradient):
        clip_l2_norm(vector, 0.0)
    dp = DifferentialPrivacy(1.0, 1e-5, 1.0, rng=1)
    in_place = np.array([3.0, 4.0])
    dp.clip_l2(in_place, 2.5)
    assert float(np.linalg.norm(in_place)) == pytest.approx(2.5)


def test_verifier_clip_by_norm_in_place_only_for_writeable_float32() -> None:
    grad = np.array([3, 4], np.float32)
    assert GradientVerifier.clip_by_norm(grad, 2.5) is grad
    np.testing.assert_allclose(grad, [1.5, 2.0])
    frozen = np.array([3, 4], np.float32)
    frozen.flags.writeable = False
    out = GradientVerifier.clip_by_norm(frozen, 2.5)
    assert out is not frozen
    np.testing.assert_array_equal(frozen, [3, 4])
    as_list = GradientVerifier.clip_by_norm([3.0, 4.0], 0.0)
    assert as_list.dtype == np.float32
    np.testing.assert_array_equal(as_list, [0, 0])


@pytest.mark.parametrize(
    "facade",
    [
        lambda g: clip_gradient_norm(g, 1.0),
        lambda g: clip_l2_norm(g.astype(np.float64), 1.0),
        lambda g: GradientVerifier.clip_by_norm(g, 1.0),
        lambda g: DifferentialPrivacy(1.0, 1e-5, 1.0, rng=1).clip_l2(g, 1.0),
    ],
)
def test_every_facade_calls_the_one_clip(facade: Callable[[np.ndarray], object]) -> None:
    # Prepare: watch the one implementation wherever it was imported from.
    with mock.patch.object(robust, "clip_to_norm", wraps=robust.clip_to_norm) as spy:
        targets = [
            mock.patch(f"{module}.clip_to_norm", spy)
            for module in (
                "gradfed_ipfs.tensor.verification",
                "gradfed_ipfs.federated.privacy.mechanisms",
            )
        ]
        for target in targets:
            target.start()
        try:
            # Execute
            facade(np.array([3, 4], np.float32))
        finally:
            for target in targets:
                target.stop()
    # Assert
    assert spy.call_count == 1
