"""Members that change in a running agreed session (issue 33 item 3), on the in-memory bus.

A stranger joins by a signed ``agreed/join`` (admitted by the allow-list, or by members'
approvals), a member leaves by a signed ``agreed/leave``, an absent member is evicted after
``evict_after`` rounds; each round uses its base record's member set, named by CID in the record
that changed it, and a roster proposing a set its requests and rosters do not call for is refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence

import pytest
from multiformats import CID

from gradfed_ipfs import AgreedConfig, AgreedRoundResult, AgreedSession, verify_agreed_history
from gradfed_ipfs.errors import NotAdmitted, RoundVerificationFailed
from gradfed_ipfs.federated.agreed import Admission
from gradfed_ipfs.federated.agreed.members import MAX_PENDING_JOINS, HeldRequest, MemberTracker
from gradfed_ipfs.federated.agreed.membership import change_problem
from gradfed_ipfs.federated.agreed.round.coordinator import coordinator_ranking
from gradfed_ipfs.formats.agreed.membership import (
    APPROVE,
    JOIN,
    LEAVE,
    MemberChange,
    MemberSet,
    approve_body,
    join_body,
    leave_body,
)
from gradfed_ipfs.formats.agreed.roster import AgreedRecord, Roster
from gradfed_ipfs.formats.statement import sign_statement
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore
from tests.federated.agreed.test_rounds import FAST, PEERS, close, delta, initial_model
from tests.polling import apoll_until

SESSION = "s1"
NEW = "peer-d"
STRANGER = "peer-x"


def config(admission: Admission, **settings: object) -> AgreedConfig:
    return AgreedConfig(members=PEERS, admission=admission, **{**FAST, **settings})  # type: ignore[arg-type]


async def started(
    store: MemoryBlockStore, bus: MemoryPubsubBus, configs: Sequence[AgreedConfig]
) -> tuple[CID, list[AgreedSession]]:
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    sessions = [
        AgreedSession(store, bus.endpoint(p), SESSION, genesis, c)
        for p, c in zip(PEERS, configs, strict=True)
    ]
    for session in sessions:
        await session.start(initial_model())
    return genesis, sessions


async def run(sessions: Sequence[AgreedSession]) -> list[AgreedRoundResult]:
    return list(
        await asyncio.gather(
            *(s.run_round(delta(i, s.round), weight=1) for i, s in enumerate(sessions))
        )
    )


async def held(
    sessions: Sequence[AgreedSession], what: str, ready: Callable[[MemberTracker], bool]
) -> None:
    async def check() -> bool:
        return all(s.board.requests is not None and ready(s.board.requests) for s in sessions)

    await apoll_until(check, timeout=5.0, what=what)


async def record_of(store: MemoryBlockStore, cid: CID) -> AgreedRecord:
    return AgreedRecord.from_block(await store.get(cid))


async def test_a_peer_on_the_allow_list_joins_a_running_session_and_contributes_next_round() -> (
    None
):
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    settings = config(Admission("allow-list", allow=(NEW,)))
    genesis, sessions = await started(store, bus, [settings] * 3)
    joiner = AgreedSession(store, bus.endpoint(NEW), SESSION, genesis, settings)
    try:
        first = await run(sessions)
        assert len({bytes(r.record) for r in first}) == 1
        assert (await record_of(store, first[0].record)).members is None
        joining = asyncio.create_task(joiner.join(initial_model(), timeout=90.0))
        await held(sessions, "the join", lambda t: NEW in t.joins)
        admitted = await run(sessions)  # round 1's roster admits the joiner
        records = {bytes(r.record) for r in admitted}
        assert len(records) == 1
        record = await record_of(store, admitted[0].record)
        assert record.members is not None
        named = MemberSet.from_block(await store.get(record.members))
        assert named.members == tuple(sorted([*PEERS, NEW]))
        assert [c.op for c in named.changes] == ["join"]
        assert all(s.members == named.members for s in sessions)
        resynced = await joining
        assert resynced.changed
        assert joiner.round == 2
        assert joiner.head == admitted[0].record
        everyone = [*sessions, joiner]
        after = await run(everyone)  # the joiner contributes from the round after its admission
        assert len({bytes(r.record) for r in after}) == 1
        assert set(after[0].roster.peers) == {*PEERS, NEW}
        assert (await record_of(store, after[0].record)).members is None
        head = after[0].record
        verified = await verify_agreed_history(
            store, head, session=SESSION, genesis=genesis, keys=bus.keys,
            admission=settings.admission, members=PEERS,
        )  # fmt: skip
        assert [r.round for r in verified] == [0, 1, 2]
        with pytest.raises(RoundVerificationFailed, match="admission"):
            await verify_agreed_history(
                store, head, session=SESSION, genesis=genesis, keys=bus.keys
            )
        # A tampered record naming another member set (one evicting peer-a) is refused.
        forged = dataclasses.replace(
            named, members=tuple(p for p in named.members if p != PEERS[0]),
            changes=(*named.changes, MemberChange("evict", PEERS[0])),
        )  # fmt: skip
        forged_cid = await store.put(forged.to_block())
        tampered = await store.put(dataclasses.replace(record, members=forged_cid).to_block())
        with pytest.raises(RoundVerificationFailed, match="member set"):
            await verify_agreed_history(
                store, tampered, session=SESSION, genesis=genesis, keys=bus.keys,
                admission=settings.admission, members=PEERS,
            )  # fmt: skip
    finally:
        await close([*sessions, joiner])


async def test_a_join_by_majority_needs_the_members_approvals() -> None:
    """peer-a and peer-b approve peer-d (on their own allow-lists), peer-c approves nobody;
    peer-x is on nobody's list and stays out."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    approving = config(Admission("majority", allow=(NEW,)))
    silent = config(Admission("majority"))
    genesis, sessions = await started(store, bus, [approving, approving, silent])
    joiner = AgreedSession(store, bus.endpoint(NEW), SESSION, genesis, silent)
    stranger = AgreedSession(store, bus.endpoint(STRANGER), SESSION, genesis, silent)
    try:
        joining = asyncio.create_task(joiner.join(initial_model(), timeout=90.0))
        refused = asyncio.create_task(stranger.join(initial_model(), timeout=6.0))

        def ready(tracker: MemberTracker) -> bool:
            approvals = [k for k in tracker.approvals if k[1] == NEW]
            return len(approvals) == 2 and STRANGER in tracker.joins

        await held(sessions, "two approvals of peer-d's join", ready)
        results = await run(sessions)
        assert len({bytes(r.record) for r in results}) == 1
        assert all(s.members == tuple(sorted([*PEERS, NEW])) for s in sessions)
        await joining
        after = await run([*sessions, joiner])
        assert len({bytes(r.record) for r in after}) == 1
        assert STRANGER not in after[0].roster.expected
        with pytest.raises(NotAdmitted):
            await refused
    finally:
        await close([*sessions, joiner, stranger])


