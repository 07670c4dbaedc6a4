"""Round latency: agreed rounds (AgreedSession) vs the current RoundRunner, one process per peer.

Every peer is its own OS process beside its own loopback Kubo daemon (a KuboSwarm started
here). Each runs ``--rounds`` rounds of seeded deltas of ``--dim`` floats with every peer
required (RoundRunner: ``min_peers = n - 1``; agreed: ``min_peers = n``), with no loss and with
20 % of one peer's incoming announcements dropped. The two protocols run in ``--blocks``
alternated blocks (runner, agreed, runner, agreed, ...) so that both see the same drift of a
shared machine's load. Per-round latency is measured on every peer from the start of its
``run_round`` to its return (a runner round that closes short at its 10 s collect deadline,
``InsufficientPeers``, counts with that time; ``short`` counts such rounds); p50/p95 over all
peer-rounds (the first round of each block excluded: subscriptions warm up) and the
agreed/runner ratios are printed, with a 95 % bootstrap interval of the p50 ratio (whole rounds
resampled: a round's peers wait for each other), the date and the load average (1, 5, 15 min).
The test data (each round's delta) is made before the round's clock starts.

    python benchmarks/bench_rounds.py                      # 3 and 8 peers, d = 1M
    python benchmarks/bench_rounds.py --peers 3 --rounds 12 --blocks 5 --losses 0

Idle 2-core VM, 2026-11-30 20:00 (the benchmark's own load only), after the model is put by 2
holders instead of every peer (``AgreedConfig.model_replicas``), CIDs' bytes without
multiformats' run-time checks and batched ``block/put``, seconds::

    peers  loss  runner p50   p95  agreed p50   p95  p50 ratio (95% CI)  p95 ratio  rounds
        3    0%       0.154  0.301      0.191  0.354   1.24 (1.08-1.33)       1.18   55+55
        8    0%       1.174  2.558      1.181  1.741   1.01 (0.60-1.16)       0.68   15+15

Two more 3-peer runs right after (``--rounds 10 --blocks 4``, 36 rounds each): 1.21 (1.04-1.40)
and 1.18 (1.02-1.31). The <= 1.2x goal holds at 8 peers and not reliably at 3 (25-37 ms above
the runner's p50; every 95 % interval reaches above 1.2). Earlier
runs, with the delta's generation (~25 ms) inside the timed round, which lowers the ratio for the
same gap: 3 peers 1.13, 1.21, 1.33, 1.12, 1.29 at idle; 1.22 at load 10-15; 8 peers 1.10-1.12.
With 20 % of one peer's announcements lost, agreed rounds stay complete while the runner closes
rounds short at its 10 s deadline (3 of 42 at idle; its p95 ~10 s), so the p95 ratio is ~0.1.

Where the 3-peer gap is (timelines of ``run_round`` start and end on every peer, 3 blocks):
from the last peer's start to each peer's end, agreed rounds are as fast as the runner's (p50
0.167 vs 0.173 s), but agreed peers start each round 91 ms apart at p50 against the runner's
44 ms. An agreed peer that starts last already holds the others' contributions (fetched as soon
as heard, the next round's too) and finishes first, so the order rotates and the early
starters wait; the runner's late starter picks up the others' announcements only when it
starts, so its peers stay in step. What agreed rounds add on 2 shared cores: the deterministic
float64 update (~5 ms), hashing the new model (~8 ms), and on the model's 2 holders a 4 MB put
(~5 ms of Python, ~20 ms of daemon CPU). Deferring the model's put past the next announcement,
or skipping it altogether (measured only to size it), moved the ratio less than the noise; so
did fetching the next round's contributions only once that round starts (1.22 and 1.36 against
1.21 and 1.18 alternated), which would keep the peers in step as the runner's are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gradfed_ipfs.errors import InsufficientPeers  # noqa: E402
from gradfed_ipfs.federated.round import GossipModelSync, RoundConfig, RoundRunner  # noqa: E402
from gradfed_ipfs.federated.round.agreed import AgreedConfig, AgreedSession  # noqa: E402
from gradfed_ipfs.federated.round.agreed_history import model_cid  # noqa: E402
from gradfed_ipfs.kubo import KuboPubsub, KuboSwarm, PubsubTransport  # noqa: E402
from gradfed_ipfs.storage import KuboBlockStore  # noqa: E402
from tests.multiprocess.lossy import LossyPubsub  # noqa: E402


def initial_model(dim: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(dim).astype(np.float32)


def delta(index: int, round_number: int, dim: int) -> np.ndarray:
    return (0.01 * np.random.default_rng([index, round_number]).standard_normal(dim)).astype(
        np.float32
    )


async def peer_main(args: argparse.Namespace) -> None:
    store = KuboBlockStore(args.api, timeout=60.0)
    pubsub: PubsubTransport = KuboPubsub(args.api)
    if args.loss > 0:
        pubsub = LossyPubsub(pubsub, args.loss, seed=args.index)
    members = args.members.split(",")
    latencies = []
    if args.protocol == "agreed":
        config = AgreedConfig(
            tuple(members), collect_timeout=30.0, round_timeout=120.0, fetch_timeout=60.0
        )
        session = AgreedSession(store, pubsub, args.session, args.genesis, config)
        await session.start(initial_model(args.dim))
        for r in range(args.rounds):
            gradient = delta(args.index, r, args.dim)  # test data: not part of the round's time
            t = time.monotonic()
            result = await session.run_round(gradient, weight=1 + args.index)
            latencies.append((time.monotonic() - t, len(result.roster.entries)))
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
        await asyncio.sleep(3.0)  # keep serving blocks and announcements to slower peers
        await runner.aclose()
        await gossip.aclose()
    await pubsub.aclose()
    await store.aclose()
    print(json.dumps({"latencies": latencies}), flush=True)


def run_protocol(
    swarm: KuboSwarm, protocol: str, dim: int, rounds: int, loss: float, tag: str
) -> list[list[tuple[float, int]]]:
    """Run one block; return each round's (latency, participants) of every peer."""
    members = ",".join(d.peer_id for d in swarm)
    genesis = str(asyncio.run(model_cid(initial_model(dim))))
    procs = []
    for index, daemon in enumerate(swarm):
        lossy = ["--loss", str(loss)] if loss and index == len(swarm) - 1 else []
        command = [
            sys.executable, __file__, "--peer", "--protocol", protocol, "--api", daemon.api_url,
            "--index", str(index), "--members", members, "--session", f"bench-{tag}",
            "--genesis", genesis, "--dim", str(dim), "--rounds", str(rounds), *lossy,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env))
    by_round: list[list[tuple[float, int]]] = [[] for _ in range(rounds - 1)]
    for proc in procs:
        out, _ = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"{protocol} peer failed with {proc.returncode}")
        latencies = json.loads(out.strip().splitlines()[-1])["latencies"][1:]
        for group, (seconds, participants) in zip(by_round, latencies, strict=True):
            group.append((seconds, participants))
    return by_round


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--protocol", choices=["agreed", "runner"])
    parser.add_argument("--api")
    parser.add_argument("--index", type=int)
    parser.add_argument("--members")
    parser.add_argument("--session")
    parser.add_argument("--genesis")
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--peers", type=int, nargs="+", default=[3, 8])
    parser.add_argument("--dim", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--losses", type=float, nargs="+", default=[0.0, 0.2])
    args = parser.parse_args()
    if args.peer:
        asyncio.run(peer_main(args))
        return
    print(f"round latency, one process + one Kubo daemon per peer, d = {args.dim:,} floats")
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load average {load()}")
    print(f"{'peers':>5} {'loss':>5} {'runner p50':>10} {'p95':>6} {'agreed p50':>10} {'p95':>6}"
          f" {'p50 ratio (95% CI)':>19} {'p95 ratio':>9} {'short':>5}")  # fmt: skip
    for n in args.peers:
        with KuboSwarm(n) as swarm:
            for loss in args.losses:
                runner_rounds: list[list[tuple[float, int]]] = []
                agreed_rounds: list[list[tuple[float, int]]] = []
                for block in range(args.blocks):  # alternated: both see the same load drift
                    tag = f"{n}-{loss}-{block}-{os.getpid()}"
                    runner_rounds += run_protocol(
                        swarm, "runner", args.dim, args.rounds, loss, f"r{tag}"
                    )
                    agreed_rounds += run_protocol(
                        swarm, "agreed", args.dim, args.rounds, loss, f"a{tag}"
                    )
                runner = [x for group in runner_rounds for x in group]
                agreed = [x for group in agreed_rounds for x in group]
                short = sum(1 for _, k in runner if k < n) + sum(1 for _, k in agreed if k < n)
                r50, r95 = percentile(runner, 50), percentile(runner, 95)
                a50, a95 = percentile(agreed, 50), percentile(agreed, 95)
                low, high = ratio_interval(agreed_rounds, runner_rounds, 50)
                print(f"{n:>5} {loss:>5.0%} {r50:>10.3f} {r95:>6.3f} {a50:>10.3f} {a95:>6.3f}"
                      f" {a50 / r50:>6.2f} ({low:.2f}-{high:.2f}) {a95 / r95:>9.2f} {short:>5}"
                      f"  load {load()}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
