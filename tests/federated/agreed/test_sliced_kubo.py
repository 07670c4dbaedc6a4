"""Reduce-scatter agreed rounds over three real Kubo daemons (bitswap and pubsub between them)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedRoundResult, AgreedSession, verify_agreed_history
from gradfed_ipfs.federated.sliced import SliceFaults
from gradfed_ipfs.federated.sliced.peer import CountingStore
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore
from tests.federated.sliced.hostile import HidingLiar
from tests.helpers import aclose_all

D = 196_608  # 13 chunks of 64 KiB
CHUNK = 65_536
SETTINGS = {
    "collect_timeout": 5.0,
    "takeover_timeout": 3.0,
    "round_timeout": 60.0,
    "done_timeout": 5.0,
    "announce_interval": 0.1,
    "fetch_timeout": 20.0,
    # A backup reducer that takes over re-fetches a slice of every input (d/3 values each): at
    # 3 s that happened under a loaded CI run and broke the byte bound below.
    "reducer_timeout": 15.0,
    "chunk_bytes": CHUNK,
    "learning_rate": 0.25,
}


async def one_round(
    nodes,
    name: str,
    aggregation: str,  # type: ignore[no-untyped-def]
    faults: dict[int, SliceFaults] | None = None,
) -> tuple[list[AgreedRoundResult | BaseException], list[int], object, KuboBlockStore]:
    """Run one agreed round of the three nodes; return results, per-peer downloads, genesis.

    ``faults``: the reducer hooks of the sessions at those indexes (their own round's outcome
    is returned as it ends, an exception included).
    """
    rng = np.random.default_rng(41)
    model = rng.standard_normal(D).astype(np.float32)
    members = tuple(n.peer_id for n in nodes)
    config = AgreedConfig(members=members, aggregation=aggregation, **SETTINGS)  # type: ignore[arg-type]
    stores = [KuboBlockStore(n.api_url, timeout=30.0) for n in nodes]
    pubsubs = [KuboPubsub(n.api_url) for n in nodes]
    counting = [CountingStore(s) for s in stores]
    sessions: list[AgreedSession] = []
    try:
        genesis = await AgreedSession.commit_genesis(stores[0], model)
        for i, (store, pubsub) in enumerate(zip(counting, pubsubs, strict=True)):
            session = AgreedSession(
                store,  # type: ignore[arg-type]
                pubsub,
                name,
                genesis,
                config,
                faults=(faults or {}).get(i),
            )
            sessions.append(session)
            await session.start(model)
            store.downloaded = 0
        grads = {p: np.random.default_rng([i, 7]).standard_normal(D).astype(np.float32)
                 for i, p in enumerate(sorted(members))}  # fmt: skip
        results = await asyncio.gather(
            *(s.run_round(grads[s.peer_id], weight=1 + i) for i, s in enumerate(sessions)),
            return_exceptions=bool(faults),
        )
        for session in sessions:
            await session.aclose()
        return list(results), [c.downloaded for c in counting], genesis, stores[1]
    finally:
        await aclose_all(sessions, pubsubs, stores[:1] + stores[2:])


@pytest.mark.kubo
async def test_reduce_scatter_agreed_round_over_kubo_equals_all_to_all_and_downloads_less(
    kubo_swarm3,  # type: ignore[no-untyped-def]
) -> None:
    sliced, rs_bytes, genesis, store = await one_round(kubo_swarm3, "rs-kubo", "reduce-scatter")
    try:
        assert {r.aggregation for r in sliced} == {"reduce-scatter"}
        assert len({r.record for r in sliced}) == 1
        assert all(len(r.slices) == 3 and not r.missing and not r.liars for r in sliced)
        # A third daemon's store re-verifies the round from its record CID alone.
        records = await verify_agreed_history(
            store,
            sliced[0].record,
            session="rs-kubo",
            genesis=genesis,  # type: ignore[arg-type]
        )
        assert records[0].slices == sliced[0].slices
    finally:
        await store.aclose()
    whole, a2a_bytes, _, other = await one_round(kubo_swarm3, "a2a-kubo", "all-to-all")
    await other.aclose()
    assert {r.model for r in sliced} == {r.model for r in whole} == {whole[0].model}
    for rs, a2a in zip(rs_bytes, a2a_bytes, strict=True):
        assert a2a >= 2 * D * 4  # two other whole gradients
        # The slice plan gives 4/3·d·4 B (1.05-1.19 MB: 13 chunks split 5/4/4) plus manifests
        # and records, and a slice of the author it verifies (d/3: 0.26-0.33 MB); about one run
        # in seven a peer fetched 2-3 chunks more (not yet explained). The bound is issue 14's
        # per-peer goal, and under all-to-all (at 3 peers the verified slice is a third of d).
        assert rs <= 2.5 * D * 4
        assert rs < a2a


@pytest.mark.kubo
async def test_a_reducer_hiding_its_lie_in_its_check_values_is_caught_over_kubo(
    kubo_swarm3,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 32, attack 5 over three daemons (signed slice boards, bitswap): +5.0 on its
    slice and its own check value shifted by the lie's projection."""
    liar = 1  # weight 2 of W = 6
    hiding = HidingLiar(5.0, 6 / 2, float(SETTINGS["learning_rate"]))
    results, _, genesis, store = await one_round(
        kubo_swarm3, "hide-kubo", "reduce-scatter", {liar: hiding}
    )
    try:
        assert hiding.k is not None
        assert hiding.published  # it lied and shifted its own check value to match
        honest = [res for i, res in enumerate(results) if i != liar]
        assert all(isinstance(res, AgreedRoundResult) for res in honest), results
        checked = [res for res in honest if isinstance(res, AgreedRoundResult)]
        liar_id = kubo_swarm3[liar].peer_id
        assert all(res.liars == (liar_id,) for res in checked)
        assert len({res.model for res in checked}) == 1
        await verify_agreed_history(store, checked[0].record, session="hide-kubo", genesis=genesis)  # type: ignore[arg-type]
    finally:
        await store.aclose()
