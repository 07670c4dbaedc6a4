"""Reduce-scatter faults inside agreed rounds (issue 14): agreed exclusion of proven liars."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from multiformats import CID

from gradfed_ipfs import AgreedConfig, AgreedSession, verify_agreed_history
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import MalformedManifest, RoundVerificationFailed
from gradfed_ipfs.federated.agreed.history import load_record, load_result
from gradfed_ipfs.federated.agreed.round.coordinator import roster_problem
from gradfed_ipfs.federated.exchange.encoded import encode_gradient
from gradfed_ipfs.federated.sliced import Lying
from gradfed_ipfs.formats.agreed.roster import AgreedMessage, AgreedRecord, Roster
from gradfed_ipfs.formats.sliced.slices import FraudRecord
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore, put_gradient
from gradfed_ipfs.tensor.deterministic import deterministic_update
from tests.federated.agreed.test_sliced import (
    CHUNK,
    LR,
    PEERS,
    Peers,
    gradient,
    initial_model,
)
from tests.helpers import MEMORY_KEYS, roster_signature, signed, signed_entry

LIAR = PEERS[2]


async def lie_then_resync() -> tuple[Peers, AgreedSession, CID, list[CID]]:
    """Round 0 among a, b and the liar c (caught); then d starts late and resyncs.

    Returns the peers (a, b, d running; c closed), d, the genesis and round 0's record CIDs.
    """
    peers = Peers(MemoryBlockStore(), MemoryPubsubBus())
    genesis = await peers.start(
        PEERS[:3],
        aggregation="reduce-scatter",
        min_peers=3,
        collect_timeout=0.5,
        takeover_skew=60.0,  # every rank's roster is checked at once (the liar's included)
        faults={2: Lying(1e-2)},
    )
    try:
        liar = peers.sessions[2]
        first = await peers.round(0)
        await liar.aclose()
        peers.sessions.remove(liar)
        late = AgreedSession(
            peers.store,
            peers.bus.endpoint(PEERS[3]),
            "rs",
            genesis,  # type: ignore[arg-type]
            peers.sessions[0].config,
        )
        peers.sessions.append(late)
        await late.start(initial_model())
        assert (await late.resync(timeout=5.0)).changed
    except BaseException:
        await peers.close()
        raise
    return peers, late, genesis, [res.record for res in first]  # type: ignore[return-value]


async def test_a_peer_that_resyncs_after_a_lie_excludes_the_liar_and_refuses_its_roster() -> None:
    peers, late, genesis, first = await lie_then_resync()
    store, bus = peers.store, peers.bus
    try:
        record0 = await load_record(store, first[0])
        assert record0.excluded == (LIAR,)
        assert record0.frauds is not None
        assert len(record0.frauds) == 1
        assert FraudRecord.from_block(await store.get(record0.frauds[0])).reducer == LIAR
        # d took no part in round 0: it learned the exclusion from the agreed record alone.
        assert late.excluded == {LIAR}
        assert all(s.excluded == {LIAR} for s in peers.sessions)
        # The liar contributes to round 1 and publishes a roster listing itself and the others'
        # real contributions: without the exclusion it would be adopted at once.
        base, base_model = late.model_cid, late.model.copy()
        grads = {p: gradient(PEERS.index(p), 1) for p in PEERS}
        cids = {p: (await encode_gradient(g, chunk_bytes=CHUNK)).cid for p, g in grads.items()}
        await put_gradient(store, grads[LIAR], chunk_bytes=CHUNK)
        forged = Roster.new(
            "rs", genesis, 1, base, LIAR, PEERS, {p: (cids[p], 1) for p in PEERS}
        ).to_block()
        await store.put(forged, pin=False)  # the liar serves it, as any coordinator does
        endpoint, topic = bus.endpoint(LIAR), late.topic
        contrib = AgreedMessage("contrib", "rs", genesis, 1, LIAR, cids[LIAR], base=base, weight=1)
        roster = AgreedMessage("roster", "rs", genesis, 1, LIAR, forged.cid, inline=forged.data)
        await endpoint.publish(topic, await signed(contrib, bus))
        await endpoint.publish(topic, await signed(roster, bus))
        results = await asyncio.gather(
            *(s.run_round(grads[s.peer_id], weight=1) for s in peers.sessions)
        )
    finally:
        await peers.close()
    assert {res.model for res in results} == {results[0].model}
    assert all(res.roster.peers == (PEERS[0], PEERS[1], PEERS[3]) for res in results)
    assert all("proven lying" in res.rejected[LIAR] for res in results)
    live = [grads[p] for p in results[0].roster.peers]
    want = deterministic_update(base_model, live, [1] * 3, LR)
    assert results[0].model == await put_gradient(MemoryBlockStore(), want)
    records = await verify_agreed_history(
        store, results[0].record, keys=bus.keys, session="rs", genesis=genesis
    )
    assert [r.excluded for r in records] == [(LIAR,), (LIAR,)]
    assert records[1].frauds is None  # no lie in round 1: the exclusion is carried forward


async def test_records_that_forget_a_liar_or_list_it_later_fail_verification() -> None:
    peers, _, genesis, first = await lie_then_resync()
    await peers.close()
    store = peers.store
    record0 = await load_record(store, first[0])
    # 1. Round 0's record without its exclusion (or without its fraud record) is refused.
    for bad in (
        dataclasses.replace(record0, excluded=None),
        dataclasses.replace(record0, frauds=None),
    ):
        cid = await store.put(bad.to_block())
        with pytest.raises(RoundVerificationFailed, match="excludes"):
            await verify_agreed_history(
                store, cid, keys=MEMORY_KEYS, session="rs", genesis=genesis, recompute=False
            )
    # 2. A fraud record whose "correct" record is not the recorded slice proves nothing.
    assert record0.frauds is not None
    assert record0.slices is not None
    fraud = FraudRecord.from_block(await store.get(record0.frauds[0]))
    other = record0.slices[(fraud.k + 1) % len(record0.slices)]
    wrong = dataclasses.replace(fraud, correct=other)
    await store.put(wrong.to_block())
    cid = await store.put(dataclasses.replace(record0, frauds=(wrong.to_block().cid,)).to_block())
    with pytest.raises(RoundVerificationFailed, match="does not prove"):
        await verify_agreed_history(
            store, cid, keys=MEMORY_KEYS, session="rs", genesis=genesis, recompute=False
        )

    # 3. A later (all-to-all) round whose roster lists the liar is refused, though it
    #    re-aggregates correctly; the same round without the liar verifies.
    base, _ = await load_result(store, record0)  # round 0's model was not stored: rebuilt

    async def round1(listed: tuple[str, ...]) -> CID:
        grads = [gradient(PEERS.index(p), 1) for p in listed]
        entries = {
            p: await signed_entry("rs", genesis, 1, record0.result, p, await put_gradient(store, g))
            for p, g in zip(listed, grads, strict=True)
        }
        roster = Roster.new("rs", genesis, 1, record0.result, PEERS[0], PEERS, entries)
        roster_cid = await store.put(roster.to_block())
        model = await put_gradient(store, deterministic_update(base, grads, [1] * len(grads), LR))
        record = AgreedRecord(
            "rs",
            genesis,
            1,
            first[0],
            record0.result,
            roster_cid,
            model,
            LR,
            excluded=(LIAR,),
            roster_signature=await roster_signature(roster),  # its coordinator's, as peers write
        )
        return await store.put(record.to_block())

    fine = await round1((PEERS[0], PEERS[1], PEERS[3]))
    assert (
        len(
            await verify_agreed_history(
                store, fine, keys=MEMORY_KEYS, session="rs", genesis=genesis
            )
        )
        == 2
    )
    with pytest.raises(RoundVerificationFailed, match="lists proven lying reducer"):
        await verify_agreed_history(
            store, await round1(PEERS), keys=MEMORY_KEYS, session="rs", genesis=genesis
        )


def test_roster_problem_refuses_a_proven_liar_and_records_stay_backward_compatible() -> None:
    genesis = make_cid(b"genesis", "raw")
    roster = Roster.new("s", genesis, 3, genesis, PEERS[0], PEERS, {p: (genesis, 1) for p in PEERS})
    config = AgreedConfig(PEERS, min_peers=2)
    assert roster_problem(roster, "s", genesis, 3, genesis, config) == ""
    assert roster_problem(roster, "s", genesis, 3, genesis, config, {"peer-x"}) == ""
    assert "peer-c" in roster_problem(roster, "s", genesis, 3, genesis, config, {LIAR})
    # Records without the new fields keep their bytes; unsorted exclusions are refused.
    plain = AgreedRecord("s", genesis, 0, None, genesis, make_cid(b"r", "dag-cbor"), genesis, 1.0)
    assert b"excluded" not in plain.to_block().data
    assert b"frauds" not in plain.to_block().data
    assert AgreedRecord.from_block(plain.to_block()) == plain
    with_liars = dataclasses.replace(plain, excluded=(PEERS[0], PEERS[2]))
    assert AgreedRecord.from_block(with_liars.to_block()) == with_liars
    unsorted = dataclasses.replace(plain, excluded=(PEERS[2], PEERS[0])).to_block()
    with pytest.raises(MalformedManifest, match="sorted"):
        AgreedRecord.from_block(unsorted)


async def test_with_default_min_peers_the_session_goes_on_without_the_proven_liar() -> None:
    peers = Peers(MemoryBlockStore(), MemoryPubsubBus())
    await peers.start(  # min_peers: every member
        PEERS, aggregation="reduce-scatter", faults={2: Lying(1e-2)}
    )
    try:
        await peers.round(0)
        # The liar still contributes, no roster may list it: before the fix, QuorumNotReached.
        second = await peers.round(1)
    finally:
        await peers.close()
    assert all(res.roster.peers == (PEERS[0], PEERS[1], PEERS[3]) for res in second)
    assert len({res.model for res in second}) == 1
