"""Chained reduce-scatter in memory: the same model, fewer blocks, missing senders, silent and
lying steps, and the fraud proof of a lying partial sum (issue 14)."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from gradfed_ipfs._types import CIDLike
from gradfed_ipfs.block import Block
from gradfed_ipfs.cid import parse_cid
from gradfed_ipfs.errors import BlockTimeout, RoundVerificationFailed
from gradfed_ipfs.federated.sliced import SliceFaults
from gradfed_ipfs.federated.sliced.peer import (
    MemorySliceBoard,
    ReduceScatterConfig,
    ReduceScatterPeer,
)
from gradfed_ipfs.federated.sliced.plan import (
    chain_groups,
    chain_senders,
    chain_sum,
    reducer_rankings,
)
from gradfed_ipfs.federated.sliced.proofs import (
    check_partial_frauds,
    partial_fraud_fits,
    partial_lie_proven,
)
from gradfed_ipfs.formats.sliced.partials import PartialRecord, partial_blocks
from gradfed_ipfs.formats.sliced.slices import FraudRecord, SliceRecord
from gradfed_ipfs.storage import MemoryBlockStore
from gradfed_ipfs.storage.base import UNSET, StoreWrapper, Unset
from gradfed_ipfs.storage.dag import fetch_manifest
from tests.federated.sliced.test_peer import CHUNK, LR, make_round, reference, run_all

D = 262_144  # 16 chunks of 64 KiB: chunk-aligned slices up to S = 16


def chained(**more: float) -> ReduceScatterConfig:
    """Chained settings; ``G = 2`` unless ``chain_groups`` is given (``None``: the default)."""
    settings = {"phase_timeout": 20.0, "reducer_timeout": 0.3, "chain_groups": 2, **more}
    return ReduceScatterConfig(chunk_bytes=CHUNK, learning_rate=LR, chained=True, **settings)  # type: ignore[arg-type]


def test_chain_shape_is_about_the_square_root_and_groups_follow_the_roster() -> None:
    assert [chain_groups(n) for n in (1, 4, 9, 10, 16, 31, 32, 64, 128, 256)] == [
        1, 1, 1, 2, 2, 4, 4, 8, 8, 16,
    ]  # fmt: skip
    for n in range(2, 300):  # at least 5 slices: the float64 partial adds at most 0.4·d
        assert chain_groups(n) == 1 or -(-n // chain_groups(n)) >= 5
    peers = [f"p{i}" for i in range(10)]
    groups = chain_senders(peers, 3)
    assert [sorted(g) for g in groups] == [peers[0:3], peers[3:6], peers[6:10]]


@pytest.mark.parametrize(("n", "groups"), [(4, 2), (8, 2), (9, 2), (10, None), (16, 4)])
async def test_a_chained_round_gives_the_all_to_all_model_with_n_to_the_1_5_blocks(
    n: int, groups: int | None
) -> None:
    r = await make_round(n, d=D)
    results, board = await run_all(r, config=chained(chain_groups=groups))  # type: ignore[arg-type]
    assert {res.model_cid for res in results.values()} == {await reference(r)}
    groups = groups or chain_groups(n)
    slices = -(-n // groups)
    assert len({tuple(res.records) for res in results.values()}) == 1
    assert all(len(res.records) == slices and not res.liars for res in results.values())
    partials = [m for m in board.messages if m.kind == "partial"]
    assert sorted(m.k for m in partials) == sorted(
        k * groups + j for k in range(slices) for j in range(groups - 1)
    )  # one partial per step but the last: no backup took over
    # The slice records are ordinary ones: the whole roster as inputs, W over it.
    record = SliceRecord.from_block(await r.store.get(results[r.roster.peers[0]].records[0]))
    assert record.inputs == tuple((e.peer, e.contribution) for e in r.roster.entries)
    assert record.weight_sum == sum(r.weights.values())
    if n == 8:  # S = 4 chunk-aligned slices: pieces d, the partial 2·d/S, results d
        assert max(res.downloaded for res in results.values()) <= 2.6 * D * 4


async def test_median_rounds_stay_one_level_when_chained_is_asked() -> None:
    r = await make_round(4, d=D)
    results, board = await run_all(r, config=chained(rule="median"))  # type: ignore[arg-type]
    assert not [m for m in board.messages if m.kind == "partial"]
    assert all(len(res.records) == 4 for res in results.values())


async def test_a_sender_missing_from_one_step_is_excluded_from_every_slice() -> None:
    r = await make_round(8, d=D)
    dropped = r.roster.peers[5]
    manifest = await fetch_manifest(r.store, r.roster.entries[5].contribution)
    await r.store.delete(manifest.chunks[-1].cid)  # only the last slice's step misses it
    results, board = await run_all(r, skip=(dropped,), config=chained(fetch_timeout=1.0))
    want = await reference(r, without=(dropped,))
    assert {res.model_cid for res in results.values()} == {want}
    assert all(res.missing == (dropped,) for res in results.values())
    assert max(m.phase for m in board.messages if m.kind == "slice") == 1
    final = [m for m in board.messages if m.kind == "partial" and m.phase == 1]
    for message in final:
        partial = PartialRecord.from_block(await r.store.get(message.cid))  # type: ignore[arg-type]
        assert partial.missing == (dropped,)
        assert partial.weight_sum == sum(w for p, w in r.weights.items() if p != dropped)


async def test_a_silent_first_step_is_taken_over_by_its_next_ranked_peer() -> None:
    r = await make_round(8, d=D)
    groups = 2
    rankings = reducer_rankings(bytes(r.roster_cid), 4 * groups, r.roster.peers)
    quiet = rankings[0][0]  # step (0, 0): the chain of slice 0 waits for its partial
    results, board = await run_all(r, silent=(quiet,), config=chained())
    assert {res.model_cid for res in results.values()} == {await reference(r)}
    assert quiet not in {m.sender for m in board.messages if m.kind in ("partial", "slice")}
    (taken,) = [m for m in board.messages if m.kind == "partial" and m.k == 0]
    assert taken.sender == rankings[0][1]


async def test_a_step_whose_first_ranks_are_silent_is_served_late_by_a_lower_rank() -> None:
    r = await make_round(8, d=D)
    groups = 2
    rankings = reducer_rankings(bytes(r.roster_cid), 4 * groups, r.roster.peers)
    quiet = tuple(rankings[0][:2])  # step (0, 0)'s only ranks that wait from the start
    results, board = await run_all(r, silent=quiet, config=chained(backups=2))
    assert {res.model_cid for res in results.values()} == {await reference(r)}
    (taken,) = [m for m in board.messages if m.kind == "partial" and m.k == 0]
    assert taken.sender == rankings[0][2]


async def test_steps_with_a_live_first_rank_are_served_by_it_alone() -> None:
    r = await make_round(8, d=D)
    results, board = await run_all(r, config=chained(backups=1, reducer_timeout=1.0))
    assert {res.model_cid for res in results.values()} == {await reference(r)}
    rankings = reducer_rankings(bytes(r.roster_cid), 4 * 2, r.roster.peers)
    steps = [m for m in board.messages if m.kind == "partial"]
    assert sorted(m.k for m in steps) == [0, 2, 4, 6]  # each step of j = 0 once
    assert all(m.sender == rankings[m.k][0] for m in steps)


class _GarbagePartials(SliceFaults):
    """Announces well-formed partial records whose values are NaN (no finite sum is)."""

    def partial_blocks(self, k: int, acc: np.ndarray) -> list[Block] | None:
        return [Block.new(np.full(acc.size, np.nan).tobytes())]


async def test_a_garbage_partial_is_computed_again_by_the_next_step() -> None:
    # Its backups saw a record and stood aside; before, every peer's round timed out waiting
    # for a valid partial of that step (one member's bytes failed the round).
    r = await make_round(8, d=D)
    groups = 2
    rankings = reducer_rankings(bytes(r.roster_cid), 4 * groups, r.roster.peers)
    garbage = rankings[0][0]  # step (0, 0): read by step (0, 1) only
    board = MemorySliceBoard(members=r.roster.peers)
    config = chained(phase_timeout=10.0)
    peers = [
        ReduceScatterPeer(
            p, r.store, board, config, faults=_GarbagePartials() if p == garbage else None
        )
        for p in r.roster.peers
    ]
    results = await asyncio.gather(
        *(peer.run(r.roster, r.roster_cid, r.base, r.grads[peer.peer]) for peer in peers)
    )
    assert {res.model_cid for res in results} == {await reference(r)}
    assert all(res.missing == () for res in results)
    readers = [res.garbage for res in results if res.garbage]  # who read it refused it
    assert readers
    assert all(set(seen) == {garbage} and "non-finite" in seen[garbage] for seen in readers)
    step0 = [m for m in board.messages if m.kind == "partial" and m.k == 0]
    assert {m.sender for m in step0} == {garbage, rankings[1][0]}  # step (0, 1) redid it


async def test_a_lying_partial_is_blamed_on_its_author_and_the_fraud_record_proves_it() -> None:
    r = await make_round(8, d=D)
    groups = 2
    rankings = reducer_rankings(bytes(r.roster_cid), 4 * groups, r.roster.peers)
    liar = rankings[0][0]  # step (0, 0) only: the record of slice 0 is written by an honest peer
    writer = rankings[groups - 1][0]
    assert writer != liar
    results, _ = await run_all(r, lie={liar: 1e-3}, config=chained())
    honest = {p: res for p, res in results.items() if p != liar}
    assert {res.model_cid for res in honest.values()} == {await reference(r)}
    assert all(res.liars == {liar} for res in honest.values())  # not the slice's writer
    (fraud_cid,) = {c for res in honest.values() for c in res.frauds}
    fraud = FraudRecord.from_block(await r.store.get(fraud_cid))
    assert (fraud.reducer, fraud.k) == (liar, 0)
    claimed = PartialRecord.from_block(await r.store.get(fraud.claimed))
    correct = SliceRecord.from_block(await r.store.get(fraud.correct))
    assert claimed.j == 0
    assert fraud.correct == honest[writer].records[0]
    assert partial_fraud_fits(claimed, correct, r.roster)
    assert await partial_lie_proven(r.store, claimed, correct, r.roster, D)
    await check_partial_frauds(r.store, [fraud_cid], r.roster, D)  # does not raise

    # The honest partial of that step, named as a lie, proves nothing.
    senders = [e for e in r.roster.entries if e.peer in chain_senders(r.roster.peers, groups)[0]]
    rows = [r.grads[e.peer][claimed.offset : claimed.offset + claimed.length] for e in senders]
    right = chain_sum(None, rows, [e.weight for e in senders], claimed.weight_sum, claimed.length)
    blocks = partial_blocks(right)
    for block in blocks:
        await r.store.put(block)
    honest_partial = dataclasses.replace(claimed, values=tuple(b.cid for b in blocks))
    assert honest_partial != claimed
    honest_cid = await r.store.put(honest_partial.to_block())
    framed = FraudRecord(r.roster_cid, 0, writer, honest_cid, fraud.correct)
    framed_cid = await r.store.put(framed.to_block())
    with pytest.raises(RoundVerificationFailed, match="right"):
        await check_partial_frauds(r.store, [framed_cid], r.roster, D)
    # A partial of another exclusion set or of the last step does not fit the slice.
    assert not partial_fraud_fits(dataclasses.replace(claimed, missing=("x",)), correct, r.roster)
    assert not partial_fraud_fits(dataclasses.replace(claimed, j=groups - 1), correct, r.roster)


class _Hanging(StoreWrapper):
    """Chunks of a dead sender: each ``get`` waits its timeout, then fails (as Kubo does)."""

    def __init__(self, inner: MemoryBlockStore, dead: set[bytes], peer: str, asked: set[str]):
        super().__init__(inner)
        self.dead, self.peer, self.asked = dead, peer, asked

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        if bytes(parse_cid(cid)) in self.dead:
            self.asked.add(self.peer)
            await asyncio.sleep(timeout if isinstance(timeout, float) else 1.0)
            raise BlockTimeout(f"{cid}: no provider answered in time")
        return await self.store.get(cid, timeout=timeout)


async def test_a_dead_sender_costs_one_fetch_timeout_and_no_takeover_wait() -> None:
    """A sender gone after its commit (each chunk times out) is asked for by the steps of its
    group, once each; the backup of its own step takes over without ``reducer_timeout``
    (its rank 0 is reported missing)."""
    r = await make_round(16, d=D)
    groups = 4
    rankings = reducer_rankings(bytes(r.roster_cid), 16, r.roster.peers)
    dead = rankings[9][0]  # the rank 0 of step (2, 1)
    index = r.roster.peers.index(dead)
    manifest = await fetch_manifest(r.store, r.roster.entries[index].contribution)
    chunks = {bytes(c.cid) for c in manifest.chunks}
    config = chained(
        chain_groups=groups, fetch_timeout=0.5, reducer_timeout=60.0, phase_timeout=10.0
    )  # waiting reducer_timeout once would fail the phase
    board, asked = MemorySliceBoard(members=r.roster.peers), set[str]()
    live = [p for p in r.roster.peers if p != dead]
    peers = [ReduceScatterPeer(p, _Hanging(r.store, chunks, p, asked), board, config) for p in live]
    results = await asyncio.gather(
        *(peer.run(r.roster, r.roster_cid, r.base, r.grads[peer.peer]) for peer in peers)
    )
    assert {res.model_cid for res in results} == {await reference(r, without=(dead,))}
    assert all(res.missing == (dead,) for res in results)
    group = chain_senders(r.roster.peers, groups).index(
        next(g for g in chain_senders(r.roster.peers, groups) if dead in g)
    )
    owners = {rankings[k * groups + group][0] for k in range(4)} - {dead}
    # The steps of its group asked while reducing (the backup that replaced it did not wait
    # for it); the others asked once more each, to check the records' claim that it is
    # missing before excluding it (issue 32, item 6).
    assert owners <= asked
