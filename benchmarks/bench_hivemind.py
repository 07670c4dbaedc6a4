"""Side by side: hivemind's ``DecentralizedAverager`` all-reduce against our agreed chained round.

Both sides average N seeded gradients of d float32 values (weights ``1 + i % 7``) on this
machine, over loopback:

- **hivemind** (optional dependency, ``pip install -e '.[bench-hivemind]'``; not in CI): N
  ``hivemind.DHT`` processes, each with its own ``p2pd`` listening on 127.0.0.1 only (the first
  one's visible multiaddrs are the others' ``initial_peers``; no public bootstrap), and N
  ``DecentralizedAverager`` processes with ``target_group_size = min_group_size = N``. A step
  runs with ``require_trigger``: the time to form the group (matchmaking) and the all-reduce's
  own time are measured apart; ``total`` is their sum.
- **ours**: an :class:`~gradfed_ipfs.federated.agreed.AgreedSession` per member,
  ``aggregation="reduce-scatter"``, ``chained=True``, over real Kubo daemons (one per member by
  default; ``--daemons K`` hosts N / K members on each of K daemons). The round includes the
  roster agreement, the checks of every slice and the agreement on one record CID (``one CID``
  when every member ended on the same record).

Printed per N: wall time of a round (the slowest member's), CPU seconds of every process of
that side over the round (this process, the daemons, hivemind's DHT / averager / p2pd
processes), bytes received per peer over the peer-to-peer TCP connections (``ss -ti``
``bytes_received`` of the daemons' sockets, RPC sockets excluded), peak RSS, and the ratio
ours / hivemind. ``--rounds`` rounds run on each side after one unmeasured warm-up round; the
median is printed.

Members hosted on a shared daemon (``--daemons K < N``) each have their own Ed25519 identity
(:class:`~gradfed_ipfs.formats.statement.LocalSigner`): :class:`HostedPubsub` prefixes what a
member publishes with its name, and a receiver accepts a name only from the daemon that hosts
it (the daemon authenticates the envelope; the session sees the member's name as ``from``).

Run::

    python benchmarks/bench_hivemind.py                          # N = 8, 16, 32, d = 1M
    python benchmarks/bench_hivemind.py --peers 16 --profile /tmp/ours.prof --sides ours
    python benchmarks/bench_hivemind.py --peers 256 --daemons 8 --sides ours --rounds 2

Results: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import hashlib
import itertools
import logging
import os
import pstats
import re
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_load import gradient

from gradfed_ipfs.federated.agreed import AgreedConfig, AgreedSession
from gradfed_ipfs.formats import PubsubMessage
from gradfed_ipfs.formats.statement import PEER_ID_KEYS, KeyBook, LocalSigner, Signer
from gradfed_ipfs.kubo import KuboPubsub, KuboSwarm, PubsubTransport
from gradfed_ipfs.storage import KuboBlockStore

TICK = os.sysconf("SC_CLK_TCK")


def weight_of(i: int) -> int:
    return 1 + i % 7


def reference(seed: int, round_id: int, n: int, d: int) -> np.ndarray:
    """The weighted mean of the N gradients of round ``round_id`` (float64)."""
    total = np.zeros(d, dtype=np.float64)
    for i in range(n):
        total += weight_of(i) * gradient(seed, round_id, i, d).astype(np.float64)
    return total / sum(weight_of(i) for i in range(n))


# --------------------------------------------------------------------------- measurement


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    tree, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(tree.get(pid, []))
    return out


def cpu_of(pids: list[int]) -> float:
    """CPU seconds (user + system) the live processes ``pids`` used so far."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def pss_of(pids: list[int]) -> int:
    """Sum of the proportional set sizes of ``pids`` (bytes: shared pages split, not counted
    once per process)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
    return total


_SOCKET = re.compile(r"^\d+\s+\d+\s+(\S+):(\d+)\s+(\S+):(\d+)\s+users:\(\(.*?pid=(\d+)")
_RECEIVED = re.compile(r"bytes_received:(\d+)")


def tcp_received(pids: set[int], skip_ports: set[int]) -> dict[tuple[str, ...], int]:
    """``bytes_received`` of every established TCP socket of ``pids`` whose local port is not
    in ``skip_ports`` (the RPC servers'), keyed by (local, peer) address."""
    out = subprocess.run(
        ["ss", "-tinpH", "state", "established"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    sockets: dict[tuple[str, ...], int] = {}
    for line, info in itertools.pairwise(out):
        head = _SOCKET.match(line.strip()) if not line.startswith("\t") else None
        if head is None or int(head[5]) not in pids or int(head[2]) in skip_ports:
            continue
        got = _RECEIVED.search(info)
        sockets[(head[1], head[2], head[3], head[4])] = int(got[1]) if got else 0
    return sockets


def received_between(before: dict[tuple[str, ...], int], after: dict[tuple[str, ...], int]) -> int:
    """Bytes received between two :func:`tcp_received` snapshots (sockets closed in between
    are lost: both sides keep their connections open)."""
    return sum(v - before.get(k, 0) for k, v in after.items())


@dataclass
class Row:
    """One side at one N: medians over the measured rounds."""

    side: str
    n: int
    daemons: int
    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    cpu_self: list[float] = field(default_factory=list)
    received: list[int] = field(default_factory=list)
    matchmaking: list[float] = field(default_factory=list)
    rss: int = 0
    max_error: float = 0.0
    records: list[int] = field(default_factory=list)
    note: str = ""

    @property
    def time(self) -> float:
        return statistics.median(self.seconds)

    def line(self) -> str:
        mm = (
            f" (matchmaking {statistics.median(self.matchmaking):5.2f} s + all-reduce "
            f"{self.time - statistics.median(self.matchmaking):5.2f} s)"
            if self.matchmaking
            else ""
        )
        cids = f" records={self.records}" if self.records else ""
        return (
            f"{self.side:>8} N={self.n:>3} daemons={self.daemons:>3} "
            f"time={self.time:6.2f} s{mm} cpu={statistics.median(self.cpu):6.1f} s "
            f"(this process {statistics.median(self.cpu_self):5.1f} s) "
            f"recv/peer={statistics.median(self.received) / self.n / 1e6:6.1f} MB "
            f"pss={self.rss / 2**30:5.2f} GiB max|err|={self.max_error:.1e}{cids} {self.note}"
        )


# --------------------------------------------------------------------------- hivemind


def run_hivemind(n: int, d: int, rounds: int, seed: int, matchmaking: float) -> Row:
    """N DHTs + N averagers on 127.0.0.1; ``rounds`` measured steps after a warm-up."""
    import hivemind  # optional dependency
    import torch
    from hivemind.averaging.control import AveragingStage

    row = Row("hivemind", n, n)
    first = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    peers = [str(a) for a in first.get_visible_maddrs()]
    assert all("/127.0.0.1/" in a for a in peers), peers
    dhts = [first] + [
        hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=peers)
        for _ in range(n - 1)
    ]
    averagers = [
        hivemind.averaging.DecentralizedAverager(
            [torch.zeros(d)],
            dht,
            start=True,
            prefix="bench",
            target_group_size=n,
            min_group_size=n,
            min_matchmaking_time=matchmaking,
        )
        for dht in dhts
    ]
    try:
        for r in range(rounds + 1):
            for i, averager in enumerate(averagers):
                with averager.get_tensors() as tensors:
                    tensors[0][:] = torch.from_numpy(gradient(seed, r, i, d))
            pids = process_tree(os.getpid())
            p2p = {p for p in pids if _name(p) == "p2pd"}
            sockets, cpu, started = tcp_received(p2p, set()), cpu_of(pids), time.monotonic()
            cpu_self = cpu_of([os.getpid()])
            steps = [
                a.step(wait=False, require_trigger=True, weight=float(weight_of(i)), timeout=600)
                for i, a in enumerate(averagers)
            ]
            deadline = started + 600
            while any(s.stage != AveragingStage.AWAITING_TRIGGER for s in steps):
                if time.monotonic() > deadline or any(s.done() for s in steps):
                    waiting = sum(s.stage != AveragingStage.AWAITING_TRIGGER for s in steps)
                    raise RuntimeError(
                        f"no group of {n} formed in {time.monotonic() - started:.0f} s "
                        f"({waiting} averagers still matchmaking)"
                    )
                time.sleep(0.01)  # polling against a deadline
            formed = time.monotonic()
            for s in steps:
                s.allow_allreduce()
            for s in steps:
                s.result(timeout=600)
            seconds = time.monotonic() - started
            if r == 0:
                continue  # the warm-up round: connections open, first allocations
            row.seconds.append(seconds)
            row.matchmaking.append(formed - started)
            row.cpu.append(cpu_of(pids) - cpu)
            row.cpu_self.append(cpu_of([os.getpid()]) - cpu_self)
            row.received.append(received_between(sockets, tcp_received(p2p, set())))
            row.rss = max(row.rss, pss_of(pids))
            want = reference(seed, r, n, d)
            for averager in averagers:
                with averager.get_tensors() as tensors:
                    error = float(np.max(np.abs(tensors[0].numpy() - want)))
                row.max_error = max(row.max_error, error)
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in dhts:
            dht.shutdown()
    return row


def _name(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text().strip()
    return ""


# --------------------------------------------------------------------------- ours


class HostedPubsub:
    """One member hosted on a shared daemon, with its own name and key.

    What it publishes goes out as ``len(name) (1 byte) | name | data`` through the daemon's
    :class:`KuboPubsub`; a received envelope is accepted only if the daemon that sent it hosts
    the name it carries (``hosts``: member name -> daemon peer ID), and reaches the member with
    that name as ``from``. One subscription per daemon and topic feeds every member on it.
    """

    def __init__(self, hub: Hub, signer: LocalSigner) -> None:
        self.hub, self._signer = hub, signer
        self.name = signer.peer_id
        self._prefix = bytes([len(self.name)]) + self.name.encode()

    async def local_peer_id(self) -> str:
        return self.name

    async def signer(self) -> Signer:
        return self._signer

    @property
    def keys(self) -> KeyBook:
        return PEER_ID_KEYS  # the names are Ed25519 peer IDs

    async def publish(self, topic: str, data: bytes) -> None:
        await self.hub.pubsub.publish(topic, self._prefix + data)

    def subscribe(self, topic: str) -> AsyncIterator[PubsubMessage]:
        return self.hub.subscribe(topic)

    async def peers(self, topic: str) -> list[str]:
        return [p for p, host in self.hub.hosts.items() if host in await self.hub.peers(topic)]

    async def aclose(self) -> None:
        return None


class Hub:
    """A daemon's pubsub shared by the members it hosts: one stream per topic, fanned out."""

    def __init__(self, pubsub: KuboPubsub, hosts: dict[str, str], own: str) -> None:
        self.pubsub, self.hosts, self.own = pubsub, hosts, own
        self._queues: dict[str, list[asyncio.Queue[PubsubMessage]]] = {}
        self._readers: list[asyncio.Task[None]] = []

    async def peers(self, topic: str) -> list[str]:
        return [*await self.pubsub.peers(topic), self.own]

    async def subscribe(self, topic: str) -> AsyncIterator[PubsubMessage]:
        queue: asyncio.Queue[PubsubMessage] = asyncio.Queue()
        if topic not in self._queues:
            self._queues[topic] = []
            self._readers.append(asyncio.create_task(self._read(topic)))
        self._queues[topic].append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._queues[topic].remove(queue)

    async def _read(self, topic: str) -> None:
        async for message in self.pubsub.subscribe(topic):
            data = message.data
            name = data[1 : 1 + data[0]].decode(errors="replace") if data else ""
            if self.hosts.get(name) != message.from_peer:
                continue  # a name this daemon does not host: forged
            inner = PubsubMessage(name, data[1 + data[0] :], message.seqno, message.topics)
            for queue in self._queues[topic]:
                queue.put_nowait(inner)

    async def aclose(self) -> None:
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        await self.pubsub.aclose()


def agreed_config(
    members: tuple[str, ...], n: int, chunk_bytes: int, announce: float
) -> AgreedConfig:
    """Every member required; timeouts loose enough for a shared 2-core machine."""
    scale = max(1.0, n / 32)
    return AgreedConfig(
        members=members,
        min_peers=n,
        aggregation="reduce-scatter",
        chained=True,
        collect_timeout=10.0 * scale,
        takeover_timeout=10.0 * scale,
        round_timeout=600.0 * scale,
        fetch_timeout=60.0 * scale,
        reducer_timeout=20.0 * scale,
        announce_interval=announce * scale,
        max_announce_interval=4 * announce * scale,
        chunk_bytes=chunk_bytes,
        learning_rate=1.0,
    )


@contextlib.contextmanager
def _profiled(path: str) -> Iterator[None]:
    if not path:
        yield
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        profiler.dump_stats(path)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


async def _transports(
    swarm: list[Any], n: int
) -> tuple[list[PubsubTransport], list[KuboBlockStore], list[Hub], tuple[str, ...]]:
    """One KuboPubsub per member if N = daemons, else :class:`HostedPubsub` members."""
    k = len(swarm)
    stores = [KuboBlockStore(node.api_url, timeout=120.0) for node in swarm]
    if k == n:
        pubsubs: list[PubsubTransport] = [KuboPubsub(node.api_url) for node in swarm]
        return pubsubs, stores, [], tuple(node.peer_id for node in swarm)
    signers = [
        LocalSigner.from_seed(hashlib.sha256(f"bench-member-{i}".encode()).digest())
        for i in range(n)
    ]
    hosts = {s.peer_id: swarm[i % k].peer_id for i, s in enumerate(signers)}
    hubs = [Hub(KuboPubsub(node.api_url), hosts, node.peer_id) for node in swarm]
    hosted: list[PubsubTransport] = [HostedPubsub(hubs[i % k], s) for i, s in enumerate(signers)]
    return hosted, [stores[i % k] for i in range(n)], hubs, tuple(s.peer_id for s in signers)


async def run_ours(swarm: list[Any], n: int, args: argparse.Namespace) -> Row:
    """N agreed members over ``swarm``; ``args.rounds`` measured rounds after a warm-up."""
    d, seed = args.d, args.seed
    row = Row("ours", n, len(swarm))
    pubsubs, stores, hubs, members = await _transports(swarm, n)
    config = agreed_config(members, n, args.chunk_bytes, args.announce)
    model = np.zeros(d, dtype=np.float32)
    genesis = await AgreedSession.commit_genesis(stores[0], model)
    sessions = [
        AgreedSession(stores[i], pubsubs[i], f"hm-{n}-{len(swarm)}", genesis, config)
        for i in range(n)
    ]
    daemon_pids = {node.pid for node in swarm}
    rpc_ports = {int(node.api_url.rsplit(":", 1)[1]) for node in swarm}
    try:
        await asyncio.gather(*(s.start(model) for s in sessions))
        for r in range(max(1, args.rounds + (args.rounds > 0))):
            pids = [os.getpid(), *daemon_pids]
            sockets = tcp_received(daemon_pids, rpc_ports)
            before = sessions[0].model.astype(np.float64)
            grads = [gradient(seed, r, i, d) for i in range(n)]  # made before the clock starts
            cpu, cpu_self, started = cpu_of(pids), cpu_of(pids[:1]), time.monotonic()
            with _profiled(args.profile if r == 1 else ""):
                results = await asyncio.gather(
                    *(s.run_round(grads[i], weight=weight_of(i)) for i, s in enumerate(sessions))
                )
            del grads
            seconds = time.monotonic() - started
            row.records.append(len({bytes(res.record) for res in results}))
            print(f"  ours N={n} round {r}: {seconds:.2f} s, records={row.records[-1]}", flush=True)
            if r == 0 and args.rounds:
                row.records.clear()
                continue  # the warm-up round (none with --rounds 0: the first is measured)
            row.seconds.append(seconds)
            row.cpu.append(cpu_of(pids) - cpu)
            row.cpu_self.append(cpu_of(pids[:1]) - cpu_self)
            row.received.append(received_between(sockets, tcp_received(daemon_pids, rpc_ports)))
            row.rss = max(row.rss, pss_of(pids))
            _check(row, sessions, before + reference(seed, r, n, d))
    finally:
        for session in sessions:
            await session.aclose()
        for pubsub in pubsubs:
            await pubsub.aclose()
        for hub in hubs:
            await hub.aclose()
        for store in set(stores):
            await store.aclose()
    return row


def _check(row: Row, sessions: list[AgreedSession], want: np.ndarray) -> None:
    """Members applied the weighted mean (learning rate 1, from the previous model)."""
    for session in sessions[:4]:  # the models are equal when the records are: check a few
        row.max_error = max(row.max_error, float(np.max(np.abs(session.model - want))))


def ours_in_swarm(n: int, daemons: int, args: argparse.Namespace) -> Row:
    with KuboSwarm(daemons) as swarm:
        return asyncio.run(run_ours(list(swarm), n, args))


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=str, default="8,16,32", metavar="N,N,...")
    parser.add_argument("--d", type=int, default=1_000_000)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measured rounds after one warm-up (ours, 0: one round, measured, no warm-up)",
    )
    parser.add_argument("--daemons", type=int, default=0, help="Kubo daemons (0: one per peer)")
    parser.add_argument("--sides", type=str, default="hivemind,ours")
    parser.add_argument("--chunk-bytes", type=int, default=262_144)  # see docs: 1 MiB doubles bytes
    parser.add_argument("--matchmaking", type=float, default=5.0, help="min_matchmaking_time")
    parser.add_argument(
        "--announce", type=float, default=0.25, help="first re-announce interval (s, at N <= 32)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", type=str, default="", help="cProfile ours' first round")
    parser.add_argument("--log", type=str, default="", help="log gradfed_ipfs at this level")
    args = parser.parse_args()
    if args.log:
        logging.basicConfig(level=logging.WARNING, format="%(relativeCreated)9.0f %(message)s")
        logging.getLogger("gradfed_ipfs").setLevel(args.log.upper())
    sides = args.sides.split(",")
    if args.rounds < 1 and "hivemind" in sides:
        parser.error("--rounds 0 is for --sides ours only")
    print(
        f"# d={args.d:,} rounds={args.rounds} cpus={os.cpu_count()} "
        f"load={' '.join(f'{x:.1f}' for x in os.getloadavg())} "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        flush=True,
    )
    rows: list[tuple[Row | None, Row | None]] = []
    for n in (int(x) for x in args.peers.split(",")):
        theirs = None
        if "hivemind" in sides:
            try:
                theirs = run_hivemind(n, args.d, args.rounds, args.seed, args.matchmaking)
            except RuntimeError as exc:  # no group formed: say so, and still run ours
                print(f"hivemind N={n:>3}: {exc}", flush=True)
        if theirs is not None:
            print(theirs.line(), flush=True)
        ours = ours_in_swarm(n, args.daemons or n, args) if "ours" in sides else None
        if ours is not None:
            print(ours.line(), flush=True)
        rows.append((theirs, ours))
    print(f"# load after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for theirs, ours in rows:
        if theirs is not None and ours is not None:
            print(
                f"N={ours.n:>3}: ours/hivemind time {ours.time / theirs.time:4.2f}x "
                f"(against the all-reduce alone "
                f"{ours.time / (theirs.time - statistics.median(theirs.matchmaking)):4.2f}x), "
                f"cpu {statistics.median(ours.cpu) / statistics.median(theirs.cpu):4.2f}x, "
                f"bytes/peer "
                f"{statistics.median(ours.received) / statistics.median(theirs.received):4.2f}x, "
                f"one CID={all(c == 1 for c in ours.records)}"
            )


if __name__ == "__main__":
    main()
