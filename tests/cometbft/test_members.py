"""The round machine's member sets: joins by allow-list and by vote, leaves, evictions, updates."""

from __future__ import annotations

import json

import dag_cbor

from gradfed_ipfs.block import Block
from gradfed_ipfs.cid import parse_cid
from gradfed_ipfs.cometbft.abci import (
    LedgerApp,
    RoundMachine,
    RoundsGenesis,
    TxCode,
    attestation_tx,
    contribution_tx,
    result_tx,
    validator_binding,
)
from gradfed_ipfs.cometbft.abci.pb.cometbft.abci.v1 import types_pb2 as abci
from gradfed_ipfs.cometbft.abci.txs import VALIDATOR
from gradfed_ipfs.formats.agreed.membership import (
    APPROVE,
    JOIN,
    JOIN_ROUNDS,
    LEAVE,
    approve_body,
    join_body,
    leave_body,
)
from gradfed_ipfs.formats.statement import LocalSigner, sign_statement

SIGNERS = [LocalSigner.from_seed(bytes([i + 1]) * 32) for i in range(4)]
A, B, C, D = SIGNERS
E = LocalSigner.from_seed(bytes([5]) * 32)  # on the allow-list
F = LocalSigner.from_seed(bytes([6]) * 32)  # admitted by a vote
SESSION, CHAIN = "s", "chain-1"
M0 = str(Block.new(b"genesis model", "raw").cid)
SECOND = 1_000_000_000  # ns


def _key(s: LocalSigner) -> bytes:  # a stand-in validator key per member (32 bytes)
    return bytes(Block.new(s.peer_id.encode(), "raw").cid)[-32:]


KEYS = {s.peer_id: _key(s) for s in SIGNERS}


def _cid(tag: str) -> str:
    return str(Block.new(tag.encode(), "raw").cid)


def _genesis(policy: str = "allow-list", evict_after: int = 0) -> RoundsGenesis:
    members = tuple(s.peer_id for s in SIGNERS)
    return RoundsGenesis(
        SESSION, M0, members, 3, 5000, admission=policy, allow=(E.peer_id,),
        evict_after=evict_after,
    )  # fmt: skip


class Chain:
    """A round machine fed block by block (block time in seconds), with its validator updates."""

    def __init__(self, genesis: RoundsGenesis) -> None:
        self.machine = RoundMachine(genesis, chain_id=CHAIN, validator_keys=KEYS)
        self.height = 0
        self.updates: list[list[tuple[bytes, int]]] = []

    def block(self, txs: list[bytes], at: float = 0.0) -> list[TxCode]:
        self.height += 1
        verdicts, _ = self.machine.finalize(self.height, txs, int(at * SECOND))
        self.updates.append(self.machine.validator_updates())
        self.machine.commit()
        return [v.code for v in verdicts]


async def _statement(s: LocalSigner, kind: str, body: bytes) -> bytes:
    return (await sign_statement(s, kind, body)).block.data


async def _join(s: LocalSigner, r: int = 0, key: bytes | None = None) -> tuple[bytes, bytes]:
    """``s``'s validator binding and join statement, both of round ``r``."""
    binding = await validator_binding(s, SESSION, CHAIN, _key(s) if key is None else key, r)
    join = await _statement(s, JOIN, join_body(SESSION, parse_cid(M0), s.peer_id, r))
    return binding, join


async def _approve(s: LocalSigner, joiner: LocalSigner, join: bytes) -> bytes:
    cid = Block.new(join, "dag-cbor").cid
    return await _statement(s, APPROVE, approve_body(SESSION, parse_cid(M0), joiner.peer_id, cid))


async def _round(
    chain: Chain, r: int, base: str, who: list[LocalSigner], at: float = 0.0
) -> list[TxCode]:
    """``who`` contribute on ``base`` and the next of them attests each (one block)."""
    txs = [await contribution_tx(s, SESSION, r, _cid(f"{s.peer_id}/{r}"), 1, base) for s in who]
    txs += [
        await attestation_tx(after, SESSION, r, s.peer_id, _cid(f"{s.peer_id}/{r}"))
        for s, after in zip(who, [*who[1:], who[0]], strict=True)
    ]
    return chain.block(txs, at)


