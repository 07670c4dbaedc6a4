"""The digits task through the training API: 3 peers in one process, and as 3 OS processes.

The task's code is the example's (``examples/digits_training.py``, ``digits_processes.py``).
Agreed rounds are bit-reproducible, so when every round's roster holds all three peers the
processes end on the very model CID the in-process run ends on.
"""

# ruff: noqa: E402 (the examples import after the sklearn check and the sys.path entry)
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

from gradfed_ipfs.training import History, VectorAdapter, run_simulation
from tests.conftest import KuboNode
from tests.required import import_area
from tests.training.strategies import make_strategy

import_area("sklearn", "sklearn")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import digits_training as task
from digits_processes import run_processes
from digits_training import Task, final_accuracy

TASK = Task(peers=3, rounds=8, alpha=0.5)  # smaller than the example's 4 peers, 20 rounds


def simulate(strategy: str = "fedavg", **settings: object) -> list[History]:
    return task.simulate(
        TASK, lambda: make_strategy(strategy), session=f"digits-{strategy}", **settings
    )


@pytest.fixture(scope="module")
def in_process() -> list[History]:
    return simulate()


def test_three_peers_in_one_process_agree_and_learn(in_process: list[History]) -> None:
    assert len({h.entries[-1].model for h in in_process}) == 1
    history = in_process[0]
    assert len(history.entries) == TASK.rounds + 1  # and the final evaluation round
    assert all(e.results == 3 and e.failures == 0 for e in history.entries[:-1])
    assert history.entries[-1].results == 0  # evaluation only
    assert final_accuracy(history) >= 0.9
    losses = [loss for _, loss in history.losses_distributed()]
    assert len(losses) == TASK.rounds
    assert losses[-1] < losses[0] / 2
    # the federated evaluation covers every training sample, weighted by sample count
    assert history.entries[-1].eval_samples == sum(len(p) for p in TASK.data().parts)
    fit = history.metrics_distributed_fit()["accuracy"]
    assert [r for r, _ in fit] == list(range(1, TASK.rounds + 1))


def test_in_process_matches_a_plain_fedavg_loop(in_process: list[History]) -> None:
    data = TASK.data()
    clients = [task.make_client(data, i, TASK) for i in range(TASK.peers)]
    w = task.initial_model()
    for r in range(TASK.rounds):
        config = {"server_round": r + 1, "local_steps": TASK.local_steps, "lr": TASK.lr}
        outs = [c.train(w.copy(), config) for c in clients]
        n = sum(o[1] for o in outs)
        w = (w + sum(o[1] / n * (o[0] - w) for o in outs)).astype(np.float32)
    plain = task.held_out_evaluate(data)(w, TASK.rounds)[1]["accuracy"]
    assert abs(plain - final_accuracy(in_process[0])) <= 0.01


def test_history_saves_reloads_and_plots(in_process: list[History], tmp_path: Path) -> None:
    history = in_process[0]
    path = history.save(tmp_path / "history.json")
    again = History.load(path)
    assert again == history
    assert again.losses_distributed() == history.losses_distributed()
    assert "round 3: received 3 results and 0 failures" in again.report()
    import_area("sklearn", "matplotlib")
    assert history.plot(tmp_path / "history.png").stat().st_size > 1000


def test_fraction_samples_two_of_three_and_the_others_follow() -> None:
    histories = simulate("fedavg", rounds=4, fraction=0.5)  # ceil(1.5) = 2 trainers per round
    assert len({h.entries[-1].model for h in histories}) == 1
    entries = histories[0].entries
    assert all(len(e.sampled) == 2 and e.results == 2 for e in entries[:-1])
    assert all(len(e.roster) == 3 for e in entries)  # every peer still evaluates and follows
    assert len({tuple(e.sampled) for e in entries[:-1]}) > 1  # the sample changes


