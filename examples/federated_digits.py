"""Federated training of a softmax-regression model on scikit-learn's ``digits`` over Kubo.

Four peers (``--peers``), each beside its own Kubo daemon in a loopback :class:`KuboSwarm`,
hold a non-IID share of the training set (label proportions drawn from a seeded Dirichlet).
Two ways to run them:

- by default, in **one process**: each peer trains locally, commits its delta to its own
  daemon, announces the CID over pubsub, fetches the others' deltas by CID over bitswap,
  aggregates with ``--method`` and commits a verifiable round record (``digits_rounds.py``);
  the run is compared with centralized training on the pooled data (same steps);
- with ``--processes``, **one OS process per peer**, each talking only to its own daemon,
  through the training API's agreed rounds (``digits_processes.py``); every process ends on
  the same model CID, printed next to the in-process run of the same task
  (``digits_training.py``). There ``--diloco H`` trains H local steps a round under DiLoCo's
  outer Nesterov step, and ``--compress`` sends each contribution with that codec (int8, int4,
  int2, topk:R, topk:R,int8, topk:R,int2) with error feedback, inside the agreed rounds.

Options: ``--byzantine K`` makes the last K peers send their delta sign-flipped and scaled by 10;
``--dp-noise Z`` clips each delta to ``--dp-clip`` and adds Gaussian noise N(0, (Z·C)²) before it
leaves the peer (local, client-level DP), accounted per peer with an RDP accountant;
``--secagg`` sends sample-weighted deltas masked with the Bonawitz et al. protocol (peer 0 acts
as the aggregator: it fetches the masked vectors by CID and learns only their sum; the small
key-agreement messages are passed in-process, not over pubsub); ``--compress`` encodes deltas
with a codec and error feedback (with ``--processes``: the agreed rounds' contributions). The
first three need the one-process mode.

The data and model are in ``digits_model.py``. Run ``python examples/federated_digits.py --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from digits_model import load_data, plot_curves, single_threaded_blas, train_centralized
from digits_processes import PeerRun, run_processes
from digits_rounds import Node, Options, Result, check_options, run_federated
from digits_training import Task, final_accuracy, simulate

from gradfed_ipfs.errors import ConfigError, GradfedError
from gradfed_ipfs.training import History

__all__ = [
    "Node", "Options", "ProcessesRun", "Result", "check_options", "main", "plot", "run",
    "run_federated", "run_processes_mode", "task_of",
]  # fmt: skip

DEFAULT_PLOT = Path(__file__).resolve().parents[1] / "docs" / "img" / "federated_digits.png"


def run(options: Options, log: Callable[[str], None] = print, *, keep: bool = False) -> Result:
    """Start ``options.peers`` loopback Kubo daemons, train, and stop them.

    With ``keep``, the daemons stay up until the user presses Enter, and the command that
    re-verifies the last round record through one of them is printed.
    """
    from gradfed_ipfs.kubo import KuboSwarm

    with KuboSwarm(options.peers) as swarm:
        result = asyncio.run(run_federated(options, list(swarm), log))
        if keep and result.record_cids:
            api = next(iter(swarm)).api_url
            print(
                f"the daemons keep running; in another shell:\n"
                f"  gradfed-ipfs --api {api} history {result.record_cids[-1]}"
            )
            input("press Enter to stop them ")
        return result


def plot(result: Result, path: str | Path) -> Path:
    """Write a PNG of test accuracy against rounds, with the centralized reference line."""
    title = f"digits, softmax regression, {result.options.peers} peers over Kubo"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return plot_curves(
        result.accuracy, result.centralized, describe(result.options), title, Path(path)
    )


def describe(options: Options) -> str:
    """A short label of a run's settings."""
    parts = [options.method]
    if options.compress:
        parts.append(f"compress {options.compress}")
    if options.dp_noise is not None:
        parts.append(f"DP z={options.dp_noise}")
    if options.secagg:
        parts.append("SecAgg")
    if options.byzantine:
        parts.append(f"{options.byzantine} Byzantine")
    return "federated: " + ", ".join(parts)


