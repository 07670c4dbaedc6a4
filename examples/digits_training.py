"""The digits task through the training API (:mod:`gradfed_ipfs.training`), shared by every run.

One :class:`Task` (peers, rounds, local steps, learning rate, Dirichlet α, seed, rule) fixes the
split, the clients and the federation settings, so a peer process rebuilt from the same task
trains exactly what the in-process run trains. ``digits_processes.py`` runs it with one OS
process per peer; :func:`simulate` runs it in one process (in-memory pubsub and store); the
tests in ``tests/training/`` use both.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from gradfed_ipfs.tensor import Codec, fedprox_gradient
from gradfed_ipfs.training import (
    Client,
    ConfigValue,
    DiLoCo,
    FedAvg,
    FederationConfig,
    History,
    Robust,
    Strategy,
    VectorAdapter,
    run_simulation,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from digits_model import (
    N_CLASSES,
    N_FEATURES,
    Array,
    DigitsData,
    accuracy,
    gradient,
    load_data,
    parse_codec,
    parse_method,
)

Vector = NDArray[np.float32]


@dataclass(frozen=True)
class Task:
    """What every peer of one digits session must agree on (a peer process gets it as flags)."""

    peers: int = 4
    rounds: int = 20
    local_steps: int = 5
    lr: float = 0.5
    alpha: float = 1.0
    seed: int = 0
    method: str = "fedavg"
    diloco: bool = False
    compress: str = ""

    def data(self) -> DigitsData:
        """Return the seeded split (the same in every process)."""
        return load_data(self.peers, self.alpha, self.seed)

    def strategy(self) -> Strategy:
        """Return a fresh strategy: ``DiLoCo`` with ``diloco``, else ``FedAvg`` or ``Robust``."""
        if self.diloco:
            return DiLoCo(outer_lr=0.7, momentum=0.9)  # OpenDiLoCo's outer Nesterov SGD
        if self.method.lower() == "fedavg":
            return FedAvg()
        return Robust(parse_method(self.method, self.peers))

    def compression(self) -> Codec | None:
        """Return the agreed rounds' contribution codec (``None``: dense float32)."""
        return parse_codec(self.compress)

    def flags(self) -> list[str]:
        """Return the task as command-line flags of ``digits_processes.py peer``."""
        return [
            f"--peers={self.peers}", f"--rounds={self.rounds}",
            f"--local-steps={self.local_steps}", f"--lr={self.lr!r}",
            f"--alpha={self.alpha!r}", f"--seed={self.seed}", f"--method={self.method}",
            *(["--diloco"] if self.diloco else []), f"--compress={self.compress}",
        ]  # fmt: skip


def initial_model() -> Vector:
    """Return the session's initial model (zeros, float32, 650 values)."""
    return np.zeros(N_FEATURES * N_CLASSES, np.float32)


def loss(weights: NDArray[np.floating], x: Array, y: NDArray[np.int64]) -> float:
    """Mean cross-entropy of softmax regression."""
    logits = x @ np.asarray(weights, np.float64).reshape(N_FEATURES, N_CLASSES)
    logits -= logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(y)), y].mean())


def make_client(data: DigitsData, index: int, task: Task = Task()) -> Client[Vector]:
    """Return peer ``index``'s client: full-batch gradient steps on its part of the data.

    ``local_steps`` and ``lr`` come from the round's config (``task``'s by default), and a
    ``proximal_mu`` there (FedProx) adds the proximal term.
    """
    rows = data.parts[index]
    x, y = data.x_train[rows], data.y_train[rows]

    def train(
        model: Vector, config: Mapping[str, ConfigValue]
    ) -> tuple[Vector, int, dict[str, float]]:
        w = np.asarray(model, np.float64).copy()
        w0 = w.copy()
        mu = float(config.get("proximal_mu", 0.0))
        for _ in range(int(config.get("local_steps", task.local_steps))):
            g = gradient(w, x, y)
            if mu:
                g = fedprox_gradient(g, w, w0, mu).astype(np.float64)
            w -= float(config.get("lr", task.lr)) * g
        return w.astype(np.float32), len(rows), {"accuracy": accuracy(w, x, y)}

    def evaluate(
        model: Vector, config: Mapping[str, ConfigValue]
    ) -> tuple[float, int, dict[str, float]]:
        return loss(model, x, y), len(rows), {"accuracy": accuracy(model, x, y)}

    return Client(train=train, evaluate=evaluate)


def held_out_evaluate(
    data: DigitsData,
) -> Callable[[Vector, int], tuple[float, dict[str, float]]]:
    """Return the ``evaluate_fn`` on the held-out test set (loss, ``{"accuracy": ...}``)."""

    def evaluate_fn(model: Vector, server_round: int) -> tuple[float, dict[str, float]]:
        return loss(model, data.x_test, data.y_test), {
            "accuracy": accuracy(model, data.x_test, data.y_test)
        }

    return evaluate_fn


def federation(data: DigitsData, task: Task = Task(), **kwargs: object) -> FederationConfig[Vector]:
    """Return the federation settings of ``task`` (``kwargs`` override, e.g. ``fraction``)."""
    settings: dict[str, object] = {
        "rounds": task.rounds,
        "fit_metrics": ("accuracy",),
        "eval_metrics": ("accuracy",),
        "on_fit_config": lambda r: {"local_steps": task.local_steps, "lr": task.lr},
        "evaluate_fn": held_out_evaluate(data),
        **kwargs,
    }
    return FederationConfig(**settings)  # type: ignore[arg-type]


def final_accuracy(history: History) -> float:
    """Held-out test accuracy of the final global model, as this peer measured it."""
    return history.metrics_centralized()["accuracy"][-1][1]


def simulate(
    task: Task = Task(),
    strategy: Callable[[], Strategy] | None = None,
    session: str = "digits",
    **settings: object,
) -> list[History]:
    """Run ``task`` with every peer in this process (in-memory pubsub and store).

    ``strategy`` overrides the task's rule (a factory: one instance per peer); ``settings``
    override :class:`FederationConfig` fields.
    """
    data = task.data()
    return asyncio.run(
        run_simulation(
            [make_client(data, i, task) for i in range(task.peers)],
            adapter=VectorAdapter(),
            initial_model=initial_model(),
            config=federation(data, task, **settings),
            strategy=strategy or task.strategy,
            session=session,
            compression=task.compression(),
        )
    )
