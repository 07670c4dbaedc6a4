"""A reducer cannot hide a lie by shifting its own check values, nor censor a sender with a
false ``missing`` claim (issue 32, item 6; attacks 5 and 6)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gradfed_ipfs.errors import DecodeError
from gradfed_ipfs.federated.sliced import SliceFaults
from gradfed_ipfs.federated.sliced.peer import (
    MemorySliceBoard,
    PubsubSliceBoard,
    ReduceScatterConfig,
    ReduceScatterPeer,
    ReduceScatterResult,
)
from gradfed_ipfs.federated.sliced.plan import projection_seed, projection_vector, reducer_rankings
from gradfed_ipfs.federated.sliced.proofs import check_partial_frauds
from gradfed_ipfs.formats import decode_statement
from gradfed_ipfs.formats.sliced.partials import PartialRecord
from gradfed_ipfs.formats.sliced.slices import FraudRecord, SliceMessage, SliceRecord
from gradfed_ipfs.kubo import MemoryPubsubBus
from tests.federated.sliced.hostile import Censor, HidingLiar
from tests.federated.sliced.test_peer import (
    CHUNK,
    LR,
    D,
    Round,
    _GarbageRecord,
    make_round,
    reference,
)


async def _run(
    r: Round, faults: dict[str, SliceFaults], **settings: object
) -> tuple[dict[str, ReduceScatterResult], MemorySliceBoard]:
    board = MemorySliceBoard(members=r.roster.peers)
    config = ReduceScatterConfig(
        chunk_bytes=CHUNK,
        learning_rate=LR,
        phase_timeout=20,
        **settings,  # type: ignore[arg-type]
    )
    peers = {
        p: ReduceScatterPeer(p, r.store, board, config, faults=faults.get(p))
        for p in r.roster.peers
    }
    results = await asyncio.gather(
        *(peer.run(r.roster, r.roster_cid, r.base, r.grads[p]) for p, peer in peers.items())
    )
    return dict(zip(peers, results, strict=True)), board


def _true_value(r: Round, res: ReduceScatterResult, liar: str, k: int, offset: int) -> float:
    """The liar's honest check value of slice ``k`` (the projection of its rows there)."""
    seed = projection_seed([bytes(c) for c in res.records])
    n = SliceRecord.from_block(res.record_blocks[bytes(res.records[k])]).length
    z = projection_vector(seed, k, n)
    return float(np.einsum("i,i->", z, r.grads[liar][offset : offset + n].astype(np.float64)))


async def test_a_reducer_shifting_its_own_check_value_by_its_lie_is_caught_and_proven() -> None:
    """Attack 5: +5.0 on every value of its slice, its own check value shifted to match."""
    r = await make_round(4)
    liar = reducer_rankings(bytes(r.roster_cid), 4, r.roster.peers)[1][0]  # reduces slice 1
    hiding = HidingLiar(5.0, sum(r.weights.values()) / r.weights[liar], LR, partials=False)
    results, board = await _run(r, {liar: hiding})
    honest = {p: res for p, res in results.items() if p != liar}
    assert hiding.k == 1  # it did lie, in its own slice
    assert {res.model_cid for res in honest.values()} == {await reference(r)}
    assert all(res.liars == {liar} for res in honest.values())
    assert all(liar in res.false_values for res in honest.values())
    (fraud_cid,) = {c for res in honest.values() for c in res.frauds}
    fraud = FraudRecord.from_block(await r.store.get(fraud_cid))
    assert (fraud.reducer, fraud.k) == (liar, 1)
    # It did publish the shifted value (the projection of its lie), not its rows' one.
    res = next(iter(honest.values()))
    offset = SliceRecord.from_block(res.record_blocks[bytes(res.records[1])]).offset
    (said,) = {m.values for m in board.messages if m.kind == "proj" and m.sender == liar}
    assert said == hiding.published
    assert abs(said[1] - _true_value(r, res, liar, 1, offset)) > 1.0
    # Its backup published the value its blocks give, which every peer checked.
    checked = [c for m in board.messages if m.kind == "proj" for c in m.checked if c[1] == liar]
    assert checked
    assert all(c[0] == 1 for c in checked)


