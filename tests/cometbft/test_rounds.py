"""The round machine without CometBFT: rosters by attestation, close, finality, hostile txs."""

from __future__ import annotations

import json

import dag_cbor
import pytest

from gradfed_ipfs.block import Block
from gradfed_ipfs.cometbft.abci import (
    LedgerApp,
    RoundMachine,
    RoundsGenesis,
    RoundView,
    TxCode,
    attestation_tx,
    contribution_tx,
    result_tx,
    roster_digest,
)
from gradfed_ipfs.cometbft.abci.pb.cometbft.abci.v1 import types_pb2 as abci
from gradfed_ipfs.errors import MalformedManifest
from gradfed_ipfs.formats.statement import LocalSigner, decode_statement, sign_statement

SIGNERS = [LocalSigner.from_seed(bytes([i + 1]) * 32) for i in range(4)]
A, B, C, D = SIGNERS
OUTSIDER = LocalSigner.from_seed(bytes([9]) * 32)
SESSION = "s"
M0 = str(Block.new(b"genesis model", "raw").cid)
SECOND = 1_000_000_000  # ns


def _cid(tag: str) -> str:
    return str(Block.new(tag.encode(), "raw").cid)


def _genesis(min_peers: int = 3, collect_ms: int = 5000) -> RoundsGenesis:
    return RoundsGenesis(SESSION, M0, tuple(s.peer_id for s in SIGNERS), min_peers, collect_ms)


class Chain:
    """A round machine fed block by block, with the block time in seconds."""

    def __init__(self, genesis: RoundsGenesis | None = None) -> None:
        self.machine = RoundMachine(genesis or _genesis())
        self.height = 0

    def block(self, txs: list[bytes], at: float = 0.0) -> list[TxCode]:
        self.height += 1
        verdicts, _ = self.machine.finalize(self.height, txs, int(at * SECOND))
        self.machine.commit()
        return [v.code for v in verdicts]

    def view(self, r: int) -> RoundView:
        return self.machine.view(r)


async def _contrib(s: LocalSigner, r: int = 0, tag: str = "", base: str = M0, w: int = 1) -> bytes:
    return await contribution_tx(s, SESSION, r, _cid(tag or f"{s.peer_id}/{r}"), w, base)


async def _attest(s: LocalSigner, of: LocalSigner, r: int = 0, tag: str = "") -> bytes:
    return await attestation_tx(s, SESSION, r, of.peer_id, _cid(tag or f"{of.peer_id}/{r}"))


async def _result(s: LocalSigner, r: int = 0, record: str = "rec", model: str = "m1") -> bytes:
    return await result_tx(s, SESSION, r, _cid(record), _cid(model))


async def _full_round(chain: Chain, r: int, base: str, at: float) -> None:
    """Every member contributes on ``base``; the next member attests each."""
    txs = [await _contrib(s, r, base=base) for s in SIGNERS]
    txs += [await _attest(SIGNERS[(i + 1) % 4], s, r) for i, s in enumerate(SIGNERS)]
    assert chain.block(txs, at) == [TxCode.OK] * 8


async def test_a_round_closes_once_every_contribution_is_held_by_f_plus_one() -> None:
    chain = Chain()
    txs = [await _contrib(s) for s in SIGNERS]
    assert chain.block(txs, at=0) == [TxCode.OK] * 4
    assert chain.view(0).status == "open"  # each held by its author only: f + 1 = 2 needed
    assert chain.block([await _attest(B, A), await _attest(C, B), await _attest(D, C)], at=1)
    assert chain.view(0).status == "open"  # D's is not attested yet
    assert chain.block([await _attest(A, D)], at=2) == [TxCode.OK]
    view = chain.view(0)
    assert view.status == "closed"
    expected = sorted((s.peer_id, _cid(f"{s.peer_id}/0"), 1) for s in SIGNERS)
    assert [(e.peer, e.cid, e.weight) for e in view.roster or ()] == expected


