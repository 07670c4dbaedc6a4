"""Round latency: agreed rounds (AgreedSession) vs the best-effort RoundRunner, a process per peer.

Measures per-round latency (p50, p95, mean), the start skew of a round and the CPU seconds per
round of the peers and of their daemons. Every peer is its own OS process beside its own
loopback Kubo daemon (a ``KuboSwarm`` started here) and runs ``--rounds`` rounds of seeded
deltas of ``--dim`` floats with every peer required, with no loss and with 20 % of one peer's
incoming announcements dropped (``--losses``). Each swarm first runs an unmeasured warm-up
block of each protocol (``WARMUP_ROUNDS``).

Baseline: ``RoundRunner`` (``min_peers = n - 1``) against agreed rounds (``min_peers = n``),
in ``--blocks`` alternated blocks so that both see the same drift of a shared machine's load.
``--signing`` adds a third arm to each block, the same agreed rounds unsigned (a signer that
returns zeros without a ``key/sign`` call, and keys that accept any signature: benchmark-only,
in the peer processes of that arm), and prints the signed / unsigned ratio: the cost of signing
and checking every statement; the two agreed arms swap order every other block (the runner
runs first in each). The signed arms sign as ``KuboPubsub`` does by default, with a
delegate key the daemon's identity bound at start (``DelegatedSigner``: no ``key/sign`` call
per statement); ``--kubo-key-sign`` makes them call ``key/sign`` for every statement instead.
``--control cometbft`` measures agreed rounds on the CometBFT control plane instead (issue #36):
each block runs the same agreed rounds on the pubsub control plane, then on a fresh chain of
``n`` loopback validators (one per peer, bound to its daemon's key) for each block timing of
``--block-intervals``, each ``TC[/EMPTY[/GOSSIP]]`` in seconds (``BlockTiming``'s
``timeout_commit``, ``idle_interval`` and ``peer_gossip_sleep``; a part left out keeps
``DEFAULT_TIMING``'s), and prints both planes' p50 / p95, their ratio, the chain's mean block
interval over the arm (first validator's heights) and the goal (CometBFT p50 ≤ 1.5 × pubsub
p50 + one block interval, the larger of ``timeout_commit`` and that mean).
``BENCH_ROUNDS_LOG=1`` makes every peer log each round's phases to stderr, one line each with
its wall-clock time: ``start`` and ``done`` (both planes) and, on the chain, ``contribution
sent``, ``roster closed``, ``result sent`` and ``finalized``.
A runner round that closes short at its 10 s deadline counts with that time (``short``). The
p50 ratio comes with a 95 % bootstrap interval (whole rounds resampled), the date and the load
average. ``--done-timeout`` sets ``AgreedConfig.done_timeout`` and ``--aggregation`` the
agreed peers' ``AgreedConfig.aggregation``.

Run::

    python benchmarks/bench_rounds.py                      # 3 and 8 peers, d = 1M
    python benchmarks/bench_rounds.py --peers 3 --rounds 12 --blocks 5 --losses 0
    python benchmarks/bench_rounds.py --peers 3 8 32 --dim-at 32=100000 --losses 0 --signing
    python benchmarks/bench_rounds.py --control cometbft --peers 4 8 --block-intervals 0 0.3/0/0.1

Results: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gradfed_ipfs.cometbft import (  # noqa: E402
    DEFAULT_TIMING,
    BlockTiming,
    CometNetwork,
    launch_session_chain,
)
from gradfed_ipfs.errors import InsufficientPeers  # noqa: E402
from gradfed_ipfs.federated.agreed import rounds_genesis  # noqa: E402
from gradfed_ipfs.federated.agreed.history import model_cid  # noqa: E402
from gradfed_ipfs.federated.agreed.session import AgreedConfig, AgreedSession  # noqa: E402
from gradfed_ipfs.federated.besteffort import GossipModelSync, RoundConfig, RoundRunner  # noqa: E402
from gradfed_ipfs.kubo import KuboPubsub, KuboSwarm, PubsubTransport, PubsubWrapper  # noqa: E402
from gradfed_ipfs.storage import KuboBlockStore  # noqa: E402
from tests.multiprocess.lossy import LossyPubsub  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _NullSigner:
    """Signs nothing: 64 zero bytes, no ``key/sign`` RPC (the unsigned arm only)."""

    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id

    async def sign(self, data: bytes) -> bytes:
        return bytes(64)


class _AnyKey:
    def verify(self, signature: bytes, data: bytes) -> None:
        """Accept every signature (the unsigned arm only)."""


class _TrustingKeys:
    def key_of(self, author: str) -> _AnyKey:
        return _AnyKey()


class UnsignedPubsub(PubsubWrapper):
    """The agreed rounds without signatures: the baseline of ``--signing``."""

    async def signer(self) -> _NullSigner:  # type: ignore[override]
        return _NullSigner(await self.inner.local_peer_id())

    @property
    def keys(self) -> _TrustingKeys:  # type: ignore[override]
        return _TrustingKeys()


WARMUP_ROUNDS = 4
"""Rounds of the unmeasured warm-up block each protocol runs on a new swarm."""
PEER_FLAGS: list[str] = []
"""Options every peer process gets as well (``--kubo-key-sign``)."""
ARM_TAGS = {"runner": "r", "agreed": "a", "agreed-unsigned": "u", "agreed-comet": "c"}
"""Each arm's part of its session names: no two arms of a block share a topic (until
2026-12-02 the signed and unsigned arms were both ``ad…``)."""


def agreed_config(members: list[str], done_timeout: float, aggregation: str) -> AgreedConfig:
    """The agreed peers' settings (both control planes; every member required)."""
    return AgreedConfig(
        tuple(members), collect_timeout=30.0, round_timeout=120.0, fetch_timeout=60.0,
        done_timeout=done_timeout, aggregation=aggregation,  # type: ignore[arg-type]
    )  # fmt: skip


