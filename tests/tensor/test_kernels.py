from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

from gradfed_ipfs.tensor import kernels
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


def _peers(count: int, length: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(length, dtype=np.float32) for _ in range(count)]


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_result_is_bitwise_independent_of_thread_count(threads: int) -> None:
    # Every block is summed in the same row order whoever claims it, so threads change nothing.
    grads = _peers(6, CACHE_BLOCK_FLOATS * 3 + 11)
    weights = np.linspace(0.1, 0.9, 6)
    reference = weighted_sum(grads, weights, threads=1)
    np.testing.assert_array_equal(weighted_sum(grads, weights, threads=threads), reference)


def test_numpy_fallback_without_blas_pointer(monkeypatch: pytest.MonkeyPatch) -> None:
    grads = _peers(3, CACHE_BLOCK_FLOATS + 5)
    weights = [0.5, -0.25, 2.0]
    with_blas = weighted_sum(grads, weights)
    monkeypatch.setattr(kernels, "_blas_saxpy", lambda: None)
    np.testing.assert_allclose(weighted_sum(grads, weights), with_blas, rtol=1e-6, atol=1e-6)


def test_blas_pointer_is_found_here() -> None:
    # The fast path must not silently degrade to the NumPy loop on the machines we support.
    assert kernels._blas_saxpy() is not None


def test_concurrent_calls_are_correct_and_restore_blas_threads() -> None:
    controller = ThreadpoolController()
    before = [lib.num_threads for lib in controller.select(user_api="blas").lib_controllers]
    grads = _peers(4, CACHE_BLOCK_FLOATS * 2 + 1)
    expected = {k: weighted_sum(grads, [k, 1.0, 2.0, 3.0], threads=1) for k in range(6)}
    with ThreadPoolExecutor(max_workers=6) as callers:
        results = dict(
            zip(
                range(6),
                callers.map(lambda k: weighted_sum(grads, [k, 1.0, 2.0, 3.0]), range(6)),
                strict=True,
            )
        )
    for k, result in results.items():
        np.testing.assert_array_equal(result, expected[k])
    after = [
        lib.num_threads for lib in ThreadpoolController().select(user_api="blas").lib_controllers
    ]
    assert after == before


@pytest.mark.parametrize(
    ("gradients", "weights", "match"),
    [
        ([], [], "at least one"),
        ([np.ones(3, np.float32), np.ones(4, np.float32)], [1.0, 1.0], "differ in length"),
        ([np.ones(3, np.float32)], [1.0, 2.0], "2 weights for 1"),
    ],
)
def test_bad_inputs_raise_value_error(
    gradients: list[np.ndarray], weights: list[float], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        weighted_sum(gradients, weights)


def test_bad_out_or_threads_raise_value_error() -> None:
    grads = [np.ones(8, np.float32), np.full(8, 2.0, np.float32)]
    with pytest.raises(ValueError, match="float32 of shape"):
        weighted_sum(grads, [1.0, 1.0], out=np.empty(8, np.float64))
    with pytest.raises(ValueError, match="float32 of shape"):
        weighted_sum(grads, [1.0, 1.0], out=np.empty(9, np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        weighted_sum(grads, [1.0, 1.0], out=np.empty(16, np.float32)[::2])
    with pytest.raises(ValueError, match="share memory"):
        weighted_sum(grads, [1.0, 1.0], out=grads[1])
    with pytest.raises(ValueError, match="threads"):
        weighted_sum(grads, [1.0, 1.0], threads=0)
    np.testing.assert_array_equal(grads[1], np.full(8, 2.0))  # untouched by the refused call


def test_worker_pool_is_rebuilt_in_a_forked_child(monkeypatch: pytest.MonkeyPatch) -> None:
    parent_pool = kernels._pool()
    monkeypatch.setattr(kernels.os, "getpid", lambda: -1)  # what a forked child would see
    child_pool = kernels._pool()
    assert child_pool is not parent_pool
    grads = _peers(2, CACHE_BLOCK_FLOATS * 2)
    np.testing.assert_allclose(weighted_sum(grads, [1.0, 1.0]), grads[0] + grads[1], rtol=1e-6)
    monkeypatch.undo()
    child_pool.shutdown()
    parent_pool.shutdown()
    assert kernels._pool() is not child_pool


def test_caller_sums_alone_when_workers_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    class ShutDownPool:
        def submit(self, *args: object) -> None:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    grads = _peers(3, CACHE_BLOCK_FLOATS * 3)
    expected = weighted_sum(grads, [1.0, 2.0, 3.0], threads=1)
    monkeypatch.setattr(kernels, "_pool", ShutDownPool)
    np.testing.assert_array_equal(weighted_sum(grads, [1.0, 2.0, 3.0], threads=4), expected)
