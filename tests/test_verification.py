"""``verify(record_cid, store)`` picks the check from the record's type (all three kinds)."""

from __future__ import annotations

import dag_cbor
import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs import Block, MemoryBlockStore, MemoryPubsubBus, put_gradient, verify
from gradfed_ipfs.errors import NotARoundRecord, RoundVerificationFailed
from gradfed_ipfs.verification import record_kind
from tests.federated.agreed.test_rounds import PEERS, close, make_sessions, run_all
from tests.federated.agreed.test_rounds import initial_model as agreed_model
from tests.federated.regional.test_rounds import KEYS, REGIONS, run_peers
from tests.provenance.test_round_record import run_rounds


async def tampered(store: MemoryBlockStore, cid: CID, key: str, value: object) -> CID:
    record = dag_cbor.decode((await store.get(cid)).data)
    assert isinstance(record, dict)
    record[key] = value
    return await store.put(Block.new(dag_cbor.encode(record), "dag-cbor"))


async def test_a_best_effort_round_record_is_checked_as_one() -> None:
    async with MemoryBlockStore() as store:
        cids, _ = await run_rounds(store, rounds=2)
        assert await record_kind(store, cids[-1]) == "round"
        verified = await verify(cids[-1], store)
        assert (verified.kind, verified.round) == ("round", 1)
        bad = await tampered(store, cids[-1], "aggregate", cids[0])
        with pytest.raises(RoundVerificationFailed, match="round 1: mismatch"):
            await verify(bad, store)


async def test_an_agreed_round_record_is_re_aggregated() -> None:
    async with MemoryBlockStore() as store:
        bus = MemoryPubsubBus()
        genesis = await put_gradient(store, agreed_model())
        sessions = await make_sessions(
            store, [bus.endpoint(p) for p in PEERS], genesis, model_every=1
        )
        try:
            results = await run_all(sessions, [0, 1, 2])
        finally:
            await close(sessions)
        record = results[0].record
        verified = await verify(record, store)
        assert (verified.kind, verified.round) == ("agreed", 0)
        forged = await tampered(store, record, "result", genesis)
        with pytest.raises(RoundVerificationFailed):
            await verify(forged, store)


async def test_a_regional_round_record_is_recombined() -> None:
    store, _, rounds = await run_peers(sorted(REGIONS), rounds=1)
    top = next(iter(rounds[0].values())).record
    verified = await verify(top, store, keys=KEYS)
    assert (verified.kind, verified.round) == ("regional", 0)
    forged = await tampered(store, top, "combine", "weighted")
    with pytest.raises(RoundVerificationFailed, match="combine to"):
        await verify(forged, store, keys=KEYS)
    with pytest.raises(RoundVerificationFailed, match="not an Ed25519 peer ID"):
        await verify(top, store)  # the bus's names are no peer IDs: their votes need its keys


async def test_a_cid_that_names_no_round_record_is_refused() -> None:
    async with MemoryBlockStore() as store:
        gradient = await put_gradient(store, np.ones(8, np.float32))
        with pytest.raises(NotARoundRecord, match="raw block"):
            await verify(gradient, store)
        other = await store.put(Block.new(dag_cbor.encode({"type": "x"}), "dag-cbor"))
        with pytest.raises(NotARoundRecord, match="neither"):
            await verify(other, store)
