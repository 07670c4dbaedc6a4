"""Attacks 4 and 10 through the training API: a huge update with 2**24 samples changes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedRoundResult, AgreedSession
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore
from gradfed_ipfs.training import Client, FederationConfig, Peer, VectorAdapter
from tests.training.test_peer_node import D, client

TIMING = {
    "collect_timeout": 1.5,
    "takeover_timeout": 0.5,
    "round_timeout": 20.0,
    "done_timeout": 0.5,
    "announce_interval": 0.05,
    "max_announce_interval": 0.5,
    "fetch_timeout": 5.0,
    "min_peers": 2,
}


def huge(samples: int) -> Client[np.ndarray]:
    def train(model: np.ndarray, _config: object) -> tuple[np.ndarray, int, Mapping[str, float]]:
        return np.full(D, 3.0e38, np.float32), samples, {}

    return Client(train, returns="update")


@pytest.mark.parametrize(
    ("samples", "reason"), [(2**24, "max_weight"), (2**20, "max_value")], ids=["weight", "value"]
)
async def test_a_huge_update_is_refused_and_honest_peers_stay_finite(
    monkeypatch: pytest.MonkeyPatch, samples: int, reason: str
) -> None:
    results: dict[str, list[AgreedRoundResult]] = {}
    run_round = AgreedSession.run_round

    async def recorded(self: AgreedSession, *args: Any, **kwargs: Any) -> AgreedRoundResult:
        result = await run_round(self, *args, **kwargs)
        results.setdefault(self.peer_id, []).append(result)
        return result

    monkeypatch.setattr(AgreedSession, "run_round", recorded)
    members = ("peer-0", "peer-1", "peer-2")
    bus, store = MemoryPubsubBus(), MemoryBlockStore()
    config: FederationConfig[np.ndarray] = FederationConfig(rounds=3, final_evaluation=False)

    def peer(i: int, **bounds: Any) -> Peer[np.ndarray]:
        return Peer(
            store=store, pubsub=bus.endpoint(members[i]),
            client=huge(samples) if bounds else client(i), adapter=VectorAdapter(),
            initial_model=np.zeros(D, np.float32), config=config, session="sanity",
            agreed=AgreedConfig(members=members, **TIMING, **bounds),  # type: ignore[arg-type]
        )  # fmt: skip

    honest = [peer(0), peer(1)]
    hostile = peer(2, max_weight=2**24, max_value=None)  # it does not hold itself to the rules
    bad = asyncio.ensure_future(hostile.run())
    try:
        histories = await asyncio.wait_for(asyncio.gather(*(p.run() for p in honest)), 120)
    finally:
        bad.cancel()
        await asyncio.gather(bad, return_exceptions=True)
    assert [len(h.entries) for h in histories] == [3, 3]
    assert histories[0].entries[-1].model == histories[1].entries[-1].model
    for p in honest:
        assert np.isfinite(p.model_vector).all()
        assert np.abs(p.model_vector).max() < 10
    for peer_id in members[:2]:
        first = results[peer_id][0]
        assert "peer-2" not in first.roster.peers
        assert reason in first.rejected["peer-2"]