async def _finish(chain: Chain, r: int, who: list[LocalSigner]) -> str:
    """Results from ``who``: round ``r`` final with record ``rec/r``, model ``m/r``."""
    txs = [await result_tx(s, SESSION, r, _cid(f"rec/{r}"), _cid(f"m/{r}")) for s in who]
    assert chain.block(txs) == [TxCode.OK] * len(txs)
    assert chain.machine.view(r).status == "final"
    return _cid(f"m/{r}")


async def test_an_allow_listed_join_is_a_member_and_a_validator_from_the_next_round() -> None:
    chain = Chain(_genesis())
    binding, join = await _join(E)
    assert chain.block([binding, join]) == [TxCode.OK, TxCode.OK]
    early = await contribution_tx(E, SESSION, 0, _cid("e/0"), 1, M0)
    assert chain.block([early]) == [TxCode.NOT_MEMBER]  # not in round 0
    assert await _round(chain, 0, M0, SIGNERS) == [TxCode.OK] * 8
    view = chain.machine.view(0)
    assert view.status == "closed"
    assert view.members == tuple(sorted([*KEYS, E.peer_id]))
    assert [(op, peer) for op, peer, _ in view.changes] == [("join", E.peer_id)]
    assert view.changes[0][2] == (join,)  # the join statement itself, no approvals needed
    assert chain.updates[-1] == [(_key(E), 1)]  # the close block makes E a validator
    info = dag_cbor.decode(chain.machine.query("/members", b"")[0] or b"")
    assert isinstance(info, dict)
    assert info["next"] == list(view.members)
    assert info["joined"][E.peer_id] == 1
    # E's round 1 contribution is held (E is in round 1's set) before round 0 is final.
    ahead = await contribution_tx(E, SESSION, 1, _cid(f"{E.peer_id}/1"), 1, _cid("m/0"))
    assert chain.block([ahead]) == [TxCode.OK]
    base = await _finish(chain, 0, [A, B, C])
    assert chain.machine.members == view.members
    assert chain.machine.view(0).members == view.members  # the final round names it too
    # Round 1 closes only once all five are held: E is expected.
    assert await _round(chain, 1, base, [A, B, C, D]) == [TxCode.OK] * 8
    assert chain.machine.view(1).status == "open"
    attest = await attestation_tx(A, SESSION, 1, E.peer_id, _cid(f"{E.peer_id}/1"))
    assert chain.block([attest]) == [TxCode.OK]
    assert [line.peer for line in chain.machine.view(1).roster or ()] == list(view.members)
    # Replays of the used binding and join.
    assert chain.block([binding, join]) == [TxCode.DUPLICATE, TxCode.DUPLICATE]


async def test_invalid_membership_requests_are_refused_with_their_codes() -> None:
    fixed = Chain(RoundsGenesis(SESSION, M0, tuple(KEYS), 3, 5000))
    binding, join = await _join(E)
    assert fixed.block([binding, join]) == [TxCode.NOT_ALLOWED, TxCode.NOT_ALLOWED]
    chain = Chain(_genesis())
    hash_before = chain.machine.app_hash
    outsider = await _join(F)
    assert chain.block(list(outsider)) == [TxCode.NOT_ALLOWED] * 2  # not on the allow-list
    mine = await _join(A)
    assert chain.block(list(mine)) == [TxCode.ALREADY_MEMBER] * 2
    other_chain = await validator_binding(E, SESSION, "another-chain", _key(E), 0)
    stolen_key = await validator_binding(E, SESSION, CHAIN, _key(A), 0)
    for_b = await _statement(E, LEAVE, leave_body(SESSION, parse_cid(M0), B.peer_id, 0))
    assert chain.block([other_chain, stolen_key, for_b, b"\x00junk"]) == [
        TxCode.OTHER_SESSION, TxCode.CONFLICT, TxCode.MALFORMED, TxCode.MALFORMED,
    ]  # fmt: skip
    stranger_leave = await _statement(E, LEAVE, leave_body(SESSION, parse_cid(M0), E.peer_id, 0))
    approve = await _approve(F, E, join)  # by a non-member
    assert chain.block([stranger_leave, approve]) == [TxCode.NOT_MEMBER] * 2
    assert chain.machine.app_hash == hash_before  # refused: nothing changed
    assert chain.block([binding, binding]) == [TxCode.OK, TxCode.DUPLICATE]  # used once
    again = await validator_binding(E, SESSION, CHAIN, bytes(32), 0)
    assert chain.block([again]) == [TxCode.CONFLICT]  # one key per joiner and round
    stolen_later = await validator_binding(E, SESSION, CHAIN, _key(A), 1)
    assert chain.block([stolen_later]) == [TxCode.CONFLICT]  # a later one, of A's key


