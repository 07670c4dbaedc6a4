"""Commit and fetch through ``KuboBlockStore`` vs a bare httpx ``block/put``/``block/get`` loop.

Measures, on one loopback Kubo daemon started here and for block sizes 256 KiB … 2 MiB, the
throughput (MB/s) of ``KuboBlockStore.put`` (hash, size check, CID check, pin) and
``KuboBlockStore.get`` (timeout, re-hash against the CID).

Baseline: a bare multipart POST loop on the same daemon with its own ``httpx.AsyncClient``, on
fresh random blocks of the same sizes; ``ours/raw`` is 1.0 when we add nothing.

Run: ``python benchmarks/bench_kubo.py``. Results: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import httpx

from gradfed_ipfs.kubo import KuboDaemon
from gradfed_ipfs.storage import Block, KuboBlockStore

SIZES = [256 * 1024, 512 * 1024, 1024 * 1024, 2 * 1024 * 1024]


async def bench(api_url: str, count: int) -> None:
    print(f"{'block':>8} {'op':>4} {'ours MB/s':>10} {'raw MB/s':>9} {'ours/raw':>9}")
    async with (
        KuboBlockStore(api_url, timeout=30) as store,
        httpx.AsyncClient(base_url=f"{api_url}/api/v0", timeout=60) as raw,
    ):
        for size in SIZES:
            ours_blocks = [Block.new(os.urandom(size)) for _ in range(count)]
            raw_blocks = [Block.new(os.urandom(size)) for _ in range(count)]
            params = {"cid-codec": "raw", "mhtype": "sha2-256", "pin": "true"}

            started = time.perf_counter()
            for block in ours_blocks:
                await store.put(block)
            t_ours_put = time.perf_counter() - started

            started = time.perf_counter()
            for block in raw_blocks:
                response = await raw.post(
                    "/block/put", params=params, files={"file": ("b", block.data)}
                )
                response.raise_for_status()
            t_raw_put = time.perf_counter() - started

            started = time.perf_counter()
            for block in ours_blocks:
                await store.get(block.cid)
            t_ours_get = time.perf_counter() - started

            started = time.perf_counter()
            for block in raw_blocks:
                response = await raw.post(
                    "/block/get", params={"arg": str(block.cid), "timeout": "30s"}
                )
                response.raise_for_status()
            t_raw_get = time.perf_counter() - started

            megabytes = size * count / 1e6
            for op, ours, bare in (("put", t_ours_put, t_raw_put), ("get", t_ours_get, t_raw_get)):
                print(
                    f"{size // 1024:>6}Ki {op:>4} {megabytes / ours:10.1f} {megabytes / bare:9.1f} "
                    f"{bare / ours:9.2f}"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=40, help="blocks per size and side")
    args = parser.parse_args()
    with KuboDaemon() as daemon:
        asyncio.run(bench(daemon.api_url, args.count))


if __name__ == "__main__":
    main()
