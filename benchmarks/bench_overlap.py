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

With ``--timing`` it measures wall time instead: FedAvg without and with overlap, each
peer's ``train`` padded by ``--train-seconds`` of sleep (compute that releases the GIL, as
PyTorch's kernels do) and every pubsub message delivered ``--latency`` seconds after it is
published (a slow link; the shared in-memory store stays instant). It prints the seconds per
round and the held-out loss. Overlap can save at most the shorter of the exchange and the
training per round.

Run::

    python benchmarks/bench_overlap.py
    python benchmarks/bench_overlap.py --rounds 40 --local-steps 20 --alpha 0.3
    python benchmarks/bench_overlap.py --timing --train-seconds 0.3 --latency 0.1

Results: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from digits_training import (  # noqa: E402
    Task,
    federation,
    final_accuracy,
    initial_model,
    make_client,
    simulate,
)

from gradfed_ipfs import AgreedConfig  # noqa: E402
from gradfed_ipfs.kubo import MemoryPubsubBus, PubsubTransport, PubsubWrapper  # noqa: E402
from gradfed_ipfs.storage import MemoryBlockStore  # noqa: E402
from gradfed_ipfs.training import (  # noqa: E402
    Client,
    ConfigValue,
    DiLoCo,
    FedAdam,
    FedAvg,
    History,
    Peer,
    Strategy,
    VectorAdapter,
)
from gradfed_ipfs.training.simulation import SIMULATION_TIMING  # noqa: E402

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


class SlowLink(PubsubWrapper):
    """A pubsub transport whose messages reach the others ``latency`` seconds after publishing."""

    def __init__(self, inner: PubsubTransport, latency: float) -> None:
        super().__init__(inner)
        self.latency = latency
        self.pending: set[asyncio.Task[None]] = set()

    async def publish(self, topic: str, data: bytes) -> None:
        task = asyncio.get_running_loop().create_task(self._later(topic, data))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _later(self, topic: str, data: bytes) -> None:
        await asyncio.sleep(self.latency)
        await self.inner.publish(topic, data)

    async def aclose(self) -> None:
        for task in list(self.pending):
            task.cancel()
        await self.inner.aclose()


def padded(client: Client[object], seconds: float) -> Client[object]:
    """``client`` whose ``train`` also sleeps ``seconds`` (compute that releases the GIL)."""

    def train(
        model: object, config: Mapping[str, ConfigValue]
    ) -> tuple[object, int, dict[str, float]]:
        time.sleep(seconds)
        out, n, metrics = client.train(model, dict(config))
        return out, n, dict(metrics)

    return Client(train=train, evaluate=client.evaluate)


async def timed_run(
    task: Task, overlap: bool, latency: float, train_seconds: float
) -> list[History]:
    """Run ``task`` with FedAvg over slow links; return the peers' histories."""
    data, bus = task.data(), MemoryPubsubBus()
    members = tuple(f"peer-{i}" for i in range(task.peers))
    agreed = AgreedConfig(members=members, **SIMULATION_TIMING)  # type: ignore[arg-type]
    config = federation(data, task, overlap=overlap)
    async with MemoryBlockStore() as store:
        peers = [
            Peer(
                store=store,
                pubsub=SlowLink(bus.endpoint(peer_id), latency),
                client=padded(make_client(data, i, task), train_seconds),  # type: ignore[arg-type]
                adapter=VectorAdapter(),
                initial_model=initial_model(),
                config=config,
                agreed=agreed,
                strategy=FedAvg(),
                session=f"timing-{overlap}",
            )
            for i, peer_id in enumerate(members)
        ]
        return list(await asyncio.gather(*(peer.run() for peer in peers)))


def timing(task: Task, args: argparse.Namespace) -> None:
    """Print seconds per round and the final held-out loss, without and with overlap."""
    print(f"digits, {task}, train +{args.train_seconds} s, link latency {args.latency} s")
    print(f"{'setting':12} {'s/round':>8} {'final loss':>11}")
    for overlap in (False, True):
        histories = asyncio.run(timed_run(task, overlap, args.latency, args.train_seconds))
        assert len({h.entries[-1].model for h in histories}) == 1  # one CID on every peer
        per_round = max(h.seconds for h in histories) / (args.rounds + 1)
        final = held_out_losses(histories[0])[args.rounds]
        print(f"{'overlap' if overlap else 'no overlap':12} {per_round:8.3f} {final:11.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--local-steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategies", nargs="+", default=["fedavg", "diloco"])
    parser.add_argument("--timing", action="store_true", help="measure wall time instead")
    parser.add_argument("--train-seconds", type=float, default=0.3)
    parser.add_argument("--latency", type=float, default=0.1)
    args = parser.parse_args()
    logging.getLogger("gradfed_ipfs").setLevel(logging.WARNING)
    task = Task(args.peers, args.rounds, args.local_steps, args.lr, args.alpha, args.seed)
    if args.timing:
        timing(task, args)
        return
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
