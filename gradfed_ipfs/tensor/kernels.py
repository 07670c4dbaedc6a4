"""Memory-bandwidth-bound kernels for aggregation over many peers' float32 vectors.

A weighted sum of N vectors of length d cannot beat reading N·d floats once, which is what a
BLAS ``w @ X`` over a pre-stacked N×d matrix does. Stacking first would cost a full extra copy,
and NumPy's ``acc += w * g`` makes a temporary and two passes per peer. :func:`weighted_sum`
instead walks the output in cache-sized blocks and, for each block, lets BLAS ``saxpy`` add
every peer's slice into the block while it stays in cache: each input is read once from memory,
the output written once.

One worker thread per core claims blocks in turn and the workers run in parallel. BLAS is
reached through the C function pointers SciPy publishes in ``scipy.linalg.cython_blas`` and
called with :mod:`ctypes`, which releases the GIL for the length of each call, so the threads
really do overlap; an f2py wrapper such as ``scipy.linalg.blas.saxpy`` holds the GIL and costs
~3 µs of argument parsing per call. BLAS itself is held to one thread: each call is one cache
block, too small to be worth waking BLAS's own threads for.

Measured on a 2-core VM at d = 10M (``benchmarks/bench_aggregate.py``): 0.7–0.9× of the
two-thread ``w @ X`` bound at N = 4 and 1.0–1.1× at N = 16, against 1.3× and 1.9× for the former
single-threaded f2py ``saxpy`` loop.

When the BLAS pointer is not available (another Python implementation, a SciPy without
``cython_blas``), the same blocked loop runs in NumPy on one thread.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import numpy as np
from threadpoolctl import ThreadpoolController

from .._types import FloatArray

__all__ = ["CACHE_BLOCK_FLOATS", "weighted_sum"]

CACHE_BLOCK_FLOATS = 1 << 19
"""Output floats per block: 2 MiB of float32, one block per worker held in the shared L3.

Every BLAS call ends with the worker taking the GIL back, and on a VM that hand-over between two
cores costs microseconds, so fewer, longer calls win over keeping the block in L2: at N = 16,
d = 10M the median call took 27 ms with 2^16-float blocks, 26 with 2^17 and 24 with 2^19 (the
bound: 23).
"""

_SaxpyPointer = Callable[[int, int, int, int, int, int], None]


def weighted_sum(
    gradients: Sequence[FloatArray],
    weights: Sequence[float] | np.ndarray,
    *,
    out: FloatArray | None = None,
    threads: int | None = None,
) -> FloatArray:
    """Return ``Σ_i weights[i] · gradients[i]`` as float32, reading each input once.

    Parameters
    ----------
    gradients
        N ≥ 1 float32 vectors of the same length d. Other dtypes and strided views are copied to
        contiguous float32 first.
    weights
        N weights (already normalised if a mean is wanted).
    out
        Optional C-contiguous, writable float32 output of length d that shares no memory with
        any input.
    threads
        Worker threads (the caller is one of them); default: the CPUs this process may run on,
        and never more than there are cache blocks.

    Returns
    -------
    FloatArray
        The weighted sum, shape ``(d,)``, accumulated in float32.

    Raises
    ------
    ValueError
        No gradients, lengths or weight count that do not match, an unusable ``out``, or
        ``threads < 1``. The kernel reads raw memory, so these are checked rather than trusted.
    """
    if not gradients:
        raise ValueError("weighted_sum needs at least one gradient")
    rows = [np.ascontiguousarray(g, dtype=np.float32).reshape(-1) for g in gradients]
    length = int(rows[0].size)
    if any(row.size != length for row in rows):
        raise ValueError(f"gradients differ in length: {sorted({row.size for row in rows})}")
    # A private copy: the workers read the weights through raw pointers while the call runs.
    w = np.array(weights, dtype=np.float32).reshape(-1)
    if w.size != len(rows):
        raise ValueError(f"{w.size} weights for {len(rows)} gradients")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    result = _checked_out(out, rows, length)
    if length == 0:
        return result
    blocks = -(-length // CACHE_BLOCK_FLOATS)
    workers = min(blocks, threads if threads is not None else _available_cpus())
    saxpy = _blas_saxpy()
    if saxpy is None:
        _accumulate_numpy(rows, w, result, 0, length)
        return result
    # Workers claim blocks one at a time rather than owning fixed spans: on a shared machine one
    # core is often stalled for a while, and with fixed halves the call would wait for it.
    claims = itertools.count()
    with _single_threaded_blas:
        futures: list[Future[None]] = []
        for _ in range(workers - 1):
            try:
                futures.append(_pool().submit(_accumulate_blas, saxpy, rows, w, result, claims))
            except RuntimeError:  # interpreter shutting down: the caller claims every block
                break
        _accumulate_blas(saxpy, rows, w, result, claims)  # the caller works too
        for future in futures:
            future.result()
    return result


def _checked_out(out: FloatArray | None, rows: list[FloatArray], length: int) -> FloatArray:
    if out is None:
        return np.empty(length, dtype=np.float32)
    if out.dtype != np.float32 or out.shape != (length,):
        raise ValueError(f"out must be float32 of shape ({length},), got {out.dtype} {out.shape}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("out must be C-contiguous and writable")
    if any(np.may_share_memory(out, row) for row in rows):
        raise ValueError("out must not share memory with a gradient")
    return out


def _accumulate_blas(
    saxpy: _SaxpyPointer,
    rows: list[FloatArray],
    weights: np.ndarray,
    out: FloatArray,
    claims: Iterator[int],
) -> None:
    """Add every row's share into each block claimed from ``claims`` until none are left."""
    # Fortran BLAS takes every scalar by pointer: each worker has its own block length, and
    # the weights, only ever read, are the caller's private copy.
    count = ctypes.c_int(0)
    unit_stride = ctypes.c_int(1)
    count_at, stride_at = ctypes.addressof(count), ctypes.addressof(unit_stride)
    weight_at = [weights.ctypes.data + 4 * i for i in range(weights.size)]
    row_at = [row.ctypes.data for row in rows]
    out_at = out.ctypes.data
    for claimed in claims:  # next() on itertools.count is atomic under the GIL
        block = claimed * CACHE_BLOCK_FLOATS
        if block >= out.size:
            return
        size = min(CACHE_BLOCK_FLOATS, out.size - block)
        count.value = size
        offset = 4 * block
        ctypes.memset(out_at + offset, 0, 4 * size)
        for source, weight in zip(row_at, weight_at, strict=True):
            saxpy(count_at, weight, source + offset, stride_at, out_at + offset, stride_at)