def block_timing(arm: str) -> BlockTiming:
    """Parse a ``--block-intervals`` arm, ``TC[/EMPTY[/GOSSIP]]`` seconds (see the docstring)."""
    names = ("timeout_commit", "idle_interval", "peer_gossip_sleep")
    parts = arm.split("/")
    if not 1 <= len(parts) <= len(names):
        raise SystemExit(f"--block-intervals {arm!r}: not TC[/EMPTY[/GOSSIP]]")
    try:
        values = {name: float(part) for name, part in zip(names, parts, strict=False)}
    except ValueError as exc:
        raise SystemExit(f"--block-intervals {arm!r}: {exc}") from None
    return dataclasses.replace(DEFAULT_TIMING, **values)


def log_phases(index: int) -> None:
    """``BENCH_ROUNDS_LOG=1``: print the control plane's phase records to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(lambda record: hasattr(record, "phase"))
    handler.setFormatter(logging.Formatter(f"%(created).3f peer {index} round %(round)d %(phase)s"))
    agreed = logging.getLogger("gradfed_ipfs.federated.agreed")
    agreed.addHandler(handler)
    agreed.setLevel(logging.DEBUG)


def start_chain(
    swarm: KuboSwarm, session: str, genesis: str, timing: BlockTiming, done_timeout: float
) -> CometNetwork:
    """Start ``len(swarm)`` validators for ``session``, each bound to its daemon's peer ID."""
    members = [d.peer_id for d in swarm]
    network = CometNetwork(len(swarm), timing=timing)
    config = agreed_config(members, done_timeout, "all-to-all")

    async def launch() -> None:
        pubsubs = [KuboPubsub(daemon.api_url) for daemon in swarm]
        try:
            signers = [await pubsub.signer() for pubsub in pubsubs]
            chain = rounds_genesis(session, genesis, config)
            await launch_session_chain(network, chain, signers, timeout=120)
        finally:
            for pubsub in pubsubs:
                await pubsub.aclose()

    asyncio.run(launch())
    return network


