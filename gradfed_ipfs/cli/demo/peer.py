"""One peer of ``gradfed-ipfs demo``: an OS process beside its own Kubo daemon.

``python -m gradfed_ipfs.cli.demo.peer --api URL --index I --members ID,ID,... --rounds R``
talks only to the daemon at ``URL`` (a :class:`~gradfed_ipfs.Node`), joins the agreed session
with :meth:`~gradfed_ipfs.Node.session`, and runs ``R`` rounds of :class:`DemoTask`: it trains
the agreed model on its own part of the data and contributes the update, weighted by its sample
count. It prints JSON lines on stdout: ``start`` (peer ID, genesis, samples, loss), one
``round`` per round (model CID, loss) and ``final`` (model and record CIDs, loss); or ``error``
and exit status 1. It lingers after the last round until every member has announced it, so
nobody stops answering while another still needs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from ..._types import FloatArray
from ...federated.agreed.config import AgreedConfig
from ...node import Node

__all__ = ["DEMO_TIMING", "DemoTask", "main", "run_peer"]

DEMO_TIMING: Final[dict[str, float]] = {
    "collect_timeout": 20.0,
    "takeover_timeout": 10.0,
    "round_timeout": 60.0,
    "announce_interval": 0.2,
    "max_announce_interval": 1.0,
    "fetch_timeout": 20.0,
}
"""Agreed-round timing over loopback daemons (seconds), generous for a loaded machine."""

Float64Array = NDArray[np.float64]


@dataclass(frozen=True)
class DemoTask:
    """Seeded linear regression ``y = X·w + b + noise`` on synthetic data, split across peers.

    Peer ``i`` holds a contiguous part of the ``samples`` rows, sized in proportion to
    ``i + 1`` (so FedAvg's sample weights matter). The model is float32 ``(features + 1,)``:
    the weights, then the bias; it starts at zero. A round's update is ``local_steps`` steps of
    gradient descent (step ``lr``) on the peer's mean squared error, as new minus old model.
    """

    peers: int = 3
    seed: int = 0
    features: int = 8
    samples: int = 600
    local_steps: int = 5
    lr: float = 0.1
    noise: float = 0.1

    def data(self) -> tuple[Float64Array, Float64Array]:
        """Return every peer's rows ``X (samples, features)`` and targets ``y (samples,)``."""
        rng = np.random.default_rng(self.seed)
        x = rng.standard_normal((self.samples, self.features))
        w, b = rng.standard_normal(self.features), float(rng.standard_normal())
        y = x @ w + b + self.noise * rng.standard_normal(self.samples)
        return x, y

    def part(self, index: int) -> tuple[Float64Array, Float64Array]:
        """Return peer ``index``'s rows and targets."""
        shares = np.arange(1, self.peers + 1, dtype=np.float64)
        bounds = np.rint(np.concatenate([[0.0], np.cumsum(shares)]) / shares.sum() * self.samples)
        lo, hi = int(bounds[index]), int(bounds[index + 1])
        x, y = self.data()
        return x[lo:hi], y[lo:hi]

    def initial_model(self) -> FloatArray:
        """Return the session's initial model: zeros, float32 ``(features + 1,)``."""
        return np.zeros(self.features + 1, np.float32)

    @staticmethod
    def loss(model: FloatArray, x: Float64Array, y: Float64Array) -> float:
        """Return the mean squared error of ``model`` on ``(x, y)``."""
        params = model.astype(np.float64)
        return float(np.mean((x @ params[:-1] + params[-1] - y) ** 2))

    def update(self, model: FloatArray, index: int) -> tuple[FloatArray, int]:
        """Train ``model`` on peer ``index``'s part; return ``(new - model, samples)``."""
        x, y = self.part(index)
        params = model.astype(np.float64)
        for _ in range(self.local_steps):
            residual = x @ params[:-1] + params[-1] - y
            grad = np.concatenate([2 * x.T @ residual, [2 * residual.sum()]]) / len(y)
            params -= self.lr * grad
        return (params - model).astype(np.float32), len(y)


def emit(event: str, **fields: Any) -> None:
    """Print one JSON line on stdout (what the parent reads)."""
    print(json.dumps({"event": event, **fields}), flush=True)


async def run_peer(
    api: str, index: int, members: Sequence[str], session: str, rounds: int, task: DemoTask
) -> None:
    """Run peer ``index``'s rounds against the daemon at ``api``, printing its events."""
    x, y = task.data()
    async with Node(api, timeout=DEMO_TIMING["fetch_timeout"]) as node:
        config = AgreedConfig(members=tuple(members), **DEMO_TIMING)  # type: ignore[arg-type]
        agreed = await node.session(session, task.initial_model(), config)
        emit(
            "start", peer=agreed.peer_id, genesis=str(agreed.genesis),
            samples=len(task.part(index)[1]), loss=task.loss(agreed.model, x, y),
        )  # fmt: skip
        while agreed.round < rounds:
            update, samples = task.update(agreed.model, index)
            result = await agreed.run_round(update, weight=samples)
            emit(
                "round", round=result.round, model=str(result.model),
                peers=len(result.roster.peers), loss=task.loss(agreed.model, x, y),
                seconds=round(result.seconds, 3),
            )  # fmt: skip
        heard = await agreed.linger(timeout=DEMO_TIMING["round_timeout"])
        emit(
            "final", model=str(agreed.model_cid), record=str(agreed.head),
            loss=task.loss(agreed.model, x, y), lingered=len(heard),
        )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of one peer process; returns its exit status."""
    parser = argparse.ArgumentParser(prog="python -m gradfed_ipfs.cli.demo.peer")
    add = parser.add_argument
    add("--api", required=True, help="this peer's own Kubo daemon (RPC URL)")
    add("--index", type=int, required=True, help="this peer's part of the data")
    add("--members", required=True, help="comma-separated peer IDs of every member")
    add("--session", default="demo")
    add("--rounds", type=int, default=5)
    add("--seed", type=int, default=0)
    add("--deadline", type=float, default=120.0, help="seconds before this peer gives up")
    args = parser.parse_args(argv)
    members = args.members.split(",")
    task = DemoTask(peers=len(members), seed=args.seed)
    started = time.monotonic()
    run = run_peer(args.api, args.index, members, args.session, args.rounds, task)
    try:
        asyncio.run(asyncio.wait_for(run, args.deadline))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # reported to the parent, which prints it
        if isinstance(exc, TimeoutError):
            exc = TimeoutError(f"not done after {time.monotonic() - started:.1f} s")
        emit("error", kind=type(exc).__name__, message=str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
