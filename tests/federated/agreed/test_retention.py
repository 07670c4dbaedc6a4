"""Retention: pins stay bounded, garbage collection runs between rounds, history stays walkable."""

from __future__ import annotations

import numpy as np
import pytest

from gradfed_ipfs.errors import ConfigError
from gradfed_ipfs.federated.agreed.history import verify_agreed_history, verify_agreed_round
from gradfed_ipfs.federated.agreed.session import AgreedConfig, AgreedSession
from gradfed_ipfs.kubo import KuboPubsub, MemoryPubsubBus
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore, Retention, RetentionKeeper
from tests.conftest import KuboNode

FAST = {"collect_timeout": 1.0, "round_timeout": 20.0, "announce_interval": 0.05}


def delta(d: int, r: int) -> np.ndarray:
    return (0.01 * np.random.default_rng(r).standard_normal(d)).astype(np.float32)


def test_policy_is_checked() -> None:
    with pytest.raises(ConfigError):
        Retention(keep_rounds=0)


async def test_old_contributions_and_models_are_unpinned_records_kept() -> None:
    store = MemoryBlockStore()
    genesis = await AgreedSession.commit_genesis(store, np.zeros(64, np.float32))
    session = AgreedSession(
        store,
        MemoryPubsubBus().endpoint("solo"),
        "s",
        genesis,
        AgreedConfig(("solo",), model_every=1, **FAST),  # type: ignore[arg-type]
        retention=RetentionKeeper(store, Retention(keep_rounds=2, gc_every=None), keep=[genesis]),
    )
    await session.start(np.zeros(64, np.float32))
    try:
        results = [await session.run_round(delta(64, r)) for r in range(7)]
    finally:
        await session.aclose()  # the last round is reported: rounds 5 and 6 are kept
    for old in results[:5]:  # rounds <= 6 - 2: contributions dropped
        assert not await store.is_pinned(old.roster.entries[0].contribution)
    for old in results[:4]:  # and their base models, but round 5's base (round 4's result)
        assert not await store.is_pinned(old.model)
    for kept in results[4:]:
        assert await store.is_pinned(kept.model)
    for result in results:
        assert await store.is_pinned(result.record)
        assert await store.is_pinned(result.roster_cid)
    assert await store.is_pinned(genesis)


@pytest.mark.kubo
async def test_repo_stays_flat_with_gc_and_recent_rounds_reverify(kubo_node: KuboNode) -> None:
    d = 300_000  # two chunks and a manifest per gradient
    async with KuboBlockStore(kubo_node.api_url, timeout=10.0) as store:
        keeper = RetentionKeeper(store, Retention(keep_rounds=2, gc_every=2))
        pubsub = KuboPubsub(kubo_node.api_url)
        peer = await pubsub.local_peer_id()
        genesis = await AgreedSession.commit_genesis(store, np.zeros(d, np.float32))
        session = AgreedSession(
            store,
            pubsub,
            f"retention-{peer[-6:]}",
            genesis,
            AgreedConfig((peer,), model_every=1, **FAST),  # type: ignore[arg-type]
            retention=keeper,
        )
        await session.start(np.zeros(d, np.float32))
        try:
            for r in range(10):
                await session.run_round(delta(d, r))
        finally:
            await session.aclose()
            await pubsub.aclose()
        assert [c.round for c in keeper.collections] == [1, 3, 5, 7, 9]
        # After K rounds the repo holds K rounds of models and contributions, not all of them.
        # Sizes are Kubo's repo/stat right after each collection: a stat taken when run_round
        # returns races the round's background store and collection (flaky under load).
        sizes = [c.size_after for c in keeper.collections]
        growth = sizes[-1] - sizes[1]
        assert growth < 2 * 4 * d, sizes
        assert session.head is not None
        records = await verify_agreed_history(
            store, session.head, session=session.session, genesis=genesis, recompute=False
        )
        assert [r.round for r in records] == list(range(10))
        await verify_agreed_round(store, session.head)  # the latest round still re-aggregates