def initial_model(dim: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(dim).astype(np.float32)


def delta(index: int, round_number: int, dim: int) -> np.ndarray:
    return (0.01 * np.random.default_rng([index, round_number]).standard_normal(dim)).astype(
        np.float32
    )


async def peer_main(args: argparse.Namespace) -> None:
    store = KuboBlockStore(args.api, timeout=60.0)
    pubsub: PubsubTransport = KuboPubsub(args.api, delegated=not args.kubo_key_sign)
    if args.loss > 0:
        pubsub = LossyPubsub(pubsub, args.loss, seed=args.index)
    if args.protocol == "agreed-unsigned":
        pubsub = UnsignedPubsub(pubsub)
    members = args.members.split(",")
    phases = os.environ.get("BENCH_ROUNDS_LOG") == "1"
    if phases:
        log_phases(args.index)
    phase = logging.getLogger("gradfed_ipfs.federated.agreed")
    latencies: list[tuple[float, int]] = []
    starts: list[float] = []  # wall clock: the peers share this machine's
    cpu: list[tuple[float, float]] = []  # (this process, its daemon) after each round

    def count_cpu() -> None:
        cpu.append((cpu_seconds(os.getpid()), cpu_seconds(args.daemon_pid)))

    if args.protocol.startswith("agreed"):
        config = agreed_config(members, args.done_timeout, args.aggregation)
        if args.protocol == "agreed-comet":
            config = dataclasses.replace(config, control="cometbft")
        session = AgreedSession(
            store, pubsub, args.session, args.genesis, config, validator_rpc=args.validator_rpc
        )
        await session.start(initial_model(args.dim))
        for r in range(args.rounds):
            gradient = delta(args.index, r, args.dim)  # test data: not part of the round's time
            t = time.monotonic()
            if phases:
                phase.debug("start", extra={"phase": "start", "round": r})
            result = await session.run_round(gradient, weight=1 + args.index)
            latencies.append((time.monotonic() - t, len(result.roster.entries)))
            if phases:
                phase.debug("done", extra={"phase": "done", "round": r})
            starts.append(time.time() - latencies[-1][0])
            count_cpu()
        await session.linger(timeout=30.0)
        await session.aclose()
    else:
        peer_id = await pubsub.local_peer_id()
        gossip = GossipModelSync(peer_id, pubsub, session_id=args.session)
        await gossip.start()
        runner = RoundRunner(
            store,
            gossip,
            RoundConfig(
                min_peers=len(members) - 1,
                collect_timeout=10.0,
                fetch_timeout=60.0,
                republish_interval=0.25,
            ),
        )
        for r in range(args.rounds):
            gradient = delta(args.index, r, args.dim)
            t = time.monotonic()
            try:
                outcome = await runner.run_round(r, gradient, num_samples=1 + args.index)
                latencies.append((time.monotonic() - t, outcome.stats.participants))
            except InsufficientPeers as exc:  # the round closed short at its deadline
                latencies.append((time.monotonic() - t, 1 + exc.got))
            starts.append(time.time() - latencies[-1][0])
            count_cpu()
        await asyncio.sleep(3.0)  # keep serving blocks and announcements to slower peers
        await runner.aclose()
        await gossip.aclose()
    await pubsub.aclose()
    await store.aclose()
    # CPU of rounds 2.. (the first is excluded like its latency)
    used = [b - a for a, b in zip(cpu[0], cpu[-1], strict=True)]
    print(json.dumps({"latencies": latencies, "starts": starts, "cpu": used}), flush=True)


def run_protocol(
    swarm: KuboSwarm,
    protocol: str,
    dim: int,
    rounds: int,
    loss: float,
    tag: str,
    done_timeout: float,
    aggregation: str = "all-to-all",
    validators: list[str] | None = None,
) -> tuple[list[list[tuple[float, int]]], list[float], np.ndarray]:
    """Run one block; return each round's (latency, participants) of every peer, each round's
    start skew (seconds from the first peer's start to the last one's) and the CPU seconds the
    peers and their daemons used over the timed rounds (summed over peers)."""
    members = ",".join(d.peer_id for d in swarm)
    genesis = str(asyncio.run(model_cid(initial_model(dim))))
    procs = []
    for index, daemon in enumerate(swarm):
        lossy = ["--loss", str(loss)] if loss and index == len(swarm) - 1 else []
        command = [
            sys.executable, __file__, "--peer", "--protocol", protocol, "--api", daemon.api_url,
            "--index", str(index), "--members", members, "--session", f"bench-{tag}",
            "--genesis", genesis, "--dim", str(dim), "--rounds", str(rounds), *lossy,
            "--done-timeout", str(done_timeout), "--daemon-pid", str(daemon.pid),
            "--aggregation", aggregation, *PEER_FLAGS,
            *(("--validator-rpc", validators[index]) if validators else ()),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env))
    by_round: list[list[tuple[float, int]]] = [[] for _ in range(rounds - 1)]
    starts: list[list[float]] = [[] for _ in range(rounds - 1)]
    cpu = np.zeros(2)
    reports = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=1800)
            if proc.returncode != 0:
                raise SystemExit(f"{protocol} peer failed with {proc.returncode}")
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:  # a failed block's other peers: stopped here, not by a dead daemon
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for report in reports:
        for group, (seconds, participants) in zip(by_round, report["latencies"][1:], strict=True):
            group.append((seconds, participants))
        for group, start in zip(starts, report["starts"][1:], strict=True):
            group.append(start)
        cpu += report["cpu"]
    return by_round, [max(s) - min(s) for s in starts], cpu


