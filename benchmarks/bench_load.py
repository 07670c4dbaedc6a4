"""Load: many peers as asyncio tasks over a few Kubo daemons, FedAvg rounds over pubsub.

Run: ``python benchmarks/bench_load.py`` (32 peers, 4 daemons, 5 rounds of d = 1M) or
``python benchmarks/bench_load.py --scaling`` (peers 8/16/32 at d = 1M, and d = 1M/4M at 8
peers). Issue 8, scenario 6; ``tests/reliability/test_load.py`` runs a reduced version.

Each round, every peer generates its gradient (seeded), commits it to its daemon with a
``StreamingAccumulator`` (chunked DAG, pinned), and announces the CID on the session topic (an
:class:`~gradfed_ipfs.Announcement`, re-published every second until the round ends, as
``RoundRunner`` does). One subscription per daemon fans the announcements out to that daemon's
peers. Each peer fetches every other peer's gradient through its own daemon (bitswap moves the
blocks between daemons), folds it in as the chunks arrive, and finalizes; its aggregate is
compared with a float64 reference.

Simulated peers share their daemon's pubsub identity, so the receiver's per-peer checks of
``AnnouncementFilter`` (``from`` must equal the announced peer ID) are replaced here by: the
``from`` must be the daemon that hosts the announced peer.

``--reduce-scatter`` (issue 14) runs the same peers both ways on one swarm: all-to-all as
above, then reduce-scatter / all-gather
(:class:`~gradfed_ipfs.federated.sliced.peer.ReduceScatterPeer`: each peer reduces one
chunk-aligned slice of every contribution, then fetches the N slice results), printing the
round time and per-peer downloaded bytes of each and their ratio; ``--faults`` adds one
reduce-scatter round each with a silent reducer, a lying reducer and a sender whose chunks
vanish after commit (detected / recovered, the final CID equal on every honest peer, extra
time). The roster is built in process (its agreement is issue 13's, not timed here) and the
slice board is in process; all gradient and slice bytes move through the daemons. The
contributions are committed as an agreed round commits them (``EncodedGradient.store``: the
chunks in one ``block/put`` call), chunked at :func:`slice_chunk_bytes` (``4·d/N``: slice k is
chunk k). The line also prints the CPU seconds of this process and of the daemons, the load
average, and how many slices a backup reducer redid (takeovers).

``--chained`` adds a chained round (:mod:`~gradfed_ipfs.federated.sliced.chain`: each
slice reduced in G steps along the roster, float64 partial sums passed by CID; G =
``chain_groups(N)``: 1 at N = 8, 2 at 16, 4 at 32, 8 at 64) after the one-level one at each N,
and runs ``--faults`` chained. 2026-12-01 11:47 at 7cad6b8 (idle, load 0.4 rising to 5.3),
``--reduce-scatter 8,16,32,64 --chained --peer-clients --a2a-max 32 --connections 16``:
chained 0.89 (one level) / 1.64 / 4.39 / 8.93 s against one-level 0.94 / 1.94 / 5.71 / 14.12 s
and all-to-all 3.01 / 11.28 / 46.23 s (N = 32: 10.5× all-to-all; N^1.11 from 8 to 64 against
one-level's N^1.30); per-peer 1.75 / 2.13 / 2.26 / 2.26·d·4 B; equal CIDs, equal to the
reference (10:39, before a step fetched its rows during the previous one: 0.86 / 1.99 / 4.26 /
8.01 s). (With G = √N, 10:31: 2.14 / 3.92 / 8.24 s at
N = 16 / 32 / 64, but 2.50·d·4 B at 16. The data path alone, measured with a prototype before
the mode existed: 0.76 / 1.40 / 2.31 / 4.76 s, and at N = 128 9.94 s against one-level
53.56 s.) Chained faults, extra time over the clean chained round: N = 16, G = 2 (11:10, clean
1.72 s): silent +9.95 s (1 takeover), lying +1.02 s (every checker recomputes the lied slice:
G·d values; 4.26·d·4 B per peer), dropped +9.76 s, killed +10.57 s; N = 32, G = 4 (11:11,
clean 4.33 s): +9.38 / +3.66 (6.89·d·4 B) / +8.74 / +10.04 s. Equal CIDs on every honest peer.
The dropped sender cost +29.84 s (N = 16, G = 4, 10:35) until a step stopped waiting for a
sender another step of the phase had reported missing.

Reading the numbers. Every simulated peer is a task of this one process and the 4 daemons share
the machine's 2 cores with it, so a round takes about (this process's CPU + the daemons' CPU)
/ 2; the machine is shared, so CPU seconds are the measure and times move with the load.
Reduce-scatter's per-peer bytes are constant (~2·d·4 B) but its per-peer *counts* grow with N:
a commit is N chunks, a reducer reads N−1 manifests of N links and N−1 chunks, every peer reads
N slice records of N inputs and N−1 slice results: ~4N blocks and ~N² decoded items per peer.

Made cheaper, in order (each found with cProfile of one round at N = 16-64, 2026-11-30):
RPC calls through ``gradfed_ipfs.kubo.http1`` (httpx + httpcore cost 1.3-2.8 ms of CPU a call
and scanned their pool per request), one TLS context, a client per simulated peer
(``--peer-clients``: one client shared by N/4 peers queued ~N²/4 requests); CIDs built and
rendered without multiformats' run-time checks, and remembered; a strict dag-cbor fast path
(``formats/fast_cbor.py``); reducer ranking hashed once per round. Then (branch ``rs-lin``):

- slice projections by ``einsum``, not BLAS: multi-threaded OpenBLAS woke and then spun its
  threads for each of a peer's ~3N small dot products (at N = 64 holding it to one thread cut
  this process's CPU from 30.6 to 21.3 s);
- a reducer decodes only the links of the manifest chunks covering its slice
  (``formats/manifest_window.py``; 64 manifests of 64 links, cold: 86 → 6.6 ms);
- a phase's expected slice inputs are checked once and compared as bytes with each record's
  (``SliceInputs``; 64 records of 64 inputs: 22.6 → 5.5 ms);
- ``json_depth`` scans short texts in Python (NumPy's set-up was ~40 of the ~120 µs of decoding
  one Arrow chunk; ~2N decodes per peer);
- a commit's N chunks go in one ``block/put`` call (``put_many``); a waiting backup reducer
  asks the board's count of filled slices before counting ranked records.

Back to back, ``--reduce-scatter 8,16,32,64 --peer-clients --a2a-max 32 --connections 16``,
2026-11-30, ``main`` at 729a32b ("before") then this branch ("after"), twice; other
developers' work kept the load at 3.6-6.5 (run 1, 19:02-19:07) and raised it from 0.5 to
6.9 during run 2 (19:21-19:26). Reduce-scatter round (this process's CPU + the daemons')::

    N   before, run 1       after, run 1        before, run 2       after, run 2
    8    2.41 s ( 1.7+1.1)   1.42 s ( 1.1+1.4)   1.07 s ( 1.2+0.8)   1.14 s ( 0.9+1.0)
   16    4.94 s ( 3.6+2.2)   2.82 s ( 2.1+2.8)   3.45 s ( 3.2+2.0)   2.66 s ( 1.7+2.2)
   32   16.97 s ( 9.8+5.9)   6.93 s ( 5.0+6.0)  16.41 s (11.6+5.7)  10.10 s ( 4.8+5.8)
   64   36.11 s (29.2+14.5) 17.50 s (13.3+14.4) 33.01 s (27.8+14.3) 21.70 s (13.7+14.2)

Every run: equal CIDs on all peers, equal to the reference, no takeovers, per-peer download
1.76 / 1.89 / 1.98 / 2.12·d·4 B. At N = 64 this process's CPU halved (29.2 → 13.3 and 27.8 →
13.7 s); the daemons' did not change (~14.3 s) and is now half of the total. From N = 8 to 64
the total CPU grew 15.6x / 21x before and 11.1x / 14.7x after (the N = 8 totals are 1.9-2.8 s
and noisy): closer to linear, short of the ~10x aimed at. CPU per simulated peer, after (run
1): ours 0.14 / 0.13 / 0.16 / 0.21 s, the daemons' 0.18 / 0.18 / 0.19 / 0.23 s. All-to-all
at N = 32 took 56.1 and 62.2 s (8.1x and 6.2x reduce-scatter's time). The idle-machine
reference before this work (17:11, load 0.6-3.3) was 1.05 / 2.37 / 6.04 / 20.66 s with 1.1 /
2.6 / 6.5 / 23.6 s of this process's CPU.

What is left is per-block cost, about equal on both sides at N = 64. Ours: ~4N RPC calls per
peer (a ``send`` and an asyncio exchange each, ~0.1-0.25 ms) and ~2N Arrow decodes (~0.2 ms
each). The daemons' (pprof of one daemon during an N = 64 round): ~55 % serving RPC calls, of
which ~20 % is flatfs writing each stored or fetched block as its own file (temp file, write,
fsync, rename), ~8 % bitswap streams; ~2N block writes and ~4N calls per peer. Slice records
inline in board messages (no ``block/get`` of N records per peer) measured within the noise in
a first experiment (N = 64: 13.2 / 12.4 s of this process's CPU without, 13.8 / 11.9 s with).
They are in since 2026-12-01 (with dense blocks by template): 3N - 2 calls per peer; alternated
back to back, N = 32 6.64 / 6.42 s before and 5.43 / 5.73 s after, N = 64 14.53 / 14.48 before
and 14.82 / 14.34 after (the daemons, 15-16 s of CPU, dominate there: a flatfs file create
costs 0.39 ms on this VM's disk). Under retention the keeper stores the records a peer read
from announcements and pins them alone, so every daemon still keeps them. At d = 4M
(``--d 4000000``) the growth is linear: 4.37 / 7.53 / 17.03 / 36.87 s at N = 8..64.

``--reduce-scatter 16 --faults --peer-clients --a2a-max 0`` (19:20, this branch, load 0.5-0.8,
clean round 2.28 s): silent reducer +10.41 s (1 takeover), lying reducer caught +0.67 s,
dropped sender excluded +39.77 s; every final CID equal on the honest peers and to the
reference (17:14, before: +9.67 / +0.12 / +39.3 s). 2026-12-01 08:20 (load 0.8-1.9, clean
2.42 s): +9.80 / -0.17 / +9.05 s: a sender one fetch of a peer failed is now missing from all
that peer's slices at once, and a backup does not wait for a reducer known gone (the dead
sender's slice had cost a reducer timeout, a second fetch timeout and, in the phase that
excludes it, a second reducer timeout). N = 8: +9.94 / -0.07 / +9.64 s. ``killed`` (a peer
stopped once its slice is announced, 09:05, N = 16): +9.91 s (the check's wait for its values
ends ``reducer_timeout`` after the last ones that came; before, it lasted ``fetch_timeout``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np
from multiformats import CID

from gradfed_ipfs.errors import DecodeError
from gradfed_ipfs.federated.accumulate import AccumulatorConfig, StreamingAccumulator
from gradfed_ipfs.federated.exchange.encoded import encode_gradient
from gradfed_ipfs.federated.sliced import Lying, Silent, SliceFaults
from gradfed_ipfs.federated.sliced.peer import (
    MemorySliceBoard,
    ReduceScatterConfig,
    ReduceScatterPeer,
)
from gradfed_ipfs.federated.sliced.plan import chain_groups, reducer_rankings
from gradfed_ipfs.formats.announcement import Announcement
from gradfed_ipfs.formats.roster import Roster
from gradfed_ipfs.kubo.pubsub import KuboPubsub, session_topic
from gradfed_ipfs.kubo.rpc import DEADLINE_GRACE, KuboRpc
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore
from gradfed_ipfs.storage.dag import put_gradient
from gradfed_ipfs.tensor.aggregation import FedAvg
from gradfed_ipfs.tensor.deterministic import deterministic_update

FAULTS: dict[str, Callable[[], SliceFaults]] = {"lying": lambda: Lying(1e-2), "silent": Silent}
"""The reducer faults ``--fault`` injects into one peer (``dropped``: that peer never runs)."""


class Node(Protocol):
    api_url: str
    peer_id: str


@dataclass
class LoadResult:
    """Measurements of one load run."""

    peers: int
    daemons: int
    d: int
    rounds: int
    peer_latencies: list[float] = field(default_factory=list)
    round_seconds: list[float] = field(default_factory=list)
    rpc_bytes: int = 0
    bitswap_bytes: int = 0
    peak_rss_self: int = 0
    peak_rss_daemon: int = 0
    max_error: float = 0.0

    def p(self, q: float) -> float:
        """Quantile ``q`` of the per-peer round latencies (seconds)."""
        return float(np.quantile(self.peer_latencies, q))

    def summary(self) -> str:
        return (
            f"peers={self.peers:>3} daemons={self.daemons} d={self.d:>9,} rounds={self.rounds}  "
            f"latency p50={self.p(0.5):6.2f}s p95={self.p(0.95):6.2f}s "
            f"round(max)={max(self.round_seconds):6.2f}s  "
            f"rpc={self.rpc_bytes / 1e6:8.1f} MB bitswap={self.bitswap_bytes / 1e6:7.1f} MB  "
            f"rss self={self.peak_rss_self / 1e6:6.0f} MB "
            f"daemon={self.peak_rss_daemon / 1e6:5.0f} MB"
            f"  max|err|={self.max_error:.2e}"
        )


def gradient(seed: int, round_id: int, peer: int, d: int) -> np.ndarray:
    return np.random.default_rng([seed, round_id, peer]).standard_normal(d, dtype=np.float32)


def samples_of(peer: int) -> int:
    return 10 + peer


def _bitswap_bytes(node: Node) -> int:
    answer = httpx.post(f"{node.api_url}/api/v0/bitswap/stat", timeout=30).json()
    return int(answer.get("DataReceived", 0))


def _daemon_hwm(node: Any) -> int:
    pid = getattr(node, "pid", None)
    if pid is None:
        return 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


async def run_load(
    nodes: list[Any],
    *,
    peers: int,
    rounds: int,
    d: int,
    session: str,
    seed: int = 0,
    fetch_concurrency: int = 4,
    timeout: float = 600.0,
) -> LoadResult:
    """Run ``rounds`` FedAvg rounds of ``peers`` simulated peers spread over ``nodes``."""
    result = LoadResult(peers, len(nodes), d, rounds)
    topic = session_topic(session)
    host = [i % len(nodes) for i in range(peers)]
    names = [f"peer-{i:03d}" for i in range(peers)]
    stores = [KuboBlockStore(n.api_url, timeout=timeout) for n in nodes]
    pubsubs = [KuboPubsub(n.api_url) for n in nodes]
    queues: list[asyncio.Queue[Announcement]] = [asyncio.Queue() for _ in range(peers)]
    bitswap_before = sum(
        await asyncio.gather(*(asyncio.to_thread(_bitswap_bytes, n) for n in nodes))
    )

    async def fan_out(k: int) -> None:
        heard: set[tuple[str, bytes]] = set()
        async for message in pubsubs[k].subscribe(topic):
            # Announcers re-publish every second: N·daemons decodes per second of byte-identical
            # messages (each parses a CID, ~2 ms) would take a core's share from the round.
            if (message.from_peer, message.data) in heard:
                continue
            heard.add((message.from_peer, message.data))
            try:
                announcement = Announcement.decode(message.data)
            except DecodeError:
                continue
            if announcement.peer_id not in names:
                continue
            if message.from_peer != nodes[host[names.index(announcement.peer_id)]].peer_id:
                continue  # announced peer not hosted by the sending daemon: forged
            for i in range(peers):
                if host[i] == k:
                    queues[i].put_nowait(announcement)

    cluster = _Cluster(
        nodes,
        stores,
        pubsubs,
        queues,
        names,
        host,
        session,
        topic,
        d,
        seed,
        timeout,
        fetch_concurrency,
    )
    readers = [asyncio.create_task(fan_out(k)) for k in range(len(nodes))]
    try:
        for k, pubsub in enumerate(pubsubs):
            deadline = time.monotonic() + 30
            while topic not in await pubsub.topics():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"subscription on daemon {k} did not open")
                await asyncio.sleep(0.05)  # polling against a deadline
        for round_id in range(rounds):
            reference = np.zeros(d, dtype=np.float64)
            for i in range(peers):
                reference += samples_of(i) * gradient(seed, round_id, i, d).astype(np.float64)
            reference /= sum(samples_of(i) for i in range(peers))
            seconds, outcomes = await _round(cluster, round_id)
            result.round_seconds.append(seconds)
            for latency, aggregate in outcomes:
                result.peer_latencies.append(latency)
                result.max_error = max(
                    result.max_error, float(np.max(np.abs(aggregate - reference)))
                )
            for queue in queues:  # re-publications of this round still queued
                while not queue.empty():
                    queue.get_nowait()
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        for store in stores:
            await store.aclose()
        for pubsub in pubsubs:
            await pubsub.aclose()
    bitswap_after = sum(
        await asyncio.gather(*(asyncio.to_thread(_bitswap_bytes, n) for n in nodes))
    )
    result.bitswap_bytes = bitswap_after - bitswap_before
    result.rpc_bytes = cluster.fetched
    result.peak_rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result.peak_rss_daemon = max(_daemon_hwm(n) for n in nodes)
    return result


@dataclass
class _Cluster:
    """What every round of one load run shares."""

    nodes: list[Any]
    stores: list[KuboBlockStore]
    pubsubs: list[KuboPubsub]
    queues: list[asyncio.Queue[Announcement]]
    names: list[str]
    host: list[int]
    session: str
    topic: str
    d: int
    seed: int
    timeout: float
    fetch_concurrency: int
    fetched: int = 0


async def _round(c: _Cluster, round_id: int) -> tuple[float, list[tuple[float, np.ndarray]]]:
    """One round on every peer; return its wall time and each peer's (latency, aggregate)."""
    peers, d, seed, timeout, session, topic = (
        len(c.names),
        c.d,
        c.seed,
        c.timeout,
        c.session,
        c.topic,
    )
    stores, pubsubs, queues, names, host = c.stores, c.pubsubs, c.queues, c.names, c.host
    fetch_concurrency = c.fetch_concurrency
    everyone_done = asyncio.Event()
    announcers: list[asyncio.Task[None]] = []
    started = time.monotonic()

    async def peer(i: int) -> tuple[float, np.ndarray]:
        store = stores[host[i]]
        accumulator = StreamingAccumulator(
            session,
            AccumulatorConfig(aggregation=FedAvg(), max_peers=peers, timeout=timeout),
            local_peer_id=names[i],
        )
        cid = await accumulator.commit_local(
            gradient(seed, round_id, i, d), store, num_samples=samples_of(i)
        )
        mine = Announcement.new(
            session, round_id, names[i], cid, num_samples=samples_of(i), length=d
        ).encode()

        async def announce() -> None:
            while not everyone_done.is_set():
                with contextlib.suppress(Exception):
                    await pubsubs[host[i]].publish(topic, mine)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(everyone_done.wait(), 1.0)

        announcers.append(asyncio.create_task(announce()))
        seen: set[str] = set()
        pending: set[asyncio.Task[None]] = set()
        limit = asyncio.Semaphore(fetch_concurrency)

        async def fold(found: Announcement) -> None:
            async with limit:
                await accumulator.add(
                    found.peer_id, found.cid, store, num_samples=found.num_samples
                )
                c.fetched += 4 * d

        try:
            while len(seen) < peers - 1:
                found = await asyncio.wait_for(queues[i].get(), timeout)
                if found.round != round_id or found.peer_id in (names[i], *seen):
                    continue
                seen.add(found.peer_id)
                pending.add(asyncio.create_task(fold(found)))
            await asyncio.gather(*pending)
            aggregate = accumulator.finalize()
        finally:
            for task in pending:
                task.cancel()
        return time.monotonic() - started, aggregate

    try:
        outcomes = await asyncio.gather(*(peer(i) for i in range(peers)))
    finally:
        everyone_done.set()
        await asyncio.gather(*announcers, return_exceptions=True)
    return time.monotonic() - started, outcomes


