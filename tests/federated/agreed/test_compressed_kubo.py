"""Compressed agreed rounds over three real Kubo daemons (bitswap and pubsub between them)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedSession, verify_agreed_history
from gradfed_ipfs.formats.agreed.roster import AgreedRecord
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore
from gradfed_ipfs.tensor import Int8
from tests.helpers import aclose_all

D = 100_000  # 7 chunks of 64 KiB as dense; as int8 each chunk block is about a quarter
SETTINGS = {
    "collect_timeout": 5.0,
    "takeover_timeout": 3.0,
    "round_timeout": 60.0,
    "done_timeout": 5.0,
    "announce_interval": 0.1,
    "fetch_timeout": 20.0,
    "chunk_bytes": 65_536,
    "learning_rate": 0.5,
}


@pytest.mark.kubo
async def test_int8_all_to_all_rounds_over_kubo_agree_and_reverify(kubo_swarm3) -> None:  # type: ignore[no-untyped-def]
    nodes = kubo_swarm3
    model = np.random.default_rng(5).standard_normal(D).astype(np.float32)
    members = tuple(n.peer_id for n in nodes)
    config = AgreedConfig(members=members, compression=Int8(clip_sigmas=4.0), **SETTINGS)  # type: ignore[arg-type]
    stores = [KuboBlockStore(n.api_url, timeout=30.0) for n in nodes]
    pubsubs = [KuboPubsub(n.api_url) for n in nodes]
    sessions: list[AgreedSession] = []
    try:
        genesis = await AgreedSession.commit_genesis(stores[0], model)
        for store, pubsub in zip(stores, pubsubs, strict=True):
            session = AgreedSession(store, pubsub, "int8-kubo", genesis, config)
            sessions.append(session)
            await session.start(model)
        for r in range(2):
            grads = [
                np.random.default_rng([i, r]).standard_normal(D).astype(np.float32)
                for i in range(3)
            ]
            results = await asyncio.gather(
                *(s.run_round(grads[i], weight=1 + i) for i, s in enumerate(sessions))
            )
            assert len({res.model for res in results}) == 1
            assert len({res.record for res in results}) == 1
            assert all(res.roster.peers == tuple(sorted(members)) for res in results)
            # int8: a byte a value, a scale per 1024, framing and a manifest: ~d, not 4·d.
            assert all(D < res.sent_bytes < 1.1 * D for res in results)
        for session in sessions:
            await session.aclose()
        record = AgreedRecord.from_block(await stores[2].get(results[0].record))
        assert record.encoding == "int8/1024"
        # The third daemon re-verifies both rounds from the head record alone.
        records = await verify_agreed_history(
            stores[2], results[0].record, session="int8-kubo", genesis=genesis
        )
        assert [rec.round for rec in records] == [0, 1]
        assert len({s.model.tobytes() for s in sessions}) == 1
    finally:
        await aclose_all(sessions, pubsubs, stores)