def ratio_interval(
    agreed: list[list[tuple[float, int]]], runner: list[list[tuple[float, int]]], q: float
) -> tuple[float, float]:
    """95 % bootstrap interval of the agreed/runner ratio of the q-th percentile.

    Resamples whole rounds (a round's peers wait for each other, so their latencies are not
    independent samples), 2,000 times, with a fixed seed.
    """
    rng = np.random.default_rng(0)

    def resampled(groups: list[list[tuple[float, int]]]) -> float:
        picked = rng.integers(0, len(groups), len(groups))
        return float(np.percentile([s for i in picked for s, _ in groups[i]], q))

    ratios = [resampled(agreed) / resampled(runner) for _ in range(2000)]
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def percentile(samples: list[tuple[float, int]], q: float) -> float:
    return float(np.percentile([s for s, _ in samples], q))


def block_order(arms: list[tuple[str, list[Any]]], block: int) -> list[tuple[str, list[Any]]]:
    """Return the arms in the order block ``block`` runs them.

    The runner first; the signed and unsigned agreed arms swap places every other block, so
    neither always runs right after the runner (whose daemons are still busy for a while
    after its processes end).
    """
    return arms[:1] + (arms[1:] if block % 2 == 0 else arms[:0:-1])


def print_signing(
    n: int,
    signed: list[list[tuple[float, int]]],
    unsigned: list[list[tuple[float, int]]],
    cpu: dict[str, np.ndarray],
    blocks: int,
) -> None:
    """Print the signed / unsigned agreed rounds' p50, p95 and CPU ratios, and each block's.

    The blocks' p50 ratios show the load's drift: on a shared machine they spread far more
    than what signing costs (measured 2026-12-02: 0.80-2.08 over four blocks at N = 8).
    """
    flat_s = [x for group in signed for x in group]
    flat_u = [x for group in unsigned for x in group]
    s50, u50 = percentile(flat_s, 50), percentile(flat_u, 50)
    s95, u95 = percentile(flat_s, 95), percentile(flat_u, 95)
    low, high = ratio_interval(signed, unsigned, 50)
    (sp, sd), (up, ud) = cpu["agreed"] / blocks, cpu["agreed-unsigned"] / blocks
    print(f"{'':>11} signing: {n} peers, agreed p50 {s50:.3f} s signed / {u50:.3f} s unsigned"
          f" = {s50 / u50:.2f} ({low:.2f}-{high:.2f}), p95 {s95 / u95:.2f},"
          f" CPU per round {sp + sd:.3f} / {up + ud:.3f} s = {(sp + sd) / (up + ud):.2f}"
          f" (peers {sp:.3f} / {up:.3f} s, daemons {sd:.3f} / {ud:.3f} s)",
          flush=True)  # fmt: skip
    size = len(signed) // blocks  # rounds per block (each block adds as many to both arms)
    ratios = [
        percentile([x for g in signed[i : i + size] for x in g], 50)
        / percentile([x for g in unsigned[i : i + size] for x in g], 50)
        for i in range(0, size * blocks, size)
    ]
    print(f"{'':>11} p50 ratio by block: {', '.join(f'{r:.2f}' for r in ratios)}", flush=True)