async def test_at_the_deadline_a_round_closes_with_the_held_contributions() -> None:
    chain = Chain(_genesis(min_peers=2, collect_ms=5000))
    txs = [await _contrib(A), await _contrib(B), await _contrib(C), await _attest(A, B)]
    chain.block(txs, at=10)
    chain.block([await _attest(B, A)], at=14.9)
    assert chain.view(0).status == "open"
    chain.block([], at=15)  # C's is held by C alone: not in the roster
    roster = chain.view(0).roster
    assert roster is not None
    assert {e.peer for e in roster} == {A.peer_id, B.peer_id}
    late = [await _contrib(D), await _attest(A, C)]
    assert chain.block(late, at=16) == [TxCode.CLOSED, TxCode.CLOSED]


async def test_below_min_peers_the_deadline_waits() -> None:
    chain = Chain(_genesis(min_peers=3, collect_ms=1000))
    chain.block([await _contrib(A), await _contrib(B), await _attest(A, B), await _attest(B, A)])
    chain.block([], at=100)
    assert chain.view(0).status == "open"
    chain.block([await _contrib(C), await _attest(A, C)], at=101)
    assert chain.view(0).status == "closed"


async def test_2f_plus_1_equal_results_make_a_round_final_and_the_next_current() -> None:
    chain = Chain()
    await _full_round(chain, 0, M0, at=0)
    early = await _result(A, r=1)
    assert chain.block([early]) == [TxCode.NOT_CLOSED]
    codes = chain.block([await _result(A), await _result(B), await _result(C, record="other")])
    assert codes == [TxCode.OK] * 3
    assert chain.view(0).status == "closed"  # two equal results of four: not 2f + 1
    assert chain.block([await _result(A, record="again")]) == [TxCode.CONFLICT]
    assert chain.block([await _result(D)]) == [TxCode.OK]
    final = chain.view(0)
    assert (final.status, final.record, final.model) == ("final", _cid("rec"), _cid("m1"))
    assert chain.machine.current == 1
    assert chain.view(1).base == _cid("m1")
    assert chain.block([await _contrib(A, r=0, tag="late")]) == [TxCode.OTHER_ROUND]
    assert chain.block([await _contrib(A, r=1, base=M0)]) == [TxCode.WRONG_BASE]
    await _full_round(chain, 1, _cid("m1"), at=1)
    assert chain.view(1).status == "closed"


def _all_of(r: int = 0) -> bytes:
    """The digest of the roster of every member's contribution to round ``r``."""
    return roster_digest(sorted((s.peer_id, _cid(f"{s.peer_id}/{r}"), 1) for s in SIGNERS))


async def test_results_naming_the_roster_close_and_finish_a_round_in_one_block() -> None:
    chain = Chain()
    txs = [await _contrib(s) for s in SIGNERS]
    assert chain.block(txs) == [TxCode.OK] * 4
    named = [await result_tx(s, SESSION, 0, _cid("rec"), _cid("m1"), _all_of()) for s in SIGNERS]
    unnamed = await _result(A)
    assert chain.block([unnamed]) == [TxCode.NOT_CLOSED]  # no roster yet, none named
    attests = [await _attest(SIGNERS[(i + 1) % 4], s) for i, s in enumerate(SIGNERS)]
    # Three results ride in the block whose attestations close the round: it is final there.
    assert chain.block([*named[:3], *attests]) == [TxCode.OK] * 7
    view = chain.view(0)
    assert (view.status, view.record, view.model) == ("final", _cid("rec"), _cid("m1"))
    assert chain.machine.current == 1


