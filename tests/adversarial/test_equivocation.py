"""Equivocation is evidence (issue 32, attack 2 and item 3), over the in-memory bus.

A member that never contributes sends each honest peer a different roster and echoes each
peer's own ``done`` back to it (:mod:`tests.adversarial.equivocator`). Before this, the honest
peers ended every round on different models with only ``matched=False``, and resync left
them split.
"""

from __future__ import annotations

import asyncio

import pytest
from multiformats import CID

from gradfed_ipfs import AgreedRoundResult, AgreedSession, verify_agreed_history
from gradfed_ipfs.errors import BadSignature, MalformedManifest, QuorumNotReached, RoundMismatch
from gradfed_ipfs.federated.agreed import AgreedConfig
from gradfed_ipfs.federated.agreed.round.coordinator import coordinator_ranking
from gradfed_ipfs.formats.agreed.evidence import decode_equivocation, equivocation_proof
from gradfed_ipfs.formats.agreed.roster import AgreedMessage, Roster, sign_message
from gradfed_ipfs.formats.records import encode_record
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore
from tests.adversarial.equivocator import DirectedPubsub, Equivocator
from tests.federated.agreed.test_rounds import FAST, delta, initial_model
from tests.polling import apoll_until

EVIL = "evil"
HONEST = ("peer-a", "peer-b")
MEMBERS = tuple(sorted((*HONEST, EVIL)))
ROUNDS = 4


async def _session_where_evil_coordinates(
    store: MemoryBlockStore, members: tuple[str, ...] = MEMBERS
) -> tuple[str, CID]:
    """A session name whose round 0 the attacker coordinates (rank 0: taken at once)."""
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    for n in range(100):
        if coordinator_ranking(f"s{n}", genesis, 0, members)[0] == EVIL:
            return f"s{n}", genesis
    raise AssertionError("no session name found")


async def _run(session: AgreedSession, index: int, late: float = 0.0) -> list[AgreedRoundResult]:
    """Run rounds as an application does (``Peer.run``): resync and retry on a mismatch
    (``late`` seconds after it: a slow peer, as on a loaded machine)."""
    ran: list[AgreedRoundResult] = []
    while session.round < ROUNDS:
        try:
            ran.append(await session.run_round(delta(index, session.round), weight=1 + index))
        except (RoundMismatch, QuorumNotReached):
            await asyncio.sleep(late)  # fault injection, not synchronisation
            await session.resync(timeout=5.0)
    return ran


async def _one_clean_chain(
    store: MemoryBlockStore,
    sessions: list[AgreedSession],
    name: str,
    genesis: CID,
    bus: MemoryPubsubBus,
) -> None:
    """Every honest peer ends on one head whose chain verifies and has no roster of EVIL."""
    assert len({bytes(s.head) for s in sessions if s.head is not None}) == 1
    assert len({s.model_cid for s in sessions}) == 1
    head = sessions[0].head
    assert head is not None
    records = await verify_agreed_history(store, head, session=name, genesis=genesis, keys=bus.keys)
    assert [r.round for r in records] == list(range(ROUNDS))
    for record in records:
        roster = Roster.from_block(await store.get(record.roster))
        assert roster.coordinator != EVIL
        assert EVIL not in roster.peers