@pytest.mark.parametrize(
    "strategy", ["fedprox", "fedavgm", "fedadam", "qfedavg", "median", "diloco", "sparseloco"]
)
def test_strategies_learn_the_task(strategy: str) -> None:
    histories = simulate(strategy, rounds=5)
    assert len({h.entries[-1].model for h in histories}) == 1
    assert final_accuracy(histories[0]) >= 0.8
    assert histories[0].strategy.startswith(make_strategy(strategy).name)


# --------------------------------------------------------------------------- OS processes


@pytest.mark.kubo
def test_the_examples_peer_processes_match_the_in_process_run(
    kubo_swarm3: list[KuboNode], tmp_path: Path
) -> None:
    small = Task(peers=3, rounds=3, alpha=0.5)  # reduced: process start-up dominates
    runs = run_processes(small, kubo_swarm3, tmp_path, timeout=240.0, log=lambda _: None)
    assert [r.api_url for r in runs] == [node.api_url for node in kubo_swarm3]
    assert len({r.model for r in runs}) == 1  # one model CID on every peer process
    assert len({r.history.entries[-1].record for r in runs}) == 1
    assert len({r.pid for r in runs}) == 3
    in_process = task.simulate(small, session="digits-reference")[0]
    assert all(len(r.history.entries) == small.rounds + 1 for r in runs)
    for r in runs:
        assert abs(r.accuracy - final_accuracy(in_process)) <= 0.01
    if all(len(e.roster) == 3 for e in runs[0].history.entries):  # every peer in every round
        assert runs[0].model == in_process.entries[-1].model
        assert runs[0].accuracy == final_accuracy(in_process)
    final_line = (tmp_path / "peer0.log").read_text().splitlines()[-1]
    assert f'"model": "{runs[0].model}"' in final_line


def test_local_dp_reports_epsilon_and_a_spent_budget_stops_training() -> None:
    from gradfed_ipfs.federated.privacy.mechanisms import DifferentialPrivacy
    from gradfed_ipfs.training import LocalDP

    data = TASK.data()

    def privacy(i: int) -> LocalDP:
        dp = DifferentialPrivacy(4.5, 1e-5, 1.0, noise_multiplier=2.0, rng=i)
        return LocalDP(dp, clip_norm=5.0)

    histories = asyncio.run(
        run_simulation(
            [task.make_client(data, i, TASK) for i in range(TASK.peers)],
            adapter=VectorAdapter(),
            initial_model=task.initial_model(),
            config=task.federation(data, TASK, rounds=6),
            privacy=privacy,
            session="digits-dp",
        )
    )
    assert len({h.entries[-1].model for h in histories}) == 1
    entries = histories[0].entries[:-1]
    spent = [e.epsilon for e in entries]
    # z = 2 spends ε = 2.17, 3.19, 4.01 (δ = 1e-5); a fourth release (4.73) exceeds 4.5, so
    # later rounds report failures (the peers still evaluate and follow), not errors
    assert spent == pytest.approx([2.17, 3.19, 4.01, 4.01, 4.01, 4.01], abs=0.01)
    assert [e.results for e in entries] == [3, 3, 3, 0, 0, 0]
    assert [e.failures for e in entries] == [0, 0, 0, 3, 3, 3]


def test_a_failing_client_is_a_reported_failure_not_a_failed_round() -> None:
    from gradfed_ipfs.training import Client

    data = TASK.data()
    clients = [task.make_client(data, i, TASK) for i in range(TASK.peers)]

    def broken(model: np.ndarray, config: object) -> tuple[np.ndarray, int, dict[str, float]]:
        raise RuntimeError("out of memory")

    clients[2] = Client(train=broken, evaluate=clients[2].evaluate)
    lines: list[str] = []
    histories = asyncio.run(
        run_simulation(
            clients,
            adapter=VectorAdapter(),
            initial_model=task.initial_model(),
            config=task.federation(data, TASK, rounds=2),
            session="digits-broken",
            log=lines.append,
        )
    )
    assert len({h.entries[-1].model for h in histories}) == 1
    assert lines[0].startswith("round 1: received 2 results and 1 failures")
    assert histories[0].entries[0].eval_samples == sum(len(p) for p in data.parts)


