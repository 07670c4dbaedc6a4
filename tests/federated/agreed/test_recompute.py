"""Recomputing a fedavg round streams its contributions: the same bits, bounded memory."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedSession
from gradfed_ipfs.errors import RoundVerificationFailed
from gradfed_ipfs.federated.agreed.history import (
    STREAM_WINDOW,
    load_record,
    load_round_inputs,
    recompute_round,
)
from gradfed_ipfs.formats.agreed.roster import AgreedRecord
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore
from gradfed_ipfs.storage.dag import fetch_manifest
from gradfed_ipfs.tensor.deterministic import deterministic_update
from tests.federated.agreed.test_rounds import FAST, close, delta, initial_model

MEMBERS = tuple(f"m{i:02d}" for i in range(2 * STREAM_WINDOW + 3))  # three windows' worth


async def _one_round() -> tuple[MemoryBlockStore, AgreedRecord, np.ndarray]:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    config = AgreedConfig(members=MEMBERS, aggregation="all-to-all", **FAST)  # type: ignore[arg-type]
    sessions = [AgreedSession(store, bus.endpoint(p), "s1", genesis, config) for p in MEMBERS]
    try:
        for session in sessions:
            await session.start(initial_model())
        results = await asyncio.gather(
            *(s.run_round(delta(i, 0), weight=1 + i % 5) for i, s in enumerate(sessions))
        )
    finally:
        await close(sessions)
    assert len({bytes(r.record) for r in results}) == 1
    return store, await load_record(store, results[0].record), sessions[0].model.copy()


async def test_a_streamed_recompute_gives_the_bits_of_the_whole_roster_update() -> None:
    store, record, model = await _one_round()
    roster, recomputed = await recompute_round(store, record)
    assert len(roster.entries) == len(MEMBERS)
    _, base, gradients = await load_round_inputs(store, record)
    whole = deterministic_update(
        base, gradients, [e.weight for e in roster.entries], record.learning_rate
    )
    assert recomputed.tobytes() == whole.tobytes() == model.tobytes()


async def test_a_contribution_missing_late_in_the_roster_fails_the_recompute_cleanly() -> None:
    store, record, _ = await _one_round()
    roster, _ = await recompute_round(store, record)
    lost = roster.entries[-2].contribution  # fetched after two windows were summed
    manifest = await fetch_manifest(store, lost) if lost.codec.name == "dag-cbor" else None
    await store.delete(manifest.chunks[0].cid if manifest is not None else lost)
    with pytest.raises(RoundVerificationFailed, match="round 0"):
        await recompute_round(store, record)
    assert asyncio.all_tasks() == {asyncio.current_task()}  # no fetch left running