async def test_a_result_naming_another_roster_is_dropped_at_the_close_and_may_be_resent() -> None:
    chain = Chain(_genesis(min_peers=3, collect_ms=1000))
    chain.block([await _contrib(s) for s in SIGNERS], at=0)
    wrong = await result_tx(A, SESSION, 0, _cid("rec"), _cid("m1"), _all_of())
    again = await result_tx(A, SESSION, 0, _cid("rec2"), _cid("m2"), _all_of())
    assert chain.block([wrong, again], at=0.5) == [TxCode.OK, TxCode.CONFLICT]  # one per author
    # At the deadline only A, B and C's are held (D's is not attested): another roster.
    attests = [await _attest(B, A), await _attest(C, B), await _attest(A, C)]
    assert chain.block(attests, at=2) == [TxCode.OK] * 3
    view = chain.view(0)
    assert (view.status, view.results) == ("closed", 0)  # the guess did not count
    three = list(view.roster or ())
    assert {line.peer for line in three} == {A.peer_id, B.peer_id, C.peer_id}
    right = roster_digest((e.peer, e.cid, e.weight) for e in three)
    named_wrong = await result_tx(B, SESSION, 0, _cid("rec"), _cid("m1"), _all_of())
    results = [await result_tx(s, SESSION, 0, _cid("r3"), _cid("m3"), right) for s in (A, B, C)]
    assert chain.block([named_wrong, *results]) == [TxCode.WRONG_ROSTER] + [TxCode.OK] * 3
    assert (chain.view(0).status, chain.view(0).record) == ("final", _cid("r3"))


async def test_a_result_body_with_a_bad_roster_digest_is_malformed() -> None:
    chain = Chain()
    chain.block([await _contrib(s) for s in SIGNERS])
    short = await sign_statement(
        A, "comet/result",
        dag_cbor.encode({"session": SESSION, "round": 0, "record": _cid("rec"),
                         "model": _cid("m1"), "roster": b"short"}),
    )  # fmt: skip
    assert chain.block([short.block.data]) == [TxCode.MALFORMED]


async def test_next_round_contributions_wait_for_their_base() -> None:
    chain = Chain(_genesis(min_peers=2))
    await _full_round(chain, 0, M0, at=0)
    ahead = [await _contrib(A, r=1, base=_cid("m1")), await _contrib(B, r=1, base=_cid("bad"))]
    assert chain.block(ahead) == [TxCode.OK, TxCode.OK]  # base unknown yet: held
    assert chain.view(1).status == "waiting"
    assert chain.block([await _contrib(C, r=2, base=_cid("x"))]) == [TxCode.OTHER_ROUND]
    chain.block([await _result(s) for s in (A, B, C)])
    assert chain.view(1).status == "open"
    # B's contribution was made on another model: dropped; it may contribute again.
    assert chain.block([await _contrib(B, r=1, base=_cid("m1"), tag="again")]) == [TxCode.OK]
    chain.block([await _attest(C, A, r=1), await _attest(C, B, r=1, tag="again")], at=100)
    roster = chain.view(1).roster
    assert roster is not None
    assert [e.peer for e in roster] == sorted([A.peer_id, B.peer_id])


def _forged(tx: bytes, author: str) -> bytes:
    record = dag_cbor.decode(tx)
    assert isinstance(record, dict)
    record["author"] = author  # another member's name on this signature
    return dag_cbor.encode(record)


async def test_hostile_transactions_are_refused_and_change_nothing() -> None:
    chain = Chain()
    before = chain.machine.app_hash
    good = await _contrib(A)
    other_session = await contribution_tx(A, "other", 0, _cid("x"), 1, M0)
    wrong_fields = await sign_statement(A, "comet/contribution", dag_cbor.encode({"round": 0}))
    unknown_kind = await sign_statement(A, "comet/nope", dag_cbor.encode({"session": SESSION}))
    txs = [
        _forged(good, B.peer_id),
        await _contrib(OUTSIDER),
        other_session,
        await _contrib(A, r=7),
        await _attest(A, OUTSIDER),
        wrong_fields.block.data,
        unknown_kind.block.data,
        b"",
        b"\xa1junk",
        await _result(A),  # a result before any roster
    ]
    codes = chain.block(txs)
    assert codes == [
        TxCode.BAD_SIGNATURE,
        TxCode.NOT_MEMBER,
        TxCode.OTHER_SESSION,
        TxCode.OTHER_ROUND,
        TxCode.NOT_MEMBER,
        TxCode.MALFORMED,
        TxCode.MALFORMED,
        TxCode.MALFORMED,
        TxCode.MALFORMED,
        TxCode.NOT_CLOSED,
    ]
    assert chain.machine.app_hash == before
    assert chain.view(0) == RoundView(0, "open", M0, None, None, None)
    assert chain.block([good, good]) == [TxCode.OK, TxCode.DUPLICATE]
    assert chain.machine.check(good).code == TxCode.DUPLICATE


