"""``FederationConfig(overlap=True)``: round r + 1 trains while round r's exchange runs.

A least-squares task over 3 in-process peers (in-memory bus and store). The update a peer sends
in round r + 1 is trained from round r's base (one round stale); the agreed rule is unchanged,
so every peer still ends each round on one model CID.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping

import numpy as np
import pytest

from gradfed_ipfs import ConfigError
from gradfed_ipfs.training import (
    Client,
    ConfigValue,
    DiLoCo,
    FedAvg,
    FederationConfig,
    FitResult,
    History,
    SecAgg,
    VectorAdapter,
    run_simulation,
)

PEERS, D, ROUNDS, STEPS, LR = 3, 8, 6, 10, 0.05
WAIT = 30.0  # seconds; a rendezvous that is not met fails the test instead of hanging


def peer_data(index: int) -> tuple[np.ndarray, np.ndarray]:
    """Peer ``index``'s 40 rows of ``y = X w* + noise`` (its own feature scales: non-IID)."""
    rng = np.random.default_rng([7, index])
    x = rng.standard_normal((40, D)) * (1.0 + index * np.arange(D) / D)
    w_star = np.random.default_rng(99).standard_normal(D)
    return x, x @ w_star + 0.01 * rng.standard_normal(40)


def mse(w: np.ndarray) -> float:
    """Mean squared error of ``w`` over every peer's rows."""
    parts = [peer_data(i) for i in range(PEERS)]
    return float(np.mean([np.mean((x @ w - y) ** 2) for x, y in parts]))


class Recorder:
    """The models a peer's client was given: to ``train`` and (bases) to ``evaluate``."""

    def __init__(self) -> None:
        self.trained_from: list[bytes] = []
        self.trained: list[np.ndarray] = []  # what train returned
        self.bases: list[bytes] = []


def make_client(index: int, recorder: Recorder) -> Client[np.ndarray]:
    x, y = peer_data(index)

    def train(
        model: np.ndarray, config: Mapping[str, ConfigValue]
    ) -> tuple[np.ndarray, int, dict[str, float]]:
        recorder.trained_from.append(model.tobytes())
        w = model.astype(np.float64)
        for _ in range(STEPS):  # the inner loop: H local gradient steps
            w -= LR * 2 * x.T @ (x @ w - y) / len(y)
        recorder.trained.append(w.astype(np.float32))
        return recorder.trained[-1], len(y), {}

    def evaluate(
        model: np.ndarray, config: Mapping[str, ConfigValue]
    ) -> tuple[float, int, dict[str, float]]:
        recorder.bases.append(model.tobytes())
        return float(np.mean((x @ model - y) ** 2)), len(y), {}

    return Client(train=train, evaluate=evaluate)


def simulate(
    overlap: bool, strategy: object = None, start: str = "estimate"
) -> tuple[list[History], list[Recorder]]:
    recorders = [Recorder() for _ in range(PEERS)]
    config: FederationConfig[np.ndarray] = FederationConfig(
        rounds=ROUNDS,
        overlap=overlap,
        overlap_start=start,  # type: ignore[arg-type]
    )
    histories = asyncio.run(
        run_simulation(
            [make_client(i, r) for i, r in enumerate(recorders)],
            adapter=VectorAdapter(),
            initial_model=np.zeros(D, np.float32),
            config=config,
            strategy=strategy or FedAvg,  # type: ignore[arg-type]
            session=f"overlap-{overlap}-{start}",
        )
    )
    return histories, recorders


def final_model(recorders: list[Recorder]) -> np.ndarray:
    return np.frombuffer(recorders[0].bases[-1], np.float32)  # the evaluation round's base


def one_cid_per_round(histories: list[History]) -> None:
    for r in range(ROUNDS + 1):
        assert len({h.entries[r].model for h in histories}) == 1, r
        assert histories[0].entries[r].results == (PEERS if r < ROUNDS else 0), r


def test_overlapped_from_the_estimate_trains_from_the_own_step_and_learns() -> None:
    histories, recorders = simulate(True, FedAvg)
    one_cid_per_round(histories)
    for rec in recorders:
        assert len(rec.bases) == ROUNDS + 1  # each round's base, and the final model
        assert rec.trained_from[0] == rec.bases[0]  # round 0 trains as usual
        for k in range(ROUNDS - 1):
            # Round k + 1 trains from round k's base moved by this peer's own round-k update.
            own = rec.trained[k] - np.frombuffer(rec.trained_from[k], np.float32)
            base = np.frombuffer(rec.bases[k], np.float32)
            guess, _ = FedAvg().aggregate(base, [FitResult("me", own, 40)], 1.0, None)
            assert rec.trained_from[k + 1] == guess.tobytes(), k
    assert mse(final_model(recorders)) < 0.05 * mse(np.zeros(D))