def test_a_late_peer_resumes_with_the_optimizer_state_and_agrees() -> None:
    from gradfed_ipfs.federated.agreed.session import AgreedConfig
    from gradfed_ipfs.kubo import MemoryPubsubBus
    from gradfed_ipfs.storage import MemoryBlockStore
    from gradfed_ipfs.training import FedAdam, Peer

    data = TASK.data()
    members = ("peer-0", "peer-1", "peer-2")
    agreed = AgreedConfig(
        members=members, collect_timeout=0.5, takeover_timeout=0.3, round_timeout=30.0,
        done_timeout=1.0, announce_interval=0.05, max_announce_interval=0.5, fetch_timeout=5.0,
    )  # fmt: skip

    async def scenario() -> tuple[History, History]:
        async with MemoryBlockStore() as store:
            bus = MemoryPubsubBus()
            peers = [
                Peer(
                    store=store,
                    pubsub=bus.endpoint(members[i]),
                    client=task.make_client(data, i, TASK),
                    adapter=VectorAdapter(),
                    initial_model=task.initial_model(),
                    config=task.federation(data, TASK, rounds=6, min_available=2),
                    agreed=agreed,
                    strategy=FedAdam(eta=0.05),
                    session="resume",
                )
                for i in range(3)
            ]
            early = [asyncio.create_task(p.run()) for p in peers[:2]]
            deadline = asyncio.get_running_loop().time() + 60.0
            while peers[0].session is None or peers[0].session.round < 2:
                assert asyncio.get_running_loop().time() < deadline, "peers 0, 1 stuck"
                await asyncio.sleep(0.05)  # polling the other peers' progress, with a deadline
            late = await peers[2].run(resume=True, resync_timeout=5.0)
            first, _ = await asyncio.gather(*early)
            return first, late

    first, late = asyncio.run(scenario())
    assert late.entries[0].round >= 2  # it resumed, it did not replay rounds 0 and 1
    records = {e.round: e.record for e in first.entries}
    assert all(records[e.round] == e.record for e in late.entries)  # same FedAdam state
    assert late.entries[-1].model == first.entries[-1].model
    assert any(len(e.roster) == 3 for e in late.entries)


def test_a_list_of_arrays_model_through_the_numpy_adapter() -> None:
    from gradfed_ipfs.training import ArraysAdapter, Client, FederationConfig

    # y = x @ w + b on eight points per peer; the model is [w (2, 1) float32, b (1,) float32]
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((8, 2)) for _ in range(3)]

    def client(x: np.ndarray) -> Client[list[np.ndarray]]:
        y = x @ np.array([[2.0], [-1.0]]) + 0.5

        def mse(model: list[np.ndarray]) -> float:
            return float(((x @ model[0] + model[1] - y) ** 2).mean())

        def train(model: list[np.ndarray], config: object) -> tuple[list[np.ndarray], int, dict]:
            w, b = (m.astype(np.float64) for m in model)
            for _ in range(20):
                err = x @ w + b - y
                w, b = w - 0.1 * x.T @ err / len(x), b - 0.1 * err.mean(axis=0)
            return [w.astype(np.float32), b.astype(np.float32)], len(x), {}

        def evaluate(model: list[np.ndarray], config: object) -> tuple[float, int, dict]:
            assert model[0].shape == (2, 1)
            assert model[1].shape == (1,)
            return mse(model), len(x), {}

        return Client(train=train, evaluate=evaluate)

    initial = [np.zeros((2, 1), np.float32), np.zeros(1, np.float32)]
    histories = asyncio.run(
        run_simulation(
            [client(x) for x in xs],
            adapter=ArraysAdapter(initial),
            initial_model=initial,
            config=FederationConfig(rounds=15),
            session="arrays",
        )
    )
    assert len({h.entries[-1].model for h in histories}) == 1
    losses = histories[0].losses_distributed()
    assert losses[-1][1] < 1e-3 * histories[0].entries[0].eval_loss  # type: ignore[operator]
