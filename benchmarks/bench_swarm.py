"""Large gradients on a loopback swarm: chunked commit/fetch vs bare httpx, and streaming memory.

Starts two connected loopback Kubo daemons, A (owner) and B (fetcher), and measures:

1. **Throughput** (MB/s of float32 payload) for 1M, 10M and 50M floats, on fresh seeded data,
   best of at least two repetitions (five at 1M):

   - ``commit``: :func:`gradfed_ipfs.storage.dag.put_gradient` on A, against a bare httpx
     ``block/put`` loop over chunks of the same sizes encoded before the clock starts;
   - ``fetch``: :func:`gradfed_ipfs.storage.dag.fetch_gradient` on B (manifest, chunks over
     bitswap, re-hash, decode), against a bare httpx ``block/get`` loop on B;
   - ``seq fetch``: the same fetch with one chunk in flight, against the concurrent one.

   Both sides keep 8 chunks in flight, so the ratio measures our overhead.

2. **Peak memory** of aggregating N = 16 peers at d = 10M (FedAvg) from daemon A: the holding
   accumulator against the streaming one, each in its own subprocess, as peak RSS (``VmHWM``)
   over a baseline taken after imports and a warm-up. Goal: streaming <= 1.5 × d × 4 bytes.

Run: ``python benchmarks/bench_swarm.py``. Results: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import httpx
import numpy as np

from gradfed_ipfs.federated.accumulate import (
    AccumulatorConfig,
    DistributedGradientAccumulator,
    StreamingAccumulator,
)
from gradfed_ipfs.formats.arrow import store_gradient_as_arrow
from gradfed_ipfs.kubo import KuboSwarm
from gradfed_ipfs.storage import Block, KuboBlockStore
from gradfed_ipfs.storage.dag import fetch_gradient, plan_chunks, put_gradient

CONCURRENCY = 8


def gradient(n: int, seed: int) -> np.ndarray:
    """Return ``n`` seeded standard-normal float32 values."""
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32)


async def bounded(jobs: list[Callable[[], Awaitable[None]]], limit: int) -> None:
    """Run ``jobs`` with at most ``limit`` in flight."""
    gate = asyncio.Semaphore(limit)

    async def run(job: Callable[[], Awaitable[None]]) -> None:
        async with gate:
            await job()

    await asyncio.gather(*(run(job) for job in jobs))


async def raw_put(client: httpx.AsyncClient, blocks: list[Block]) -> None:
    """Bare ``block/put`` of every block, ``CONCURRENCY`` in flight."""
    params = {"cid-codec": "raw", "mhtype": "sha2-256", "pin": "true"}

    def job(block: Block) -> Callable[[], Awaitable[None]]:
        async def put() -> None:
            response = await client.post(
                "/block/put", params=params, files={"file": ("b", block.data)}
            )
            response.raise_for_status()

        return put

    await bounded([job(b) for b in blocks], CONCURRENCY)


async def raw_get(client: httpx.AsyncClient, blocks: list[Block]) -> None:
    """Bare ``block/get`` of every block, ``CONCURRENCY`` in flight."""

    def job(block: Block) -> Callable[[], Awaitable[None]]:
        async def get() -> None:
            response = await client.post(
                "/block/get", params={"arg": str(block.cid), "timeout": "60s"}
            )
            response.raise_for_status()

        return get

    await bounded([job(b) for b in blocks], CONCURRENCY)


async def measure(
    owner: KuboBlockStore,
    fetcher: KuboBlockStore,
    raw_a: httpx.AsyncClient,
    raw_b: httpx.AsyncClient,
    n: int,
    seed: int,
) -> dict[str, float]:
    """Time one round of every operation on fresh seeded data of ``n`` floats."""
    times = {}
    ours_grad = gradient(n, seed)
    started = time.perf_counter()
    cid = await put_gradient(owner, ours_grad, concurrency=CONCURRENCY)
    times["commit"] = time.perf_counter() - started
    del ours_grad

    raw_grad = gradient(n, seed + 1)
    blocks = [Block.new(store_gradient_as_arrow(raw_grad[o : o + k])) for o, k in plan_chunks(n)]
    del raw_grad
    started = time.perf_counter()
    await raw_put(raw_a, blocks)
    times["raw_put"] = time.perf_counter() - started

    started = time.perf_counter()
    fetched = await fetch_gradient(fetcher, cid, concurrency=CONCURRENCY)
    times["fetch"] = time.perf_counter() - started
    del fetched

    started = time.perf_counter()
    await raw_get(raw_b, blocks)
    times["raw_get"] = time.perf_counter() - started
    del blocks

    seq_cid = await put_gradient(owner, gradient(n, seed + 2), concurrency=CONCURRENCY)
    started = time.perf_counter()
    await fetch_gradient(fetcher, seq_cid, concurrency=1)
    times["seq"] = time.perf_counter() - started
    return times


async def throughput(a_url: str, b_url: str, sizes: list[int]) -> list[str]:
    """Measure commit/fetch throughput; return the table's lines."""
    lines = [
        f"{'floats':>7} {'op':>10} {'ours MB/s':>10} {'base MB/s':>10} {'ratio':>6}  baseline",
    ]
    async with (
        KuboBlockStore(a_url, timeout=60) as owner,
        KuboBlockStore(b_url, timeout=60) as fetcher,
        httpx.AsyncClient(base_url=f"{a_url}/api/v0", timeout=120) as raw_a,
        httpx.AsyncClient(base_url=f"{b_url}/api/v0", timeout=120) as raw_b,
    ):
        # Warm up both paths on both daemons (connections, repo directories, code paths).
        warm = gradient(600_000, 7)
        await fetch_gradient(fetcher, await put_gradient(owner, warm), concurrency=CONCURRENCY)
        negated = -warm  # different bytes, so the bare loop really stores and moves them
        warm_blocks = [
            Block.new(store_gradient_as_arrow(negated[o : o + k])) for o, k in plan_chunks(600_000)
        ]
        await raw_put(raw_a, warm_blocks)
        await raw_get(raw_b, warm_blocks)
        for n in sizes:
            megabytes = 4 * n / 1e6
            label = f"{n // 1_000_000}M"
            repeats = max(2, min(5, 20_000_000 // n))  # best of several: loopback is noisy
            times: dict[str, float] = {}
            for repeat in range(repeats):
                seed = 10 * (n // 1000) + 3 * repeat
                for name, seconds in (await measure(owner, fetcher, raw_a, raw_b, n, seed)).items():
                    times[name] = min(times.get(name, seconds), seconds)
            t_commit, t_raw_put = times["commit"], times["raw_put"]
            t_fetch, t_raw_get, t_seq = times["fetch"], times["raw_get"], times["seq"]
            for op, ours, base, what in (
                ("commit", t_commit, t_raw_put, "bare block/put x8"),
                ("fetch", t_fetch, t_raw_get, "bare block/get x8"),
                ("conc/seq", t_fetch, t_seq, "our fetch, 1 chunk in flight"),
            ):
                lines.append(
                    f"{label:>7} {op:>10} {megabytes / ours:10.1f} {megabytes / base:10.1f} "
                    f"{base / ours:6.2f}  {what}"
                )
            print(lines[-3], lines[-2], lines[-1], sep="\n", flush=True)
    return lines


# --------------------------------------------------------------------------- peak memory


def _status(field: str) -> int:
    """Return a ``/proc/self/status`` field in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> int:
    """Reset the peak-RSS mark (``VmHWM``) to the current RSS; return the current RSS."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    return _status("VmRSS")


async def rss_child(mode: str, api_url: str, cids: list[str], d: int, concurrency: int) -> None:
    """Subprocess body: aggregate ``cids`` with the ``mode`` accumulator; print JSON."""
    local = gradient(d, 999)
    config = AccumulatorConfig(max_peers=len(cids), timeout=120)
    async with KuboBlockStore(api_url, timeout=120) as store:
        # Warm up (connections, pyarrow IPC, dag-cbor, memory pools) before the baseline, so
        # that only the aggregation's own memory is measured.
        warm = await put_gradient(store, gradient(600_000, 1), chunk_bytes=1 << 20)
        await fetch_gradient(store, warm, concurrency=concurrency)
        baseline = _reset_peak()
        started = time.perf_counter()
        if mode == "streaming":
            streaming = StreamingAccumulator("bench", config, concurrency=concurrency)
            await streaming.commit_local(local, store)
            for index, cid in enumerate(cids):
                await streaming.add(f"peer-{index:02d}", cid, store)
            result = streaming.finalize()
        else:
            holding = DistributedGradientAccumulator("bench", config)
            await holding.commit_local(local, store)
            for index, cid in enumerate(cids):
                await holding.add(f"peer-{index:02d}", cid, store)
            result = holding.finalize()
        seconds = time.perf_counter() - started
    peak = _status("VmHWM")
    checksum = float(np.sum(result, dtype=np.float64))
    print(json.dumps({"extra": peak - baseline, "seconds": seconds, "checksum": checksum}))


async def commit_peers(api_url: str, peers: int, d: int) -> list[str]:
    """Commit ``peers`` seeded gradients of length ``d`` to the daemon; return their CIDs."""
    cids = []
    async with KuboBlockStore(api_url, timeout=120) as store:
        for index in range(peers):
            cids.append(str(await put_gradient(store, gradient(d, 5000 + index))))
    return cids


def peak_memory(api_url: str, peers: int, d: int, concurrencies: list[int]) -> list[str]:
    """Run the holding and streaming accumulators in subprocesses; return the table's lines."""
    cids = asyncio.run(commit_peers(api_url, peers, d))
    darray = 4 * d
    lines = [
        f"{'N':>3} {'d':>5} {'mode':>10} {'chunks':>6} {'extra MB':>9} {'x d*4':>6} {'seconds':>8}"
    ]
    runs = [("holding", CONCURRENCY)] + [("streaming", c) for c in concurrencies]
    measured = []
    for mode, concurrency in runs:
        command = [sys.executable, __file__, "--rss-child", mode, "--api", api_url, "--d", str(d)]
        command += ["--stream-concurrency", str(concurrency), "--cids", ",".join(cids)]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        result = json.loads(output.strip().splitlines()[-1])
        measured.append(result)
        extra = result["extra"]
        lines.append(
            f"{peers:>3} {d // 1_000_000:>4}M {mode:>10} {concurrency:>6} {extra / 1e6:9.1f} "
            f"{extra / darray:6.2f} {result['seconds']:8.2f}"
        )
        print(lines[-1], flush=True)
    best = min(m["extra"] for m in measured[1:])
    drift = max(abs(m["checksum"] - measured[0]["checksum"]) for m in measured)
    lines.append(
        f"holding/streaming extra memory: {measured[0]['extra'] / best:.1f}x "
        f"(aggregate checksums agree within {drift:.1e}); goal: streaming <= 1.50 x d*4"
    )
    return lines


def main() -> None:
    """Parse arguments; run the benchmark or, with ``--rss-child``, one measurement."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,10,50", help="millions of floats, comma-separated")
    parser.add_argument("--peers", type=int, default=16, help="N for the memory measurement")
    parser.add_argument("--d", type=int, default=10_000_000, help="d for the memory measurement")
    parser.add_argument(
        "--stream-concurrency",
        default="8,4,2",
        help="chunks in flight for the streaming runs, comma-separated",
    )
    parser.add_argument("--rss-child", choices=["holding", "streaming"], help=argparse.SUPPRESS)
    parser.add_argument("--api", help=argparse.SUPPRESS)
    parser.add_argument("--cids", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        cids = args.cids.split(",")
        concurrency = int(args.stream_concurrency)
        asyncio.run(rss_child(args.rss_child, args.api, cids, args.d, concurrency))
        return
    sizes = [int(float(s) * 1_000_000) for s in args.sizes.split(",")]
    with KuboSwarm(2) as swarm:
        a, b = swarm[0], swarm[1]
        print(f"daemons: A {a.api_url}  B {b.api_url}  (cpus: {os.cpu_count()})", flush=True)
        table = asyncio.run(throughput(a.api_url, b.api_url, sizes))
        table += [
            "",
            *peak_memory(
                a.api_url, args.peers, args.d, [int(c) for c in args.stream_concurrency.split(",")]
            ),
        ]
    print("\n" + "\n".join(table))


if __name__ == "__main__":
    main()