async def test_a_member_leaves_and_the_rounds_after_go_on_without_it() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    settings = config(Admission())
    _, sessions = await started(store, bus, [settings] * 3)
    try:
        await run(sessions)
        leaver = sessions[2]
        await leaver.leave()  # after round 1, which it still takes part in
        await held(sessions[:2], "the leave", lambda t: PEERS[2] in t.leaves)
        last = await run(sessions)
        assert set(last[0].roster.peers) == set(PEERS)
        assert leaver.left
        assert not sessions[0].left
        rest = sessions[:2]
        assert all(s.members == PEERS[:2] for s in rest)
        after = await run(rest)
        assert len({bytes(r.record) for r in after}) == 1
        assert after[0].roster.expected == PEERS[:2]
        assert after[0].absent == ()
        with pytest.raises(NotAdmitted):
            await leaver.run_round(delta(2, leaver.round))
    finally:
        await close(sessions)


async def test_a_killed_member_is_evicted_after_evict_after_absent_rounds() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    settings = config(Admission(evict_after=2), min_peers=2)
    _, sessions = await started(store, bus, [settings] * 3)
    rest = sessions[:2]
    try:
        await run(sessions)
        await sessions[2].aclose()  # killed: it never contributes again
        one = await run(rest)
        assert one[0].absent == (PEERS[2],)
        assert rest[0].members == PEERS
        two = await run(rest)  # its second absent roster: this round evicts it
        record = await record_of(store, two[0].record)
        assert record.members is not None
        evicted = MemberSet.from_block(await store.get(record.members))
        assert evicted.members == PEERS[:2]
        assert evicted.changes == (MemberChange("evict", PEERS[2]),)
        three = await run(rest)
        assert len({bytes(r.record) for r in three}) == 1
        assert three[0].roster.expected == PEERS[:2]
        assert three[0].absent == ()
    finally:
        await close(rest)


