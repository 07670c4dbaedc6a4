"""Scale: N agreed members (``AgreedSession``) in one process, per-member CPU per round.

Every member is an asyncio task of this process on one :class:`MemoryPubsubBus` and one
:class:`MemoryBlockStore` (no daemons: only the protocol's own work counts), so the process CPU
divided by N is a member's CPU. Each round a seeded ``--churn`` share of the members is absent
(it does not contribute and catches up with :meth:`AgreedSession.resync` after the round);
``--loss`` drops that share of every member's incoming pubsub messages (seeded). Printed per
round: wall time, CPU per member (ms; of which in the garbage collector, and in the absent
members' catch-up), messages and bytes published per member, how many distinct record CIDs the
members that ran the round ended on (``one CID`` when 1), the roster size, and the peak RSS.

Two things keep one process close to N member processes: the collector's full collections are
made N times rarer (:func:`scale_collector`; ``--gc-default`` keeps Python's thresholds), and
a ``get`` of a block announced before its put waits for the put (``MemoryBlockStore(
wait_for_puts=...)``), as Kubo's does, instead of failing and being retried.

Run::

    python benchmarks/bench_scale.py --members 64,128 --d 100000 --chained --churn 0.05
    python benchmarks/bench_scale.py --members 256 --d 10000 --all-to-all --rounds 2
    python benchmarks/bench_scale.py --members 64 --profile /tmp/scale.prof   # cProfile

``benchmarks/bench_load.py`` runs the reduce-scatter peers alone (no agreed session) over real
daemons. Results: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import logging
import os
import pstats
import random
import resource
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_load import _cpu, gradient

from gradfed_ipfs.errors import QuorumNotReached
from gradfed_ipfs.federated.agreed import AgreedConfig, AgreedRoundResult, AgreedSession
from gradfed_ipfs.formats import PubsubMessage
from gradfed_ipfs.kubo import MemoryPubsubBus, PubsubTransport, PubsubWrapper
from gradfed_ipfs.storage import MemoryBlockStore


class CountingPubsub(PubsubWrapper):
    """A member's transport: counts what it publishes, drops a seeded share of what it hears."""

    def __init__(self, inner: PubsubTransport, loss: float, seed: int) -> None:
        super().__init__(inner)
        self.loss, self.rng = loss, random.Random(seed)
        self.messages = 0
        self.bytes = 0
        self.dropped = 0

    async def publish(self, topic: str, data: bytes) -> None:
        self.messages += 1
        self.bytes += len(data)
        await self.inner.publish(topic, data)

    def subscribe(self, topic: str) -> AsyncIterator[PubsubMessage]:
        heard = self.inner.subscribe(topic)
        return self._lossy(heard) if self.loss else heard  # no generator per message at 0

    async def _lossy(self, heard: AsyncIterator[PubsubMessage]) -> AsyncIterator[PubsubMessage]:
        async for message in heard:
            if self.loss and self.rng.random() < self.loss:
                self.dropped += 1
                continue
            yield message

    async def peers(self, topic: str) -> list[str]:
        return await self.inner.peers(topic)

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class RoundRow:
    """One round's measurements (CPU in seconds of this process, all members together)."""

    members: int
    round: int
    seconds: float
    cpu: float
    messages: int
    bytes: int
    absent: int
    ran: int
    records: int
    roster: int
    aggregation: str = ""
    resync: float = 0.0
    gc: float = 0.0
    resync_cpu: float = 0.0
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        n = self.members
        verdict = "one CID" if self.records == 1 and not self.errors else "DIVERGED"
        return (
            f"N={n:>5} round={self.round} wall={self.seconds:7.2f}s (+{self.resync:5.1f}s resync) "
            f"cpu/member={1e3 * self.cpu / n:7.1f} ms (gc {1e3 * self.gc / n:5.1f}, "
            f"resync {1e3 * self.resync_cpu / n:5.1f})  "
            f"msgs/member={self.messages / n:6.1f} "
            f"bytes/member={self.bytes / n / 1e3:7.1f} kB  absent={self.absent:>3} "
            f"roster={self.roster:>5}/{self.ran} {self.aggregation} "
            f"records={self.records} {verdict}  "
            f"rss={_rss() / 2**30:5.2f} GiB load={os.getloadavg()[0]:4.1f}"
            + (f"  errors={self.errors[:3]}" if self.errors else "")
        )


