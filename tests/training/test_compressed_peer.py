"""A training ``Peer`` whose agreed config compresses: one model CID, exact metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedRoundResult, AgreedSession, ConfigError
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore
from gradfed_ipfs.tensor import Codec, Int8, TopKInt2
from gradfed_ipfs.training import (
    Client,
    FedAvg,
    FederationConfig,
    History,
    Peer,
    SecAgg,
    VectorAdapter,
)
from gradfed_ipfs.training.simulation import SIMULATION_TIMING

_RUN_ROUND = AgreedSession.run_round  # unwrapped, whichever test patched it before
D = 3000
MEMBERS = ("peer-0", "peer-1", "peer-2")
CONFIG: FederationConfig[np.ndarray] = FederationConfig(
    rounds=3, final_evaluation=False, fit_metrics=("acc",), eval_metrics=("acc",)
)


def client(index: int) -> Client[np.ndarray]:
    """Moves a tenth of the way to its target; metrics that do not depend on the model."""
    target = np.random.default_rng(index).standard_normal(D).astype(np.float32)

    def train(model: np.ndarray, _config: object) -> tuple[np.ndarray, int, Mapping[str, float]]:
        return model + 0.1 * (target - model), 3 * index + 1, {"acc": 0.1 + 0.2 * index}

    def evaluate(model: np.ndarray, _config: object) -> tuple[float, int, Mapping[str, float]]:
        return 1.0 / (index + 3), 2 * index + 5, {"acc": 0.3 + 0.1 * index}

    return Client(train, evaluate=evaluate)


async def train(
    compression: Codec | None, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[History], dict[str, list[AgreedRoundResult]]]:
    results: dict[str, list[AgreedRoundResult]] = {}
    run_round = _RUN_ROUND

    async def recorded(self: AgreedSession, *args: Any, **kwargs: Any) -> AgreedRoundResult:
        result = await run_round(self, *args, **kwargs)
        results.setdefault(self.peer_id, []).append(result)
        return result

    monkeypatch.setattr(AgreedSession, "run_round", recorded)
    bus, store = MemoryPubsubBus(), MemoryBlockStore()
    agreed = AgreedConfig(members=MEMBERS, compression=compression, **SIMULATION_TIMING)  # type: ignore[arg-type]
    peers = [
        Peer(store=store, pubsub=bus.endpoint(m), client=client(i), adapter=VectorAdapter(),
             initial_model=np.zeros(D, np.float32), config=CONFIG, agreed=agreed, session="cmp")
        for i, m in enumerate(MEMBERS)
    ]  # fmt: skip
    assert all(p.agreed.exact_tail == (p.layout.tail if compression else 0) for p in peers), "tail"
    histories = await asyncio.wait_for(asyncio.gather(*(p.run() for p in peers)), 120)
    return list(histories), results


def summaries(history: History) -> list[tuple[object, ...]]:
    return [
        (e.fit_samples, e.fit_metrics, e.eval_samples, e.eval_loss, e.eval_metrics, e.results)
        for e in history.entries
    ]


@pytest.mark.parametrize("codec", [Int8(), TopKInt2(ratio=0.05)], ids=["int8", "topk-int2"])
async def test_a_compressed_peer_session_ends_on_one_model_with_exact_metrics(
    codec: Codec, monkeypatch: pytest.MonkeyPatch
) -> None:
    dense, dense_results = await train(None, monkeypatch)
    packed, packed_results = await train(codec, monkeypatch)
    for histories in (dense, packed):
        assert [len(h.entries) for h in histories] == [3, 3, 3]
        for r in range(3):
            assert len({h.entries[r].model for h in histories}) == 1  # one model CID a round
    # The metrics ride in the exact tail: the same numbers, to the bit, as without compression.
    assert summaries(packed[0]) == summaries(dense[0])
    assert packed[0].entries[0].fit_samples == 1 + 4 + 7
    # The models differ (lossy parameters), and the contributions are smaller.
    assert packed[0].entries[-1].model != dense[0].entries[-1].model
    for peer in MEMBERS:
        for dense_round, packed_round in zip(
            dense_results[peer], packed_results[peer], strict=True
        ):
            assert packed_round.sent_bytes < dense_round.sent_bytes / 3


def test_secagg_peers_refuse_compression() -> None:
    with pytest.raises(ConfigError, match="masked"):
        Peer(
            store=MemoryBlockStore(), pubsub=MemoryPubsubBus().endpoint("peer-0"),
            client=client(0), adapter=VectorAdapter(), initial_model=np.zeros(D, np.float32),
            config=CONFIG, strategy=SecAgg(FedAvg()), session="cmp",
            agreed=AgreedConfig(members=MEMBERS, compression=Int8()),
        )  # fmt: skip


async def test_an_unsampled_peer_keeps_its_error_feedback_residual() -> None:
    """A round that does not sample a peer neither sends nor resets its residual."""
    bus, store = MemoryPubsubBus(), MemoryBlockStore()
    agreed = AgreedConfig(
        members=MEMBERS, compression=TopKInt2(ratio=0.05), **SIMULATION_TIMING,  # type: ignore[arg-type]
    )  # fmt: skip
    config: FederationConfig[np.ndarray] = FederationConfig(
        rounds=6, final_evaluation=False, fraction=0.5, min_fit=1, min_available=3
    )
    peers = [
        Peer(store=store, pubsub=bus.endpoint(m), client=client(i), adapter=VectorAdapter(),
             initial_model=np.zeros(D, np.float32), config=config, agreed=agreed, session="ef")
        for i, m in enumerate(MEMBERS)
    ]  # fmt: skip
    residuals: dict[str, list[np.ndarray | None]] = {m: [] for m in MEMBERS}
    run_round = _RUN_ROUND

    async def recorded(self: AgreedSession, *args: Any, **kwargs: Any) -> AgreedRoundResult:
        before = self.residual
        result = await run_round(self, *args, **kwargs)
        residuals[self.peer_id].append(None if before is None else before.copy())
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AgreedSession, "run_round", recorded)
        histories = await asyncio.wait_for(asyncio.gather(*(p.run() for p in peers)), 120)
    final = {
        m: p.session.residual if p.session else None for m, p in zip(MEMBERS, peers, strict=True)
    }
    skipped = 0
    for member, history in zip(MEMBERS, histories, strict=True):
        seen = [*residuals[member][1:], final[member]]  # the residual after each round
        for entry, before, after in zip(history.entries, residuals[member], seen, strict=True):
            if member in entry.sampled or before is None:
                continue
            skipped += 1
            assert after is not None
            np.testing.assert_array_equal(after, before)  # carried, not sent and lost
    assert skipped > 0, "no round left a peer with a residual unsampled"
