"""A member's task file: least squares on the member's own seeded shard.

Run by ``gradfed-ipfs train --federation F examples/federation_task.py`` (the federation tests and
docker-compose.members.yml use it). Every member draws its data from ``GRADFED_TASK_SEED`` and its
index, so the members' shards differ and the federation's model converges to the shared true
weights; ``GRADFED_TASK_ROUNDS`` sets the rounds (default 10) and ``GRADFED_TASK_SECONDS`` the
seconds each local training takes at least (default 0: a stand-in for real compute, so that
members can join and leave while the others train). With ``GRADFED_TASK_GATE=FILE`` the
training of server round ``s`` waits until FILE holds a number ``>= s`` (printing ``task:
round s at the gate`` on stderr first): the federation tests pace the rounds with it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from gradfed_ipfs.federation import Member, Task
from gradfed_ipfs.training import Client, FederationConfig, VectorAdapter

DIM = 8
TRUE_WEIGHTS = np.linspace(-1.0, 1.0, DIM, dtype=np.float32)


def wait_for_gate(server_round: object) -> None:
    """Wait until ``$GRADFED_TASK_GATE`` lets ``server_round`` train (no gate: at once)."""
    gate = os.environ.get("GRADFED_TASK_GATE")
    if gate is not None and isinstance(server_round, int):
        print(f"task: round {server_round} at the gate", file=sys.stderr, flush=True)
    while gate is not None and isinstance(server_round, int):
        try:
            allowed = int(Path(gate).read_text().strip() or 0)
        except (OSError, ValueError):
            allowed = 0
        if allowed >= server_round:
            return
        time.sleep(0.05)  # the test opens the gate: a round's training waits for it


def task(member: Member) -> Task:
    seed = int(os.environ.get("GRADFED_TASK_SEED", "0"))
    rng = np.random.default_rng([seed, member.index])
    compute = float(os.environ.get("GRADFED_TASK_SECONDS", "0"))
    features = rng.normal(size=(64, DIM)).astype(np.float32)
    targets = features @ TRUE_WEIGHTS + 0.01 * rng.normal(size=64).astype(np.float32)

    def loss_of(weights: np.ndarray) -> float:
        return float(np.mean((features @ weights - targets) ** 2))

    def train(
        weights: np.ndarray, config: Mapping[str, object]
    ) -> tuple[np.ndarray, int, dict[str, float]]:
        wait_for_gate(config.get("server_round"))
        time.sleep(compute)  # a stand-in for a real model's training time
        local = weights.astype(np.float32).copy()
        for _ in range(5):
            gradient = 2 * features.T @ (features @ local - targets) / len(targets)
            local -= np.float32(0.05) * gradient.astype(np.float32)
        return local, len(targets), {}

    def evaluate(
        weights: np.ndarray, config: Mapping[str, object]
    ) -> tuple[float, int, dict[str, float]]:
        return loss_of(weights), len(targets), {}

    rounds = int(os.environ.get("GRADFED_TASK_ROUNDS", "10"))
    return Task(
        client=Client(train=train, evaluate=evaluate),
        adapter=VectorAdapter(),
        initial_model=np.zeros(DIM, np.float32),
        config=FederationConfig(rounds=rounds, final_evaluation=False),
    )
