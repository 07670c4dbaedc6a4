"""Issue 32, attacks 8 and 12: one peer cannot set a training History or a secure sum.

Over the memory bus and one block store (the wiring of ``tests/training``). Attack 8: a peer's
self-reported metrics and sample counts, and a SecAgg aggregator's made-up mean; attack 12: a
SecAgg client whose share bundle is unusable to every other client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig
from gradfed_ipfs.federated.secagg_round import SecureRoundPeer, SecureRoundResult
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore
from gradfed_ipfs.training import Client, FedAvg, FederationConfig, History, Peer, VectorAdapter
from gradfed_ipfs.training.secure import SecAgg
from tests.training import test_secure as secure

D = 8
HUGE = 1.0e19  # the 3e38 is above the agreed max_value (2**64): refused as a value
TIMING: dict[str, Any] = {
    "collect_timeout": 1.5,
    "takeover_timeout": 0.5,
    "round_timeout": 20.0,
    "done_timeout": 0.5,
    "announce_interval": 0.05,
    "max_announce_interval": 0.5,
    "fetch_timeout": 5.0,
    "min_peers": 2,
}
HONEST_LOSS = (0.5, 0.75)
HONEST_ACC = (0.25, 0.5)


def honest(i: int) -> Client[np.ndarray]:
    """A small update, ``10·(i+1)`` samples, metrics in [0, 1]."""

    def train(model: np.ndarray, _c: object) -> tuple[np.ndarray, int, Mapping[str, float]]:
        return np.full(D, 0.01, np.float32), 10 * (i + 1), {"acc": HONEST_ACC[i]}

    def evaluate(model: np.ndarray, _c: object) -> tuple[float, int, Mapping[str, float]]:
        return HONEST_LOSS[i], 10 * (i + 1), {"acc": HONEST_ACC[i]}

    return Client(train, evaluate, returns="update")


def liar(fit_samples: int, eval_samples: int) -> Client[np.ndarray]:
    """Reports accuracy 1e19 and loss −1e19, with the given sample counts."""

    def train(model: np.ndarray, _c: object) -> tuple[np.ndarray, int, Mapping[str, float]]:
        return np.full(D, 0.01, np.float32), fit_samples, {"acc": HUGE}

    def evaluate(model: np.ndarray, _c: object) -> tuple[float, int, Mapping[str, float]]:
        return -HUGE, eval_samples, {"acc": HUGE}

    return Client(train, evaluate, returns="update")


@pytest.mark.parametrize("eval_samples", [2**20, 2**24], ids=["at-the-cap", "above-the-cap"])
async def test_attack8_one_peers_metrics_and_counts_do_not_set_the_history(
    eval_samples: int,
) -> None:
    members = ("peer-0", "peer-1", "peer-2")
    bus, store = MemoryPubsubBus(), MemoryBlockStore()
    config: FederationConfig[np.ndarray] = FederationConfig(
        rounds=2, final_evaluation=False, fit_metrics=("acc",), eval_metrics=("acc",)
    )

    def peer(i: int, client: Client[np.ndarray], **bounds: Any) -> Peer[np.ndarray]:
        return Peer(
            store=store, pubsub=bus.endpoint(members[i]), client=client, adapter=VectorAdapter(),
            initial_model=np.zeros(D, np.float32), config=config, session="metrics-attack",
            agreed=AgreedConfig(members=members, **TIMING, **bounds),
        )  # fmt: skip

    peers = [peer(0, honest(0)), peer(1, honest(1))]
    # Its weight (= fit samples) is allowed; it does not hold itself to the caps.
    hostile = peer(2, liar(2**20, eval_samples), max_weight=2**24, max_value=None)
    bad = asyncio.ensure_future(hostile.run())
    try:
        histories: list[History] = await asyncio.wait_for(
            asyncio.gather(*(p.run() for p in peers)), 120
        )
    finally:
        bad.cancel()
        await asyncio.gather(bad, return_exceptions=True)
    assert [e.model for e in histories[0].entries] == [e.model for e in histories[1].entries]
    assert "peer-2" in histories[0].entries[0].roster  # listed (weight allowed): its tail judged
    honest_samples = 10 + 20
    for entry in histories[0].entries:
        assert min(HONEST_LOSS) <= entry.eval_loss <= max(HONEST_LOSS)  # type: ignore[operator]
        assert min(HONEST_ACC) <= entry.eval_metrics["acc"] <= max(HONEST_ACC)
        assert min(HONEST_ACC) <= entry.fit_metrics["acc"] <= max(HONEST_ACC)
        assert entry.eval_samples <= honest_samples + 2**20  # one peer adds at most the cap
        assert entry.fit_samples <= honest_samples + 2**20
        if eval_samples > 2**20:  # its tail is refused on every peer: its counts are nowhere
            assert (entry.eval_samples, entry.fit_samples) == (honest_samples, honest_samples)
    assert np.isfinite(peers[0].model_vector).all()


async def test_attack8_the_aggregators_made_up_secure_mean_is_not_adopted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: each round's aggregator replaces the survivors' sum by one whose mean is +5.0
    # (it reveals its true round key, so the other survivors can recompute the real sum).
    honest_aggregate = SecureRoundPeer.aggregate
    lies: list[str] = []

    async def lying(self: SecureRoundPeer) -> SecureRoundResult:
        result = await honest_aggregate(self)
        result.total[: secure.D] = 5.0 * result.total[secure.D]  # S_Δ = 5·W: mean +5.0
        lies.append(self.peer_id)
        return result

    monkeypatch.setattr(SecureRoundPeer, "aggregate", lying)
    async with MemoryBlockStore() as store:
        histories = await secure.run_peers(
            lambda: SecAgg(FedAvg(), **secure.FAST_SECAGG), stores=[store] * 3
        )
        got = await secure.final_params(store, histories[0])
    # Assert: every round had a lying aggregator, yet every peer took the true FedAvg mean (the
    # two other survivors' recomputed claim is the majority) and the History names all three.
    assert len(lies) == secure.ROUNDS
    secure.check_agreed(histories)
    bound = secure.quantisation_bound()
    assert float(np.abs(got - secure.fedavg_reference()).max()) <= bound + 1e-6
    for history in histories:
        for entry in history.entries[: secure.ROUNDS]:
            assert entry.secure == ["peer-0", "peer-1", "peer-2"]
            assert (entry.results, entry.fit_samples) == (3, sum(secure.SAMPLES))