async def test_a_chained_partial_hidden_by_a_shifted_check_value_is_blamed_and_proven() -> None:
    """Attack 5, chained: the author of step (0, 0) adds 5.0 to its partial sum and shifts
    its own check value of slice 0; the slice's writer is honest."""
    r = await make_round(8)
    groups = 2
    rankings = reducer_rankings(bytes(r.roster_cid), 4 * groups, r.roster.peers)
    liar, writer = rankings[0][0], rankings[groups - 1][0]
    assert writer != liar
    hiding = HidingLiar(5.0, sum(r.weights.values()) / r.weights[liar], LR, partials=True)
    results, _ = await _run(
        r, {liar: hiding}, chained=True, chain_groups=groups, reducer_timeout=0.3
    )
    honest = {p: res for p, res in results.items() if p != liar}
    assert hiding.k == 0
    assert hiding.published  # its shifted check values
    assert {res.model_cid for res in honest.values()} == {await reference(r)}
    assert all(res.liars == {liar} for res in honest.values())
    assert all(liar in res.false_values for res in honest.values())
    (fraud_cid,) = {c for res in honest.values() for c in res.frauds}
    fraud = FraudRecord.from_block(await r.store.get(fraud_cid))
    assert (fraud.reducer, fraud.k) == (liar, 0)
    assert PartialRecord.from_block(await r.store.get(fraud.claimed)).j == 0
    await check_partial_frauds(r.store, [fraud_cid], r.roster, D)  # the proof re-checks


async def test_a_false_missing_claim_excludes_nobody_and_names_the_claimant() -> None:
    """Attack 6: a reducer claims it could not fetch an honest sender's slice."""
    r = await make_round(4)
    censor, victim = r.roster.peers[1], r.roster.peers[2]
    results, _ = await _run(r, {censor: Censor(victim)})
    assert {res.model_cid for res in results.values()} == {await reference(r)}
    assert all(res.missing == () for res in results.values())
    honest = {p: res for p, res in results.items() if p != censor}
    assert all("false missing claim" in res.garbage[censor] for res in honest.values())
    assert all(victim not in res.garbage for res in honest.values())


async def _run_pubsub(
    r: Round, faults: dict[str, SliceFaults], bus: MemoryPubsubBus
) -> tuple[dict[str, ReduceScatterResult], list[PubsubSliceBoard]]:
    """A round over signing pubsub boards (one per peer, on ``bus``)."""
    topic = "gradfed/v1/s/slices"
    config = ReduceScatterConfig(chunk_bytes=CHUNK, learning_rate=LR, phase_timeout=20)
    boards = [
        PubsubSliceBoard(bus.endpoint(p), topic, p, members=r.roster.peers) for p in r.roster.peers
    ]
    for board in boards:
        await board.__aenter__()
    try:
        results = await asyncio.gather(
            *(
                ReduceScatterPeer(p, r.store, b, config, faults=faults.get(p)).run(
                    r.roster, r.roster_cid, r.base, r.grads[p]
                )
                for p, b in zip(r.roster.peers, boards, strict=True)
            ),
            return_exceptions=True,  # a hostile peer's own round is its business
        )
    finally:
        for board in boards:
            await board.__aexit__(None, None, None)
    out = {p: res for p, res in zip(r.roster.peers, results, strict=True) if p not in faults}
    assert all(isinstance(res, ReduceScatterResult) for res in out.values()), results
    return {p: res for p, res in out.items() if isinstance(res, ReduceScatterResult)}, boards


async def test_over_signing_boards_the_hidden_lie_and_its_false_values_are_signed_evidence() -> (
    None
):
    r = await make_round(4)
    liar = reducer_rankings(bytes(r.roster_cid), 4, r.roster.peers)[1][0]
    hiding = HidingLiar(5.0, sum(r.weights.values()) / r.weights[liar], LR, partials=False)
    bus = MemoryPubsubBus()
    results, _ = await _run_pubsub(r, {liar: hiding}, bus)
    honest = {p: res for p, res in results.items() if p != liar}
    assert {res.model_cid for res in honest.values()} == {await reference(r)}
    assert all(res.liars == {liar} for res in honest.values())
    for res in honest.values():
        # The signed statement of its false check values (the first it was caught in) or of
        # its lying record: its key signed it, and it says what the blocks contradict.
        statement = decode_statement(await r.store.get(res.evidence[liar]), keys=bus.keys)
        assert statement.author == liar
        assert statement.kind in ("sliced/proj", "sliced/slice")
        if statement.kind == "sliced/proj":
            assert SliceMessage.decode(statement.body, liar).values == hiding.published


