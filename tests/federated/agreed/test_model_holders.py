"""Which peers store an agreed round's model (``AgreedConfig.model_replicas``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs import AgreedConfig, AgreedSession, verify_agreed_history
from gradfed_ipfs.block import Block
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import InvalidGradient
from gradfed_ipfs.federated.agreed.round.coordinator import coordinator_ranking, model_holders
from gradfed_ipfs.federated.sliced.peer import CountingStore
from gradfed_ipfs.kubo import KuboPubsub, MemoryPubsubBus
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore, fetch_gradient
from gradfed_ipfs.storage.base import StoreWrapper
from gradfed_ipfs.storage.retention import put_all_pinned_alone, put_pinned_alone
from tests.conftest import KuboNode
from tests.federated.agreed.test_rounds import FAST, PEERS, close, initial_model, run_all
from tests.polling import apoll_until

ROUNDS = 4


class PutLog(StoreWrapper):
    """Records the CID of every block this peer puts."""

    def __init__(self, store: MemoryBlockStore) -> None:
        super().__init__(store)
        self.puts: set[bytes] = set()

    async def put(self, block: Block, *, pin: bool = True) -> CID:
        self.puts.add(bytes(block.cid))
        return await super().put(block, pin=pin)


@pytest.fixture
async def store() -> AsyncIterator[MemoryBlockStore]:
    async with MemoryBlockStore() as s:
        yield s


def test_holders_are_the_first_roster_peers_of_the_ranking() -> None:
    genesis = make_cid(b"genesis")
    members = ("a", "b", "c", "d", "e")
    for r in range(20):
        ranking = coordinator_ranking("s", genesis, r, members)
        roster = set(members) - {ranking[0]}  # the first-ranked peer is absent
        holders = model_holders("s", genesis, r, members, roster, 2)
        assert holders == tuple(ranking[1:3])
        assert model_holders("s", genesis, r, members, roster, None) == tuple(ranking[1:])
        assert model_holders("s", genesis, r, members, {"e"}, 3) == ("e",)
    rounds = [model_holders("s", genesis, r, members, members, 1) for r in range(20)]
    assert len(set(rounds)) > 1  # the holder moves from round to round


def test_model_replicas_must_be_positive() -> None:
    with pytest.raises(InvalidGradient, match="model_replicas"):
        AgreedConfig(members=PEERS, model_replicas=0)


@pytest.mark.parametrize("replicas", [1, 2, None])
async def test_only_the_holders_store_the_model_and_every_peer_can_read_it(
    store: MemoryBlockStore, replicas: int | None
) -> None:
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    config = AgreedConfig(members=PEERS, model_replicas=replicas, model_every=1, **FAST)  # type: ignore[arg-type]
    logs = [PutLog(store) for _ in PEERS]
    sessions = [
        AgreedSession(log, bus.endpoint(peer), "s1", genesis, config)
        for log, peer in zip(logs, PEERS, strict=True)
    ]
    for session in sessions:
        await session.start(initial_model())
    models: list[bytes] = []
    try:
        for r in range(ROUNDS):
            results = await run_all(sessions, [0, 1, 2])
            assert len({bytes(res.model) for res in results}) == 1
            models.append(bytes(results[0].model))
            holders = model_holders("s1", genesis, r, PEERS, PEERS, replicas)
            assert len(holders) == (3 if replicas is None else replicas)

            async def stored(r: int = r, holders: tuple[str, ...] = holders) -> bool:
                return all(
                    models[r] in log.puts
                    for p, log in zip(PEERS, logs, strict=True)
                    if p in holders
                )

            await apoll_until(stored, timeout=5.0, what=f"round {r}'s model on its holders")
            # Every peer reads the model from a holder's copy.
            values = await fetch_gradient(store, results[0].model)
            np.testing.assert_array_equal(values, sessions[1].model)
        records = await verify_agreed_history(
            store, sessions[2].head, keys=bus.keys, session="s1", genesis=genesis
        )
        assert [rec.round for rec in records] == list(range(ROUNDS))
    finally:
        await close(sessions)  # stores whatever is still pending
    for r, model in enumerate(models):
        holders = model_holders("s1", genesis, r, PEERS, PEERS, replicas)
        putters = tuple(p for p, log in zip(PEERS, logs, strict=True) if model in log.puts)
        assert sorted(putters) == sorted(holders), r


async def test_records_are_pinned_alone_through_store_wrappers(store: MemoryBlockStore) -> None:
    record = Block.new(b"\xa1arb", "dag-cbor")  # any block: how it is pinned is what counts
    wrapped = PutLog(store)
    cid = await put_pinned_alone(wrapped, record)
    assert bytes(cid) in wrapped.puts  # the put went through the wrapper
    assert bytes(cid) in store.pins
    assert bytes(cid) in store.direct
    roster = Block.new(b"\xa1aro", "dag-cbor")
    both = await put_all_pinned_alone(wrapped, [roster, record])
    assert both == [roster.cid, record.cid]
    assert {bytes(c) for c in both} <= wrapped.puts & store.pins & store.direct


KUBO_SETTINGS = {**FAST, "fetch_timeout": 10.0, "round_timeout": 30.0, "announce_interval": 0.1}
"""Agreed settings for sessions on a 3-daemon swarm."""


def kubo_clients(
    swarm: Sequence[KuboNode],
) -> tuple[tuple[str, ...], list[KuboBlockStore], list[KuboPubsub]]:
    """Return the members, a store and a pubsub client per daemon (the caller closes them)."""
    members = tuple(n.peer_id for n in swarm)
    stores = [KuboBlockStore(n.api_url, timeout=20.0) for n in swarm]
    return members, stores, [KuboPubsub(n.api_url) for n in swarm]


@pytest.mark.kubo
async def test_non_holders_keep_kubo_collectable_and_read_the_model_from_a_holder(
    kubo_swarm3,  # type: ignore[no-untyped-def]
) -> None:
    d = 50_000
    members, stores, pubsubs = kubo_clients(kubo_swarm3)
    config = AgreedConfig(members=members, model_replicas=1, model_every=1, **KUBO_SETTINGS)  # type: ignore[arg-type]
    model = np.random.default_rng(3).standard_normal(d).astype(np.float32)
    sessions: list[AgreedSession] = []
    try:
        genesis = await AgreedSession.commit_genesis(stores[0], model)
        for store, pubsub in zip(stores, pubsubs, strict=True):
            # Wrapped: the records' direct pins must reach the daemon through the wrapper.
            session = AgreedSession(CountingStore(store), pubsub, "holders", genesis, config)
            sessions.append(session)
            await session.start(model)
        for r in range(2):
            grads = [
                np.random.default_rng([i, r]).standard_normal(d).astype(np.float32)
                for i in range(3)
            ]
            results = await asyncio.gather(
                *(s.run_round(g) for s, g in zip(sessions, grads, strict=True))
            )
            assert len({bytes(res.model) for res in results}) == 1
        for session in sessions:
            await session.aclose()  # every round's blocks are stored
        (holder,) = model_holders("holders", genesis, 1, members, members, 1)
        reader = stores[[n.peer_id for n in kubo_swarm3].index(holder) - 1]  # a non-holder
        # No pin links a block its daemon lacks: Kubo's repo/gc walks every recursive pin.
        for store in stores:
            await store.collect_garbage()
        values = await fetch_gradient(reader, results[0].model, timeout=10.0)
        np.testing.assert_array_equal(values, sessions[0].model)
        await verify_agreed_history(reader, results[0].record, session="holders", genesis=genesis)
    finally:
        for session in sessions:
            await session.aclose()
        for closable in (*pubsubs, *stores):
            await closable.aclose()