async def test_conflicting_contributions_are_evidence_and_leave_the_peer_out() -> None:
    chain = Chain(_genesis(min_peers=3, collect_ms=1000))
    first, second = await _contrib(D, tag="one"), await _contrib(D, tag="two")
    txs = [await _contrib(s) for s in (A, B, C)] + [first]
    txs += [await _attest(B, A), await _attest(C, B), await _attest(A, C)]
    txs += [await _attest(A, D, tag="one"), second, await _contrib(D, tag="three")]
    codes = chain.block(txs, at=0)
    # The second contribution is accepted as evidence; the peer is out of the round after it.
    assert codes == [TxCode.OK] * 9 + [TxCode.CONFLICT]
    # Every member but the equivocator is held: the round closes without waiting.
    view = chain.view(0)
    assert view.status == "closed"
    assert view.evidence == (D.peer_id,)
    assert D.peer_id not in {e.peer for e in view.roster or ()}
    assert chain.block([await _attest(B, D, tag="one")]) == [TxCode.CLOSED]


async def test_one_attestation_per_attester_and_contributor() -> None:
    chain = Chain()
    chain.block([await _contrib(A)])
    codes = chain.block([await _attest(B, A), await _attest(B, A, tag="something else")])
    assert codes == [TxCode.OK, TxCode.CONFLICT]


async def _script() -> list[list[bytes]]:
    blocks = [[await _contrib(s) for s in SIGNERS]]
    blocks.append([await _attest(SIGNERS[(i + 1) % 4], s) for i, s in enumerate(SIGNERS)])
    blocks.append([await _result(s) for s in SIGNERS])
    return blocks


def _run(blocks: list[list[bytes]], times: list[float] | None = None) -> bytes:
    chain = Chain()
    for i, txs in enumerate(blocks):
        chain.block(txs, (times or [float(i)] * len(blocks))[i])
    return chain.machine.app_hash


async def test_the_app_hash_is_a_function_of_the_blocks() -> None:
    blocks = await _script()
    assert _run(blocks) == _run(blocks)  # two validators, one state
    flat = [tx for txs in blocks for tx in txs]
    assert _run(blocks) == _run([flat[:4], flat[4:8], flat[8:]], [0, 1, 2])
    swapped = [blocks[0][::-1], *blocks[1:]]
    assert _run(swapped) != _run(blocks)  # another order of the log
    refused = [*blocks[:2], [await _contrib(OUTSIDER), *blocks[2]]]
    assert _run(refused) == _run(blocks)  # refused transactions change nothing
    # Finality moved the current round and the decided chain: it is in the hash.
    assert _run(blocks) != _run(blocks[:2]) != _run(blocks[:1]) != _run([])


async def test_the_member_set_is_in_the_app_hash() -> None:
    assert RoundMachine(_genesis()).app_hash != RoundMachine(_genesis(min_peers=4)).app_hash
    fewer = RoundsGenesis(SESSION, M0, tuple(s.peer_id for s in SIGNERS[:3]), 2, 5000)
    assert RoundMachine(fewer).app_hash != RoundMachine(_genesis()).app_hash


def test_a_genesis_app_state_round_trips_and_bad_ones_are_refused() -> None:
    genesis = _genesis()
    raw = json.dumps(genesis.to_dict()).encode()
    assert RoundsGenesis.from_app_state(raw) == genesis
    assert RoundsGenesis.from_app_state(b"") is None
    assert RoundsGenesis.from_app_state(b'{"app": "other"}') is None
    with pytest.raises(MalformedManifest):
        RoundsGenesis.from_app_state(json.dumps({**genesis.to_dict(), "min_peers": 9}).encode())
    with pytest.raises(MalformedManifest):
        RoundsGenesis.from_app_state(json.dumps({"app": genesis.to_dict()["app"]}).encode())