def dim_override(text: str) -> tuple[int, int]:
    """Parse ``--dim-at``'s ``N=D`` (peers, floats)."""
    peers, _, dim = text.partition("=")
    try:
        pair = (int(peers), int(dim))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N=D (two integers), got {text!r}") from None
    if min(pair) < 1:
        raise argparse.ArgumentTypeError(f"N and D must be positive, got {text!r}")
    return pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--protocol", choices=["agreed", "agreed-unsigned", "agreed-comet", "runner"]
    )
    parser.add_argument(
        "--control", choices=["pubsub", "cometbft"], default="pubsub",
        help="cometbft: agreed rounds on the CometBFT control plane against the pubsub one",
    )  # fmt: skip
    parser.add_argument(
        "--block-intervals", nargs="+", default=["0", "0.3/0/0.1"],
        help="with --control cometbft: the chains' block timings, each TC[/EMPTY[/GOSSIP]]"
        " seconds (timeout_commit, idle interval, peer gossip sleep; default: DEFAULT_TIMING's)",
    )  # fmt: skip
    parser.add_argument("--validator-rpc", help=argparse.SUPPRESS)
    parser.add_argument(
        "--signing", action="store_true",
        help="also run the agreed rounds unsigned and print the signed / unsigned ratio",
    )  # fmt: skip
    parser.add_argument(
        "--kubo-key-sign", action="store_true",
        help="sign every statement with the daemon's key/sign (no delegate key)",
    )  # fmt: skip
    parser.add_argument("--api")
    parser.add_argument("--index", type=int)
    parser.add_argument("--members")
    parser.add_argument("--session")
    parser.add_argument("--genesis")
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--peers", type=int, nargs="+", default=[3, 8])
    parser.add_argument("--dim", type=int, default=1_000_000)
    parser.add_argument(
        "--dim-at", type=dim_override, action="append", default=[], metavar="N=D",
        help="use D floats instead of --dim at N peers (e.g. 32=100000: 32 peers' fetches of"
        " 4 MB contributions do not fit a 2-core machine's round deadline)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--losses", type=float, nargs="+", default=[0.0, 0.2])
    parser.add_argument("--daemon-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--done-timeout", type=float, default=AgreedConfig.done_timeout,
        help="agreed peers wait up to this for the others' done (AgreedConfig.done_timeout)",
    )  # fmt: skip
    parser.add_argument(
        "--aggregation",
        choices=["all-to-all", "reduce-scatter", "auto"],
        default="all-to-all",
        help="the agreed peers' AgreedConfig.aggregation",
    )
    args = parser.parse_args()
    if args.peer:
        asyncio.run(peer_main(args))
        return
    if args.kubo_key_sign:
        PEER_FLAGS.append("--kubo-key-sign")
    if args.control == "cometbft":
        comet_main(args)
        return
    dims = {n: args.dim for n in args.peers} | dict(args.dim_at)
    sizes = ", ".join(f"{d:,} at N = {n}" for n, d in dims.items() if d != args.dim)
    print(f"round latency, one process + one Kubo daemon per peer, d = {args.dim:,} floats"
          + (f" ({sizes})" if sizes else ""))  # fmt: skip
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load average {load()}")
    print(f"{'peers':>5} {'loss':>5} {'runner p50':>10} {'p95':>6} {'agreed p50':>10} {'p95':>6}"
          f" {'p50 ratio (95% CI)':>19} {'p95 ratio':>9} {'short':>5}")  # fmt: skip
    for n in args.peers:
        with KuboSwarm(n) as swarm:
            # A new swarm's first block ran ~2x slower whichever protocol ran it (measured
            # 2026-12-01): unmeasured, one short block of each warms it up.
            warm = ("runner", "agreed", *(("agreed-unsigned",) if args.signing else ()))
            for protocol in warm:
                tag = f"w{ARM_TAGS[protocol]}{n}-{os.getpid()}"
                run_protocol(
                    swarm, protocol, dims[n], WARMUP_ROUNDS, 0.0, tag, args.done_timeout,
                    args.aggregation,
                )  # fmt: skip
            for loss in args.losses:
                runner_rounds: list[list[tuple[float, int]]] = []
                agreed_rounds: list[list[tuple[float, int]]] = []
                unsigned_rounds: list[list[tuple[float, int]]] = []
                arms = [("runner", runner_rounds), ("agreed", agreed_rounds)]
                if args.signing:
                    arms.append(("agreed-unsigned", unsigned_rounds))
                skews: dict[str, list[float]] = {p: [] for p, _ in arms}
                cpu = {p: np.zeros(2) for p, _ in arms}
                for block in range(args.blocks):  # alternated: both see the same load drift
                    tag = f"{n}-{loss}-{block}-{os.getpid()}"
                    for protocol, rounds in block_order(arms, block):
                        groups, skew, used = run_protocol(
                            swarm, protocol, dims[n], args.rounds, loss,
                            f"{ARM_TAGS[protocol]}{tag}",
                            args.done_timeout, args.aggregation,
                        )  # fmt: skip
                        rounds += groups
                        skews[protocol] += skew
                        cpu[protocol] += used / (args.rounds - 1)
                if args.signing:
                    print_signing(n, agreed_rounds, unsigned_rounds, cpu, args.blocks)
                runner = [x for group in runner_rounds for x in group]
                agreed = [x for group in agreed_rounds for x in group]
                short = sum(1 for _, k in runner if k < n) + sum(1 for _, k in agreed if k < n)
                r50, r95 = percentile(runner, 50), percentile(runner, 95)
                a50, a95 = percentile(agreed, 50), percentile(agreed, 95)
                low, high = ratio_interval(agreed_rounds, runner_rounds, 50)
                print(f"{n:>5} {loss:>5.0%} {r50:>10.3f} {r95:>6.3f} {a50:>10.3f} {a95:>6.3f}"
                      f" {a50 / r50:>6.2f} ({low:.2f}-{high:.2f}) {a95 / r95:>9.2f} {short:>5}"
                      f"  load {load()}", flush=True)  # fmt: skip
                mean_r = float(np.mean([x for x, _ in runner]))
                mean_a = float(np.mean([x for x, _ in agreed]))
                print(f"{'':>11} mean {mean_r:.3f} / {mean_a:.3f} s (ratio {mean_a / mean_r:.2f}),"
                      f" start skew p50 {np.median(skews['runner']) * 1e3:.0f} /"
                      f" {np.median(skews['agreed']) * 1e3:.0f} ms (runner / agreed)",
                      flush=True)  # fmt: skip
                (rp, rd), (ap, ad) = cpu["runner"] / args.blocks, cpu["agreed"] / args.blocks
                print(f"{'':>11} CPU per round (peers + daemons): runner {rp:.3f} + {rd:.3f} s,"
                      f" agreed {ap:.3f} + {ad:.3f} s (ratio {(ap + ad) / (rp + rd):.2f})",
                      flush=True)  # fmt: skip


