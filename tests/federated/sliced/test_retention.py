"""Reduce-scatter agreed rounds under retention: flat repo, records pinned alone, GC-safe pins."""

from __future__ import annotations

import asyncio
import dataclasses

import dag_cbor
import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs import AgreedConfig, AgreedRoundResult, AgreedSession, verify_agreed_history
from gradfed_ipfs.block import Block
from gradfed_ipfs.cid import DAG_CBOR
from gradfed_ipfs.errors import RoundVerificationFailed
from gradfed_ipfs.federated.agreed.history import load_record, verify_agreed_round
from gradfed_ipfs.federated.sliced import Lying
from gradfed_ipfs.federated.sliced.peer import ReduceScatterResult
from gradfed_ipfs.federated.sliced.retention import UnpinnedPuts, keep_slice_blocks
from gradfed_ipfs.formats.sliced.slices import FraudRecord, SliceRecord
from gradfed_ipfs.kubo import KuboPubsub, MemoryPubsubBus
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore, Retention, RetentionKeeper
from tests.federated.agreed.test_sliced import (
    FAST,
    PEERS,
    DropMessages,
    gradient,
    initial_model,
)
from tests.helpers import aclose_all

ROUNDS = 5
K = 2


def dangling_recursive_pins(store: MemoryBlockStore) -> list[str]:
    """Recursive pins whose DAG is not all local: Kubo's ``repo/gc`` fails on each of them."""
    bad = []
    for key in store.pins - store.direct:
        todo, seen = [key], set()
        while todo:
            cid_bytes = todo.pop()
            if cid_bytes in seen:
                continue
            seen.add(cid_bytes)
            if cid_bytes not in store.blocks:
                bad.append(str(store.blocks[key][0]))
                break
            cid, data = store.blocks[cid_bytes]
            if cid.codec.code == DAG_CBOR:
                todo.extend(bytes(c) for c in _links(dag_cbor.decode(data)))
    return bad


def _links(value: object) -> list[CID]:
    if isinstance(value, CID):
        return [value]
    if isinstance(value, dict):
        return [c for v in value.values() for c in _links(v)]
    if isinstance(value, list):
        return [c for v in value for c in _links(v)]
    return []


async def test_sliced_rounds_under_retention_keep_records_drop_old_slices_and_reverify() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    # One store and one keeper (its gate) for the four simulated peers, as on one node.
    keeper = RetentionKeeper(
        store, Retention(keep_rounds=K, gc_every=1, gc_wait=5.0), keep=[genesis]
    )
    config = AgreedConfig(
        members=PEERS,
        aggregation="reduce-scatter",
        min_peers=3,
        model_every=1,  # every base stored: the window is exactly K rounds
        **{**FAST, "collect_timeout": 0.3},  # type: ignore[arg-type]
    )
    lying = Lying(0.0)  # session 2 lies in round 1 only
    sessions = [
        AgreedSession(
            store,
            bus.endpoint(p),
            "rs",
            genesis,
            config,
            retention=keeper,
            faults=lying if p == PEERS[2] else None,
        )
        for p in PEERS
    ]
    results: list[list[AgreedRoundResult]] = []
    try:
        for s in sessions:
            await s.start(initial_model())
        for r in range(ROUNDS):
            lying.amount = 1e-2 if r == 1 else 0.0
            results.append(
                list(
                    await asyncio.gather(
                        *(s.run_round(gradient(i, r), weight=1 + i) for i, s in enumerate(sessions))
                    )
                )
            )
    finally:
        for s in sessions:
            await s.aclose()  # stores every pending round: the last one is reported too
    assert all(len({res.model for res in rs}) == 1 for rs in results)
    assert all(res.aggregation == "reduce-scatter" for rs in results for res in rs)
    assert results[1][0].liars == (PEERS[2],)
    assert PEERS[2] not in results[2][0].roster.peers
    assert len(keeper.collections) >= ROUNDS - 1
    # Nothing is pinned recursively without its whole DAG here (Kubo's repo/gc would fail).
    assert dangling_recursive_pins(store) == []
    records = [await load_record(store, rs[0].record) for rs in results]
    slices = [
        [SliceRecord.from_block(await store.get(c)) for c in rec.slices or ()] for rec in records
    ]
    # Slice, fraud and lying records are kept, each pinned alone, for every round.
    frauds = records[1].frauds or ()
    assert len(frauds) == 1
    claimed = FraudRecord.from_block(await store.get(frauds[0])).claimed
    for rec in records:
        for cid in (*(rec.slices or ()), *(rec.frauds or ())):
            assert bytes(cid) in store.direct
    assert bytes(claimed) in store.direct
    # Slice results and contributions of rounds older than K are gone; the last K rounds' stay.
    for r in range(ROUNDS):
        kept = r >= ROUNDS - K
        for s in slices[r]:
            assert (await store.has(s.result)) == kept, (r, s.k)
        for entry in results[r][0].roster.entries:
            assert (await store.has(entry.contribution)) == kept, (r, entry.peer)
    # The chain, its rosters, slice and fraud records still verify without recomputation ...
    chain = await verify_agreed_history(
        store, results[-1][0].record, keys=bus.keys, session="rs", genesis=genesis, recompute=False
    )
    assert [rec.excluded for rec in chain] == [None] + [(PEERS[2],)] * (ROUNDS - 1)
    swapped = records[0].slices or ()
    bad = dataclasses.replace(records[0], slices=(swapped[1], swapped[0], *swapped[2:]))
    with pytest.raises(RoundVerificationFailed, match="does not fit"):
        await verify_agreed_history(
            store,
            await store.put(bad.to_block()),
            keys=bus.keys,
            session="rs",
            genesis=genesis,
            recompute=False,
        )
    # ... the last round re-aggregates, an old one reports its dropped inputs.
    await verify_agreed_round(store, results[-1][0].record)
    with pytest.raises(RoundVerificationFailed):
        await verify_agreed_round(store, results[0][0].record)


