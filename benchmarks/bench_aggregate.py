"""FedAvg throughput: ours vs the stacked ``w @ X`` bound vs Flower's ``aggregate``.

Measures FedAvg over N separate float32 arrays (as gradients arrive), best of ``--repeat``
runs after a warm-up (``WARM_UP_SECONDS``), the contenders timed one after another on the same
arrays in this one process.

Baselines: a BLAS ``w @ X`` over a matrix stacked *before* timing (reads N·d floats exactly
once: no aggregation that starts from N arrays can be faster), and Flower's
``flwr.server.strategy.aggregate.aggregate`` (the ``bench`` extra; without it that column is
skipped).

Run: ``python benchmarks/bench_aggregate.py``; where ``OPENBLAS_CORETYPE``/``OPENBLAS_L2_SIZE``
are set, ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_aggregate.py``.
Results: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from gradfed_ipfs.tensor.aggregation import Contribution, fedavg

WARM_UP_SECONDS = 0.5
"""Calls before timing: past first-touch page faults and past OpenBLAS's worker threads, which
spin for a while after a multi-threaded call and would take a core from the next contender."""


def best_of(repeat: int, func: Callable[[], object]) -> float:
    """Best wall time of ``repeat`` calls, after ``WARM_UP_SECONDS`` of untimed ones."""
    warm_until = time.perf_counter() + WARM_UP_SECONDS
    func()
    while time.perf_counter() < warm_until:
        func()
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dims", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--peers", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    try:
        from flwr.server.strategy.aggregate import aggregate as flwr_aggregate
    except ImportError:
        flwr_aggregate = None
        print("flwr not installed (pip install -e '.[bench]'): Flower column skipped")

    rng = np.random.default_rng(0)
    header = f"{'d':>11} {'N':>3} {'bound ms':>9} {'ours ms':>8} {'flwr ms':>8} "
    header += f"{'ours/bound':>10} {'flwr/ours':>9} {'max|err|':>9}"
    print(header)
    for d in args.dims:
        for n in args.peers:
            print(run_case(rng, d, n, args.repeat, flwr_aggregate))


def run_case(
    rng: np.random.Generator,
    d: int,
    n: int,
    repeat: int,
    flwr_aggregate: Callable[..., object] | None,
) -> str:
    grads = [rng.standard_normal(d, dtype=np.float32) for _ in range(n)]
    samples = [int(s) for s in rng.integers(10, 1000, size=n)]
    contributions = {
        f"peer-{i:03d}": Contribution(g, s)
        for i, (g, s) in enumerate(zip(grads, samples, strict=True))
    }
    stacked = np.stack(grads)
    w = (np.asarray(samples, dtype=np.float64) / sum(samples)).astype(np.float32)
    contenders: dict[str, Callable[[], object]] = {
        "bound": lambda: w @ stacked,
        "ours": lambda: fedavg(contributions),
    }
    if flwr_aggregate is not None:
        results = [([g], s) for g, s in zip(grads, samples, strict=True)]
        contenders["flwr"] = lambda: flwr_aggregate(results)
    best = {name: best_of(repeat, func) for name, func in contenders.items()}
    t_bound, t_ours = best["bound"], best["ours"]
    error = float(np.max(np.abs(fedavg(contributions) - w @ stacked)))
    flwr_cols, ratio = f"{'-':>8} ", f"{'-':>9}"
    if "flwr" in best:
        flwr_cols, ratio = f"{best['flwr'] * 1e3:8.1f} ", f"{best['flwr'] / t_ours:9.2f}"
    return (
        f"{d:>11,} {n:>3} {t_bound * 1e3:9.1f} {t_ours * 1e3:8.1f} {flwr_cols}"
        f"{t_ours / t_bound:10.2f} {ratio} {error:9.1e}"
    )


if __name__ == "__main__":
    main()