def comet_main(args: argparse.Namespace) -> None:
    """``--control cometbft``: agreed rounds on a chain against the pubsub plane, per block."""
    timings = {arm: block_timing(arm) for arm in args.block_intervals}
    print(f"agreed round latency, pubsub vs CometBFT control plane, d = {args.dim:,} floats,"
          f" {args.aggregation} on both planes,"
          f" one process + one Kubo daemon (+ one validator and its app) per peer")  # fmt: skip
    aggregation = args.aggregation
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load average {load()}")
    for arm, timing in timings.items():
        print(
            f"  arm {arm}: timeout_commit {timing.timeout_commit:g} s, idle interval"
            f" {timing.idle_interval:g} s, peer gossip sleep {timing.peer_gossip_sleep:g} s"
        )
    for n in args.peers:
        with KuboSwarm(n) as swarm:
            genesis = str(asyncio.run(model_cid(initial_model(args.dim))))
            tag = f"wa{n}-{os.getpid()}"
            run_protocol(
                swarm, "agreed", args.dim, WARMUP_ROUNDS, 0.0, tag, args.done_timeout, aggregation
            )
            arms: dict[str, list[list[tuple[float, int]]]] = {"pubsub": []}
            arms.update({f"comet {arm}": [] for arm in timings})
            blocks = {arm: (0, 0.0) for arm in timings}  # blocks made, seconds, over the arm
            for block in range(args.blocks):  # alternated: every arm sees the same load drift
                tag = f"{n}-{block}-{os.getpid()}"
                groups, _, _ = run_protocol(
                    swarm, "agreed", args.dim, args.rounds, 0.0, f"ap{tag}", args.done_timeout,
                    aggregation,
                )  # fmt: skip
                arms["pubsub"] += groups
                for index, (arm, timing) in enumerate(timings.items()):
                    session_tag = f"ac{index}-{tag}"
                    network = start_chain(
                        swarm, f"bench-{session_tag}", genesis, timing, args.done_timeout
                    )
                    try:
                        first, t = network[0].latest()[0], time.monotonic()
                        groups, _, _ = run_protocol(
                            swarm, "agreed-comet", args.dim, args.rounds, 0.0, session_tag,
                            args.done_timeout, aggregation,
                            validators=[v.rpc_url for v in network],
                        )  # fmt: skip
                        made, seconds = blocks[arm]
                        last = network[0].latest()[0]
                        blocks[arm] = (made + last - first, seconds + time.monotonic() - t)
                    finally:
                        network.stop()
                    arms[f"comet {arm}"] += groups
            print_comet(n, arms, timings, blocks)