def test_overlapped_diloco_agrees_and_learns() -> None:
    histories, recorders = simulate(True, DiLoCo)
    one_cid_per_round(histories)
    assert histories[0].strategy.startswith("diloco")
    assert mse(final_model(recorders)) < 0.05 * mse(np.zeros(D))


def test_overlapped_from_the_base_sends_one_round_stale_updates() -> None:
    histories, recorders = simulate(True, FedAvg, start="base")
    one_cid_per_round(histories)
    for rec in recorders:
        # Round 0 and round 1 train from the genesis; round k >= 1 from round k - 1's base.
        assert rec.trained_from == [rec.bases[0], *rec.bases[: ROUNDS - 1]]
    assert mse(final_model(recorders)) < mse(np.zeros(D))  # it learns, but oscillates


def test_without_overlap_each_round_trains_from_its_own_base() -> None:
    _, recorders = simulate(False)
    for rec in recorders:
        assert rec.trained_from == rec.bases[:ROUNDS]
    overlapped = final_model(simulate(True)[1])
    assert final_model(recorders).tobytes() != overlapped.tobytes()  # a different algorithm
    assert mse(final_model(recorders)) < 0.05 * mse(np.zeros(D))
    with pytest.raises(ConfigError, match="overlap_start"):
        FederationConfig(rounds=1, overlap_start="latest")  # type: ignore[arg-type]


class Rendezvous:
    """Counts, per round, the trains that started and the peers whose round finished."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.started: dict[int, int] = {}
        self.finished: dict[int, int] = {}
        self.seen_finished: list[int] = []

    def wait(self, table: dict[int, int], key: int) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: table.get(key, 0) == PEERS, timeout=WAIT):
                raise TimeoutError(f"round {key}: rendezvous not met")

    def count(self, table: dict[int, int], key: int) -> None:
        with self.cond:
            table[key] = table.get(key, 0) + 1
            self.cond.notify_all()


def test_round_r_finishes_on_every_peer_while_round_r_plus_1_is_training() -> None:
    # A train of agreed round k >= 1 records how many peers had finished round k - 1, then
    # blocks until all of them have; a peer that finishes round r waits (in evaluate_fn) until
    # every round r + 1 train has started. Both hold only if training overlaps the exchange:
    # without overlap round r + 1's train would start after evaluate_fn, which would time out.
    meet = Rendezvous()
    _, y = peer_data(0)

    def train(
        model: np.ndarray, config: Mapping[str, ConfigValue]
    ) -> tuple[np.ndarray, int, dict[str, float]]:
        k = int(config["server_round"]) - 1
        if k >= 1:
            with meet.cond:
                meet.seen_finished.append(meet.finished.get(k - 1, 0))
            meet.count(meet.started, k)
            meet.wait(meet.finished, k - 1)
        return model + 0.1, len(y), {}

    def evaluate_fn(model: np.ndarray, server_round: int) -> tuple[float, dict[str, float]]:
        r = server_round - 1  # the agreed round that just finished (-1: before the first)
        if r < 0:
            return 0.0, {}
        if r + 1 < ROUNDS:
            meet.wait(meet.started, r + 1)
        meet.count(meet.finished, r)
        return 0.0, {}

    config: FederationConfig[np.ndarray] = FederationConfig(
        rounds=ROUNDS, overlap=True, evaluate_fn=evaluate_fn, final_evaluation=False
    )
    histories = asyncio.run(
        run_simulation(
            [Client(train) for _ in range(PEERS)],
            adapter=VectorAdapter(),
            initial_model=np.zeros(D, np.float32),
            config=config,
            session="overlap-rendezvous",
        )
    )
    assert meet.seen_finished == [0] * (PEERS * (ROUNDS - 1))
    assert all(h.entries[-1].model == histories[0].entries[-1].model for h in histories)
    assert all(e.results == PEERS for e in histories[0].entries)


def test_overlap_is_refused_with_secagg() -> None:
    config: FederationConfig[np.ndarray] = FederationConfig(rounds=2, overlap=True)
    with pytest.raises(ConfigError, match="overlap"):
        asyncio.run(
            run_simulation(
                [make_client(i, Recorder()) for i in range(PEERS)],
                adapter=VectorAdapter(),
                initial_model=np.zeros(D, np.float32),
                config=config,
                strategy=SecAgg(FedAvg()),
            )
        )
