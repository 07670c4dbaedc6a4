"""Retention (issue 13 item 8): which CIDs are unpinned when, roots kept, and the GC gate."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import numpy as np
import pytest

from gradfed_ipfs._types import CIDLike
from gradfed_ipfs.block import Block
from gradfed_ipfs.cid import parse_cid
from gradfed_ipfs.errors import ConfigError, RoundVerificationFailed
from gradfed_ipfs.federated.agreed.history import (
    load_record,
    verify_agreed_history,
    verify_agreed_round,
)
from gradfed_ipfs.federated.agreed.session import AgreedConfig, AgreedSession
from gradfed_ipfs.formats.records import encode_record
from gradfed_ipfs.kubo import KuboDaemon, KuboPubsub, MemoryPubsubBus
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore, fetch_gradient, put_gradient
from gradfed_ipfs.storage.retention import (
    GatedStore,
    GcGate,
    Retention,
    RetentionKeeper,
    RoundBlocks,
)

PEERS = ("peer-a", "peer-b", "peer-c")
FAST = {
    "collect_timeout": 1.0,
    "takeover_timeout": 0.5,
    "round_timeout": 8.0,
    "done_timeout": 1.0,
    "announce_interval": 0.02,
    "fetch_timeout": 2.0,
}


def values(seed: int, d: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(d).astype(np.float32)


async def settle(loop_turns: int = 20) -> None:
    """Let every runnable task run (event-loop turns, not wall-clock time)."""
    for _ in range(loop_turns):
        await asyncio.sleep(0)


@pytest.fixture
async def store() -> AsyncIterator[MemoryBlockStore]:
    async with MemoryBlockStore() as s:
        yield s


async def fake_round(
    store: MemoryBlockStore, r: int, contributions: Sequence[int], base: RoundBlocks | None = None
) -> RoundBlocks:
    """Store a round's blocks as a session would: contributions, roster, record, model."""
    cids = [await put_gradient(store, values(seed)) for seed in contributions]
    roster = await store.put(encode_record({"round": r, "entries": cids}))
    model = await put_gradient(store, values(1000 + r))
    base_cid = base.model if base else await put_gradient(store, values(999))
    record = await store.put(
        encode_record({"round": r, "roster": roster, "model": model, "base": base_cid})
    )
    return RoundBlocks(r, tuple(cids), roster, record, base_cid, model)


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ConfigError):
        Retention(keep_rounds=0)
    with pytest.raises(ConfigError):
        Retention(gc_every=0)
    with pytest.raises(ConfigError):
        Retention(gc_wait=0)
    with pytest.raises(ConfigError):
        Retention(gc_above_bytes=-1)


async def test_store_without_gc_is_refused() -> None:
    class NoGc:
        pass

    with pytest.raises(ConfigError, match="cannot collect"):
        RetentionKeeper(NoGc())  # type: ignore[arg-type]


async def test_contributions_and_models_unpinned_after_k_rounds_roots_kept(
    store: MemoryBlockStore,
) -> None:
    genesis = await put_gradient(store, values(999))
    keeper = RetentionKeeper(store, Retention(keep_rounds=3, gc_every=None), keep=[genesis])
    rounds: list[RoundBlocks] = []
    for r in range(6):
        base = rounds[-1] if rounds else None
        rounds.append(await fake_round(store, r, [10 * r, 10 * r + 1], base))
        await keeper.round_done(rounds[-1])
        # Rounds r-2..r are kept (K = 3) with their base models; older contributions are not.
        assert keeper.kept_rounds == list(range(max(0, r - 2), r + 1))
        for old in rounds:
            for cid in old.contributions:
                assert await store.is_pinned(cid) is (old.round > r - 3), (r, old.round)
            assert await store.is_pinned(old.model) is (old.round >= r - 3), (r, old.round)
            assert await store.is_pinned(old.roster)
            assert await store.is_pinned(old.record)
        assert await store.is_pinned(genesis)
    assert sorted({r for r, _ in keeper.unpinned}) == [0, 1, 2]
    assert len(keeper.unpinned) == 3 * 2 + 2  # two contributions a round, bases of rounds 1, 2

    report = await keeper.collect(5)
    assert report is not None
    assert report.removed == 8
    assert report.size_after == await store.repo_size()
    for old in rounds:
        assert await store.has(old.record)
        assert await store.has(old.roster)
        for cid in old.contributions:
            assert await store.has(cid) is (old.round >= 3)
        assert await store.has(old.model) is (old.round >= 2)