@dataclass
class ReduceScatterRun:
    """One reduce-scatter round: wall time, per-peer downloads, outcome."""

    fault: str
    seconds: float
    downloaded: list[int]
    cids_equal: bool
    matches_reference: bool
    missing: tuple[str, ...]
    liars: set[str]
    takeovers: int = 0
    """Slice records announced by a backup reducer (rank ≥ 1): redone work."""
    chunk_bytes: int = 0

    def summary(self, d: int) -> str:
        top = max(self.downloaded)
        return (
            f"  reduce-scatter {self.fault:<8} round={self.seconds:6.2f}s  per-peer download "
            f"max={top / 1e6:6.2f} MB ({top / (4 * d):.2f}·d·4B)  equal CIDs={self.cids_equal} "
            f"= all-to-all model={self.matches_reference}  missing={list(self.missing)} "
            f"liars={sorted(self.liars)} takeovers={self.takeovers}"
        )


def slice_chunk_bytes(d: int, peers: int) -> int:
    """Chunk size (bytes) putting one chunk in each of ``peers`` slices of ``d`` float32 values.

    Per-block costs (an RPC round trip, a CID parsed per manifest entry) dominate the bytes
    once chunks are small: with 64 KiB chunks at d = 1M every manifest lists 66 CIDs whatever
    ``peers`` is. A chunk of ``4·d/peers`` bytes (64 KiB … 1 MiB) makes slice k exactly chunk k.
    """
    per = -(-d // peers)  # values per slice, rounded up
    per = -(-per // 64) * 64  # values_per_chunk is a multiple of 64
    chunk = 4096 + 4 * per  # 4096 = the Arrow framing bound values_per_chunk subtracts
    return min(max(chunk, 65_536), 1 << 20)


async def run_reduce_scatter(
    nodes: list[Any],
    *,
    peers: int,
    d: int,
    seed: int = 0,
    round_id: int = 0,
    fault: str = "none",
    timeout: float = 600.0,
    reducer_timeout: float = 10.0,
    chunk_bytes: int | None = None,
    connections: int = 64,
    peer_clients: bool = False,
    chained: bool = False,
) -> ReduceScatterRun:
    """One reduce-scatter round of ``peers`` simulated peers over ``nodes``; ``fault`` is
    ``none``, ``silent`` (one reducer never answers), ``lying`` (one adds 1e-2 to its slice),
    ``dropped`` (one sender's chunks vanish after its commit) or ``killed`` (one peer stops once
    it has announced its slice, before its check values). Contributions are committed
    with ``chunk_bytes`` (default :func:`slice_chunk_bytes`), at most 16 at once; each daemon's
    client keeps ``connections`` connections (Kubo's RPC clients keep 16 alive and reconnect
    for the others: at 64 peers those reconnections timed out under load). ``peer_clients``
    gives each peer its own RPC client, as separate processes would have: one client shared
    by N/4 peers queues ~N²/4 requests, and httpcore scans that queue on every response.
    ``chained`` runs :mod:`~gradfed_ipfs.federated.sliced.chain` (S = ⌈N/G⌉ slices of
    G steps; the default chunk is then one per slice of S)."""
    groups = chain_groups(peers) if chained else 1
    slices = -(-peers // groups)
    chunk = slice_chunk_bytes(d, slices) if chunk_bytes is None else chunk_bytes
    host = [i % len(nodes) for i in range(peers)]
    names = [f"peer-{i:03d}" for i in range(peers)]
    rpcs = [
        KuboRpc(n.api_url, timeout=timeout + DEADLINE_GRACE, max_connections=connections)
        for n in nodes
    ]
    stores = [
        KuboBlockStore(n.api_url, timeout=timeout, rpc=r) for n, r in zip(nodes, rpcs, strict=True)
    ]
    peer_store = [stores[host[i]] for i in range(peers)]
    if peer_clients:
        own = [
            KuboRpc(nodes[host[i]].api_url, timeout=timeout + DEADLINE_GRACE, max_connections=8)
            for i in range(peers)
        ]
        rpcs += own
        peer_store = [KuboBlockStore(r.api_url, timeout=timeout, rpc=r) for r in own]
    commits = asyncio.Semaphore(16)

    async def commit(i: int) -> CID:
        async with commits:  # as an agreed round commits: the N chunks in one block/put call
            encoded = await encode_gradient(grads[i], chunk_bytes=chunk)
            return await encoded.store(peer_store[i])

    lr = 1.0
    base = np.zeros(d, dtype=np.float32)
    grads = [gradient(seed, round_id, i, d) for i in range(peers)]
    odd = names[peers // 2]
    try:
        started = time.monotonic()
        base_cids = await asyncio.gather(*(put_gradient(s, base) for s in stores))
        cids = await asyncio.gather(*(commit(i) for i in range(peers) if names[i] != odd))
        # The odd sender commits normally, except when it drops: then only its manifest
        # reaches its daemon (it announced the CID and went away before serving its chunks).
        odd_store = MemoryBlockStore() if fault == "dropped" else stores[host[names.index(odd)]]
        odd_cid = await put_gradient(odd_store, grads[names.index(odd)], chunk_bytes=chunk)
        if fault == "dropped":
            await stores[host[names.index(odd)]].put(await odd_store.get(odd_cid))
        cids.insert(names.index(odd), odd_cid)
        entries = {names[i]: (cids[i], samples_of(i)) for i in range(peers)}
        roster = Roster.new(
            f"rs-{seed}", base_cids[0], round_id, base_cids[0], names[0], names, entries
        )
        roster_cid = (await asyncio.gather(*(s.put(roster.to_block(), pin=False) for s in stores)))[
            0
        ]
        config = ReduceScatterConfig(
            chunk_bytes=chunk,
            learning_rate=lr,
            fetch_timeout=10.0 if fault == "dropped" else timeout,
            reducer_timeout=reducer_timeout,
            phase_timeout=timeout,
            chained=chained,
        )
        board = MemorySliceBoard()
        runners = {
            names[i]: ReduceScatterPeer(
                names[i],
                peer_store[i],
                board,
                config,
                faults=(FAULTS[fault]() if names[i] == odd and fault in FAULTS else None),
            )
            for i in range(peers)
            if not (fault == "dropped" and names[i] == odd)
        }
        runs = {
            p: asyncio.ensure_future(r.run(roster, roster_cid, base, grads[names.index(p)]))
            for p, r in runners.items()
        }
        if fault == "killed":  # dead once its slice is announced, before its check values

            def announced() -> bool:
                return any(
                    m.kind in ("slice", "partial") and m.sender == odd for m in board.messages
                )

            await board.wait_for(announced, timeout)
            runs.pop(odd).cancel()
            del runners[odd]
        results = await asyncio.gather(*runs.values())
        seconds = time.monotonic() - started
    finally:
        for rpc in rpcs:
            await rpc.aclose()
    honest = [
        r for p, r in zip(runners, results, strict=True) if not (fault == "lying" and p == odd)
    ]
    used = [i for i in range(peers) if not (fault == "dropped" and names[i] == odd)]
    model = deterministic_update(base, [grads[i] for i in used], [samples_of(i) for i in used], lr)
    want = await put_gradient(MemoryBlockStore(), model)
    # Rank 0 of each slice (one-level) or step (chained: a slice record is step k·G + G−1).
    first = [r[0] for r in reducer_rankings(bytes(roster_cid), slices * groups, names)]
    takeovers = sum(
        1
        for m in board.messages
        if m.phase >= 0
        and (
            (m.kind == "slice" and m.sender != first[m.k * groups + groups - 1])
            or (m.kind == "partial" and m.sender != first[m.k])
        )
    )
    return ReduceScatterRun(
        fault,
        seconds,
        [r.downloaded for r in results],
        len({r.model_cid for r in honest}) == 1,
        honest[0].model_cid == want,
        honest[0].missing,
        honest[0].liars,
        takeovers,
        chunk,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=32)
    parser.add_argument("--daemons", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--d", type=int, default=1_000_000)
    parser.add_argument("--scaling", action="store_true", help="peers 8/16/32, d 1M/4M")
    parser.add_argument(
        "--reduce-scatter",
        type=str,
        default="",
        metavar="N,N,...",
        help="compare all-to-all with reduce-scatter at these peer counts (e.g. 8,16,32,64)",
    )
    parser.add_argument("--faults", action="store_true", help="with --reduce-scatter: faults")
    parser.add_argument(
        "--chained",
        action="store_true",
        help="with --reduce-scatter: also chained rounds (and --faults in chained mode)",
    )
    parser.add_argument(
        "--a2a-max", type=int, default=1 << 30, help="with --reduce-scatter: all-to-all up to N"
    )
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="with --reduce-scatter: block/phase wait"
    )
    parser.add_argument(
        "--reducer-timeout",
        type=float,
        default=30.0,
        help="with --reduce-scatter: seconds before a backup reducer takes over",
    )
    parser.add_argument(
        "--connections", type=int, default=64, help="with --reduce-scatter: RPC connections"
    )
    parser.add_argument(
        "--peer-clients", action="store_true", help="with --reduce-scatter: a client per peer"
    )
    parser.add_argument(
        "--chunk-bytes",
        type=int,
        default=None,
        help="with --reduce-scatter: contributions' chunk size (default 4·d/N, one per slice)",
    )
    args = parser.parse_args()
    from gradfed_ipfs.kubo import KuboSwarm

    if args.reduce_scatter:
        with KuboSwarm(args.daemons) as swarm:
            _compare(list(swarm), [int(n) for n in args.reduce_scatter.split(",")], args)
        return

    runs = [(args.peers, args.d, args.rounds)]
    if args.scaling:
        runs = [(8, 1_000_000, 2), (16, 1_000_000, 2), (32, 1_000_000, 2), (8, 4_000_000, 2)]
    with KuboSwarm(args.daemons) as swarm:
        for n, (peers, d, rounds) in enumerate(runs):
            result = asyncio.run(
                run_load(list(swarm), peers=peers, rounds=rounds, d=d, session=f"load-{n}", seed=n)
            )
            print(result.summary(), flush=True)
            assert result.max_error < 1e-4, result.max_error


def _cpu() -> float:
    """CPU seconds (user + system) of this process: every simulated peer runs in it."""
    t = os.times()
    return t.user + t.system


def _daemon_cpu(nodes: list[Any]) -> float:
    """CPU seconds (user + system) the daemons used so far (``/proc/<pid>/stat``; 0 if unknown)."""
    total = 0
    for node in nodes:
        with contextlib.suppress(OSError, TypeError, IndexError, ValueError):
            fields = Path(f"/proc/{node.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _compare(nodes: list[Any], counts: list[int], args: argparse.Namespace) -> None:
    """Print all-to-all vs reduce-scatter rows (one round each) at each peer count."""
    for n, peers in enumerate(counts):
        load = os.getloadavg()[0]
        a2a_seconds = float("nan")
        a2a_cpu = float("nan")
        if peers <= args.a2a_max:
            cpu = _cpu()
            a2a = asyncio.run(
                run_load(
                    nodes,
                    peers=peers,
                    rounds=1,
                    d=args.d,
                    session=f"a2a-{n}",
                    seed=n,
                    timeout=args.timeout,
                )
            )
            a2a_seconds, a2a_cpu = max(a2a.round_seconds), _cpu() - cpu
            assert a2a.max_error < 1e-4, a2a.max_error
        a2a_bytes = (peers - 1) * 4 * args.d
        print(
            f"peers={peers:>3} d={args.d:,} load={load:4.1f}  all-to-all "
            f"round={a2a_seconds:7.2f}s (cpu {a2a_cpu:6.1f}s) per-peer download="
            f"{a2a_bytes / 1e6:7.1f} MB ({peers - 1}·d·4B)",
            flush=True,
        )
        clean: dict[bool, float] = {}
        for chained in (False, True) if args.chained else (False,):
            cpu, daemons = _cpu(), _daemon_cpu(nodes)
            # Another seed: no block of the all-to-all run is reused.
            rs = asyncio.run(
                run_reduce_scatter(
                    nodes,
                    peers=peers,
                    d=args.d,
                    seed=1000 + n + (500 if chained else 0),
                    timeout=args.timeout,
                    reducer_timeout=args.reducer_timeout,
                    chunk_bytes=args.chunk_bytes,
                    connections=args.connections,
                    peer_clients=args.peer_clients,
                    chained=chained,
                )
            )
            clean[chained] = rs.seconds
            rs_cpu, rs_daemons = _cpu() - cpu, _daemon_cpu(nodes) - daemons
            print(
                f"  {'chained' if chained else 'one-level'} reduce-scatter "
                f"round={rs.seconds:7.2f}s (cpu {rs_cpu:6.1f}s, daemons {rs_daemons:6.1f}s, "
                f"chunk {rs.chunk_bytes:,} B, takeovers {rs.takeovers}) per-peer "
                f"max={max(rs.downloaded) / 1e6:6.2f} MB "
                f"({max(rs.downloaded) / (4 * args.d):.2f}·d·4B)  speed-up over all-to-all "
                f"{a2a_seconds / rs.seconds:4.1f}x  equal CIDs={rs.cids_equal} "
                f"= reference={rs.matches_reference}  load {os.getloadavg()[0]:4.1f}",
                flush=True,
            )
        if args.faults and n == 0:
            # Fresh gradients per run (round_id): equal blocks of an earlier run would still be
            # on the daemons, and a "dropped" sender's chunks would be found there.
            for r, fault in enumerate(("silent", "lying", "dropped", "killed"), start=1):
                run = asyncio.run(
                    run_reduce_scatter(
                        nodes,
                        peers=peers,
                        d=args.d,
                        seed=1000 + n,
                        round_id=r,
                        fault=fault,
                        timeout=args.timeout,
                        chunk_bytes=args.chunk_bytes,
                        chained=args.chained,
                    )
                )
                extra = run.seconds - clean[args.chained]
                print(run.summary(args.d) + f"  extra={extra:+.2f}s", flush=True)


if __name__ == "__main__":
    main()