def _accumulate_numpy(
    rows: list[FloatArray], weights: np.ndarray, out: FloatArray, start: int, stop: int
) -> None:
    scratch = np.empty(min(CACHE_BLOCK_FLOATS, stop - start), dtype=np.float32)
    for block in range(start, stop, CACHE_BLOCK_FLOATS):
        end = min(block + CACHE_BLOCK_FLOATS, stop)
        target, tmp = out[block:end], scratch[: end - block]
        np.multiply(rows[0][block:end], weights[0], out=target)
        for row, weight in zip(rows[1:], weights[1:], strict=True):
            np.multiply(row[block:end], weight, out=tmp)
            np.add(target, tmp, out=target)


@functools.cache
def _blas_saxpy() -> _SaxpyPointer | None:
    """SciPy's Fortran ``saxpy`` as a GIL-releasing ctypes function; ``None`` where unreachable."""
    # Imported on first use: scipy.linalg costs ~0.2 s, which `import gradfed_ipfs` should not.
    try:
        from scipy.linalg import cython_blas

        capsule = cython_blas.__pyx_capi__["saxpy"]
        get_name = ctypes.pythonapi.PyCapsule_GetName
        get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
        get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        get_pointer.restype = ctypes.c_void_p
        get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        signature = get_name(capsule)
        # saxpy(int *n, float *a, float *x, int *incx, float *y, int *incy): 32-bit ints (LP64).
        if not signature or not signature.startswith(b"void (int *,") or signature.count(b",") != 5:
            return None
        address = get_pointer(capsule, signature)
    except (ImportError, AttributeError, KeyError, ValueError):
        return None
    prototype = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 6)
    return cast(_SaxpyPointer, prototype(address))


@functools.cache
def _blas_controller() -> ThreadpoolController:
    # Built once, after _blas_saxpy() loaded SciPy's BLAS so that the limit reaches it too:
    # discovering the loaded BLAS libraries takes milliseconds, a limit() 25 µs.
    _blas_saxpy()
    return ThreadpoolController()


class _SharedBlasLimit:
    """Hold every loaded BLAS to one thread while any :func:`weighted_sum` call runs.

    threadpoolctl's limit saves and restores the thread count, so two overlapping calls that
    each took their own limit would end with the second restoring the first's limit of one,
    leaving NumPy single-threaded for good; a shared count applies it once and lifts it once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._limiter: Any = None

    def __enter__(self) -> None:
        with self._lock:
            if self._holders == 0:
                self._limiter = _blas_controller().limit(limits=1, user_api="blas")
            self._holders += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                self._limiter.restore_original_limits()
                self._limiter = None


_single_threaded_blas = _SharedBlasLimit()


_pool_lock = threading.Lock()
_pool_by_pid: dict[int, ThreadPoolExecutor] = {}


def _pool() -> ThreadPoolExecutor:
    """Return the kernel's worker threads, created on first use (and again in a forked child)."""
    with _pool_lock:
        pool = _pool_by_pid.get(os.getpid())
        if pool is None:
            _pool_by_pid.clear()  # a forked child inherits the parent's pool without its threads
            pool = ThreadPoolExecutor(
                max_workers=max(1, _available_cpus() - 1), thread_name_prefix="gradfed-kernel"
            )
            _pool_by_pid[os.getpid()] = pool
        return pool


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
