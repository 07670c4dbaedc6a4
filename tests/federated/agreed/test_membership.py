"""Member sets that change: admission by policy, leave, eviction, one set on every peer."""

from __future__ import annotations

import numpy as np
import pytest

from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import MalformedManifest
from gradfed_ipfs.federated.agreed.membership import (
    Admission,
    absences,
    approvals_needed,
    change_problem,
    member_set_problem,
    moved_after,
    next_member_set,
)
from gradfed_ipfs.formats import LocalSigner, encode_record, sign_statement
from gradfed_ipfs.formats.agreed.membership import (
    APPROVE,
    JOIN,
    JOIN_ROUNDS,
    LEAVE,
    MemberChange,
    MemberSet,
    approve_body,
    join_body,
    leave_body,
)
from gradfed_ipfs.formats.agreed.roster import Roster
from gradfed_ipfs.storage import Block

SESSION = "members"
GENESIS = make_cid(np.zeros(4, np.float32).tobytes())
SIGNERS = [LocalSigner.from_seed(bytes([i]) * 32) for i in range(5)]
A, B, C, NEW, OTHER = SIGNERS
CURRENT = MemberSet(SESSION, GENESIS, 0, tuple(sorted(s.peer_id for s in (A, B, C))))
CURRENT_CID = CURRENT.to_block().cid


async def join(signer: LocalSigner, peer: str | None = None, made: int = 0) -> bytes:
    body = join_body(SESSION, GENESIS, peer or signer.peer_id, made)
    return (await sign_statement(signer, JOIN, body)).block.data


async def approve(signer: LocalSigner, joiner: str, join_data: bytes) -> bytes:
    body = approve_body(SESSION, GENESIS, joiner, Block.new(join_data, "dag-cbor").cid)
    return (await sign_statement(signer, APPROVE, body)).block.data


async def leave(signer: LocalSigner, after: int) -> bytes:
    body = leave_body(SESSION, GENESIS, signer.peer_id, after)
    return (await sign_statement(signer, LEAVE, body)).block.data


def test_approvals_needed_are_more_than_half_or_two_thirds() -> None:
    assert [approvals_needed("majority", n) for n in (1, 2, 3, 4)] == [1, 2, 2, 3]
    assert [approvals_needed("two-thirds", n) for n in (1, 3, 4, 6)] == [1, 3, 3, 5]
    assert approvals_needed("allow-list", 9) == 0
    with pytest.raises(ValueError, match="evict_after"):
        Admission(evict_after=0)


async def test_an_allowed_peer_joins_and_others_do_not() -> None:
    admission = Admission("allow-list", allow=(NEW.peer_id,))
    ok = MemberChange("join", NEW.peer_id, (await join(NEW),))
    assert change_problem(ok, CURRENT, 3, admission) == ""
    stranger = MemberChange("join", OTHER.peer_id, (await join(OTHER),))
    assert "allow-list" in change_problem(stranger, CURRENT, 3, admission)
    forged = MemberChange("join", NEW.peer_id, (await join(OTHER, NEW.peer_id),))
    assert "signed by" in change_problem(forged, CURRENT, 3, admission)
    member = MemberChange("join", A.peer_id, (await join(A),))
    assert "member already" in change_problem(member, CURRENT, 3, admission)


async def test_a_majority_admits_and_a_minority_or_strangers_do_not() -> None:
    admission = Admission("majority")
    request = await join(NEW)
    two = [await approve(s, NEW.peer_id, request) for s in (A, B)]
    assert (
        change_problem(MemberChange("join", NEW.peer_id, (request, *two)), CURRENT, 0, admission)
        == ""
    )
    one_twice = [two[0], two[0]]
    assert "1 approvals < 2" in change_problem(
        MemberChange("join", NEW.peer_id, (request, *one_twice)), CURRENT, 0, admission
    )
    outsider = await approve(OTHER, NEW.peer_id, request)
    assert "non-member" in change_problem(
        MemberChange("join", NEW.peer_id, (request, two[0], outsider)), CURRENT, 0, admission
    )
    other_join = await approve(C, NEW.peer_id, await join(NEW, NEW.peer_id) + b"")
    assert (
        change_problem(  # the same join bytes: an approval of it counts
            MemberChange("join", NEW.peer_id, (request, two[0], other_join)), CURRENT, 0, admission
        )
        == ""
    )
    tampered = bytearray(two[1])
    tampered[-3] ^= 1
    assert "join of" in change_problem(
        MemberChange("join", NEW.peer_id, (request, two[0], bytes(tampered))), CURRENT, 0, admission
    )


async def test_a_leave_takes_effect_after_the_round_it_names() -> None:
    admission = Admission()
    change = MemberChange("leave", B.peer_id, (await leave(B, 5),))
    assert "not yet" in change_problem(change, CURRENT, 4, admission)
    assert change_problem(change, CURRENT, 5, admission) == ""
    theirs = MemberChange("leave", A.peer_id, (await leave(B, 5),))
    assert "not its statement" in change_problem(theirs, CURRENT, 5, admission)


def roster(round_number: int, peers: list[LocalSigner]) -> Roster:
    entries = {p.peer_id: (GENESIS, 1) for p in peers}
    return Roster.new(
        SESSION, GENESIS, round_number, GENESIS, peers[0].peer_id, CURRENT.members, entries
    )


