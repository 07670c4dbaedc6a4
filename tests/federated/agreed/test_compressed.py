"""Compressed contributions in agreed rounds: every encoding, both aggregations, one model CID."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedRoundResult, AgreedSession, verify_agreed_history
from gradfed_ipfs.errors import ConfigError
from gradfed_ipfs.formats.roster import AgreedRecord
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore, fetch_gradient
from gradfed_ipfs.tensor import (
    Codec,
    Dense,
    Int2,
    Int4,
    Int8,
    RandomK,
    TopK,
    TopKInt2,
    TopKInt8,
)
from gradfed_ipfs.tensor.deterministic import deterministic_update

PEERS = ("peer-a", "peer-b", "peer-c", "peer-d")
CHUNK = 65_536
D = 40_000  # 3 chunks of 64 KiB (16 320 values each): chunk-aligned slices
FAST = {
    "collect_timeout": 1.0,
    "takeover_timeout": 0.5,
    "round_timeout": 15.0,
    "done_timeout": 1.0,
    "announce_interval": 0.02,
    "fetch_timeout": 2.0,
    "reducer_timeout": 0.3,
    "chunk_bytes": CHUNK,
    "learning_rate": 0.5,
}
CODECS: list[Codec] = [
    Int8(),
    Int8(clip_sigmas=3.0, block=256),
    Int4(block=512),
    Int2(block=128),
    TopK(ratio=0.05),
    TopKInt8(ratio=0.05),
    TopKInt2(ratio=0.02, block=64),
]


def initial_model(d: int = D) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(d).astype(np.float32)


def gradient(peer: int, round_number: int, d: int = D) -> np.ndarray:
    return (0.1 * np.random.default_rng([peer, round_number]).standard_normal(d)).astype(
        np.float32
    )


async def run_session(
    store: MemoryBlockStore,
    peers: Sequence[str],
    rounds: int,
    d: int = D,
    **settings: object,
) -> tuple[list[list[AgreedRoundResult]], list[AgreedSession], object]:
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model(d))
    config = AgreedConfig(members=tuple(peers), **{**FAST, **settings})  # type: ignore[arg-type]
    sessions = [AgreedSession(store, bus.endpoint(p), "c", genesis, config) for p in peers]  # type: ignore[arg-type]
    for session in sessions:
        await session.start(initial_model(d))
    results = []
    try:
        for r in range(rounds):
            results.append(
                list(
                    await asyncio.gather(
                        *(
                            s.run_round(gradient(i, r, d), weight=1 + i)
                            for i, s in enumerate(sessions)
                        )
                    )
                )
            )
    finally:
        for session in sessions:
            await session.aclose()
    return results, sessions, genesis


@pytest.mark.parametrize("aggregation", ["all-to-all", "reduce-scatter"])
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.packing().label)
async def test_every_encoding_ends_on_one_model_cid(codec: Codec, aggregation: str) -> None:
    async with MemoryBlockStore() as store:
        results, sessions, genesis = await run_session(
            store, PEERS, 2, compression=codec, aggregation=aggregation
        )
        for r, round_results in enumerate(results):
            assert {res.aggregation for res in round_results} == {aggregation}
            assert len({res.model for res in round_results}) == 1, r
            assert len({res.record for res in round_results}) == 1, r
            assert all(res.roster.peers == PEERS for res in round_results)
        record = AgreedRecord.from_block(await store.get(results[-1][0].record))
        assert record.encoding == codec.packing().label
        records = await verify_agreed_history(
            store, results[-1][0].record, session="c", genesis=genesis  # type: ignore[arg-type]
        )
        assert [rec.round for rec in records] == [0, 1]
        assert len({bytes(s.model.tobytes()) for s in sessions}) == 1