async def test_over_signing_boards_a_false_missing_claim_is_signed_evidence() -> None:
    r = await make_round(4)
    censor, victim = r.roster.peers[1], r.roster.peers[2]
    bus = MemoryPubsubBus()
    results, _ = await _run_pubsub(r, {censor: Censor(victim)}, bus)
    assert {res.model_cid for res in results.values()} == {await reference(r)}
    honest = {p: res for p, res in results.items() if p != censor}
    for res in honest.values():
        statement = decode_statement(await r.store.get(res.evidence[censor]), keys=bus.keys)
        assert (statement.author, statement.kind) == (censor, "sliced/slice")
        message = SliceMessage.decode(statement.body, censor)
        record = SliceRecord.from_block(await r.store.get(message.cid))  # type: ignore[arg-type]
        assert victim in record.missing  # the claim, signed; the victim's blocks are served


async def test_over_signing_boards_a_garbage_record_is_signed_evidence() -> None:
    r = await make_round(4)
    garbage = reducer_rankings(bytes(r.roster_cid), 4, r.roster.peers)[0][0]
    bus = MemoryPubsubBus()
    results, _ = await _run_pubsub(r, {garbage: _GarbageRecord()}, bus)
    honest = {p: res for p, res in results.items() if p != garbage}
    assert {res.model_cid for res in honest.values()} == {await reference(r)}
    for res in honest.values():
        assert set(res.garbage) == {garbage}
        statement = decode_statement(await r.store.get(res.evidence[garbage]), keys=bus.keys)
        assert (statement.author, statement.kind) == (garbage, "sliced/slice")
        named = SliceMessage.decode(statement.body, garbage).cid
        assert named is not None
        with pytest.raises(DecodeError):  # what it signed for slice 0 is no slice record
            SliceRecord.from_block(await r.store.get(named))


async def test_a_false_missing_claim_in_a_chained_partial_excludes_nobody() -> None:
    """Attack 6, chained: the author of step (0, 0) claims a sender of its group missing.
    Steps that took the report on its word list the sender too; every record that does is
    refused and recomputed, and the first claimant is named."""
    r = await make_round(8)
    groups = 2
    rankings = reducer_rankings(bytes(r.roster_cid), 4 * groups, r.roster.peers)
    censor = rankings[0][0]  # step (0, 0): reads group 0
    victim = next(p for p in r.roster.peers[:4] if p != censor)
    results, _ = await _run(
        r, {censor: Censor(victim)}, chained=True, chain_groups=groups, reducer_timeout=0.3
    )
    honest = {p: res for p, res in results.items() if p != censor}
    assert {res.model_cid for res in honest.values()} == {await reference(r)}
    assert all(res.missing == () for res in honest.values())
    assert all("false missing claim" in res.garbage[censor] for res in honest.values())


async def test_a_verifier_lying_about_an_honest_author_costs_a_fetch_and_frames_nobody() -> None:
    r = await make_round(4)
    ranking = reducer_rankings(bytes(r.roster_cid), 4, r.roster.peers)[1]
    author, verifier = ranking[0], ranking[1]
    board = MemorySliceBoard(members=r.roster.peers)
    # Its first check values count: a false value for the author of slice 1 (and its own).
    forged = SliceMessage(
        "proj", verifier, r.roster_cid, values=(0.0,) * 4, checked=((1, author, (123.0,)),)
    )
    await board.publish(forged)
    config = ReduceScatterConfig(chunk_bytes=CHUNK, learning_rate=LR, phase_timeout=20)
    peers = {p: ReduceScatterPeer(p, r.store, board, config) for p in r.roster.peers}
    results = await asyncio.gather(
        *(peer.run(r.roster, r.roster_cid, r.base, r.grads[p]) for p, peer in peers.items())
    )
    assert {res.model_cid for res in results} == {await reference(r)}
    assert all(not res.liars and not res.frauds for res in results)
    others = [res for p, res in zip(peers, results, strict=True) if p != verifier]
    assert all(verifier in res.false_values for res in others)
    assert all(author not in res.false_values for res in results)
