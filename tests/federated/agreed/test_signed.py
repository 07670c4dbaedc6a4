"""Signed agreed messages and rosters (issue 32, items 1 and 2; the coordinator schedule).

A member signs with its own key only (``bus.signer``): it can say anything as itself, nothing
as another member. Every test here is an attack that succeeded before the rosters carried their
owners' signatures and the coordinator schedule was enforced.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs import AgreedRoundResult, AgreedSession, verify_agreed_history
from gradfed_ipfs.errors import RoundVerificationFailed
from gradfed_ipfs.federated.agreed.config import AgreedConfig
from gradfed_ipfs.federated.agreed.round.coordinator import (
    RoundBoard,
    coordinator_ranking,
    roster_problem,
)
from gradfed_ipfs.formats import PubsubMessage
from gradfed_ipfs.formats.agreed.roster import (
    AgreedMessage,
    AgreedRecord,
    Roster,
    RosterEntry,
    open_message,
    sign_message,
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


async def hijack_messages(
    bus: MemoryPubsubBus, store: MemoryBlockStore, genesis: CID, attacker: str, named: str
) -> list[bytes]:
    """The roster hijack of issue 32: made-up contributions for the honest peers, 2**40 for the
    attacker, ``named`` as coordinator; published plain (as before signing) and signed by the
    attacker (its own entry is its own signed contribution, the others' it can only forge)."""
    signer = bus.signer(attacker)
    lines: dict[str, tuple[CID, int, bytes | None]] = {}
    for i, peer in enumerate(PEERS):
        fake = await put_gradient(store, np.full(1000, 1234.5 + i, np.float32))
        weight = 2**40 if peer == attacker else 1
        contrib = AgreedMessage("contrib", SESSION, genesis, 0, peer, fake, genesis, weight)
        forged = await sign_message(dataclasses.replace(contrib, peer=attacker), signer, bus.keys)
        own = await sign_message(contrib, signer, bus.keys) if peer == attacker else None
        lines[peer] = (fake, weight, (own or forged).signature)
    roster = Roster.new(SESSION, genesis, 0, genesis, named, PEERS, lines).to_block()
    message = AgreedMessage("roster", SESSION, genesis, 0, attacker, roster.cid, inline=roster.data)
    signed = await sign_message(message, signer, bus.keys)
    return [message.encode(), signed.block.data]


@pytest.mark.parametrize("skew", [None, 60.0])
async def test_a_roster_hijack_by_the_last_ranked_member_is_held(skew: float | None) -> None:
    """The last-ranked member publishes at t = 0 a roster naming made-up contributions for the
    honest peers (2**40 for itself, a weight the session allows here) and another peer as
    coordinator. Without a skew margin its time has not come (it waits, then the honest
    roster is taken); with a skew covering every rank it is checked at once and refused."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    ranking = coordinator_ranking(SESSION, genesis, 0, PEERS)
    attacker, honest = ranking[-1], sorted(ranking[:-1])
    config = AgreedConfig(members=PEERS, min_peers=2, max_weight=2**40, takeover_skew=skew, **FAST)  # type: ignore[arg-type]
    sessions = [AgreedSession(store, bus.endpoint(p), SESSION, genesis, config) for p in honest]
    for session in sessions:
        await session.start(initial_model())
    try:
        for data in await hijack_messages(bus, store, genesis, attacker, ranking[0]):
            await bus.endpoint(attacker).publish(sessions[0].topic, data)
        indices = [PEERS.index(p) for p in honest]
        results = await run_all(sessions, indices)
    finally:
        await close(sessions)
    weights = [1 + i for i in indices]
    want = deterministic_update(initial_model(), [delta(i, 0) for i in indices], weights, 1.0)
    assert {res.model for res in results} == {await put_gradient(MemoryBlockStore(), want)}
    for session, res in zip(sessions, results, strict=True):
        assert res.included
        assert res.roster.peers == tuple(honest)
        assert res.roster.coordinator == ranking[0]
        assert session.board.dropped["unsigned"] >= 1  # the plain copy
        if skew is not None:  # checked at once: its entries are not their owners' statements
            assert "not its signed contribution" in res.rejected[attacker]
    records = await verify_agreed_history(
        store, results[0].record, session=SESSION, genesis=genesis, keys=bus.keys
    )
    assert len(records) == 1


async def test_a_roster_from_another_member_than_it_names_is_refused() -> None:
    """A member relays, as soon as it hears them, the honest peers' own signed contributions in
    a roster naming the rank-0 coordinator (every entry checks out offline): the schedule's
    rank 0 did not send it, so it is refused, its sender named, and rank 0's own roster (the
    same bytes when rank 0 has heard the same contributions) is still taken."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    ranking = coordinator_ranking(SESSION, genesis, 0, PEERS)
    relay, honest = ranking[1], sorted((ranking[0], ranking[2]))
    config = AgreedConfig(members=PEERS, min_peers=2, takeover_skew=60.0, **FAST)  # type: ignore[arg-type]
    sessions = [AgreedSession(store, bus.endpoint(p), SESSION, genesis, config) for p in honest]
    endpoint = bus.endpoint(relay)
    heard = endpoint.subscribe(sessions[0].topic)

    async def relay_roster() -> None:
        lines: dict[str, tuple[CID, int, bytes | None]] = {}
        async for message in heard:
            decoded, signature = open_message(message.data, bus.keys)
            if decoded.kind == "contrib" and decoded.weight is not None:
                lines[decoded.peer] = (decoded.cid, decoded.weight, signature)
            if len(lines) == 2:
                break
        block = Roster.new(SESSION, genesis, 0, genesis, ranking[0], PEERS, lines).to_block()
        message = AgreedMessage("roster", SESSION, genesis, 0, relay, block.cid, inline=block.data)
        signed = await sign_message(message, bus.signer(relay), bus.keys)
        await endpoint.publish(sessions[0].topic, signed.block.data)

    for session in sessions:
        await session.start(initial_model())
    task = asyncio.create_task(relay_roster())
    try:
        results = await run_all(sessions, [PEERS.index(p) for p in honest])
        await asyncio.wait_for(task, 5.0)
    finally:
        task.cancel()
        await close(sessions)
    assert len({res.record for res in results}) == 1
    for res in results:
        assert res.roster.coordinator == ranking[0]
        assert res.roster.peers == tuple(honest)
        assert f"names {ranking[0]} as coordinator" in res.rejected[relay]