async def test_keep_models_and_shared_cids_are_not_unpinned(store: MemoryBlockStore) -> None:
    keeper = RetentionKeeper(store, Retention(keep_rounds=1, keep_models=True, gc_every=None))
    first = await fake_round(store, 0, [7, 8])
    second = await fake_round(store, 1, [7, 9], first)  # peer resubmitted the same gradient
    await keeper.round_done(first)
    await keeper.round_done(second)
    assert await store.is_pinned(first.contributions[0])  # round 1 still uses it
    assert not await store.is_pinned(first.contributions[1])
    assert await store.is_pinned(first.base)  # keep_models
    assert [cid for _, cid in keeper.unpinned] == [first.contributions[1]]


async def test_collection_schedule_every_g_rounds_and_above_size(store: MemoryBlockStore) -> None:
    keeper = RetentionKeeper(store, Retention(keep_rounds=1, gc_every=3))
    reports = [await keeper.round_done(await fake_round(store, r, [r])) for r in range(6)]
    assert [r is not None for r in reports] == [False, False, True, False, False, True]

    async with MemoryBlockStore() as other:
        sized = RetentionKeeper(other, Retention(keep_rounds=1, gc_every=None, gc_above_bytes=0))
        assert await sized.round_done(await fake_round(other, 0, [1])) is not None
        big = RetentionKeeper(other, Retention(gc_every=None, gc_above_bytes=10**9))
        assert await big.round_done(await fake_round(other, 1, [2])) is None


class SlowUnpinStore(MemoryBlockStore):
    """A memory store whose ``unpin`` of a ``held`` CID waits for the test's event."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[bytes] = set()
        self.release_unpin = asyncio.Event()
        self.unpinning = asyncio.Event()

    async def unpin(self, cid: CIDLike) -> None:
        if bytes(parse_cid(cid)) in self.held:
            self.unpinning.set()
            await self.release_unpin.wait()
        await super().unpin(cid)


async def test_overlapping_reports_keep_the_schedule_and_the_round_order() -> None:
    """A session reports round r+1 while round r's report may still be running (both stores run
    in the background): seen under load, the schedule counter was read after the next report
    moved it, and an extra collection ran."""
    async with SlowUnpinStore() as store:
        keeper = RetentionKeeper(store, Retention(keep_rounds=1, gc_every=2))
        rounds = [await fake_round(store, r, [r]) for r in range(3)]
        assert await keeper.round_done(rounds[0]) is None
        store.held = {bytes(c) for c in rounds[0].contributions}
        first = asyncio.ensure_future(keeper.round_done(rounds[1]))  # unpins round 0's: waits
        await asyncio.wait_for(store.unpinning.wait(), 5.0)
        second = asyncio.ensure_future(keeper.round_done(rounds[2]))
        await settle()
        store.release_unpin.set()
        reports = [await first, await second]
    assert [r is not None for r in reports] == [True, False]
    assert [c.round for c in keeper.collections] == [1]
    assert keeper.kept_rounds == [2]


async def test_durable_provider_gets_roots_and_models(store: MemoryBlockStore) -> None:
    async with MemoryBlockStore() as archive:
        blocks = await fake_round(store, 0, [1])
        for cid in (blocks.record, blocks.roster, blocks.model):
            await archive.put(await store.get(cid), pin=False)
        keeper = RetentionKeeper(store, Retention(gc_every=None), durable=archive)
        await keeper.round_done(blocks)
        assert archive.pins == {bytes(c) for c in (blocks.record, blocks.roster, blocks.model)}


class SlowGcStore(MemoryBlockStore):
    """A memory store whose ``get`` and ``collect_garbage`` wait for the test's events."""

    def __init__(self) -> None:
        super().__init__()
        self.release_get = asyncio.Event()
        self.release_gc = asyncio.Event()
        self.gc_started = asyncio.Event()

    async def get(self, cid: object, **kwargs: object) -> Block:  # type: ignore[override]
        await self.release_get.wait()
        return await super().get(cid)  # type: ignore[arg-type]

    async def collect_garbage(self) -> int:
        self.gc_started.set()
        await self.release_gc.wait()
        return await super().collect_garbage()


