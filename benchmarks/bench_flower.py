"""Flower vs gradfed-ipfs's training API on the same task, split and local training.

Measures accuracy curves and run time of softmax regression on scikit-learn's ``digits``
(``examples/digits_model.py``), split over ``--peers`` peers by a seeded Dirichlet(``--alpha``)
on labels, ``--rounds`` FedAvg rounds of ``--steps`` full-batch steps, with the very same
``train`` function and test set on both sides. Ours:
:func:`gradfed_ipfs.training.run_simulation` (N peers in one process over the in-memory bus,
agreed rounds, no server).

Baseline (the ``bench`` extra): ``flwr.simulation.run_simulation`` with a ServerApp/ClientApp
pair when Ray is installed (``pip install "flwr[simulation]"``), else Flower's ``FedAvg``
strategy driven by a plain loop (``--flower loop``: Flower's aggregation, not its transport).

Run::

    python benchmarks/bench_flower.py
    python benchmarks/bench_flower.py --rounds 15 --steps 5 --flower loop

Results: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from digits_model import (  # noqa: E402
    N_CLASSES,
    N_FEATURES,
    DigitsData,
    accuracy,
    gradient,
    load_data,
)

from gradfed_ipfs.training import (  # noqa: E402
    Client,
    FedAvg,
    FederationConfig,
    VectorAdapter,
    run_simulation,
)

Curve = list[float]


def train_fn(
    data: DigitsData, index: int, steps: int, lr: float
) -> Callable[[np.ndarray], tuple[np.ndarray, int, dict[str, float]]]:
    """Return peer ``index``'s local training: ``steps`` full-batch steps from ``weights``."""
    rows = data.parts[index]
    x, y = data.x_train[rows], data.y_train[rows]

    def train(weights: np.ndarray) -> tuple[np.ndarray, int, dict[str, float]]:
        w = np.asarray(weights, np.float64).reshape(-1).copy()
        for _ in range(steps):
            w -= lr * gradient(w, x, y)
        return w.astype(np.float32), len(rows), {"accuracy": accuracy(w, x, y)}

    return train


def test_accuracy(data: DigitsData, weights: np.ndarray) -> float:
    """Accuracy of ``weights`` on the held-out test set."""
    return accuracy(np.asarray(weights).reshape(-1), data.x_test, data.y_test)


# --------------------------------------------------------------------------- gradfed-ipfs


def run_ours(data: DigitsData, args: argparse.Namespace) -> tuple[Curve, float]:
    """Run the training API; return the test accuracy after each round and the wall time."""
    clients = []
    for i in range(args.peers):
        local = train_fn(data, i, args.steps, args.lr)

        def train(
            model: np.ndarray, config: Mapping[str, Any], local: Any = local
        ) -> tuple[np.ndarray, int, dict[str, float]]:
            return local(model)  # type: ignore[no-any-return]

        clients.append(Client(train=train))
    config = FederationConfig(
        rounds=args.rounds,
        fit_metrics=("accuracy",),
        evaluate_fn=lambda w, r: (0.0, {"accuracy": test_accuracy(data, w)}),
        final_evaluation=False,
    )
    started = time.perf_counter()
    histories = asyncio.run(
        run_simulation(
            clients,
            adapter=VectorAdapter(),
            initial_model=np.zeros(N_FEATURES * N_CLASSES, np.float32),
            config=config,
            strategy=FedAvg,
        )
    )
    seconds = time.perf_counter() - started
    curve = [a for r, a in histories[0].metrics_centralized()["accuracy"] if r >= 1]
    return curve, seconds


# --------------------------------------------------------------------------- Flower


def flower_strategy(data: DigitsData, curve: Curve, peers: int) -> Any:
    """Flower's FedAvg with a centralized ``evaluate_fn`` appending to ``curve``."""
    from flwr.common import ndarrays_to_parameters
    from flwr.server.strategy import FedAvg as FlowerFedAvg

    def evaluate_fn(
        server_round: int, parameters: list[np.ndarray], config: dict[str, Any]
    ) -> tuple[float, dict[str, float]]:
        if server_round > 0:
            curve.append(test_accuracy(data, parameters[0]))
        return 0.0, {}

    def weighted(metrics: list[tuple[int, dict[str, Any]]]) -> dict[str, float]:
        total = sum(n for n, _ in metrics)
        return {"accuracy": sum(n * float(m["accuracy"]) for n, m in metrics) / total}

    return FlowerFedAvg(
        fraction_fit=1.0,
        fit_metrics_aggregation_fn=weighted,
        fraction_evaluate=0.0,
        min_fit_clients=peers,
        min_available_clients=peers,
        evaluate_fn=evaluate_fn,
        initial_parameters=ndarrays_to_parameters([np.zeros(N_FEATURES * N_CLASSES, np.float32)]),
    )