async def test_a_two_thirds_vote_admits_a_join_at_the_close_after_its_third_approval() -> None:
    chain = Chain(_genesis("two-thirds"))
    binding, join = await _join(F)
    approvals = [await _approve(s, F, join) for s in (A, B, C)]
    assert chain.block([binding, join, *approvals[:2]]) == [TxCode.OK] * 4
    assert chain.block([approvals[0]]) == [TxCode.DUPLICATE]
    await _round(chain, 0, M0, SIGNERS)
    assert chain.machine.view(0).members is None  # 2 approvals of 4 members: not > 2/3
    assert chain.updates[-1] == []
    base = await _finish(chain, 0, [A, B, C])
    assert chain.block([approvals[2]]) == [TxCode.OK]
    await _round(chain, 1, base, SIGNERS)
    view = chain.machine.view(1)
    assert view.members == tuple(sorted([*KEYS, F.peer_id]))
    assert view.changes == (("join", F.peer_id, (join, *sorted(approvals))),)
    assert chain.updates[-1] == [(_key(F), 1)]


async def test_a_leave_takes_effect_at_the_close_of_the_round_it_names() -> None:
    chain = Chain(_genesis())
    leave = await _statement(D, LEAVE, leave_body(SESSION, parse_cid(M0), D.peer_id, 1))
    assert chain.block([leave, leave]) == [TxCode.OK, TxCode.DUPLICATE]
    await _round(chain, 0, M0, SIGNERS)
    assert chain.machine.view(0).members is None  # D takes part in round 1 still
    base = await _finish(chain, 0, [A, B, C])
    await _round(chain, 1, base, SIGNERS)
    view = chain.machine.view(1)
    assert view.members == tuple(sorted(KEYS.keys() - {D.peer_id}))
    assert view.changes == (("leave", D.peer_id, (leave,)),)
    assert chain.updates[-1] == [(KEYS[D.peer_id], 0)]
    base = await _finish(chain, 1, [A, B, C])
    late = await contribution_tx(D, SESSION, 2, _cid("d/2"), 1, base)
    assert chain.block([late]) == [TxCode.NOT_MEMBER]
    # Round 2 of three members (f = 0): each one's own contribution is held by itself.
    assert await _round(chain, 2, base, [A, B, C]) == [TxCode.OK] * 6
    assert chain.machine.view(2).status == "closed"


async def test_a_member_with_evidence_is_evicted_at_the_close() -> None:
    chain = Chain(_genesis())
    twice = [
        await contribution_tx(C, SESSION, 0, _cid(tag), 1, M0) for tag in ("c/first", "c/second")
    ]
    assert chain.block(twice) == [TxCode.OK, TxCode.OK]  # C equivocates: evidence
    assert await _round(chain, 0, M0, [A, B, D]) == [TxCode.OK] * 6
    view = chain.machine.view(0)
    assert (view.status, view.evidence) == ("closed", (C.peer_id,))
    assert view.changes == (("evict", C.peer_id, ()),)  # proven: out from the next round
    assert chain.updates[-1] == [(KEYS[C.peer_id], 0)]
    await _finish(chain, 0, [A, B, D])
    assert chain.machine.members == tuple(sorted(KEYS.keys() - {C.peer_id}))