async def test_gc_waits_for_an_in_flight_fetch() -> None:
    store = SlowGcStore()
    cid = await store.put(Block.new(b"x" * 100))
    keeper = RetentionKeeper(store, Retention(gc_wait=30.0))
    gated = GatedStore(store, keeper.gate)
    store.release_gc.set()
    fetch = asyncio.create_task(gated.get(cid))
    await settle()
    assert keeper.gate.in_flight == 1
    collect = asyncio.create_task(keeper.collect())
    await settle()
    assert not store.gc_started.is_set()
    assert not collect.done()
    store.release_get.set()
    assert (await fetch).data == b"x" * 100
    assert await collect is not None
    assert store.gc_started.is_set()


async def test_fetch_started_during_gc_waits_for_it() -> None:
    store = SlowGcStore()
    store.release_get.set()
    cid = await store.put(Block.new(b"y" * 100))
    keeper = RetentionKeeper(store, Retention())
    gated = GatedStore(store, keeper.gate)
    collect = asyncio.create_task(keeper.collect())
    await store.gc_started.wait()
    fetch = asyncio.create_task(gated.get(cid))
    await settle()
    assert not fetch.done()
    assert keeper.gate.in_flight == 0
    store.release_gc.set()
    assert await collect is not None
    assert (await fetch).data == b"y" * 100
    assert not keeper.gate.collecting


async def test_gc_is_skipped_when_a_transfer_outlasts_gc_wait() -> None:
    gate = GcGate()
    async with gate.transfer(), gate.collection(0.01) as clear:
        assert clear is False
    assert not gate.collecting
    assert gate.in_flight == 0
    async with gate.collection(0.01) as clear:
        assert clear is True


# --------------------------------------------------------------------------- with sessions


async def test_agreed_session_reports_rounds_and_old_rounds_stop_verifying(
    store: MemoryBlockStore,
) -> None:
    """Three peers share one store and so one keeper (their reports of a round merge).

    Every session on a store must report to its keeper: a session without one pins records
    recursively, and a recursive record pin keeps the whole history it links.
    """
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, values(0))
    keeper = RetentionKeeper(store, Retention(keep_rounds=2, gc_every=2), keep=[genesis])
    config = AgreedConfig(members=PEERS, **FAST)  # type: ignore[arg-type]
    sessions = [
        AgreedSession(store, bus.endpoint(p), "s1", genesis, config, retention=keeper)
        for p in PEERS
    ]
    for session in sessions:
        await session.start(values(0))
    records = []
    try:
        for r in range(6):
            results = await asyncio.gather(
                *(s.run_round(values(100 * r + i) * 0.01) for i, s in enumerate(sessions))
            )
            records.append(results[0].record)
        for session in sessions:
            await session.aclose()  # settles the last round: the keeper has seen all six
    finally:
        for session in sessions:
            await session.aclose()
    assert keeper.kept_rounds == [4, 5]
    assert len(keeper.collections) == 3
    await keeper.collect()
    for r in (4, 5):
        await verify_agreed_round(store, records[r])
    for r in range(4):
        assert (await load_record(store, records[r])).round == r  # records are kept
        with pytest.raises(RoundVerificationFailed):
            await verify_agreed_round(store, records[r])  # its contributions were dropped
    chain = await verify_agreed_history(
        store, records[-1], keys=bus.keys, session="s1", genesis=genesis, recompute=False
    )
    assert [record.round for record in chain] == list(range(6))
    assert await store.has(genesis)


