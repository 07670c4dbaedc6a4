"""CPU of a CometBFT chain with no rounds: what N co-located validators cost per block.

Starts N loopback validators (each with its Python ABCI app) for each block timing, lets the
chain make blocks without transactions for ``--seconds``, and prints blocks, the validators'
CPU (``cometbft`` nodes, then their apps) per block and as a share of one core. With
``idle_interval`` 0 an idle chain makes a block every ``timeout_commit``, as a busy one does:
this is the floor of the control plane's CPU on a machine that hosts every validator
(``bench_rounds.py --control cometbft``).

    python benchmarks/bench_chain_idle.py --validators 4 8 16 --block-intervals 0.3/0/0.1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_rounds import block_timing, cpu_seconds, load  # noqa: E402

from gradfed_ipfs.cometbft import BlockTiming, CometNetwork  # noqa: E402


def chain_cpu(network: CometNetwork) -> tuple[float, float]:
    """CPU seconds used so far by the network's ``cometbft`` nodes and by their apps."""
    nodes = sum(cpu_seconds(v.pid) for v in network if v.pid is not None)
    apps = sum(cpu_seconds(v.app_pid) for v in network if v.app_pid is not None)
    return nodes, apps


def measure(n: int, arm: str, timing: BlockTiming, seconds: float) -> None:
    """Run an idle chain of ``n`` validators for ``seconds``; print its blocks and CPU."""
    network = CometNetwork(n, timing=timing)
    network.prepare()
    network.launch()
    try:
        network.wait_for_height(3, timeout=180)
        (h0, _), (n0, a0), t0 = network[0].latest(), chain_cpu(network), time.monotonic()
        time.sleep(seconds)  # the measured interval itself, not a synchronisation
        (h1, _), (n1, a1), t1 = network[0].latest(), chain_cpu(network), time.monotonic()
    finally:
        network.stop()
    blocks, wall = max(h1 - h0, 1), t1 - t0
    print(f"{n:>3} validators, timing {arm}: {h1 - h0} blocks in {wall:.0f} s"
          f" (one per {wall / blocks:.3f} s); nodes {n1 - n0:.1f} s CPU"
          f" ({(n1 - n0) / blocks * 1e3:.0f} ms a block, {(n1 - n0) / blocks / n * 1e3:.0f} ms"
          f" a node), apps {a1 - a0:.1f} s; {(n1 - n0 + a1 - a0) / wall:.0%} of a core;"
          f" load {load()}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--validators", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument(
        "--block-intervals", nargs="+", default=["0.3/0/0.1"],
        help="block timings, each TC[/EMPTY[/GOSSIP]] seconds (as bench_rounds.py's)",
    )  # fmt: skip
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    print(f"idle CometBFT chain, {time.strftime('%Y-%m-%d %H:%M')}, load average {load()}")
    for arm in args.block_intervals:
        for n in args.validators:
            measure(n, arm, block_timing(arm), args.seconds)


if __name__ == "__main__":
    main()
