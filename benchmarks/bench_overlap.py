"""What overlapping the exchange with training costs in convergence (``FederationConfig.overlap``).

Runs the digits task of ``examples/digits_training.py`` (softmax regression on scikit-learn's
``digits``, ``--peers`` peers, Dirichlet(``--alpha``) split, ``--rounds`` rounds of
``--local-steps`` full-batch steps) in one process over the in-memory bus, with the same seed
and split, for each strategy (``--strategies``: FedAvg, DiLoCo's Nesterov outer step) under
three settings: no overlap (the baseline), ``overlap=True`` from the estimate of the pending
round's model (``overlap_start="estimate"``, the default) and from its base (``"base"``, a plain
one-round-stale update). It prints the held-out loss of the global model after a quarter, half
and all of the rounds, the final held-out accuracy, and the ratio of the final loss to the
baseline's.

This measures convergence only: over the memory bus an exchange takes milliseconds, so there is
no wall time to win here; the time overlap saves per round is at most the shorter of the
exchange and the local training.

Run::

    python benchmarks/bench_overlap.py
    python benchmarks/bench_overlap.py --rounds 40 --local-steps 20 --alpha 0.3

Results: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from digits_training import Task, final_accuracy, simulate  # noqa: E402

from gradfed_ipfs.training import DiLoCo, FedAdam, FedAvg, History, Strategy  # noqa: E402

STRATEGIES: dict[str, Callable[[], Strategy]] = {
    "fedavg": FedAvg,
    "diloco": DiLoCo,
    "fedadam": lambda: FedAdam(eta=0.05),
}
SETTINGS: dict[str, dict[str, object]] = {
    "no overlap": {"overlap": False},
    "overlap, estimate": {"overlap": True, "overlap_start": "estimate"},
    "overlap, base": {"overlap": True, "overlap_start": "base"},
}


def held_out_losses(history: History) -> list[float]:
    """Held-out loss of the global model after each round (index 0: the initial model)."""
    return [loss for _, loss in history.losses_centralized()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--local-steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategies", nargs="+", default=["fedavg", "diloco"])
    args = parser.parse_args()
    logging.getLogger("gradfed_ipfs").setLevel(logging.WARNING)
    task = Task(args.peers, args.rounds, args.local_steps, args.lr, args.alpha, args.seed)
    quarter, half = max(1, args.rounds // 4), max(1, args.rounds // 2)
    print(f"digits, {task}")
    print(f"{'strategy':8} {'setting':18} {'loss@' + str(quarter):>9} {'loss@' + str(half):>9}"
          f" {'final':>8} {'acc':>6} {'vs base':>8}")  # fmt: skip
    for name in args.strategies:
        baseline = None
        for setting, extra in SETTINGS.items():
            histories = simulate(task, STRATEGIES[name], f"bench-{name}", **extra)
            losses = held_out_losses(histories[0])
            assert len({h.entries[-1].model for h in histories}) == 1  # one CID on every peer
            final = losses[args.rounds]
            baseline = final if baseline is None else baseline
            print(f"{name:8} {setting:18} {losses[quarter]:9.4f} {losses[half]:9.4f} {final:8.4f}"
                  f" {final_accuracy(histories[0]):6.3f} {final / baseline:8.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