@pytest.mark.parametrize("forgery", ["join-without-approvals", "eviction-not-called-for"])
async def test_a_roster_proposing_a_forged_member_set_is_refused(
    forgery: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The round's coordinator proposes a member set its requests and rosters do not call for
    (a stranger admitted without the majority's approvals, or a member evicted that never
    missed a roster); the others refuse its roster, naming it, and take the next rank's."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    settings = config(Admission("majority", evict_after=3))
    genesis, sessions = await started(store, bus, [settings] * 3)
    coordinator = coordinator_ranking(SESSION, genesis, 0, PEERS)[0]
    hostile = sessions[PEERS.index(coordinator)]
    tracker = hostile.board.requests
    assert tracker is not None
    current = tracker.current
    if forgery == "join-without-approvals":
        join = await sign_statement(
            bus.signer(STRANGER), JOIN, join_body(SESSION, genesis, STRANGER, 0), keys=bus.keys
        )
        change = MemberChange("join", STRANGER, (join.block.data,))
        members = tuple(sorted([*PEERS, STRANGER]))
    else:
        victim = next(p for p in PEERS if p != coordinator)
        change = MemberChange("evict", victim)
        members = tuple(p for p in PEERS if p != victim)
    forged = MemberSet(SESSION, genesis, 1, members, tracker.current_cid, (change,))

    def propose(roster: Roster) -> MemberSet:
        return forged

    monkeypatch.setattr(tracker, "proposal", propose)
    try:
        results = await run(sessions)
        assert len({bytes(r.record) for r in results}) == 1
        assert results[0].roster.coordinator != coordinator
        assert all(s.members == current.members for s in sessions)
        for session, result in zip(sessions, results, strict=True):
            if session is not hostile:
                assert "member set" in result.rejected[coordinator]
    finally:
        await close(sessions)


async def test_the_board_holds_one_join_per_stranger_and_a_bounded_number() -> None:
    """Requests are held only when signed by their sender for this session: one join per
    stranger (the first), at most MAX_PENDING_JOINS of them, approvals and leaves from members."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    tracker = MemberTracker(SESSION, genesis, PEERS, Admission("majority"), bus.keys)

    async def join(peer: str, session: str = SESSION) -> bytes:
        body = join_body(session, genesis, peer, 0)
        return (await sign_statement(bus.signer(peer), JOIN, body, keys=bus.keys)).block.data

    first = await join(STRANGER)
    assert tracker.offer(first, STRANGER) is not None
    assert tracker.known(first)
    assert tracker.offer(first, STRANGER) is None
    assert tracker.offer(await join("peer-y"), "peer-z") is None  # relayed as another's
    assert tracker.offer(await join("peer-y", "other"), "peer-y") is None  # another session
    assert tracker.offer(await join(PEERS[0]), PEERS[0]) is None  # a member already
    assert tracker.offer(b"\xa0", STRANGER) is None  # not a statement
    for i in range(MAX_PENDING_JOINS + 5):
        tracker.offer(await join(f"peer-{i:03d}"), f"peer-{i:03d}")
    assert len(tracker.joins) == MAX_PENDING_JOINS
    approval = await sign_statement(
        bus.signer("peer-y"), APPROVE,
        approve_body(SESSION, genesis, STRANGER, tracker.joins[STRANGER].block.cid), keys=bus.keys,
    )  # fmt: skip
    assert tracker.offer(approval.block.data, "peer-y") is None  # not a member's
    changes = {c.peer: c for c in tracker.requests()}
    assert changes[STRANGER] == MemberChange("join", STRANGER, (first,))  # no approval with it
    listed = MemberTracker(SESSION, genesis, PEERS, Admission(allow=(STRANGER,)), bus.keys)
    assert listed.offer(await join("peer-y"), "peer-y") is None  # never admissible: not held
    assert listed.offer(first, STRANGER) is not None


async def test_the_tracker_reports_each_request_it_newly_holds() -> None:
    """``on_request`` hears each join, approval and leave once, when it is first held (the
    peer's own too); dropped and repeated ones are not reported."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    heard: list[HeldRequest] = []
    tracker = MemberTracker(
        SESSION, genesis, PEERS, Admission("majority"), bus.keys, on_request=heard.append
    )
    join = await sign_statement(
        bus.signer(NEW), JOIN, join_body(SESSION, genesis, NEW, 3), keys=bus.keys
    )
    assert tracker.offer(join.block.data, NEW) is not None
    assert tracker.offer(join.block.data, NEW) is None  # a re-announcement
    approve = approve_body(SESSION, genesis, NEW, join.block.cid)
    approval = await sign_statement(bus.signer(PEERS[1]), APPROVE, approve, keys=bus.keys)
    tracker.offer(approval.block.data, PEERS[1])
    stranger = await sign_statement(bus.signer(STRANGER), APPROVE, approve, keys=bus.keys)
    assert tracker.offer(stranger.block.data, STRANGER) is None  # not a member's: not held
    leave = leave_body(SESSION, genesis, PEERS[0], 2)
    tracker.hold_own(await sign_statement(bus.signer(PEERS[0]), LEAVE, leave, keys=bus.keys))
    assert heard == [
        HeldRequest(JOIN, NEW, NEW, 3),
        HeldRequest(APPROVE, PEERS[1], NEW, None),
        HeldRequest(LEAVE, PEERS[0], PEERS[0], 2),
    ]


async def test_a_member_that_left_rejoins_with_the_same_id_and_its_old_join_stays_refused() -> None:
    """peer-d joins at round 0, leaves after round 2 and, restarted (at round 0 again: its
    first join's bytes), rejoins: the replay is dropped, its new join (made at the round it
    resynced to) admits it, and it contributes again; every peer's records name one member set
    per round, and the history re-verifies with the admission."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    settings = config(Admission("allow-list", allow=(NEW,)))
    genesis, sessions = await started(store, bus, [settings] * 3)
    first = AgreedSession(store, bus.endpoint(NEW), SESSION, genesis, settings)
    again = None
    try:
        joining = asyncio.create_task(first.join(initial_model(), timeout=90.0))
        await held(sessions, "the first join", lambda t: NEW in t.joins)
        tracker = sessions[0].board.requests
        assert tracker is not None
        old_join = tracker.joins[NEW].block.data
        await run(sessions)  # round 0's roster admits peer-d
        await joining
        everyone = [*sessions, first]
        await run(everyone)  # round 1
        await first.leave()  # after round 2
        await held(sessions, "the leave", lambda t: NEW in t.leaves)
        await run(everyone)  # round 2: its last
        assert first.left
        await first.aclose()
        assert all(s.members == PEERS for s in sessions)
        await run(sessions)  # round 3 without it
        assert tracker.moved[NEW] == 3
        assert tracker.offer(old_join, NEW) is None  # the replay of its first join: dropped
        stale = MemberChange("join", NEW, (old_join,))
        assert "replay" in change_problem(
            stale, tracker.current, 4, Admission(allow=(NEW,)), keys=bus.keys,
            moved=tracker.moved,
        )  # fmt: skip
        again = AgreedSession(store, bus.endpoint(NEW), SESSION, genesis, settings)
        rejoining = asyncio.create_task(again.join(initial_model(), timeout=90.0))
        await held(sessions, "the new join", lambda t: NEW in t.joins)
        assert tracker.joins[NEW].block.data != old_join
        admitted = await run(sessions)  # round 4's roster admits it again
        assert len({bytes(r.record) for r in admitted}) == 1
        record = await record_of(store, admitted[0].record)
        assert record.members is not None
        named = MemberSet.from_block(await store.get(record.members))
        assert named.members == tuple(sorted([*PEERS, NEW]))
        assert [c.op for c in named.changes] == ["join"]
        await rejoining
        assert again.round == 5
        after = await run([*sessions, again])  # it contributes again
        assert len({bytes(r.record) for r in after}) == 1
        assert set(after[0].roster.peers) == {*PEERS, NEW}
        assert len({bytes(s.member_set_cid) for s in [*sessions, again]}) == 1
        verified = await verify_agreed_history(
            store, after[0].record, session=SESSION, genesis=genesis, keys=bus.keys,
            admission=settings.admission, members=PEERS,
        )  # fmt: skip
        assert [r.round for r in verified] == list(range(6))
    finally:
        await close([*sessions, first, *([again] if again is not None else [])])


async def test_a_genesis_member_that_left_restarts_and_rejoins_at_the_current_round() -> None:
    """peer-c (a genesis member) leaves after round 0; restarted, its session is at round 0 with
    the genesis set (itself in it): joining resyncs to the members' head first, then its join
    made there admits it."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    settings = config(Admission("allow-list", allow=(PEERS[2],)))
    genesis, sessions = await started(store, bus, [settings] * 3)
    rest, restarted = sessions[:2], None
    try:
        await sessions[2].leave()  # after round 0
        await held(rest, "the leave", lambda t: PEERS[2] in t.leaves)
        await run(sessions)
        assert sessions[2].left
        await sessions[2].aclose()
        await run(rest)  # round 1 without it
        restarted = AgreedSession(store, bus.endpoint(PEERS[2]), SESSION, genesis, settings)
        rejoining = asyncio.create_task(restarted.join(initial_model(), timeout=90.0))
        await held(rest, "its new join", lambda t: PEERS[2] in t.joins)
        assert not rejoining.done()  # not a member at round 0: it waits for its admission
        await run(rest)  # round 2's roster admits it
        await rejoining
        assert restarted.round == 3
        assert restarted.members == PEERS
        after = await run([*rest, restarted])
        assert len({bytes(r.record) for r in after}) == 1
        assert set(after[0].roster.peers) == set(PEERS)
        await verify_agreed_history(
            store, after[0].record, session=SESSION, genesis=genesis, keys=bus.keys,
            admission=settings.admission, members=PEERS,
        )  # fmt: skip
    finally:
        await close([*rest, *([restarted] if restarted is not None else [])])
