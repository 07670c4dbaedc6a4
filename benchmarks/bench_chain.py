"""Chained reduce-scatter's data path against the one-level reduce-scatter, one swarm (issue 14).

An experiment, not a product mode: it measures whether the design planned to make reduce-scatter
rounds grow linearly in N at d = 1M does so on this machine, before building it with records,
checks and takeovers. It has none of those: no faults, no checks, an in-process board.

The one-level reduce-scatter (``ReduceScatterPeer``, ``bench_load.py --reduce-scatter``) cuts
d into N slices and has each of N reducers read its slice from each of N senders: N² blocks of
d/N values to put, fetch and store on the daemons, and N² more in the all-gather. At d = 1M that
per-block cost, not the bytes, is what grows (``bench_load.py``'s docstring: N^1.3-1.4).

Chained: the roster is cut into G groups of g = N/G consecutive senders and d into S = N/G
slices (S·G = N tasks, one per peer, G ≈ √N). Task (k, j) reads slice k of group j's g senders,
adds them in roster order to the float64 partial sum that task (k, j−1) left
(:func:`~gradfed_ipfs.tensor.deterministic.partial_update`; a raw block of 8·d/S bytes), and
puts its own; task (k, G−1) finishes the slice (``finish_update``: ``float32(base + lr·acc)``).
Every peer then fetches the S slice results. Blocks: N·S pieces and N·S results, N^1.5 at
G = √N, instead of 2·N²; bytes per peer: d (pieces) + 2·d/S (the float64 partial) + d (results);
the model is bit-identical to ``deterministic_update`` (the same float64 operations in roster
order: checked here on every peer). Median and trimmed mean cannot be chained (they need every
sender's value of a coordinate in one place).

    python -m benchmarks.bench_chain                 # N = 8, 16, 32, 64; d = 1M; 4 daemons

(A partial sum is one raw block here, so 8·d/S must stay within Kubo's 2 MiB: d ≤ S·262,144.)

Both modes run back to back at each N on the same 4 loopback daemons, every simulated peer a
task of this process with its own RPC client (``--peer-clients`` of ``bench_load.py``), with
fresh gradients per run. "cpu" is this process's CPU, "daemons" the daemons'; "max" the largest
per-peer download over d·4 B.

Idle 2-core VM, 2026-12-01 08:34 (load 3.1 from the run before, rising to 11.6 during the
N = 64 runs), seconds::

    N   G  S   chained round (cpu, daemons)   max     one-level round (cpu, daemons)   max
    8   2  4    0.76 (0.5, 0.9)               2.50     1.01 (0.7,  1.2)               1.75
   16   4  4    1.40 (0.9, 1.5)               2.50     2.14 (1.3,  2.6)               1.89
   32   4  8    2.31 (1.5, 2.9)               2.26     4.63 (2.8,  5.9)               1.97
   64   8  8    4.76 (2.9, 6.6)               2.26    13.44 (9.5, 14.1)               2.07

Chained grows x1.8, x1.7, x2.1 per doubling (6.3x from 8 to 64 peers: linear) where one-level
grows x2.1, x2.2, x2.9 (13.3x); at N = 64 it is 2.8x faster (a first run, 08:31: 0.66 / 1.33 /
2.10 / 5.33 s against 0.88 / 1.77 / 5.22 / 15.74, 3.0x). Every model was bit-identical to
``deterministic_update``. Per-peer bytes stay within 2.5·d·4 B (the partial is float64: 2·d/S
more). Its latency has G sequential steps per slice.

``--peers 64,128`` (09:01, load 0.6 rising to 6.2): N = 64 5.75 s against 14.88 s; N = 128
(G = 8, S = 16) 9.94 s (1.7x N = 64's, per-peer 2.14·d·4 B) against 53.56 s (3.6x), where the
one-level mode also read 5.12·d·4 B per peer: its slices of d/128 values are smaller than the
64 KiB minimum chunk, so each reducer reads whole chunks for half-chunk slices.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import numpy as np
from multiformats import CID

from benchmarks.bench_load import (
    _cpu,
    _daemon_cpu,
    gradient,
    run_reduce_scatter,
    samples_of,
    slice_chunk_bytes,
)
from gradfed_ipfs.block import Block
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.federated.round.encoded import encode_gradient
from gradfed_ipfs.federated.round.slice_io import CountingStore, fetch_range
from gradfed_ipfs.federated.round.slices import plan_slices
from gradfed_ipfs.kubo.rpc import DEADLINE_GRACE, KuboRpc
from gradfed_ipfs.storage import KuboBlockStore, put_gradient
from gradfed_ipfs.storage.dag import fetch_gradient
from gradfed_ipfs.tensor.deterministic import (
    deterministic_update,
    finish_update,
    partial_update,
    update_coefficients,
)

GROUPS = {8: 2, 16: 4, 32: 4, 64: 8, 128: 8}
"""G per N: about √N, with S = N/G slices."""


async def run_chained(
    nodes: list[Any], *, peers: int, groups: int, d: int, seed: int, timeout: float = 600.0
) -> tuple[float, int, bool]:
    """One chained round; returns (seconds, largest per-peer download, bit-identical)."""
    slices = peers // groups
    if slices * groups != peers:
        raise ValueError(f"{groups} groups do not divide {peers} peers")
    size = peers // groups  # senders per group (= slices)
    chunk = slice_chunk_bytes(d, slices)
    plan = plan_slices(d, slices, chunk)  # chunk-aligned: up to d = 1M, slice k is chunk k
    rpcs = [
        KuboRpc(nodes[i % len(nodes)].api_url, timeout=timeout + DEADLINE_GRACE, max_connections=8)
        for i in range(peers)
    ]
    stores = [CountingStore(KuboBlockStore(r.api_url, timeout=timeout, rpc=r)) for r in rpcs]
    grads = [gradient(seed, 0, i, d) for i in range(peers)]
    weights = [samples_of(i) for i in range(peers)]
    coefficients = update_coefficients(weights)
    base = np.zeros(d, np.float32)
    learning_rate = 1.0
    loop = asyncio.get_running_loop()
    done: dict[tuple[int, int], asyncio.Future[CID]] = {
        (k, j): loop.create_future() for k in range(slices) for j in range(groups)
    }
    commits = asyncio.Semaphore(16)

    async def commit(i: int) -> CID:
        async with commits:
            return await (await encode_gradient(grads[i], chunk_bytes=chunk)).store(stores[i])

    async def reduce(peer: int, cids: list[CID]) -> None:
        k, j = divmod(peer, groups)
        offset, length = plan[k]
        store = stores[peer]
        senders = range(j * size, (j + 1) * size)

        async def row(i: int) -> np.ndarray:
            if i == peer:
                return grads[i][offset : offset + length]
            return await fetch_range(store, cids[i], offset, length, d)

        rows = await asyncio.gather(*(row(i) for i in senders))
        partial = None
        if j:
            block = await store.get(await done[(k, j - 1)])
            partial = np.frombuffer(block.data, np.float64)
        acc = partial_update(partial, rows, coefficients[senders.start : senders.stop])
        if j < groups - 1:
            data = acc.tobytes()
            block = Block.from_parts(make_cid(data), data)
            await store.put(block, pin=False)
            done[(k, j)].set_result(block.cid)
            return
        result = finish_update(acc, base[offset : offset + length], learning_rate)
        done[(k, j)].set_result(await put_gradient(store, result, chunk_bytes=1 << 21))

    async def peer_round(peer: int, cids: list[CID]) -> np.ndarray:
        await reduce(peer, cids)
        results = [await done[(k, groups - 1)] for k in range(slices)]
        parts = await asyncio.gather(*(fetch_gradient(stores[peer], c) for c in results))
        return np.concatenate([np.asarray(p, np.float32).reshape(-1) for p in parts])

    try:
        started = time.monotonic()
        cids = list(await asyncio.gather(*(commit(i) for i in range(peers))))
        models = await asyncio.gather(*(peer_round(p, cids) for p in range(peers)))
        seconds = time.monotonic() - started
    finally:
        for rpc in rpcs:
            await rpc.aclose()
    want = deterministic_update(base, grads, weights, learning_rate).tobytes()
    return seconds, max(s.downloaded for s in stores), all(m.tobytes() == want for m in models)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=str, default="8,16,32,64", help="N,N,... (8..128)")
    parser.add_argument("--d", type=int, default=1_000_000)
    parser.add_argument("--daemons", type=int, default=4)
    args = parser.parse_args()
    from gradfed_ipfs.kubo import KuboSwarm

    with KuboSwarm(args.daemons) as swarm:
        nodes = list(swarm)
        for n, peers in enumerate(int(p) for p in args.peers.split(",")):
            groups = GROUPS[peers]
            cpu, daemons = _cpu(), _daemon_cpu(nodes)
            seconds, top, same = asyncio.run(
                run_chained(nodes, peers=peers, groups=groups, d=args.d, seed=5000 + n)
            )
            chained = (seconds, _cpu() - cpu, _daemon_cpu(nodes) - daemons, top)
            cpu, daemons = _cpu(), _daemon_cpu(nodes)
            one = asyncio.run(
                run_reduce_scatter(
                    nodes, peers=peers, d=args.d, seed=7000 + n, peer_clients=True, connections=16
                )
            )
            level = (one.seconds, _cpu() - cpu, _daemon_cpu(nodes) - daemons, max(one.downloaded))
            print(
                f"N={peers:3} G={groups} S={peers // groups}  chained {chained[0]:6.2f}s "
                f"(cpu {chained[1]:5.1f}, daemons {chained[2]:5.1f}) max "
                f"{chained[3] / (4 * args.d):.2f}  bit-identical={same}  |  one-level "
                f"{level[0]:6.2f}s (cpu {level[1]:5.1f}, daemons {level[2]:5.1f}) max "
                f"{level[3] / (4 * args.d):.2f}  reference={one.matches_reference}  "
                f"ratio {level[0] / chained[0]:.1f}x  load {os.getloadavg()[0]:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