def build_parser() -> argparse.ArgumentParser:
    """The example's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = Options()
    add = parser.add_argument
    add("--processes", action="store_true", help="one OS process per peer (training API)")
    add("--method", default=d.method, help="fedavg | median | trimmed:B | krum:F | multikrum:F[:M]")
    add(
        "--compress",
        default=None,
        help="codec for deltas: int8 | int4 | int2 | topk:R | topk:R,int8 | topk:R,int2",
    )
    add("--diloco", type=int, default=None, metavar="H", help="--processes: DiLoCo, H steps")
    add("--dp-noise", type=float, default=None, help="Gaussian noise multiplier z (local DP)")
    add("--dp-clip", type=float, default=d.dp_clip, help="L2 clip norm C of a delta (with DP)")
    add("--dp-delta", type=float, default=d.dp_delta, help="δ at which ε is reported")
    add("--secagg", action="store_true", help="secure aggregation (FedAvg only)")
    add("--byzantine", type=int, default=0, help="last K peers send -10x their delta")
    add("--rounds", type=int, default=d.rounds, help=f"federated rounds (default {d.rounds})")
    add("--local-steps", type=int, default=d.local_steps, help="local gradient steps per round")
    add("--lr", type=float, default=d.lr, help="learning rate")
    add("--alpha", type=float, default=d.alpha, help="Dirichlet α of the label split (non-IID)")
    add("--peers", type=int, default=d.peers, help="peers, one Kubo daemon each")
    add("--seed", type=int, default=d.seed, help="seed of the data split")
    add(
        "--plot",
        "--out",
        default=None,
        help=f"PNG path ('' for none; default {DEFAULT_PLOT}, none with --processes)",
    )
    add("--keep", action="store_true", help="keep the daemons up until Enter (to run history)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example; return the exit code."""
    args = build_parser().parse_args(argv)
    options = Options(
        method=args.method,
        compress=args.compress,
        dp_noise=args.dp_noise,
        dp_clip=args.dp_clip,
        dp_delta=args.dp_delta,
        secagg=args.secagg,
        byzantine=args.byzantine,
        rounds=args.rounds,
        local_steps=args.local_steps,
        lr=args.lr,
        alpha=args.alpha,
        peers=args.peers,
        seed=args.seed,
    )
    plot_path = args.plot if args.plot is not None else "" if args.processes else str(DEFAULT_PLOT)
    try:
        if args.processes:
            processes = run_processes_mode(options, keep=args.keep, diloco=args.diloco)
            return report_processes(options, processes, plot_path)
        if args.diloco is not None:
            raise ConfigError("--diloco H: only with --processes (the training API)")
        result = run(options, keep=args.keep)
    except GradfedError as exc:
        print(f"error ({type(exc).__name__}): {exc}", file=sys.stderr)
        return exc.exit_code
    except (TimeoutError, ChildProcessError) as exc:  # an announcement or a peer process
        print(f"error ({type(exc).__name__}): {exc}", file=sys.stderr)
        return 1
    print(
        f"final accuracy {result.final_accuracy:.4f} vs centralized "
        f"{result.centralized_accuracy:.4f} (gap {100 * result.gap:+.2f} points)"
    )
    print(
        f"peer samples {result.samples}; {result.bytes_committed:,} bytes committed in "
        f"{result.seconds:.1f}s; honest peers agree: {result.consistent}"
    )
    if result.epsilon is not None:
        print(f"privacy: ε = {result.epsilon:.3f} at δ = {options.dp_delta:g} per peer (RDP)")
    if result.record_cids:
        print(f"last round record: {result.record_cids[-1]}")
        print(
            f"history re-verified through {result.verified_on}: "
            f"{sum(result.verified)}/{len(result.verified)} rounds recomputed bit for bit"
            + ("" if args.keep else " (the daemons stop now; --keep to run history yourself)")
        )
    if plot_path:
        print(f"plot: {plot(result, plot_path)}")
    verified = all(result.verified)
    return 0 if result.consistent and verified and math.isfinite(result.final_accuracy) else 1


# --------------------------------------------------------------------------- --processes