async def test_an_equivocating_coordinator_is_proven_excluded_and_the_split_heals() -> None:
    """Attack 2: the attacker coordinates round 0 and sends each honest peer a roster of that
    peer alone, then echoes their ``done``. Each peer relays the roster it took when another
    member's ``done`` differs; both then hold the same proof, drop everything the attacker
    says and leave it out of the schedule, and the heads of the split are ranked without its
    votes: the honest peers end on one model within 2 rounds of the split."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    name, genesis = await _session_where_evil_coordinates(store)
    config = AgreedConfig(members=MEMBERS, min_peers=1, **FAST)  # type: ignore[arg-type]
    transports = [DirectedPubsub(bus.endpoint(p), p, EVIL) for p in HONEST]
    sessions = [AgreedSession(store, t, name, genesis, config) for t in transports]
    attacker = Equivocator(bus.endpoint(EVIL), name, genesis, MEMBERS)
    for session in sessions:
        await session.start(initial_model())
    attack = asyncio.create_task(attacker.run(sessions[0].topic))
    try:
        results = await asyncio.gather(*(_run(s, i) for i, s in enumerate(sessions)))
    finally:
        attack.cancel()
        for session in sessions:
            await session.aclose()
    assert 0 in attacker.split
    assert attacker.echoed
    first = [ran[0] for ran in results]
    assert {r.round for r in first} == {0}
    assert len({r.model for r in first}) == 2  # the split: each on the roster sent to it
    assert all(r.roster.coordinator == EVIL for r in first)
    for ran in results:  # at most 2 rounds lost to the split (then re-run without the attacker)
        assert len(ran) <= ROUNDS + 2
    await _one_clean_chain(store, sessions, name, genesis, bus)
    cids = set()
    for session in sessions:
        proof = session.proofs[EVIL]
        held = decode_equivocation(await store.get(proof.block.cid), keys=bus.keys)
        assert held.author == EVIL
        assert held.round == 0
        assert held.kind == "agreed/roster"
        assert held.listed == frozenset(HONEST)  # whom the re-run of round 0 waits for
        cids.add(bytes(proof.block.cid))
        assert session.board.dropped["excluded"] > 0  # its later messages: ignored
        assert EVIL not in session.board.heads
    assert len(cids) == 1  # both built (or took) the same proof


async def test_a_peer_that_rewinds_late_is_waited_for_in_the_re_run() -> None:
    """The honest peer ranked second in the re-run of round 0 resyncs 2.5 s late: the other
    rewinds first, and its collect timeout (1 s) ends long before the late one is back. Before,
    it re-ran round 0 alone, and the late one took that chain without its own contribution (or
    re-ran it alone: a second split). The re-run waits for the members the proof's rosters
    list, so round 0 of the chain both end on holds both honest contributions."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    name, genesis = await _session_where_evil_coordinates(store)
    config = AgreedConfig(members=MEMBERS, min_peers=1, **FAST)  # type: ignore[arg-type]
    transports = [DirectedPubsub(bus.endpoint(p), p, EVIL) for p in HONEST]
    sessions = [AgreedSession(store, t, name, genesis, config) for t in transports]
    attacker = Equivocator(bus.endpoint(EVIL), name, genesis, MEMBERS)
    for session in sessions:
        await session.start(initial_model())
    slow = coordinator_ranking(name, genesis, 0, HONEST)[1]
    attack = asyncio.create_task(attacker.run(sessions[0].topic))
    try:
        results = await asyncio.gather(
            *(_run(s, i, 2.5 if s.peer_id == slow else 0.0) for i, s in enumerate(sessions))
        )
    finally:
        attack.cancel()
        for session in sessions:
            await session.aclose()
    assert len({ran[0].model for ran in results}) == 2  # the split
    await _one_clean_chain(store, sessions, name, genesis, bus)
    head = sessions[0].head
    assert head is not None
    records = await verify_agreed_history(store, head, session=name, genesis=genesis, keys=bus.keys)
    first = records[0]
    assert set(Roster.from_block(await store.get(first.roster)).peers) == set(HONEST)
    for ran in results:  # each re-ran round 0 itself, on that one record
        rerun = [r for r in ran if r.round == 0][-1]
        assert bytes(rerun.record) == bytes(first.to_block().cid)