async def test_absences_evict_after_k_rosters() -> None:
    chain = Chain(_genesis(evict_after=2))
    base = M0
    for r in range(2):
        await _round(chain, r, base, [A, B, C], at=10 * r)
        chain.block([], at=10 * r + 6)  # the deadline: D absent
        view = chain.machine.view(r)
        expected = None if r == 0 else tuple(sorted(KEYS.keys() - {D.peer_id}))
        assert view.members == expected
        base = await _finish(chain, r, [A, B, C])
    assert chain.machine.view(1).changes == (("evict", D.peer_id, ()),)
    assert chain.machine.members == tuple(sorted(KEYS.keys() - {D.peer_id}))


async def test_membership_is_deterministic_and_committed_in_the_app_hash() -> None:
    binding, join = await _join(E)

    async def run(with_join: bool) -> RoundMachine:
        chain = Chain(_genesis())
        chain.block([binding, join] if with_join else [])
        await _round(chain, 0, M0, SIGNERS)
        return chain.machine

    one, two, without = await run(True), await run(True), await run(False)
    assert one.app_hash == two.app_hash
    assert one.app_hash != without.app_hash
    assert "admission" not in RoundsGenesis(SESSION, M0, tuple(KEYS), 3, 5000).to_dict()
    genesis = _genesis("two-thirds", 3)
    assert RoundsGenesis.from_app_state(json.dumps(genesis.to_dict()).encode()) == genesis


async def test_finalize_block_hands_the_validator_updates_to_cometbft() -> None:
    app = LedgerApp()
    state = json.dumps(_genesis().to_dict()).encode()
    init = abci.InitChainRequest(chain_id=CHAIN, app_state_bytes=state)
    app.handle(abci.Request(init_chain=init))
    binding, join = await _join(E)
    txs = [binding, join]
    txs += [await contribution_tx(s, SESSION, 0, _cid(f"{s.peer_id}/0"), 1, M0) for s in SIGNERS]
    txs += [
        await attestation_tx(SIGNERS[(i + 1) % 4], SESSION, 0, s.peer_id, _cid(f"{s.peer_id}/0"))
        for i, s in enumerate(SIGNERS)
    ]
    block = abci.FinalizeBlockRequest(height=1, txs=txs)
    finalized = app.handle(abci.Request(finalize_block=block)).finalize_block
    assert [r.code for r in finalized.tx_results] == [TxCode.OK] * 10
    assert [(u.pub_key_type, u.pub_key_bytes, u.power) for u in finalized.validator_updates] == [
        ("ed25519", _key(E), 1)
    ]


async def _join_then_leave(chain: Chain) -> tuple[bytes, bytes, bytes, str]:
    """E joins at round 0 and leaves after round 1, whose roster is then decided (not final);
    return E's binding, join and leave, and round 0's record."""
    binding, join = await _join(E)
    assert chain.block([binding, join]) == [TxCode.OK, TxCode.OK]
    await _round(chain, 0, M0, SIGNERS)
    base = await _finish(chain, 0, [A, B, C])
    leave = await _statement(E, LEAVE, leave_body(SESSION, parse_cid(M0), E.peer_id, 1))
    assert chain.block([leave]) == [TxCode.OK]
    await _round(chain, 1, base, [*SIGNERS, E])
    return binding, join, leave, base


