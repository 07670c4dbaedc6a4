"""The chain's member-set decisions, as records name them, pass the offline check of its rules.

The round machine (``test_members``' :class:`Chain`) decides a join by the allow-list, a join by
vote together with an eviction on evidence, and a leave; each change is written as the
``gradfed.members`` record every member builds from it (the fields of
``CometControl._member_set``), named by rosters and records in a memory store.
:func:`check_chain_member_sets` (what ``verify_final_record`` applies) accepts that chain and
refuses each tampered copy.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import pytest
from multiformats import CID

from gradfed_ipfs.block import Block
from gradfed_ipfs.cid import parse_cid
from gradfed_ipfs.cometbft.abci import TxCode, contribution_tx
from gradfed_ipfs.errors import RoundVerificationFailed
from gradfed_ipfs.federated.agreed.control import check_chain_member_sets
from gradfed_ipfs.federated.agreed.history import MemberState
from gradfed_ipfs.formats.agreed.membership import (
    LEAVE,
    ChangeOp,
    MemberChange,
    MemberSet,
    leave_body,
)
from gradfed_ipfs.formats.agreed.roster import AgreedRecord, Roster
from gradfed_ipfs.formats.statement import LocalSigner
from gradfed_ipfs.storage import MemoryBlockStore
from tests.cometbft.test_members import (
    M0,
    SESSION,
    SIGNERS,
    A,
    B,
    C,
    Chain,
    D,
    E,
    F,
    _approve,
    _cid,
    _finish,
    _genesis,
    _join,
    _round,
    _statement,
)

GENESIS = parse_cid(M0)


Changes = tuple[tuple[str, str, tuple[bytes, ...]], ...]


def _member_set(r: int, members: tuple[str, ...], changes: Changes, prev: CID) -> MemberSet:
    lines = tuple(MemberChange(cast("ChangeOp", op), peer, st) for op, peer, st in changes)
    return MemberSet(SESSION, GENESIS, r + 1, members, prev, lines)


async def _decided() -> tuple[Chain, list[MemberSet | None]]:
    """Three rounds on the machine; the member set each round's close made (``None``: none)."""
    chain = Chain(_genesis("two-thirds"))
    state = MemberState.genesis(SESSION, GENESIS, chain.machine.members)
    prev, sets = state.cid, []
    binding, join = await _join(E)  # on the allow-list: its join alone
    assert chain.block([binding, join]) == [TxCode.OK] * 2
    leave = await _statement(D, LEAVE, leave_body(SESSION, GENESIS, D.peer_id, 2))
    base = M0
    for r, who in enumerate([SIGNERS, [A, B, D, E], [A, B, D, E, F]]):  # D's last: round 2
        if r == 1:  # F asks; four of the five members vote; C equivocates (evidence)
            binding, join = await _join(F)
            votes = [await _approve(s, F, join) for s in (A, B, D, E)]
            twice = [await contribution_tx(C, SESSION, 1, _cid(t), 1, base) for t in "xy"]
            assert chain.block([binding, join, *votes, *twice, leave]) == [TxCode.OK] * 9
        await _round(chain, r, base, who)
        view = chain.machine.view(r)
        member_set = None
        if view.members is not None:
            member_set = _member_set(r, view.members, view.changes, prev)
            prev = member_set.to_block().cid
        sets.append(member_set)
        base = await _finish(chain, r, who[:3])
    return chain, sets


async def _records(
    store: MemoryBlockStore, sets: list[MemberSet | None], expected: tuple[str, ...] | None = None
) -> list[tuple[CID, AgreedRecord]]:
    """Rosters and records naming ``sets``; each roster expects the set before (or ``expected``)."""
    current = tuple(sorted(s.peer_id for s in SIGNERS))
    chain, prev, base = [], None, GENESIS
    for r, member_set in enumerate(sets):
        named = None if member_set is None else await store.put(member_set.to_block())
        roster = Roster.new(SESSION, GENESIS, r, base, current[0], expected or current, {}, named)
        roster_cid = await store.put(roster.to_block())
        result = Block.new(f"model {r}".encode(), "raw").cid
        record = AgreedRecord(
            SESSION, GENESIS, r, prev, base, roster_cid, result, 0.5, members=named
        )
        prev = await store.put(record.to_block())
        chain.append((prev, record))
        base = result
        current = current if member_set is None else member_set.members
    return chain


async def test_the_chains_own_decisions_pass_and_tampered_sets_fail() -> None:
    chain, sets = await _decided()
    assert [None if s is None else [(c.op, c.peer) for c in s.changes] for s in sets] == [
        [("join", E.peer_id)],
        sorted([("evict", C.peer_id), ("join", F.peer_id)], key=lambda c: c[1]),
        [("leave", D.peer_id)],
    ]
    rules = chain.machine.genesis
    store = MemoryBlockStore()
    await check_chain_member_sets(store, await _records(store, sets), rules)

    first, second, third = (s for s in sets if s is not None)
    join_f = next(c for c in second.changes if c.op == "join")
    no_votes = replace(join_f, statements=join_f.statements[:1])
    stranger = MemberChange("evict", LocalSigner.from_seed(bytes([9]) * 32).peer_id)
    others = tuple(c for c in second.changes if c.op != "join")

    def by_peer(*changes: MemberChange) -> tuple[MemberChange, ...]:
        return tuple(sorted(changes, key=lambda c: c.peer))

    tampered = [
        ([replace(first, changes=()), second, third], "with no change"),
        ([first, replace(second, changes=by_peer(*others, no_votes)), third], "0 approvals < 4"),
        (
            [first, replace(second, changes=by_peer(*second.changes, stranger)), third],
            "is no member",
        ),
        ([replace(first, members=first.members[1:]), second, third], "not the set before"),
        ([replace(first, prev=None), second, third], "does not link"),
        ([replace(first, round=3), second, third], "of round 3"),
        ([replace(first, session="other"), second, third], "another session"),
    ]
    for broken, why in tampered:
        store = MemoryBlockStore()
        with pytest.raises(RoundVerificationFailed, match=why):
            await check_chain_member_sets(store, await _records(store, broken), rules)
    store = MemoryBlockStore()
    records = await _records(store, sets, expected=first.members)  # round 0 expects others
    with pytest.raises(RoundVerificationFailed, match="the roster expects"):
        await check_chain_member_sets(store, records, rules)
