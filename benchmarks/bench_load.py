"""Load: many peers as asyncio tasks over a few Kubo daemons, FedAvg rounds over pubsub.

Measures round latency, bytes over RPC and bitswap, peak memory and CPU (this process's and
the daemons') when many simulated peers share a few daemons. Each round every peer commits a
seeded gradient with a ``StreamingAccumulator``, announces it (re-published every second, as
``RoundRunner`` does), fetches every other peer's gradient through its own daemon and checks
its aggregate against a float64 reference. Simulated peers share their daemon's pubsub
identity, so ``from`` must be the daemon hosting the announced peer.

``--reduce-scatter N,...`` runs the same peers all-to-all (the baseline) and then
reduce-scatter / all-gather (:class:`~gradfed_ipfs.federated.sliced.peer.ReduceScatterPeer`)
on one swarm, back to back at each N, and prints round time, per-peer bytes and their ratio;
``--chained`` adds a chained round (G = ``chain_groups(N)`` steps per slice); ``--faults``
adds rounds with a silent reducer, a lying reducer, a sender whose chunks vanish and a killed
peer, and prints the extra time over a clean round. The roster and the slice board are in
process; every gradient and slice byte moves through the daemons.
``tests/reliability/test_load.py`` runs a reduced version.

Run::

    python benchmarks/bench_load.py                  # 32 peers, 4 daemons, 5 rounds, d = 1M
    python benchmarks/bench_load.py --scaling        # peers 8/16/32 at 1M, d 1M/4M at 8 peers
    python benchmarks/bench_load.py --reduce-scatter 8,16,32,64 --chained --peer-clients
    python benchmarks/bench_load.py --reduce-scatter 16 --faults --peer-clients --a2a-max 0

(the recorded runs add ``--a2a-max 32 --connections 16``; docs/benchmarks.md has each command).

Every peer shares 2 cores with the daemons, so a round takes about the sum of all CPU over
the cores: read the CPU seconds, not only the times. Results: ``docs/benchmarks.md``.
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
from gradfed_ipfs.formats.agreed.roster import Roster
from gradfed_ipfs.formats.announcement import Announcement
from gradfed_ipfs.kubo.pubsub import KuboPubsub, session_topic
from gradfed_ipfs.kubo.rpc import DEADLINE_GRACE, KuboRpc
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore
from gradfed_ipfs.storage.dag import put_gradient
from gradfed_ipfs.tensor.aggregation import SampleWeightedMean
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
            AccumulatorConfig(aggregation=SampleWeightedMean(), max_peers=peers, timeout=timeout),
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
        board = MemorySliceBoard(members=names)
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
