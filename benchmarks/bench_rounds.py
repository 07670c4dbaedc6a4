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
agreed/runner ratios are printed, with the date and the load average (1, 5, 15 min).

    python benchmarks/bench_rounds.py                      # 3 and 8 peers, d = 1M
    python benchmarks/bench_rounds.py --peers 3 --dim 100000 --rounds 6

Measured 2026-11-30 on the shared 2-core VM (load average 10-15 all along: about seven other
developers' tests and benchmarks), ``--rounds 6 --blocks 2`` for 3 peers (30 peer-rounds per
protocol and setting) and ``--rounds 4 --blocks 2`` for 8 peers (48), seconds::

    peers  loss  runner p50   p95  agreed p50   p95  p50 ratio  p95 ratio  short  load (1/5/15)
        3    0%       3.510  4.254       4.288  5.513      1.22       1.30      0  12.7 11.3 9.8
        3   20%       3.138  3.908       4.638  5.669      1.48       1.45      0  14.2 12.5 10.6
        8    0%      18.443 25.403      20.747 32.059      1.12       1.26     29  13.7 14.3 12.6
        8   20%      14.072 16.269      12.351 17.233      0.88       1.06      0  13.9 13.8 12.8

The 1.2x goal is met at 8 peers and missed at 3 (1.22x at p50). The 8-peer runner rows are
flattered: 29 of its 48 peer-rounds at 0 % loss closed at the 10 s collect deadline without
every peer (``short``), i.e. with a partial aggregate, where every agreed round had all 8 (a
runner-only rerun with logs: those peers were cut off as "still fetching at the round's
deadline: no block arrived", bitswap saturated by 8 x 7 fetches of 4 MB, not lost announcements).
Run-to-run noise at this load is about +-0.5 s at 3 peers (the same code gave an agreed p50 of
2.9-5.0 s across consecutive runs), so ratios move by +-0.2. Where an agreed round's time goes
(3 peers, load ~10, per round): encoding its own gradient 0.07-0.14 s; publishing ``contrib``
0.06-0.37 s (beside its own 4 MB put); waiting for and fetching the others' contributions
1.0-2.4 s; roster and deterministic update 0.06-0.12 s; hashing the new model 0.05-0.16 s.
What the runner does not do is the model's put (4 MB, every peer, every round, so that any peer
can serve a resync): skipping it (not an option; measured only to size it) cut the agreed p95
from 4.9-5.9 s to 3.0-4.0 s in alternated runs. Awaiting the put before announcing, starting it
after the announcement, or deferring the model's put until the next round's own put landed made
no difference beyond the noise. Before the collect-loop fix (``RoundRunner`` lost an announcement
it had accepted when a fetch finished in the same step), the 3-peer runner at 0 % loss had 2
short rounds at exactly its 10 s deadline (p95 10.4 s).

On an idle machine (2026-11-30 14:48, load 2.8), 3 peers, ``--rounds 8 --blocks 3``::

    peers  loss  runner p50   p95  agreed p50   p95  p50 ratio  p95 ratio  short
        3    0%       0.450  0.830      0.574  0.780      1.28       0.94      0
        3   20%       0.473 10.132      0.584  0.809      1.24       0.08      3

There the model's put is not the gap: a 4 MB put costs ~25 ms on an idle daemon, and awaiting
the own contribution's put before announcing it changed nothing; per-phase logs put almost all
of an agreed round (0.45-0.6 s) between announcing the contribution and adopting the roster,
i.e. the others' contributions arriving and being fetched. The p50 goal (<= 1.2x) is not met.
Again after the CID fast paths (``gradfed_ipfs.cid``) and sniffio, 15:17, load 0.6-1.3::

        3    0%       0.250  0.328      0.316  0.476      1.26       1.45      0
        3   20%       0.297 10.097      0.407  0.609      1.37       0.06      3

Both got faster; the gap at p50 (~66 ms) stayed. Per-contribution timing in that setting: the
others' ``contrib`` announcements reach a peer's fetcher 30-100 ms after they are posted, and a
4 MB fetch takes 0.1-0.45 s while the daemon also serves two others.

16:50-17:30, idle machine (load 0.5-3 from the benchmark itself), after (1) the lean RPC path
(``kubo/http1.py``: ~0.2 ms of CPU per small call instead of ~1.3 ms; it speeds the runner as
much as the agreed rounds), (2) fetching a heard contribution at once, the next round's too, and
(3) announcing the contribution before its own put starts (racing the 4 MB put, the announcement
reached the others 60-130 ms after posting), ``--rounds 8 --blocks 3`` or ``--blocks 4``::

    peers  loss  runner p50   p95  agreed p50   p95  p50 ratio  p95 ratio  short
        3    0%       0.182  0.298      0.206  0.333      1.13       1.12      0
        3    0%       0.144  0.249      0.174  0.258      1.21       1.04      0
        8    0%       1.021  2.118      1.123  1.686      1.10       0.80      0   (load 8)
        8   20%       0.940  9.779      1.098  1.574      1.17       0.16      2
        3    0%       0.150  0.291      0.200  0.288      1.33       0.99      0
        3    0%       0.171  0.324      0.192  0.293      1.12       0.91      0
        3    0%       0.150  0.241      0.193  0.298      1.29       1.23      0   (--blocks 6)

So the p50 ratio at 3 peers is 1.12-1.33 from run to run (median of these 1.21; the longest run,
126 peer-rounds per protocol, 1.29), at 8 peers 1.10. The ≤ 1.2x goal is not reliably met: the
agreed p50 is ~20-45 ms above the runner's (0.17-0.21 s against 0.14-0.18 s). What is left of
the gap is the agreed round's own work on 2 shared cores: the deterministic float64 update
(~5 ms), hashing the new model (~7 ms), and the model's 4 MB put every round (~10 ms of Python
and ~20 ms of daemon CPU), which the runner does not do. Putting the model only after the next
contribution is announced cut the agreed p50 by ~13 % in one A/B run, but then a peer that
resyncs in that window finds no model on an idle session (a memory store answers "not found"
at once): not adopted.
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