async def test_init_chain_with_a_round_app_state_runs_the_round_machine() -> None:
    app = LedgerApp()
    state = json.dumps(_genesis().to_dict()).encode()
    init = abci.InitChainRequest(chain_id="c", app_state_bytes=state)
    answer = app.handle(abci.Request(init_chain=init)).init_chain
    assert isinstance(app.ledger, RoundMachine)
    assert answer.app_hash == app.ledger.app_hash
    contributed, attested, _ = await _script()
    txs = contributed + attested
    block = abci.FinalizeBlockRequest(height=1, txs=[*txs, b"junk"])
    block.time.seconds = 1
    finalized = app.handle(abci.Request(finalize_block=block)).finalize_block
    assert [r.code for r in finalized.tx_results] == [TxCode.OK] * 8 + [TxCode.MALFORMED]
    app.handle(abci.Request(commit=abci.CommitRequest()))
    query = abci.QueryRequest(path="/round", data=b"0")
    answer_q = app.handle(abci.Request(query=query)).query
    assert answer_q.code == 0
    view = RoundView.from_dict(dag_cbor.decode(answer_q.value))
    assert view.status == "closed"
    assert view.roster is not None
    assert [(e.peer, e.cid, e.weight) for e in view.roster] == [
        (p, _cid(f"{p}/0"), 1) for p in sorted(s.peer_id for s in SIGNERS)
    ]
    signed = {decode_statement(Block.new(tx, "dag-cbor")).signature for tx in contributed}
    assert {e.signature for e in view.roster} <= signed  # each line: its owner's tx signature
    members = app.handle(abci.Request(query=abci.QueryRequest(path="/members"))).query
    decoded = dag_cbor.decode(members.value)
    assert isinstance(decoded, dict)
    assert (decoded["f"], decoded["current"]) == (1, 0)
    bad = app.handle(abci.Request(query=abci.QueryRequest(path="/round", data=b"x"))).query
    assert bad.code == 2


async def test_the_final_query_proves_each_final_round_in_the_app_hash() -> None:
    import hashlib

    from gradfed_ipfs.cometbft.abci import final_leaf, genesis_digest
    from gradfed_ipfs.cometbft.merkle import root_from_aunts

    chain = Chain()
    base = M0
    for r in range(3):
        assert chain.machine.query("/final", str(r).encode()) == (None, "")  # not final yet
        await _full_round(chain, r, base, at=10.0 * r)
        results = [await _result(s, r, record=f"rec{r}", model=f"m{r}") for s in SIGNERS[:3]]
        chain.block(results, at=10.0 * r + 1)
        base = _cid(f"m{r}")
    for r in range(3):
        raw, _ = chain.machine.query("/final", str(r).encode())
        assert raw is not None
        proof = dag_cbor.decode(raw)
        assert isinstance(proof, dict)
        state = proof["state"]
        assert isinstance(state, bytes)
        assert hashlib.sha256(state).digest() == chain.machine.app_hash
        summary = dag_cbor.decode(state)
        assert isinstance(summary, dict)
        assert summary["genesis"] == genesis_digest(chain.machine.genesis)
        assert (proof["record"], proof["total"]) == (_cid(f"rec{r}"), 3)
        leaf = final_leaf(r, _cid(f"rec{r}"), _cid(f"m{r}"))
        aunts = proof["aunts"]
        assert isinstance(aunts, list)
        assert root_from_aunts(leaf, r, 3, aunts) == summary["finals"]  # type: ignore[arg-type]
        forged = final_leaf(r, _cid("forged"), _cid(f"m{r}"))
        assert root_from_aunts(forged, r, 3, aunts) != summary["finals"]  # type: ignore[arg-type]
    assert chain.machine.query("/final", b"x")[1]  # a bad query names why