def task_of(options: Options, *, keep: bool = False, diloco: int | None = None) -> Task:
    """The training-API task of ``options``; refuses what the processes mode does not do.

    ``diloco`` (``--diloco H``) trains ``H`` local steps a round (in place of
    ``--local-steps``) under DiLoCo's outer optimizer; ``options.compress`` is the agreed
    rounds' codec.
    """
    unsupported = {
        "--dp-noise": options.dp_noise is not None, "--secagg": options.secagg,
        "--byzantine": options.byzantine, "--keep": keep,
    }  # fmt: skip
    given = [flag for flag, value in unsupported.items() if value]
    if given:
        raise ConfigError(f"{', '.join(given)}: only without --processes (one-process mode)")
    if diloco is not None and (diloco < 1 or options.method.lower() != "fedavg"):
        raise ConfigError("--diloco H needs H >= 1 and --method fedavg (DiLoCo is the rule)")
    local_steps = options.local_steps if diloco is None else diloco
    if options.peers < 2 or options.rounds < 1 or local_steps < 1:
        raise ConfigError("--processes needs --peers >= 2, --rounds >= 1, --local-steps >= 1")
    task = Task(
        options.peers, options.rounds, local_steps, options.lr, options.alpha,
        options.seed, options.method, diloco is not None, options.compress or "",
    )  # fmt: skip
    task.strategy()  # an unknown --method fails here, before any daemon starts
    task.compression()  # and an unknown --compress
    return task


@dataclass
class ProcessesRun:
    """What ``--processes`` measured: each peer process, and the in-process reference."""

    task: Task
    peers: list[PeerRun]
    in_process: History
    centralized: list[float]

    @property
    def agreed(self) -> bool:
        """Whether every peer process ended on one model CID."""
        return len({p.model for p in self.peers}) == 1

    @property
    def reference_accuracy(self) -> float:
        """Final held-out accuracy of the in-process run of the same task."""
        return final_accuracy(self.in_process)


def run_processes_mode(
    options: Options,
    log: Callable[[str], None] = print,
    *,
    keep: bool = False,
    diloco: int | None = None,
) -> ProcessesRun:
    """Run the task in one process (reference), then as one OS process per peer over Kubo."""
    from gradfed_ipfs.kubo import KuboSwarm

    task = task_of(options, keep=keep, diloco=diloco)
    with single_threaded_blas():
        in_process = simulate(task, session=options.session)[0]
        data = load_data(task.peers, task.alpha, task.seed)
        centralized = train_centralized(data, task.rounds, task.local_steps, task.lr)
    log(f"in one process: accuracy {final_accuracy(in_process):.4f}; now {task.peers} processes")
    with KuboSwarm(task.peers) as swarm, tempfile.TemporaryDirectory(prefix="digits-") as tmp:
        peers = run_processes(task, list(swarm), Path(tmp), log=log)
    return ProcessesRun(task, peers, in_process, centralized)


def report_processes(options: Options, run: ProcessesRun, plot_path: str | Path = "") -> int:
    """Print each peer process's final accuracy and model CID beside the reference's."""
    for p in run.peers:
        print(
            f"peer {p.index} (pid {p.pid}, {p.api_url}): accuracy {p.accuracy:.4f}  model {p.model}"
        )
    reference = run.in_process.entries[-1].model
    print(f"in one process (training API): accuracy {run.reference_accuracy:.4f} model {reference}")
    print(f"centralized (same steps): accuracy {run.centralized[-1]:.4f}")
    same = run.agreed and run.peers[0].model == reference
    print(
        f"{len(run.peers)} peer processes on one model CID: {run.agreed}; "
        f"the in-process run's CID: {same}"
    )
    sent = sum(e.sent_bytes for e in run.peers[0].history.entries)
    print(f"peer 0 sent {sent:,} bytes of contributions ({run.task.compress or 'float32'})")
    if plot_path:
        curve = [a for r, a in run.peers[0].history.metrics_centralized()["accuracy"] if r >= 1]
        rule = f"DiLoCo H = {run.task.local_steps}" if run.task.diloco else options.method
        codec = f", {run.task.compress}" if run.task.compress else ""
        label = f"federated: {rule}{codec}, one process per peer"
        title = f"digits, softmax regression, {len(run.peers)} peer processes over Kubo"
        Path(plot_path).parent.mkdir(parents=True, exist_ok=True)
        print(f"plot: {plot_curves(curve, run.centralized, label, title, Path(plot_path))}")
    close = all(abs(p.accuracy - run.reference_accuracy) <= 0.01 for p in run.peers)
    return 0 if run.agreed and close else 1


if __name__ == "__main__":
    sys.exit(main())
