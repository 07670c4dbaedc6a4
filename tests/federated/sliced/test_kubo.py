"""One reduce-scatter round (one-level and chained) over three real Kubo daemons (bitswap)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gradfed_ipfs.federated.sliced.peer import (
    MemorySliceBoard,
    ReduceScatterConfig,
    ReduceScatterPeer,
)
from gradfed_ipfs.formats.agreed.roster import Roster
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore
from gradfed_ipfs.storage.dag import put_gradient
from gradfed_ipfs.tensor.deterministic import deterministic_update

D = 196_608  # 13 chunks of 64 KiB
CHUNK = 65_536


@pytest.mark.kubo
@pytest.mark.parametrize("chained", [False, True])
async def test_reduce_scatter_round_over_kubo_downloads_under_two_and_a_half_d(
    kubo_swarm3,  # type: ignore[no-untyped-def]
    chained: bool,
) -> None:
    rng = np.random.default_rng(14)
    base = rng.standard_normal(D).astype(np.float32)
    peers = [n.peer_id for n in kubo_swarm3]
    stores = [KuboBlockStore(n.api_url, timeout=30.0) for n in kubo_swarm3]
    if chained:  # a chain needs 4 peers: the fourth shares the first daemon
        peers.append("peer-beside-0")
        stores.append(KuboBlockStore(kubo_swarm3[0].api_url, timeout=30.0))
    grads = {p: rng.standard_normal(D).astype(np.float32) for p in peers}
    weights = {p: i + 1 for i, p in enumerate(peers)}
    try:
        entries = {}
        for p, store in zip(peers, stores, strict=True):
            base_cid = await put_gradient(store, base)
            entries[p] = (await put_gradient(store, grads[p], chunk_bytes=CHUNK), weights[p])
        roster = Roster.new("rs-kubo", base_cid, 0, base_cid, peers[0], peers, entries)
        for store in stores:  # not pinned: a recursive pin over the contributions a peer does
            roster_cid = await store.put(roster.to_block(), pin=False)  # not hold breaks repo/gc
        board = MemorySliceBoard(members=peers)
        config = ReduceScatterConfig(
            chunk_bytes=CHUNK,
            learning_rate=0.25,
            fetch_timeout=30.0,
            phase_timeout=60.0,
            chained=chained,
            chain_groups=2,  # 2 slices of 2 steps (the default chains from 10 peers on)
        )
        results = await asyncio.gather(
            *(
                ReduceScatterPeer(p, s, board, config).run(roster, roster_cid, base, grads[p])
                for p, s in zip(peers, stores, strict=True)
            )
        )
        for store in stores[:3]:  # what the round pinned is whole on each daemon: gc runs
            await store.collect_garbage()
    finally:
        for store in stores:
            await store.aclose()
    # The reference aggregates in roster order (the roster sorts by peer ID; the daemons' IDs
    # are random, so the swarm's order is not it): float64 sums in another order can round
    # differently.
    order = roster.peers
    model = deterministic_update(base, [grads[p] for p in order], [weights[p] for p in order], 0.25)
    want = await put_gradient(MemoryBlockStore(), model)
    assert {r.model_cid for r in results} == {want}
    # One level: 2·(N−1)/N·d and d/N to verify a slice author's own check values. Chained
    # with S = 2 slices, a step after the first whose group is not its own reads up to d of
    # pieces, the float64 partial (2·d/S = d) and d/2 of results: 2.5·d plus manifests and
    # records (the default G keeps S >= 5: <= 2.4·d), and d/S = d/2 more for the peer that
    # verifies a step's author whose group is its own (nobody else holds those rows).
    bound = 3.25 if chained else 2.5
    for r in results:
        assert r.downloaded <= bound * D * 4
        assert not r.missing
        assert not r.liars
        assert len(r.records) == (2 if chained else 3)  # chained: G = 2 steps of S = 2 slices
    assert any(m.kind == "partial" for m in board.messages) == chained
