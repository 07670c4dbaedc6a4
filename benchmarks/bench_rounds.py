"""Round latency: agreed rounds (AgreedSession) vs the current RoundRunner, one process per peer.

Every peer is its own OS process beside its own loopback Kubo daemon (a KuboSwarm started
here). Each runs ``--rounds`` rounds of seeded deltas of ``--dim`` floats with every peer
required (RoundRunner: ``min_peers = n - 1``; agreed: ``min_peers = n``), with no loss and with
20 % of one peer's incoming announcements dropped. Per-round latency is measured on every peer
from the start of its ``run_round`` to its return (a runner round that closes short at its 10 s
collect deadline, ``InsufficientPeers``, counts with that time; ``short`` counts such rounds);
p50/p95 over all peer-rounds (the first round excluded: subscriptions warm up) and the
agreed/runner ratios are printed.

    python benchmarks/bench_rounds.py                      # 3 and 8 peers, d = 1M
    python benchmarks/bench_rounds.py --peers 3 --dim 100000 --rounds 6
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
            t = time.monotonic()
            result = await session.run_round(delta(args.index, r, args.dim), weight=1 + args.index)
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
            t = time.monotonic()
            try:
                outcome = await runner.run_round(
                    r, delta(args.index, r, args.dim), num_samples=1 + args.index
                )
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
) -> list[tuple[float, int]]:
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
    samples: list[tuple[float, int]] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"{protocol} peer failed with {proc.returncode}")
        samples += [tuple(x) for x in json.loads(out.strip().splitlines()[-1])["latencies"][1:]]
    return samples


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
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    if args.peer:
        asyncio.run(peer_main(args))
        return
    print(f"round latency, one process + one Kubo daemon per peer, d = {args.dim:,} floats")
    print(f"{'peers':>5} {'loss':>5} {'runner p50':>10} {'p95':>6} {'agreed p50':>10} {'p95':>6}"
          f" {'p50 ratio':>9} {'p95 ratio':>9} {'short':>5}")  # fmt: skip
    for n in args.peers:
        with KuboSwarm(n) as swarm:
            for loss in (0.0, 0.2):
                tag = f"{n}-{loss}-{os.getpid()}"
                runner = run_protocol(swarm, "runner", args.dim, args.rounds, loss, f"r{tag}")
                agreed = run_protocol(swarm, "agreed", args.dim, args.rounds, loss, f"a{tag}")
                short = sum(1 for _, k in runner if k < n) + sum(1 for _, k in agreed if k < n)
                r50, r95 = percentile(runner, 50), percentile(runner, 95)
                a50, a95 = percentile(agreed, 50), percentile(agreed, 95)
                print(f"{n:>5} {loss:>5.0%} {r50:>10.3f} {r95:>6.3f} {a50:>10.3f} {a95:>6.3f}"
                      f" {a50 / r50:>9.2f} {a95 / r95:>9.2f} {short:>5}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