class GcClock:
    """Seconds this process spent in the cyclic garbage collector (``gc.callbacks``).

    In one process holding every member the collector walks all members' objects, so its cost
    grows as N² a round although a member's own process would hold 1/N of them.
    """

    def __init__(self) -> None:
        self.seconds, self._started = 0.0, 0.0
        self.by_generation = [[0, 0.0] for _ in range(3)]  # collections, seconds
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            spent = time.perf_counter() - self._started
            self.seconds += spent
            self.by_generation[info["generation"]][0] += 1
            self.by_generation[info["generation"]][1] += spent


GC_CLOCK = GcClock()


def scale_collector(members: int) -> None:
    """Make full collections ``members`` times rarer, as in one process per member.

    A full collection walks the whole heap: here ``members`` members' objects, each member's
    process would walk its own. Young collections cost the same per allocation either way, and
    so does a full one every ``10 · members`` (not 10) young-generation collections.
    """
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 10 * members)


def _rss() -> int:
    """Peak resident memory of this process (bytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def config_for(args: argparse.Namespace, n: int) -> AgreedConfig:
    """The members' config: reduce-scatter (chained or not) or all-to-all, scaled timeouts."""
    names = tuple(f"m{i:05d}" for i in range(n))
    absent = int(args.churn * n + 0.999)
    # Everything runs on a shared core or two: timeouts scale with N (a round's wall time does).
    scale = max(1.0, n / 64)
    return AgreedConfig(
        members=names,
        min_peers=max(1, n - absent - max(1, n // 50)),
        aggregation="all-to-all" if args.all_to_all else "reduce-scatter",
        chained=args.chained,
        collect_timeout=args.collect_timeout * scale,
        # A backup coordinator waits this per rank after collect_timeout: on a saturated
        # process the first roster is late, and an early backup's would split the members.
        takeover_timeout=args.takeover_timeout * scale,
        round_timeout=600.0 * scale,
        fetch_timeout=60.0 * scale,
        reducer_timeout=10.0 * scale,
        announce_interval=0.5 * scale,
        max_announce_interval=4.0 * scale,
        chunk_bytes=args.chunk_bytes,
        model_every=1,  # an absent member's resync fetches the head's model, not rebuilds it
    )


def _dump_tasks() -> None:
    """Print where every task waits (``kill -USR1 <pid>``: a round that does not finish)."""
    from collections import Counter

    where = Counter(
        " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in reversed(t.get_stack(limit=6)))
        for t in asyncio.all_tasks()
    )
    for stack, count in where.most_common(25):
        print(f"{count:6d}  {stack}", file=sys.stderr, flush=True)
    for task in asyncio.all_tasks():  # the stragglers' whole stacks
        frames = task.get_stack(limit=6)
        key = " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in reversed(frames))
        if where[key] <= 2:
            task.print_stack(limit=20, file=sys.stderr)


async def _watch(seconds: float) -> None:
    """Dump the tasks every ``seconds`` while a round runs (a stalled round shows where)."""
    while seconds > 0:
        await asyncio.sleep(seconds)
        print(f"round still running after {seconds:.0f} s more:", file=sys.stderr)
        _dump_tasks()


async def _catch_up(session: AgreedSession, target: int, timeout: float = 120.0) -> None:
    """Resync until ``session`` is at round ``target`` (each member's earlier head is known
    at once: a resync may return before the others' new heads are heard)."""
    deadline = time.monotonic() + timeout
    while session.round < target and time.monotonic() < deadline:
        await session.resync(timeout=10.0, grace=1.0)
        if session.round < target:
            await asyncio.sleep(0.2)  # the new heads are on their way


async def run_scale(args: argparse.Namespace, n: int) -> list[RoundRow]:
    """Run ``args.rounds`` rounds of ``n`` members; return one row per round."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _dump_tasks)
    if not args.gc_default:
        scale_collector(n)
    config = config_for(args, n)
    # A get waits for the put as over Kubo: members announce a contribution before its put.
    store, bus = MemoryBlockStore(wait_for_puts=config.fetch_timeout), MemoryPubsubBus()
    model = np.random.default_rng(args.seed).standard_normal(args.d).astype(np.float32)
    genesis = await AgreedSession.commit_genesis(store, model)
    transports = [
        CountingPubsub(bus.endpoint(p), args.loss, seed=args.seed * 100_003 + i)
        for i, p in enumerate(config.members)
    ]
    sessions = [AgreedSession(store, t, "scale", genesis, config) for t in transports]
    for s in sessions:
        await s.start(model)
    rng = random.Random(args.seed)
    rows: list[RoundRow] = []
    try:
        for r in range(args.rounds):
            rows.append(await _one_round(args, sessions, transports, rng, r))
            print(rows[-1].summary(), flush=True)
    finally:
        for s in sessions:
            await s.aclose()
    return rows


async def _one_round(
    args: argparse.Namespace,
    sessions: list[AgreedSession],
    transports: list[CountingPubsub],
    rng: random.Random,
    r: int,
) -> RoundRow:
    n = len(sessions)
    absent = set(rng.sample(range(n), int(args.churn * n + 0.999) if args.churn else 0))
    running = [i for i in range(n) if i not in absent]
    messages = sum(t.messages for t in transports)
    sent = sum(t.bytes for t in transports)
    gc.collect()
    watchdog = asyncio.create_task(_watch(args.watchdog))
    cpu, started, collecting = _cpu(), time.monotonic(), GC_CLOCK.seconds
    outcomes = await asyncio.gather(
        *(
            sessions[i].run_round(
                gradient(args.seed, sessions[i].round, i, args.d), weight=1 + i % 7
            )
            for i in running
        ),
        return_exceptions=True,
    )
    seconds = time.monotonic() - started
    round_cpu = _cpu() - cpu
    # The absent members catch up (their CPU is counted: a real member pays it too).
    target = max((sessions[i].round for i in running), default=0)
    synced = await asyncio.gather(
        *(_catch_up(sessions[i], target) for i in absent), return_exceptions=True
    )
    cpu = _cpu() - cpu
    watchdog.cancel()
    synced_seconds = time.monotonic() - started - seconds
    results = [o for o in outcomes if isinstance(o, AgreedRoundResult)]
    errors = [
        f"{type(o).__name__}: {o}"[:120]
        for o in (*outcomes, *synced)
        if isinstance(o, BaseException)
    ]
    behind = [i for i in absent if sessions[i].round != sessions[running[0]].round]
    if behind:
        errors.append(f"{len(behind)} absent members did not resync")
    return RoundRow(
        n,
        r,
        seconds,
        cpu,
        sum(t.messages for t in transports) - messages,
        sum(t.bytes for t in transports) - sent,
        len(absent),
        len(running),
        len({bytes(res.record) for res in results}),
        max((len(res.roster.peers) for res in results), default=0),
        ",".join(sorted({res.aggregation for res in results})),
        synced_seconds,
        GC_CLOCK.seconds - collecting,
        cpu - round_cpu,
        [e for e in errors if not e.startswith(QuorumNotReached.__name__)] or errors,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=str, default="64", metavar="N,N,...")
    parser.add_argument("--d", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chained", action="store_true", help="chained reduce-scatter")
    parser.add_argument("--all-to-all", action="store_true", help="all-to-all rounds")
    parser.add_argument("--churn", type=float, default=0.05, help="share absent each round")
    parser.add_argument("--loss", type=float, default=0.0, help="share of pubsub messages lost")
    parser.add_argument("--chunk-bytes", type=int, default=65_536)
    parser.add_argument("--collect-timeout", type=float, default=3.0, help="at N = 64 (scaled)")
    parser.add_argument("--takeover-timeout", type=float, default=10.0, help="at N = 64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--watchdog", type=float, default=300.0, help="dump tasks when a round takes this long"
    )
    parser.add_argument(
        "--gc-default",
        action="store_true",
        help="Python's collector thresholds (default: full collections N times rarer)",
    )
    parser.add_argument("--profile", type=str, default="", help="write a cProfile here")
    parser.add_argument("--log", type=str, default="", help="log gradfed_ipfs at this level")
    args = parser.parse_args()
    if args.log:
        logging.basicConfig(level=logging.WARNING, format="%(relativeCreated)9.0f %(message)s")
        logging.getLogger("gradfed_ipfs").setLevel(args.log.upper())
    counts = [int(n) for n in args.members.split(",")]
    mode = "all-to-all" if args.all_to_all else ("chained" if args.chained else "one-level")
    print(
        f"# {mode} d={args.d:,} churn={args.churn} loss={args.loss} rounds={args.rounds} "
        f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}",
        flush=True,
    )
    for n in counts:
        profiler = cProfile.Profile() if args.profile else None
        if profiler is not None:
            profiler.enable()
        rows = asyncio.run(run_scale(args, n))
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        steady = rows[1:] or rows
        print(
            f"N={n:>5} {mode}: median cpu/member/round="
            f"{1e3 * float(np.median([row.cpu for row in steady])) / n:.1f} ms, "
            f"max wall={max(row.seconds for row in steady):.2f}s, all rounds one CID="
            f"{all(row.records == 1 and not row.errors for row in rows)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