def print_comet(
    n: int,
    arms: dict[str, list[list[tuple[float, int]]]],
    timings: dict[str, BlockTiming],
    blocks: dict[str, tuple[int, float]],
) -> None:
    """Print each arm's p50 / p95, and each chain's ratio to pubsub and its goal."""
    flat = {name: [x for group in groups for x in group] for name, groups in arms.items()}
    p50, p95 = percentile(flat["pubsub"], 50), percentile(flat["pubsub"], 95)
    print(f"{n:>5} peers: pubsub p50 {p50:.3f} s, p95 {p95:.3f} s  load {load()}", flush=True)
    for arm, timing in timings.items():
        name = f"comet {arm}"
        c50, c95 = percentile(flat[name], 50), percentile(flat[name], 95)
        low, high = ratio_interval(arms[name], arms["pubsub"], 50)
        made, seconds = blocks[arm]
        mean = seconds / max(made, 1)
        interval = max(timing.timeout_commit, mean)
        goal = 1.5 * p50 + interval
        verdict = "met" if c50 <= goal else f"missed by {c50 - goal:.3f} s"
        short = sum(1 for _, k in flat[name] if k < n)
        print(f"{'':>5} block timing {arm}: p50 {c50:.3f} s, p95 {c95:.3f} s,"
              f" ratio {c50 / p50:.2f} ({low:.2f}-{high:.2f}), p95 ratio {c95 / p95:.2f};"
              f" {made} blocks in {seconds:.1f} s (one per {mean:.3f} s);"
              f" goal 1.5 x p50 + interval = {goal:.3f} s: {verdict}; short rosters {short}",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
