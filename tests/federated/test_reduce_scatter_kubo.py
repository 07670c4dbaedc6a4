"""One reduce-scatter round (one-level and chained) over three real Kubo daemons (bitswap)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gradfed_ipfs.federated.round.reduce_scatter import (
    MemorySliceBoard,
    ReduceScatterConfig,
    ReduceScatterPeer,
)
from gradfed_ipfs.formats.roster import Roster
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
        for store in stores:
            roster_cid = await store.put(roster.to_block())
        board = MemorySliceBoard()
        config = ReduceScatterConfig(
            chunk_bytes=CHUNK,
            learning_rate=0.25,
            fetch_timeout=30.0,
            phase_timeout=60.0,
            chained=chained,
        )
        results = await asyncio.gather(
            *(
                ReduceScatterPeer(p, s, board, config).run(roster, roster_cid, base, grads[p])
                for p, s in zip(peers, stores, strict=True)
            )
        )
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
    for r in results:
        assert r.downloaded <= 2.5 * D * 4
        assert not r.missing
        assert not r.liars
        assert len(r.records) == (2 if chained else 3)  # chained: G = 2 steps of S = 2 slices
    assert any(m.kind == "partial" for m in board.messages) == chained