async def test_a_member_that_left_rejoins_by_a_new_join_and_old_requests_are_refused() -> None:
    """E joins (made at round 0), leaves after round 1 and rejoins by a join and a binding of
    round 2; its old join and binding, a join made before it left and a leave of its earlier
    membership are refused, so the chain decides one set from the log."""
    chain = Chain(_genesis())
    binding, join, leave, base = await _join_then_leave(chain)
    assert chain.machine.view(1).changes == (("leave", E.peer_id, (leave,)),)
    base = await _finish(chain, 1, [A, B, C])
    assert E.peer_id not in chain.machine.members
    made_at_1 = await _statement(E, JOIN, join_body(SESSION, parse_cid(M0), E.peer_id, 1))
    assert chain.block([join, made_at_1]) == [TxCode.DUPLICATE] * 2  # replays, by bytes or round
    rebinding, rejoin = await _join(E, 2)
    assert chain.block([binding, rebinding, rejoin]) == [TxCode.DUPLICATE, TxCode.OK, TxCode.OK]
    await _round(chain, 2, base, SIGNERS)
    view = chain.machine.view(2)
    assert view.members == tuple(sorted([*KEYS, E.peer_id]))
    assert view.changes == (("join", E.peer_id, (rejoin,)),)
    assert chain.updates[-1] == [(_key(E), 1)]
    base = await _finish(chain, 2, [A, B, C])
    old_leave = await _statement(E, LEAVE, leave_body(SESSION, parse_cid(M0), E.peer_id, 0))
    assert chain.block([leave, old_leave]) == [TxCode.DUPLICATE] * 2  # of its last membership
    assert await _round(chain, 3, base, [*SIGNERS, E]) == [TxCode.OK] * 10
    assert chain.machine.view(3).status == "closed"


async def test_a_join_expires_after_join_rounds_and_a_later_made_one_replaces_it() -> None:
    chain = Chain(_genesis("majority"))
    binding, join = await _join(F)  # made at round 0; no votes
    assert chain.block([binding, join]) == [TxCode.OK, TxCode.OK]
    base = M0
    for r in range(JOIN_ROUNDS):
        await _round(chain, r, base, SIGNERS)
        base = await _finish(chain, r, [A, B, C])
    info = dag_cbor.decode(chain.machine.query("/members", b"")[0] or b"")
    assert isinstance(info, dict)
    assert info["pending"] == []  # no close after round JOIN_ROUNDS - 1 can admit it
    late = await _approve(A, F, join)
    fresh = await _statement(F, JOIN, join_body(SESSION, parse_cid(M0), F.peer_id, JOIN_ROUNDS))
    assert chain.block([fresh, late]) == [TxCode.OK, TxCode.OK]
    older = await _statement(F, JOIN, join_body(SESSION, parse_cid(M0), F.peer_id, 3))
    assert chain.block([older]) == [TxCode.CONFLICT]  # not later-made than the held one


async def test_a_binding_made_before_its_authors_leave_is_a_replay() -> None:
    """E's round-0 binding, replayed after E left (after round 1), and a binding E signed at
    round 1 but never sent, are refused as replays; a binding of round 2 is taken."""
    # Prepare: E joins at round 0 and leaves after round 1.
    chain = Chain(_genesis())
    unsent = await validator_binding(E, SESSION, CHAIN, _key(E), 1)
    binding, *_ = await _join_then_leave(chain)
    await _finish(chain, 1, [A, B, C])
    assert E.peer_id not in chain.machine.members
    hash_before = chain.machine.app_hash
    # Execute, assert: both are replays and change nothing; round 2's is fresh.
    assert chain.block([binding, unsent]) == [TxCode.DUPLICATE, TxCode.DUPLICATE]
    assert chain.machine.app_hash == hash_before
    fresh = await validator_binding(E, SESSION, CHAIN, _key(E), 2)
    assert chain.block([fresh]) == [TxCode.OK]


