"""A roster that leaves a member out is its coordinator's: the record carries its signature.

Issue 32's leftover: a roster learned only through a record (resync, ``verify_agreed_history``,
the CLI's ``history``) was not checked for who built it, so a member could rebuild a round
from the others' signed contributions with some left out (down to ``min_peers``) and name any
coordinator. The record now carries the coordinator's signature of its ``agreed/roster``
message whenever the roster leaves an expected peer out.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs.errors import BadSignature, RoundVerificationFailed
from gradfed_ipfs.federated.agreed import AgreedConfig, AgreedSession, verify_agreed_history
from gradfed_ipfs.federated.agreed.round.coordinator import coordinator_ranking
from gradfed_ipfs.formats.agreed.roster import (
    AgreedMessage,
    AgreedRecord,
    Roster,
    open_message,
    roster_message_body,
    sign_message,
    verify_roster_coordinator,
)
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore, put_gradient
from gradfed_ipfs.tensor.deterministic import deterministic_update
from tests.federated.agreed.test_rounds import (
    FAST,
    PEERS,
    close,
    delta,
    initial_model,
    one_full_round,
    run_all,
)

SESSION = "s1"


async def two_of_three() -> tuple[MemoryBlockStore, MemoryPubsubBus, CID, AgreedRecord]:
    """A round of ``PEERS[0]`` and ``PEERS[1]`` (``PEERS[2]`` absent, min_peers 2)."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    config = AgreedConfig(members=PEERS, min_peers=2, **FAST)  # type: ignore[arg-type]
    sessions = [AgreedSession(store, bus.endpoint(p), SESSION, genesis, config) for p in PEERS[:2]]
    for session in sessions:
        await session.start(initial_model())
    try:
        results = await run_all(sessions, [0, 1])
    finally:
        await close(sessions)
    assert len({bytes(res.record) for res in results}) == 1
    assert results[0].roster.absent == (PEERS[2],)
    record = AgreedRecord.from_block(await store.get(results[0].record))
    return store, bus, genesis, record


async def test_a_round_that_leaves_a_member_out_records_its_coordinators_signature() -> None:
    store, bus, genesis, record = await two_of_three()
    block = await store.get(record.roster)
    roster = Roster.from_block(block)
    assert record.roster_signature is not None
    verify_roster_coordinator(roster, block, record.roster_signature, bus.keys)
    records = await verify_agreed_history(
        store, record.to_block().cid, session=SESSION, genesis=genesis, keys=bus.keys
    )
    assert [r.round for r in records] == [0]
    # Without it, or with another member's signature, the same round does not verify.
    for signature in (None, bytes(64)):
        stripped = dataclasses.replace(record, roster_signature=signature)
        cid = await store.put(stripped.to_block())
        with pytest.raises(RoundVerificationFailed, match=r"coordinator|does not verify"):
            await verify_agreed_history(store, cid, session=SESSION, genesis=genesis, keys=bus.keys)


async def test_a_complete_round_needs_no_coordinator_signature() -> None:
    """Nothing was left out: every peer derives the same roster, whoever built it."""
    store, bus, genesis, results = await one_full_round(SESSION)
    record = AgreedRecord.from_block(await store.get(results[0].record))
    assert record.roster_signature is None
    await verify_agreed_history(
        store, results[0].record, session=SESSION, genesis=genesis, keys=bus.keys
    )


async def test_a_member_cannot_rebuild_a_round_with_a_signed_contribution_left_out() -> None:
    """``PEERS[1]`` rebuilds the round from the two signed entries with ``PEERS[0]``'s left
    out (min_peers 1 would allow it), naming the real coordinator or itself: without the
    named coordinator's signature it does not verify; signing it as itself while naming
    another coordinator does not either. (Naming itself and signing it is its own roster: a
    verifier sees who built it; the session's members refuse it outside its schedule.)"""
    store, bus, genesis, record = await two_of_three()
    real = Roster.from_block(await store.get(record.roster))
    evil = PEERS[1]
    kept = {e.peer: (e.contribution, e.weight, e.signature) for e in real.entries if e.peer == evil}
    config = AgreedConfig(members=PEERS, min_peers=1, **FAST)  # type: ignore[arg-type]
    for coordinator in {real.coordinator, evil}:
        roster = Roster.new(SESSION, genesis, 0, genesis, coordinator, PEERS, kept)
        block = roster.to_block()
        await store.put(block)
        model = deterministic_update(initial_model(), [delta(1, 0)], [2], 1.0)
        result = await put_gradient(store, model)
        message = AgreedMessage("roster", SESSION, genesis, 0, evil, block.cid, inline=block.data)
        signature = (await sign_message(message, bus.signer(evil), bus.keys)).signature
        assert roster_message_body(roster, block) == message.encode()
        forged = AgreedRecord(
            SESSION, genesis, 0, None, genesis, block.cid, result, config.learning_rate,
            roster_signature=signature,
        )  # fmt: skip
        cid = await store.put(forged.to_block())
        if coordinator == evil:  # its own roster, signed: who built it is on record
            await verify_agreed_history(store, cid, session=SESSION, genesis=genesis, keys=bus.keys)
            continue
        with pytest.raises(RoundVerificationFailed, match="does not verify"):
            await verify_agreed_history(store, cid, session=SESSION, genesis=genesis, keys=bus.keys)
        with pytest.raises(BadSignature):
            verify_roster_coordinator(roster, block, None, bus.keys)


async def test_a_roster_message_signed_over_other_bytes_is_refused_by_its_sender() -> None:
    """The rank-0 coordinator sends its roster as a reference (not inline, though small): the
    signature is not over the message every coordinator sends, so no record could carry it;
    the roster is refused, its sender named, and the next rank's roster is taken."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    ranking = coordinator_ranking(SESSION, genesis, 0, PEERS)
    evil, honest = ranking[0], sorted(ranking[1:])
    config = AgreedConfig(members=PEERS, min_peers=2, **FAST)  # type: ignore[arg-type]
    sessions = [AgreedSession(store, bus.endpoint(p), SESSION, genesis, config) for p in honest]
    endpoint = bus.endpoint(evil)
    heard = endpoint.subscribe(sessions[0].topic)
    for session in sessions:
        await session.start(initial_model())

    async def reference_roster() -> None:
        lines: dict[str, tuple[CID, int, bytes | None]] = {}
        async for message in heard:
            decoded, signature = open_message(message.data, bus.keys)
            if decoded.kind == "contrib" and decoded.weight is not None:
                lines[decoded.peer] = (decoded.cid, decoded.weight, signature)
            if len(lines) == 2:
                break
        block = Roster.new(SESSION, genesis, 0, genesis, evil, PEERS, lines).to_block()
        await store.put(block)
        message = AgreedMessage("roster", SESSION, genesis, 0, evil, block.cid)  # no inline
        await endpoint.publish(
            sessions[0].topic, (await sign_message(message, bus.signer(evil), bus.keys)).block.data
        )

    task = asyncio.create_task(reference_roster())
    try:
        results = await run_all(sessions, [PEERS.index(p) for p in honest])
        await asyncio.wait_for(task, 5.0)
    finally:
        task.cancel()
        await close(sessions)
    assert len({bytes(res.record) for res in results}) == 1
    for res in results:
        assert res.roster.coordinator == ranking[1]
        assert "does not verify" in res.rejected[evil]
    await verify_agreed_history(
        store, results[0].record, session=SESSION, genesis=genesis, keys=bus.keys
    )
    assert np.isfinite(sessions[0].model).all()