async def test_unsigned_and_wrongly_signed_messages_are_dropped_and_counted() -> None:
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(MemoryBlockStore(), initial_model())
    board = RoundBoard(SESSION, genesis, "peer-c", PEERS, keys=bus.keys)
    contrib = AgreedMessage("contrib", SESSION, genesis, 0, "peer-a", genesis, genesis, 1)
    good = await sign_message(contrib, bus.signer("peer-a"), bus.keys)
    assert board.accept(PubsubMessage("peer-a", contrib.encode())) is None
    assert board.dropped["unsigned"] == 1
    flipped = bytes(b ^ 0xFF for b in good.signature)
    tampered = good.block.data.replace(good.signature, flipped)
    assert board.accept(PubsubMessage("peer-a", tampered)) is None
    assert board.dropped["bad-signature"] == 1
    # The attacker signs the message as itself, claiming peer-a: not peer-a's statement.
    evil = await sign_message(contrib, bus.signer("evil"), bus.keys)
    assert board.accept(PubsubMessage("peer-a", evil.block.data)) is None
    # Signed as itself, sent through peer-a's name: pubsub's from does not match.
    own = await sign_message(
        dataclasses.replace(contrib, peer="evil"), bus.signer("evil"), bus.keys
    )
    assert board.accept(PubsubMessage("peer-a", own.block.data)) is None
    assert board.dropped["forged"] >= 1
    assert board.accept(PubsubMessage("evil", own.block.data)) is None
    assert board.dropped["stranger"] == 1
    assert board.state(0).contributions == {}
    accepted = board.accept(PubsubMessage("peer-a", good.block.data))
    assert accepted == contrib
    assert board.state(0).contributions["peer-a"].signature == good.signature
    assert board.accept(PubsubMessage("peer-a", good.block.data)) is None  # a re-publication
    assert board.dropped["repeat"] == 1