async def test_overlapping_rosters_of_an_equivocator_are_rewound_for_everyone() -> None:
    """Three honest peers, ``min_peers = 2``: the attacker sends each a roster of it and the
    next one (every two overlap), so no split head has the votes of its roster and a resync
    alone could never heal it; every split round 1 lacks a quorum. Each peer holds a proof
    (maybe of two rosters other than its own): every chain that took one of the attacker's
    rosters of that round and base rewinds, and round 0 is re-run by all three."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    honest = ("peer-a", "peer-b", "peer-c")
    members = tuple(sorted((*honest, EVIL)))
    name, genesis = await _session_where_evil_coordinates(store, members)
    config = AgreedConfig(members=members, min_peers=2, **FAST)  # type: ignore[arg-type]
    transports = [DirectedPubsub(bus.endpoint(p), p, EVIL) for p in honest]
    sessions = [AgreedSession(store, t, name, genesis, config) for t in transports]
    attacker = Equivocator(bus.endpoint(EVIL), name, genesis, members, pairs=True)
    for session in sessions:
        await session.start(initial_model())
    attack = asyncio.create_task(attacker.run(sessions[0].topic))
    try:
        results = await asyncio.gather(*(_run(s, i) for i, s in enumerate(sessions)))
    finally:
        attack.cancel()
        for session in sessions:
            await session.aclose()
    first = [ran[0] for ran in results]
    assert len({r.model for r in first}) == 3  # three rosters, three models
    assert all(r.round == 0 and r.roster.coordinator == EVIL for r in first)
    await _one_clean_chain(store, sessions, name, genesis, bus)
    for session in sessions:
        assert EVIL in session.proofs


async def _rosters(
    bus: MemoryPubsubBus, author: str, genesis: CID, *, rounds: tuple[int, int] = (0, 0)
) -> list[bytes]:
    """Two signed roster messages of ``author`` naming two different rosters of one base."""
    signer, out = bus.signer(author), []
    for n, r in enumerate(rounds):
        block = Roster.new("s", genesis, r, genesis, author, MEMBERS, {}, None).to_block()
        if n:  # a different roster: another expected list
            block = Roster.new("s", genesis, r, genesis, author, HONEST, {}).to_block()
        message = AgreedMessage("roster", "s", genesis, r, author, block.cid, inline=block.data)
        out.append((await sign_message(message, signer, bus.keys)).block.data)
    return out


async def test_a_proof_verifies_offline_and_its_forgeries_are_refused() -> None:
    """Two rosters of one author, round and base are a proof anyone checks with the key book;
    statements of two authors, two rounds, the same statement twice, or a bad signature are
    not, and a session that hears them excludes nobody."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    first, second = await _rosters(bus, EVIL, genesis)
    proof = equivocation_proof(second, first, keys=bus.keys)
    assert decode_equivocation(proof.block, keys=bus.keys) == proof
    assert equivocation_proof(first, second, keys=bus.keys).block == proof.block  # canonical
    other = (await _rosters(bus, "peer-a", genesis))[1]
    later = (await _rosters(bus, EVIL, genesis, rounds=(0, 1)))[1]
    with pytest.raises(MalformedManifest, match="one author"):
        equivocation_proof(first, other, keys=bus.keys)
    with pytest.raises(MalformedManifest, match="one author"):
        equivocation_proof(first, later, keys=bus.keys)
    with pytest.raises(MalformedManifest, match="order"):
        equivocation_proof(first, first, keys=bus.keys)
    tampered = bytearray(second)
    tampered[-5] ^= 1  # inside the signature (the statement's last field)
    forged = sorted([first, bytes(tampered)])
    bad = encode_record({"type": "gradfed.equivocation", "version": 1, "statements": forged,
                         "rosters": []})  # fmt: skip
    with pytest.raises(BadSignature):
        decode_equivocation(bad, keys=bus.keys)
    done = [
        (await sign_message(
            AgreedMessage("done", "s", genesis, 0, EVIL, genesis, record=c), bus.signer(EVIL),
            bus.keys,
        )).block.data
        for c in (proof.block.cid, bad.cid)
    ]  # fmt: skip
    with pytest.raises(MalformedManifest, match="not evidence"):
        equivocation_proof(*done, keys=bus.keys)

    config = AgreedConfig(members=MEMBERS, **FAST)  # type: ignore[arg-type]
    session = AgreedSession(store, bus.endpoint("peer-a"), "s", genesis, config)
    await session.start(initial_model())
    try:
        invalid = [
            encode_record({"type": "gradfed.equivocation", "version": 1,
                           "statements": sorted([first, other]), "rosters": []}),
            encode_record({"type": "gradfed.equivocation", "version": 1,
                           "statements": [first, first], "rosters": []}),
            bad,
        ]  # fmt: skip
        member = bus.endpoint("peer-b")
        for block in invalid:
            await member.publish(session.topic, block.data)
        board = session.board

        async def refused() -> bool:
            return board.dropped["bad-evidence"] == len(invalid)

        await apoll_until(refused, timeout=10, what="the invalid proofs refused")
        assert session.proofs == {}
        assert not board.excluded

        async def proven() -> bool:
            return EVIL in session.proofs

        contribs = []
        for cid in (genesis, proof.block.cid):  # two contributions: a proof that excludes nobody
            contrib = AgreedMessage("contrib", "s", genesis, 0, EVIL, cid, genesis, 1)
            contribs.append((await sign_message(contrib, bus.signer(EVIL), bus.keys)).block.data)
        of_contribs = equivocation_proof(*contribs, keys=bus.keys)
        assert of_contribs.kind == "agreed/contrib"
        await member.publish(session.topic, of_contribs.block.data)
        await member.publish(session.topic, proof.block.data)
        await apoll_until(proven, timeout=10, what="the proof taken")
        assert session.proofs[EVIL] == proof  # the roster proof, not the contributions'
        assert board.dropped["bad-evidence"] == len(invalid)
        assert board.excluded == {EVIL}
        assert (await store.get(proof.block.cid)).data == proof.block.data
    finally:
        await session.aclose()