# --------------------------------------------------------------------------- one real daemon


@pytest.mark.kubo
async def test_kubo_unpin_and_gc_drop_the_bytes_and_kept_roots_still_verify(
    fresh_daemon: KuboDaemon,
) -> None:
    """A one-member session on its own daemon: repo/gc really frees the dropped rounds."""
    d = 300_000  # 1.2 MB: each contribution and model is a chunked DAG (manifest + 2 chunks)
    store = KuboBlockStore(fresh_daemon.api_url, timeout=10.0)
    quick = KuboBlockStore(fresh_daemon.api_url, timeout=1.0)  # a dropped block is not coming
    pubsub = KuboPubsub(fresh_daemon.api_url)
    try:
        genesis = await AgreedSession.commit_genesis(store, values(0, d))
        keeper = RetentionKeeper(store, Retention(keep_rounds=2, gc_every=None), keep=[genesis])
        config = AgreedConfig(
            members=(await store.peer_id(),),
            model_every=1,  # every base stored: exactly K rounds kept
            **FAST,  # type: ignore[arg-type]
        )
        session = AgreedSession(store, pubsub, "ret", genesis, config, retention=keeper)
        await session.start(values(0, d))
        records = []
        try:
            for r in range(5):
                records.append((await session.run_round(values(r + 1, d) * 0.01)).record)
        finally:
            await session.aclose()  # settles the last round's report
        assert keeper.kept_rounds == [3, 4]
        before = await store.repo_size()
        report = await keeper.collect(4)
        assert report is not None
        # Rounds 0-2's contributions and the bases of rounds 1-2 went: 5 gradients of 4·d bytes.
        assert report.removed >= 5 * 3
        assert before - report.size_after >= 5 * 4 * d * 0.9
        assert report.size_after == await store.repo_size()
        for r in (3, 4):
            await verify_agreed_round(quick, records[r])
        for r in range(3):
            with pytest.raises(RoundVerificationFailed, match=r"not found|did not arrive"):
                await verify_agreed_round(quick, records[r])
        chain = await verify_agreed_history(
            quick, records[-1], session="ret", genesis=genesis, recompute=False
        )
        assert [record.round for record in chain] == list(range(5))
        latest = await fetch_gradient(quick, chain[-1].result)
        assert np.array_equal(latest, session.model)
        assert await quick.has(genesis)
    finally:
        for closing in (pubsub, quick, store):
            await closing.aclose()


async def test_a_waiting_collection_does_not_hold_back_new_transfers() -> None:
    # Prepare: a fetch in flight (it waits for another peer's put), and a collection waiting
    # for it. That other peer's put waits for its own collection, which waits for its fetch of
    # our put: our put must not wait for our collection, or both peers stall until gc_wait.
    gate = GcGate()
    first = gate.transfer()
    await first.__aenter__()
    collected = asyncio.Event()

    async def collect() -> bool:
        async with gate.collection(30.0) as clear:
            collected.set()
            return clear

    collecting = asyncio.create_task(collect())
    await settle()
    # Execute: a put starts while the collection waits.
    second = gate.transfer()
    await asyncio.wait_for(second.__aenter__(), 1.0)
    assert gate.in_flight == 2
    assert not gate.collecting
    assert not collected.is_set()
    # Assert: the collection runs once nothing is in flight, and excludes transfers then.
    await first.__aexit__(None, None, None)
    await second.__aexit__(None, None, None)
    assert await asyncio.wait_for(collecting, 5.0) is True
    assert not gate.collecting