async def test_a_roster_entry_of_another_round_or_cid_is_refused() -> None:
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(MemoryBlockStore(), initial_model())
    other = await put_gradient(MemoryBlockStore(), np.ones(4, np.float32))
    config = AgreedConfig(members=PEERS, min_peers=1, **FAST)  # type: ignore[arg-type]

    async def signature(round_number: int, cid: CID, weight: int = 1) -> bytes:
        contrib = AgreedMessage(
            "contrib", SESSION, genesis, round_number, "peer-a", cid, genesis, weight
        )
        return (await sign_message(contrib, bus.signer("peer-a"), bus.keys)).signature

    def problem(sig: bytes | None) -> str:
        roster = Roster.new(
            SESSION, genesis, 0, genesis, "peer-a", PEERS, {"peer-a": (genesis, 1, sig)}
        )
        return roster_problem(roster, SESSION, genesis, 0, genesis, config, keys=bus.keys)

    assert problem(await signature(0, genesis)) == ""
    assert "not its signed contribution" in problem(await signature(1, genesis))  # round 1's
    assert "not its signed contribution" in problem(await signature(0, other))  # another CID
    assert "not its signed contribution" in problem(await signature(0, genesis, 2))  # weight
    assert "not signed" in problem(None)


async def test_verify_agreed_history_rejects_a_tampered_entry_signature() -> None:
    store, bus, genesis, results = await one_full_round(SESSION)
    record = AgreedRecord.from_block(await store.get(results[0].record))
    roster = Roster.from_block(await store.get(record.roster))
    await verify_agreed_history(
        store, results[0].record, session=SESSION, genesis=genesis, keys=bus.keys
    )
    first = roster.entries[0]
    assert first.signature is not None
    for signature in (bytes(b ^ 1 for b in first.signature), None):
        entry = RosterEntry(first.peer, first.contribution, first.weight, signature)
        bad = dataclasses.replace(roster, entries=(entry, *roster.entries[1:]))
        cid = await store.put(bad.to_block())
        head = await store.put(dataclasses.replace(record, roster=cid).to_block())
        with pytest.raises(RoundVerificationFailed, match="signed"):
            await verify_agreed_history(
                store, head, session=SESSION, genesis=genesis, keys=bus.keys
            )
        with pytest.raises(RoundVerificationFailed, match="signed"):  # without recomputing too
            await verify_agreed_history(
                store, head, session=SESSION, genesis=genesis, keys=bus.keys, recompute=False
            )


async def test_a_roster_heard_before_its_time_is_kept_and_taken_when_it_comes() -> None:
    """Rank 0 is absent; rank 1 publishes at its time. Rank 2 started the round a second
    later, so by its clock rank 1's time comes later: it keeps the roster, takes it then (not
    before), and does not publish its own meanwhile."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    ranking = coordinator_ranking(SESSION, genesis, 0, PEERS)
    config = AgreedConfig(members=PEERS, min_peers=2, **FAST)  # type: ignore[arg-type]
    first, late = (
        AgreedSession(store, bus.endpoint(p), SESSION, genesis, config) for p in ranking[1:]
    )
    for session in (first, late):
        await session.start(initial_model())

    async def later() -> AgreedRoundResult:
        await asyncio.sleep(1.0)
        return await late.run_round(delta(PEERS.index(late.peer_id), 0))

    try:
        results = await asyncio.gather(
            first.run_round(delta(PEERS.index(first.peer_id), 0)), later()
        )
    finally:
        await close([first, late])
    assert results[0].record == results[1].record
    assert results[1].roster.coordinator == ranking[1]
    assert results[1].seconds >= config.takeover_at(1)  # held until rank 1's time by its clock
