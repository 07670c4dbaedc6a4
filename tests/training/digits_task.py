"""The digits task of the training-API tests: softmax regression, 3 peers, Dirichlet split.

The model and data come from ``examples/digits_model.py``; this module wraps them as the
training API's clients. Everything is seeded, so every process builds the same split.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from gradfed_ipfs.tensor import fedprox_gradient
from gradfed_ipfs.training import Client, ConfigValue, FederationConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from digits_model import (
    N_CLASSES,
    N_FEATURES,
    DigitsData,
    accuracy,
    gradient,
    load_data,
)

PEERS = 3
ROUNDS = 8
STEPS = 5
LR = 0.5
ALPHA = 0.5
SEED = 0


def data() -> DigitsData:
    """Return the seeded split of every test (same in every process)."""
    return load_data(PEERS, ALPHA, SEED)


def initial_model() -> np.ndarray:
    """Return the session's initial model (zeros, float32)."""
    return np.zeros(N_FEATURES * N_CLASSES, np.float32)


def loss(weights: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy of softmax regression."""
    logits = x @ np.asarray(weights, np.float64).reshape(N_FEATURES, N_CLASSES)
    logits -= logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(y)), y].mean())


def make_client(d: DigitsData, index: int) -> Client[np.ndarray]:
    """Return peer ``index``'s client: full-batch gradient steps on its part of the data."""
    rows = d.parts[index]
    x, y = d.x_train[rows], d.y_train[rows]

    def train(
        model: np.ndarray, config: Mapping[str, ConfigValue]
    ) -> tuple[np.ndarray, int, dict[str, float]]:
        w = np.asarray(model, np.float64).copy()
        w0 = w.copy()
        mu = float(config.get("proximal_mu", 0.0))
        for _ in range(int(config.get("local_steps", STEPS))):
            g = gradient(w, x, y)
            if mu:
                g = fedprox_gradient(g, w, w0, mu).astype(np.float64)
            w -= float(config.get("lr", LR)) * g
        return w.astype(np.float32), len(rows), {"accuracy": accuracy(w, x, y)}

    def evaluate(
        model: np.ndarray, config: Mapping[str, ConfigValue]
    ) -> tuple[float, int, dict[str, float]]:
        return loss(model, x, y), len(rows), {"accuracy": accuracy(model, x, y)}

    return Client(train=train, evaluate=evaluate)


def held_out_evaluate(d: DigitsData):  # type: ignore[no-untyped-def]
    """Return the ``evaluate_fn`` on the held-out test set."""

    def evaluate_fn(model: np.ndarray, server_round: int) -> tuple[float, dict[str, float]]:
        return loss(model, d.x_test, d.y_test), {"accuracy": accuracy(model, d.x_test, d.y_test)}

    return evaluate_fn


def federation(d: DigitsData, rounds: int = ROUNDS, **kwargs: object) -> FederationConfig:  # type: ignore[type-arg]
    """Return the tests' federation settings."""
    return FederationConfig(
        rounds=rounds,
        fit_metrics=("accuracy",),
        eval_metrics=("accuracy",),
        on_fit_config=lambda r: {"local_steps": STEPS, "lr": LR},
        evaluate_fn=held_out_evaluate(d),
        **kwargs,  # type: ignore[arg-type]
    )
