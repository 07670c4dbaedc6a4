from __future__ import annotations

import numpy as np
import pytest

from gradfed_ipfs.tensor.kernels import CACHE_BLOCK_FLOATS, weighted_sum


@pytest.mark.parametrize("length", [0, 1, 7, CACHE_BLOCK_FLOATS, CACHE_BLOCK_FLOATS * 2 + 3])
@pytest.mark.parametrize("count", [1, 2, 5])
def test_weighted_sum_matches_float64_reference(length: int, count: int) -> None:
    rng = np.random.default_rng(length + count)
    grads = [rng.standard_normal(length).astype(np.float32) for _ in range(count)]
    weights = rng.random(count)
    expected = sum(w * g.astype(np.float64) for w, g in zip(weights, grads, strict=True))
    out = weighted_sum(grads, weights)
    assert out.dtype == np.float32
    assert out.shape == (length,)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_inputs_untouched_and_out_used() -> None:
    grads = [np.full(10, 1.0, dtype=np.float32), np.full(10, 3.0, dtype=np.float32)]
    out = np.empty(10, dtype=np.float32)
    assert weighted_sum(grads, [0.25, 0.75], out=out) is out
    np.testing.assert_array_equal(out, np.full(10, 2.5))
    np.testing.assert_array_equal(grads[0], np.ones(10))


def test_non_contiguous_and_read_only_inputs() -> None:
    base = np.arange(40, dtype=np.float32)
    strided = base[::2]  # a view with stride 8 bytes
    frozen = np.ones(20, dtype=np.float32)
    frozen.flags.writeable = False
    np.testing.assert_allclose(weighted_sum([strided, frozen], [2.0, -1.0]), strided * 2 - 1)