@pytest.mark.kubo
async def test_sliced_rounds_with_gc_on_kubo_keep_the_repo_collectable(kubo_swarm3) -> None:  # type: ignore[no-untyped-def]
    d, chunk = 98_304, 65_536  # six chunks: two per slice
    members = tuple(n.peer_id for n in kubo_swarm3)
    stores = [KuboBlockStore(n.api_url, timeout=20.0) for n in kubo_swarm3]
    pubsubs = [KuboPubsub(n.api_url) for n in kubo_swarm3]
    keepers = [RetentionKeeper(s, Retention(keep_rounds=1, gc_every=1)) for s in stores]
    model = initial_model(d)
    settings = {**FAST, "chunk_bytes": chunk, "fetch_timeout": 10.0, "round_timeout": 40.0}
    settings.update(collect_timeout=3.0, takeover_timeout=2.0, announce_interval=0.1)
    config = AgreedConfig(members=members, aggregation="reduce-scatter", **settings)  # type: ignore[arg-type]
    sessions: list[AgreedSession] = []
    try:
        genesis = await AgreedSession.commit_genesis(stores[0], model)
        for store, pubsub, keeper in zip(stores, pubsubs, keepers, strict=True):
            session = AgreedSession(store, pubsub, "rs-gc", genesis, config, retention=keeper)
            sessions.append(session)
            await session.start(model)
        for r in range(3):
            results = await asyncio.gather(
                *(s.run_round(gradient(i, r, d), weight=1) for i, s in enumerate(sessions))
            )
            assert len({res.model for res in results}) == 1
            assert {res.aggregation for res in results} == {"reduce-scatter"}
        for session in sessions:
            await session.aclose()
        # Every collection ran (a recursive pin of a slice record, whose contributions a peer
        # holds only in part, makes Kubo's repo/gc fail).
        assert all(len(k.collections) == 3 for k in keepers), [k.collections for k in keepers]
        head = results[0].record
        chain = await verify_agreed_history(
            stores[1], head, session="rs-gc", genesis=genesis, recompute=False
        )
        assert [rec.round for rec in chain] == [0, 1, 2]
        await verify_agreed_round(stores[1], head)  # the kept round re-aggregates (bitswap)
    finally:
        await aclose_all(sessions, pubsubs, stores)


async def test_the_keeper_stores_records_read_from_announcements_instead_of_fetching_them() -> None:
    store = MemoryBlockStore()
    result = await store.put(Block.new(b"slice result"))
    roster = await store.put(Block.new(dag_cbor.encode({"roster": 1}), "dag-cbor"))
    record = SliceRecord(
        roster=roster, base=roster, k=0, offset=0, length=3, rule="fedavg", learning_rate=1.0,
        inputs=(("a", result),), missing=(), weight_sum=1, result=result,
    ).to_block()  # fmt: skip
    sliced = ReduceScatterResult(
        model=np.zeros(3, np.float32),
        model_cid=result,
        records=[record.cid],
        missing=(),
        record_blocks={bytes(record.cid): record},
    )
    assert not await store.has(record.cid)  # only its announcement brought it
    kept = await keep_slice_blocks(store, UnpinnedPuts(store), sliced, timeout=0.1)
    assert kept.records == (record.cid,)
    assert await store.has(record.cid)
    assert bytes(record.cid) in store.direct  # pinned alone: it links blocks not held here


async def test_a_late_peer_that_checks_the_others_record_keeps_what_a_sliced_round_keeps() -> None:
    """The late peer of a sliced round re-aggregates it from the others' record
    (``check_finished_round``); under retention it pins the slice records alone and the whole
    contributions it fetched, with no recursive pin missing a link."""
    shared, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(shared, initial_model())
    own = MemoryBlockStore()  # the late peer's pins; its blocks are everyone's (one "network")
    own.blocks = shared.blocks
    keeper = RetentionKeeper(own, Retention(keep_rounds=K, gc_every=None), keep=[genesis])
    config = AgreedConfig(
        members=PEERS,
        aggregation="reduce-scatter",
        min_peers=3,
        **{**FAST, "collect_timeout": 0.5},  # type: ignore[arg-type]
    )
    sessions = []
    for peer in PEERS:
        if peer == PEERS[3]:  # hears no slice message: as if it was not there then
            transport = DropMessages(bus.endpoint(peer), None, "slice", None)
            session = AgreedSession(own, transport, "rs", genesis, config, retention=keeper)
        else:
            session = AgreedSession(shared, bus.endpoint(peer), "rs", genesis, config)
        await session.start(initial_model())
        sessions.append(session)
    try:
        for r in range(2):
            await asyncio.gather(*(s.run_round(gradient(i, r)) for i, s in enumerate(sessions[:3])))
        mine = await asyncio.wait_for(sessions[3].run_round(gradient(3, 0)), 10.0)
    finally:
        for session in sessions:
            await session.aclose()  # stores every pending round: the late one is reported too
    assert not mine.included
    assert mine.slices
    for cid in (*mine.slices, mine.record, mine.roster_cid):
        assert bytes(cid) in own.direct
    for entry in mine.roster.entries:
        assert bytes(entry.contribution) in own.pins - own.direct
    assert dangling_recursive_pins(own) == []