async def test_a_genesis_members_binding_is_stale_after_its_eviction() -> None:
    chain = Chain(_genesis("majority"))
    twice = [
        await contribution_tx(C, SESSION, 0, _cid(tag), 1, M0) for tag in ("c/first", "c/second")
    ]
    assert chain.block(twice) == [TxCode.OK, TxCode.OK]  # evidence: C goes after round 0
    await _round(chain, 0, M0, [A, B, D])
    await _finish(chain, 0, [A, B, D])
    assert C.peer_id not in chain.machine.members
    # its genesis binding (round 0) and one of round 0 under another key: before the eviction
    genesis_binding = await validator_binding(C, SESSION, CHAIN, _key(C), 0)
    other_key = await validator_binding(C, SESSION, CHAIN, bytes(32), 0)
    assert chain.block([genesis_binding, other_key]) == [TxCode.DUPLICATE, TxCode.DUPLICATE]
    assert chain.block([await validator_binding(C, SESSION, CHAIN, _key(C), 1)]) == [TxCode.OK]


async def test_a_binding_is_used_once() -> None:
    chain = Chain(_genesis("majority"))
    binding, _ = await _join(F)
    assert chain.block([binding, binding]) == [TxCode.OK, TxCode.DUPLICATE]
    assert chain.block([binding]) == [TxCode.DUPLICATE]  # in a later block too
    assert chain.machine.check(binding).code == TxCode.DUPLICATE  # and in CheckTx


async def test_a_pending_strangers_binding_is_replaced_only_by_a_later_rounds() -> None:
    """F binds key 1 at round 0; a binding of round 0 (another key) is a conflict, one of
    round 1 replaces it, and F's admission at round 1's close makes key 2 its validator's."""
    # Prepare: F's round-0 binding and join are held (no votes under "majority").
    chain = Chain(_genesis("majority"))
    first_key, second_key = bytes([7]) * 32, bytes([8]) * 32
    binding, join = await _join(F, 0, first_key)
    assert chain.block([binding, join]) == [TxCode.OK, TxCode.OK]
    await _round(chain, 0, M0, SIGNERS)
    base = await _finish(chain, 0, [A, B, C])
    # Execute: an equal round, a later one, then an earlier one than that.
    equal = await validator_binding(F, SESSION, CHAIN, second_key, 0)
    assert chain.block([equal]) == [TxCode.CONFLICT]
    rebinding, rejoin = await _join(F, 1, second_key)
    assert chain.block([rebinding, rejoin]) == [TxCode.OK, TxCode.OK]
    earlier = await validator_binding(F, SESSION, CHAIN, bytes([9]) * 32, 0)  # not yet used
    assert chain.block([earlier]) == [TxCode.CONFLICT]
    approvals = [await _approve(s, F, rejoin) for s in (A, B, C)]
    assert chain.block(approvals) == [TxCode.OK] * 3
    await _round(chain, 1, base, SIGNERS)
    # Assert: F is admitted with the later binding's key.
    assert chain.machine.view(1).members == tuple(sorted([*KEYS, F.peer_id]))
    assert chain.updates[-1] == [(second_key, 1)]


async def test_a_binding_with_a_bad_round_is_malformed() -> None:
    chain = Chain(_genesis("majority"))
    bodies = [
        {"session": SESSION, "chain_id": CHAIN, "pub_key": _key(F), "round": bad}
        for bad in (-1, "1", True, 2**41)
    ]
    bodies.append({"session": SESSION, "chain_id": CHAIN, "pub_key": _key(F)})  # no round
    txs = [await _statement(F, VALIDATOR, dag_cbor.encode(body)) for body in bodies]
    assert chain.block(txs) == [TxCode.MALFORMED] * len(txs)


async def test_a_join_or_binding_dated_past_the_next_round_is_refused() -> None:
    """At round 0 a request may name round 0 or 1 (the client read the open round); one of
    round 2 would outlive leaves up to that round, so it is ``OTHER_ROUND``."""
    chain = Chain(_genesis("majority"))
    binding, join = await _join(F, 2)
    assert chain.block([binding, join]) == [TxCode.OTHER_ROUND, TxCode.OTHER_ROUND]
    assert chain.machine.check(join).code == TxCode.OTHER_ROUND  # and in CheckTx
    binding, join = await _join(F, 1)
    assert chain.block([binding, join]) == [TxCode.OK, TxCode.OK]