async def test_next_member_set_is_one_set_whatever_the_order_and_evictions_follow_rosters() -> None:
    admission = Admission("allow-list", allow=(NEW.peer_id,), evict_after=2)
    streaks = absences(
        [roster(0, [A, B, C]), roster(1, [A, B]), roster(2, [A, B])], CURRENT.members
    )
    assert streaks == {A.peer_id: 0, B.peer_id: 0, C.peer_id: 2}
    requests = [
        MemberChange("join", NEW.peer_id, (await join(NEW),)),
        MemberChange("leave", B.peer_id, (await leave(B, 2),)),
        MemberChange("join", OTHER.peer_id, (await join(OTHER),)),  # not allowed: left out
    ]
    one = next_member_set(CURRENT, CURRENT_CID, 2, requests, admission, streaks)
    two = next_member_set(CURRENT, CURRENT_CID, 2, requests[::-1], admission, streaks)
    assert one.to_block().cid == two.to_block().cid
    assert one.members == tuple(sorted([A.peer_id, NEW.peer_id]))
    assert (one.round, one.prev) == (3, CURRENT_CID)
    assert [c.op for c in one.changes] == [
        {A.peer_id: "x", B.peer_id: "leave", C.peer_id: "evict", NEW.peer_id: "join"}[p]
        for p in sorted([B.peer_id, C.peer_id, NEW.peer_id])
    ]
    assert member_set_problem(one, CURRENT, CURRENT_CID, 2, admission, streaks) == ""
    # A claimed set that evicts a member the rosters did not leave out is refused.
    spared = {**streaks, C.peer_id: 1}
    assert "not the member set" in member_set_problem(
        one, CURRENT, CURRENT_CID, 2, admission, spared
    )
    assert next_member_set(CURRENT, CURRENT_CID, 2, [], Admission(), {}) is CURRENT
    decoded = MemberSet.from_block(one.to_block())
    assert decoded == one


def test_member_set_decoder_refuses_bad_orders_and_sizes() -> None:
    good = CURRENT.to_block()
    assert MemberSet.from_block(good) == CURRENT
    unsorted = MemberSet(SESSION, GENESIS, 0, tuple(reversed(CURRENT.members)))
    with pytest.raises(MalformedManifest, match="sorted"):
        MemberSet.from_block(unsorted.to_block())
    empty = MemberSet(SESSION, GENESIS, 0, ())
    with pytest.raises(MalformedManifest, match="0 members"):
        MemberSet.from_block(empty.to_block())
    bad_op = MemberSet(SESSION, GENESIS, 1, CURRENT.members, changes=(MemberChange("rename", "x"),))  # type: ignore[arg-type]
    with pytest.raises(MalformedManifest, match="op, peer"):
        MemberSet.from_block(bad_op.to_block())


async def test_a_join_admits_only_after_its_authors_last_change_and_within_its_window() -> None:
    admission = Admission("allow-list", allow=(NEW.peer_id, B.peer_id))
    made_at_2 = MemberChange("join", NEW.peer_id, (await join(NEW, made=2),))
    assert "not yet" in change_problem(made_at_2, CURRENT, 1, admission)
    assert change_problem(made_at_2, CURRENT, 2, admission) == ""
    assert change_problem(made_at_2, CURRENT, 2 + JOIN_ROUNDS - 1, admission) == ""
    assert "expired" in change_problem(made_at_2, CURRENT, 2 + JOIN_ROUNDS, admission)
    left_at_5 = {NEW.peer_id: 5}  # the set of rounds from 5 on removed it
    assert "replay" in change_problem(made_at_2, CURRENT, 6, admission, moved=left_at_5)
    made_at_5 = MemberChange("join", NEW.peer_id, (await join(NEW, made=5),))
    assert change_problem(made_at_5, CURRENT, 6, admission, moved=left_at_5) == ""
    # A join written before joins named a round: valid for a peer never added or removed.
    body = encode_record(
        {"type": "gradfed.join", "version": 1, "session": SESSION, "genesis": GENESIS,
         "peer": NEW.peer_id}
    ).data  # fmt: skip
    old = MemberChange("join", NEW.peer_id, ((await sign_statement(NEW, JOIN, body)).block.data,))
    assert change_problem(old, CURRENT, 40, admission) == ""
    assert "without a round" in change_problem(old, CURRENT, 40, admission, moved=left_at_5)
    # next_member_set leaves a replayed join out; moved_after records who a set moved.
    one = next_member_set(CURRENT, CURRENT_CID, 6, [made_at_2], admission, {}, moved=left_at_5)
    assert one is CURRENT
    two = next_member_set(CURRENT, CURRENT_CID, 6, [made_at_5], admission, {}, moved=left_at_5)
    assert moved_after(left_at_5, two) == {NEW.peer_id: 7}


async def test_a_leave_from_an_earlier_membership_is_refused() -> None:
    """B was removed and re-added by the set of rounds from 4: its leave after round 2 is one
    of its earlier membership, replayed."""
    admission = Admission()
    old = MemberChange("leave", B.peer_id, (await leave(B, 2),))
    assert change_problem(old, CURRENT, 5, admission) == ""  # a genesis member never moved
    assert "before its membership" in change_problem(
        old, CURRENT, 5, admission, moved={B.peer_id: 4}
    )
    new = MemberChange("leave", B.peer_id, (await leave(B, 4),))
    assert change_problem(new, CURRENT, 5, admission, moved={B.peer_id: 4}) == ""
