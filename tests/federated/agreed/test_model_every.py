"""Models stored every ``model_every``-th round; the others rebuilt from their records."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedSession, verify_agreed_history
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import InvalidGradient, MalformedManifest, RoundVerificationFailed
from gradfed_ipfs.federated.agreed import RobustRule
from gradfed_ipfs.federated.agreed.history import (
    load_record,
    load_result,
    model_cid,
    verify_agreed_round,
)
from gradfed_ipfs.formats.agreed.roster import AgreedRecord
from gradfed_ipfs.formats.records import decode_record, encode_record
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore, Retention, RetentionKeeper
from gradfed_ipfs.tensor.aggregation import Median
from tests.federated.agreed.test_model_holders import KUBO_SETTINGS, kubo_clients
from tests.federated.agreed.test_rounds import (
    PEERS,
    close,
    initial_model,
    make_sessions,
    run_all,
)
from tests.polling import apoll_until

EVERY = 3


def test_model_every_must_be_positive() -> None:
    with pytest.raises(InvalidGradient, match="model_every"):
        AgreedConfig(members=PEERS, model_every=0)
    config = AgreedConfig(members=PEERS, model_every=EVERY)
    assert [r for r in range(9) if config.stores_model(r)] == [2, 5, 8]
    assert all(AgreedConfig(members=PEERS, model_every=1).stores_model(r) for r in range(5))


async def test_unstored_models_are_rebuilt_bit_for_bit_and_the_history_verifies() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    sessions = await make_sessions(
        store, [bus.endpoint(p) for p in PEERS], genesis, model_every=EVERY
    )
    models: list[np.ndarray] = []
    records = []
    try:
        for r in range(7):
            results = await run_all(sessions, [0, 1, 2])
            assert len({bytes(res.record) for res in results}) == 1, r
            assert all(res.model_stored == ((r + 1) % EVERY == 0) for res in results), r
            models.append(sessions[0].model.copy())
            records.append(results[0].record)
    finally:
        await close(sessions)
    for r, cid in enumerate(records):
        record = await load_record(store, cid)
        stored = (r + 1) % EVERY == 0
        assert record.model_stored == stored, r
        # No holder put an unstored model, but the last one: its holders put it at close.
        assert await store.has(record.result) == (stored or r == 6), r
        model, state = await load_result(store, record)  # fetched, or rebuilt from round 2's
        np.testing.assert_array_equal(model, models[r])
        assert state is None
        await verify_agreed_round(store, cid)  # its base is rebuilt when it was not stored
    chain = await verify_agreed_history(
        store, records[-1], keys=bus.keys, session="s1", genesis=genesis
    )
    assert [rec.model_stored for rec in chain] == [(r + 1) % EVERY == 0 for r in range(7)]
    # What a peer already holds ends the walk back: nothing before round 5 is needed then.
    last = await load_record(store, records[-1])
    known = {bytes(last.base): (models[5], None)}
    model, _ = await load_result(store, last, known=known)
    np.testing.assert_array_equal(model, models[6])


async def test_a_record_whose_unstored_result_does_not_recompute_is_refused() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    sessions = await make_sessions(
        store, [bus.endpoint(p) for p in PEERS], genesis, model_every=EVERY
    )
    try:
        for _ in range(2):
            results = await run_all(sessions, [0, 1, 2])
    finally:
        await close(sessions)
    honest = await load_record(store, results[0].record)
    assert not honest.model_stored
    forged = dataclasses.replace(honest, result=await model_cid(initial_model(5)))
    with pytest.raises(RoundVerificationFailed, match="re-aggregates to"):
        await load_result(store, forged)
    # A later record that claims to follow it through another base: the walk back refuses.
    cid = await store.put(forged.to_block())
    follower = dataclasses.replace(honest, round=2, prev=cid, base=genesis)
    with pytest.raises(RoundVerificationFailed, match="does not follow"):
        await load_result(store, follower)
    with pytest.raises(RoundVerificationFailed, match="no stored model in the last 1 rounds"):
        await load_result(store, honest, max_rounds=1)  # rounds 1 and 0 would be rebuilt


def test_model_stored_is_written_only_as_false() -> None:
    model, link = make_cid(b"model"), make_cid(b"record", "dag-cbor")
    record = AgreedRecord("s", model, 0, None, model, link, model, 1.0)
    stored, unstored = record.to_block(), dataclasses.replace(record, model_stored=False)
    assert AgreedRecord.from_block(stored).model_stored
    assert not AgreedRecord.from_block(unstored.to_block()).model_stored
    assert len(unstored.to_block().data) > len(stored.data)  # default records keep their bytes
    fields = decode_record(stored, "gradfed.agreed-round")
    for value in (True, 0, None):
        with pytest.raises(MalformedManifest, match="model_stored"):
            AgreedRecord.from_block(encode_record({**fields, "model_stored": value}))


async def test_a_late_peer_resyncs_to_a_head_whose_model_was_not_stored() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    transports = [bus.endpoint(p) for p in PEERS]
    sessions = await make_sessions(store, transports[:2], genesis, min_peers=2, model_every=EVERY)
    late: list[AgreedSession] = []
    try:
        for _ in range(4):  # rounds 0..3: only round 2's model is stored
            await run_all(sessions, [0, 1])
        head = await load_record(store, sessions[0].head)  # type: ignore[arg-type]
        assert not head.model_stored
        assert not await store.has(head.result)
        late = await make_sessions(store, transports[2:], genesis, min_peers=2, model_every=EVERY)
        synced = await late[0].resync(timeout=5.0)
        assert (synced.round, synced.model) == (4, sessions[0].model_cid)
        np.testing.assert_array_equal(late[0].model, sessions[0].model)
        results = await run_all([*sessions, *late], [0, 1, 2])
        assert len({bytes(res.record) for res in results}) == 1
    finally:
        await close([*sessions, *late])


async def test_retention_keeps_the_rounds_back_to_a_stored_base() -> None:
    store = MemoryBlockStore()
    genesis = await AgreedSession.commit_genesis(store, np.zeros(64, np.float32))
    keeper = RetentionKeeper(store, Retention(keep_rounds=2, gc_every=1), keep=[genesis])
    session = AgreedSession(
        store,
        MemoryPubsubBus().endpoint("solo"),
        "s",
        genesis,
        AgreedConfig(("solo",), model_every=EVERY, collect_timeout=1.0, fetch_timeout=2.0),
        retention=keeper,
    )
    await session.start(np.zeros(64, np.float32))
    results = []
    try:
        for r in range(9):
            rng = np.random.default_rng(r)
            results.append(await session.run_round(rng.standard_normal(64).astype(np.float32)))
    finally:
        await session.aclose()
    # Stored models: rounds 2, 5 and 8. The last K = 2 rounds are 7 and 8; round 7's base
    # (round 6's model) was not stored: it is rebuilt from round 5's model and round 6's
    # inputs, so round 6 stays too, and everything before it goes.
    assert keeper.kept_rounds == [6, 7, 8]
    for old in results[:6]:
        assert not await store.has(old.roster.entries[0].contribution), old.round
    assert not await store.has(results[2].model)  # dropped with round 3, its base
    assert await store.has(results[5].model)
    for kept in results[6:]:
        await verify_agreed_round(store, kept.record)


async def test_without_its_rule_a_custom_rule_model_is_read_only_if_its_holders_put_it() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    rule = RobustRule(Median())
    sessions = await make_sessions(
        store, [bus.endpoint(p) for p in PEERS], genesis, model_every=EVERY, rule=rule
    )
    try:
        first = (await run_all(sessions, [0, 1, 2]))[0]
        last = (await run_all(sessions, [0, 1, 2]))[0]
    finally:
        await close(sessions)  # the holders of round 1 put its model now
    records = [await load_record(store, res.record) for res in (first, last)]
    assert not any(record.model_stored for record in records)
    model, _ = await load_result(store, records[1])  # no rule: fetched, put at close
    np.testing.assert_array_equal(model, sessions[0].model)
    with pytest.raises(RoundVerificationFailed, match="needs that rule, pass it"):
        await load_result(store, records[0])  # nobody put round 0's
    rebuilt, _ = await load_result(store, records[0], rule)
    assert bytes(await model_cid(rebuilt)) == bytes(first.model)


@pytest.mark.kubo
async def test_on_kubo_a_returning_peer_rebuilds_an_unstored_head_from_the_others_daemons(
    kubo_swarm3,  # type: ignore[no-untyped-def]
) -> None:
    d = 50_000
    members, stores, pubsubs = kubo_clients(kubo_swarm3)
    config = AgreedConfig(members=members, min_peers=2, model_every=EVERY, **KUBO_SETTINGS)  # type: ignore[arg-type]
    model = np.random.default_rng(3).standard_normal(d).astype(np.float32)

    def grad(i: int, r: int) -> np.ndarray:
        return (0.01 * np.random.default_rng([i, r]).standard_normal(d)).astype(np.float32)

    sessions: list[AgreedSession] = []
    returning: AgreedSession | None = None
    try:
        genesis = await AgreedSession.commit_genesis(stores[0], model)
        for store, pubsub in zip(stores, pubsubs, strict=True):
            sessions.append(AgreedSession(store, pubsub, "every", genesis, config))
            await sessions[-1].start(model)
        await asyncio.gather(*(s.run_round(grad(i, 0)) for i, s in enumerate(sessions)))
        await sessions[2].aclose()  # it leaves after round 0 (its daemon stays up)
        for r in (1, 2, 3, 4):  # round 2's model is stored, rounds 1, 3 and 4 are not
            await asyncio.gather(*(s.run_round(grad(i, r)) for i, s in enumerate(sessions[:2])))
        head = await load_record(stores[2], sessions[0].head)  # type: ignore[arg-type]
        assert (head.round, head.model_stored) == (4, False)
        returning = AgreedSession(stores[2], pubsubs[2], "every", genesis, config)
        await returning.start(model)

        # It holds round 0's model; rounds 3 and 4 are rebuilt from round 2's, which only the
        # holders' daemons have, and from contributions that only their owners' daemons have.
        # (A head heard first may be round 3's, still re-announced: resync until round 4's.)
        async def caught_up() -> bool:
            assert returning is not None
            return (await returning.resync(timeout=10.0)).round == 5

        await apoll_until(caught_up, timeout=30.0, what="the returning peer to reach round 5")
        assert returning.model_cid == sessions[0].model_cid
        np.testing.assert_array_equal(returning.model, sessions[0].model)
        results = await asyncio.gather(
            *(s.run_round(grad(i, 5)) for i, s in enumerate([*sessions[:2], returning]))
        )
        assert len({bytes(res.record) for res in results}) == 1
        assert all(len(res.roster.entries) == 3 for res in results)
    finally:
        for session in [*sessions, *([returning] if returning else [])]:
            await session.aclose()
        for closable in (*pubsubs, *stores):
            await closable.aclose()