def run_flower_simulation(data: DigitsData, args: argparse.Namespace) -> tuple[Curve, float]:
    """Flower's ``run_simulation`` (Ray backend): ServerApp + ClientApp + NumPyClient."""
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import Context
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.simulation import run_simulation as flower_run_simulation

    curve: Curve = []

    class DigitsClient(NumPyClient):  # type: ignore[misc]
        def __init__(self, index: int) -> None:
            self.train = train_fn(data, index, args.steps, args.lr)

        def fit(
            self, parameters: list[np.ndarray], config: dict[str, Any]
        ) -> tuple[list[np.ndarray], int, dict[str, float]]:
            w, n, metrics = self.train(parameters[0])
            return [w], n, metrics

    def client_fn(context: Context) -> Any:
        return DigitsClient(int(context.node_config["partition-id"])).to_client()

    def server_fn(context: Context) -> ServerAppComponents:
        return ServerAppComponents(
            strategy=flower_strategy(data, curve, args.peers),
            config=ServerConfig(num_rounds=args.rounds),
        )

    started = time.perf_counter()
    flower_run_simulation(
        server_app=ServerApp(server_fn=server_fn),
        client_app=ClientApp(client_fn=client_fn),
        num_supernodes=args.peers,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    return curve, time.perf_counter() - started


def run_flower_loop(data: DigitsData, args: argparse.Namespace) -> tuple[Curve, float]:
    """Flower's ``FedAvg.aggregate_fit`` and ``evaluate`` driven by a plain loop (no Ray)."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

    curve: Curve = []
    strategy = flower_strategy(data, curve, args.peers)
    trains = [train_fn(data, i, args.steps, args.lr) for i in range(args.peers)]
    started = time.perf_counter()
    parameters = strategy.initialize_parameters(None)
    for server_round in range(1, args.rounds + 1):
        weights = parameters_to_ndarrays(parameters)[0]
        results = []
        for train in trains:
            w, n, metrics = train(weights)
            fit = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([w]), n, metrics)
            results.append((None, fit))
        parameters, _ = strategy.aggregate_fit(server_round, results, [])
        strategy.evaluate(server_round, parameters)
    return curve, time.perf_counter() - started


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--flower", choices=["auto", "simulation", "loop"], default="auto")
    args = parser.parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    data = load_data(args.peers, args.alpha, args.seed)
    print(
        f"digits softmax regression, {args.peers} peers, Dirichlet({args.alpha}) split, "
        f"{args.rounds} rounds x {args.steps} local steps (lr {args.lr})"
    )
    ours, ours_s = run_ours(data, args)
    if importlib.util.find_spec("flwr") is None:
        print("Flower is not installed (pip install -e '.[bench]'); only ours:")
        flower: Curve = []
        flower_s, how = float("nan"), "absent"
    else:
        has_ray = importlib.util.find_spec("ray") is not None
        how = (
            "simulation"
            if args.flower == "simulation" or (args.flower == "auto" and has_ray)
            else "loop"
        )
        runner = run_flower_simulation if how == "simulation" else run_flower_loop
        flower, flower_s = runner(data, args)
    print(f"\n{'round':>5} {'gradfed-ipfs':>13} {'flower':>8}")
    for r in range(args.rounds):
        theirs = f"{flower[r]:8.4f}" if r < len(flower) else f"{'-':>8}"
        print(f"{r + 1:5d} {ours[r]:13.4f} {theirs}")
    print(f"\ngradfed-ipfs run_simulation (agreed rounds, memory bus): {ours_s:6.2f} s")
    print(f"Flower ({how}): {flower_s:6.2f} s")
    if flower:
        print(f"final accuracy difference: {100 * (ours[-1] - flower[-1]):+.2f} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
