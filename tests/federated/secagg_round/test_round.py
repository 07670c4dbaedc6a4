"""SecAgg rounds over pubsub + block stores: every protocol message is a block announced by CID.

In memory, each peer has its own :class:`MemoryBlockStore`; a recording wrapper serves other
peers' blocks on a miss (what bitswap does for Kubo) and records every block a peer stores, so
the tests can show that no unmasked vector is ever stored by anyone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from gradfed_ipfs import BlockNotFound, parse_cid
from gradfed_ipfs.errors import SecureAggregationError
from gradfed_ipfs.federated.secagg import FixedPoint
from gradfed_ipfs.federated.secagg.blocks import decode_masked_block
from gradfed_ipfs.federated.secagg.codec import unpack_masked
from gradfed_ipfs.federated.secagg.crypto import SEALED_MAGIC
from gradfed_ipfs.federated.secagg_round import SecAggSettings
from gradfed_ipfs.federated.secagg_round.peer import (
    SecureRoundConfig,
    SecureRoundPeer,
    SecureRoundResult,
    secagg_topic,
)
from gradfed_ipfs.kubo.pubsub import KuboPubsub, MemoryPubsubBus, PubsubMessage
from gradfed_ipfs.storage import Block, KuboBlockStore, MemoryBlockStore
from tests.federated.secagg.test_secure_aggregation import byte_chi_square_p, rb, tolerance

D = 2_000
AGG = "aggregator"


@dataclass
class RecordingStore:
    """A peer's own store; a miss is served from the other peers' stores (like bitswap)."""

    own: MemoryBlockStore
    network: list[MemoryBlockStore]
    stored: list[bytes] = field(default_factory=list)
    fetched_remote: list[str] = field(default_factory=list)

    async def put(self, block: Block, *, pin: bool = True) -> object:
        self.stored.append(block.data)
        return await self.own.put(block, pin=pin)

    async def get(self, cid: object, *, timeout: object = None) -> Block:
        if await self.own.has(cid):  # type: ignore[arg-type]
            return await self.own.get(cid)  # type: ignore[arg-type]
        for other in self.network:
            if await other.has(cid):  # type: ignore[arg-type]
                self.fetched_remote.append(str(cid))
                return await other.get(cid)  # type: ignore[arg-type]
        raise BlockNotFound(f"{cid} is nowhere")

    async def has(self, cid: object) -> bool:
        return await self.own.has(cid)  # type: ignore[arg-type]

    async def delete(self, cid: object) -> None:
        await self.own.delete(cid)  # type: ignore[arg-type]


def inputs_for(peers: Sequence[str], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {p: rng.normal(0.0, 1.0, D).astype(np.float32) for p in peers}


def make_peers(
    n: int,
    threshold: int,
    *,
    seed: int,
    settings: SecAggSettings | None = None,
    **transport: float,
) -> tuple[SecureRoundConfig, dict[str, SecureRoundPeer], dict[str, RecordingStore]]:
    clients = tuple(f"peer-{i}" for i in range(n))
    cfg = SecureRoundConfig(
        session_id="sess",
        round_id=3,
        clients=clients,
        aggregator=AGG,
        threshold=threshold,
        length=D,
        settings=settings or SecAggSettings(),
        **transport,
    )
    bus = MemoryPubsubBus()
    names = [*clients, AGG]
    backing = {name: MemoryBlockStore() for name in names}
    stores = {
        name: RecordingStore(backing[name], [backing[o] for o in names if o != name])
        for name in names
    }
    peers = {
        name: SecureRoundPeer(
            stores[name],  # type: ignore[arg-type]
            bus.endpoint(name),
            cfg,
            randbytes=rb(seed + i),
        )
        for i, name in enumerate(names)
    }
    return cfg, peers, stores


async def run_memory_round(
    n: int,
    threshold: int,
    inputs: dict[str, np.ndarray],
    *,
    seed: int,
    drop_before_masking: Sequence[str] = (),
    settings: SecAggSettings | None = None,
) -> tuple[SecureRoundResult, dict[str, RecordingStore], dict[str, SecureRoundPeer]]:
    _, peers, stores = make_peers(n, threshold, seed=seed, settings=settings)
    await asyncio.gather(*(p.start() for p in peers.values()))

    async def client(name: str) -> bool:
        if name in drop_before_masking:  # shares its keys, then vanishes
            await peers[name].share_keys()
            await peers[name].aclose()
            return False
        return await peers[name].run_client(inputs[name])

    try:
        outcome = await asyncio.gather(peers[AGG].aggregate(), *(client(c) for c in sorted(inputs)))
    finally:
        await asyncio.gather(*(p.aclose() for p in peers.values()))
    result = outcome[0]
    assert isinstance(result, SecureRoundResult)
    return result, stores, peers


def assert_no_unmasked_vector_stored(
    stores: dict[str, RecordingStore], inputs: dict[str, np.ndarray], ring_bits: int = 32
) -> None:
    codec = FixedPoint(len(inputs), 8.0, ring_bits)
    windows = []
    for vector in inputs.values():
        for raw in (vector.astype("<f4").tobytes(), codec.encode(vector).tobytes()):
            windows += [raw[i : i + 32] for i in range(0, len(raw) - 32, len(raw) // 8)]
    for name, store in stores.items():
        assert store.stored, name
        for data in store.stored:
            assert not any(w in data for w in windows), name
            assert not data.startswith(b"ARROW1"), name  # masked vectors travel sealed
            if data.startswith(SEALED_MAGIC):  # masked vectors and unmasking answers
                body = np.frombuffer(data[len(SEALED_MAGIC) :], dtype=np.uint8)
                assert body.size < 1000 or byte_chi_square_p(body) > 0.001, name
            else:
                assert data.startswith(b"{"), name  # a small JSON protocol message
                assert len(data) < 16_384, name


async def test_memory_round_without_dropouts_sums_masked_vectors_only() -> None:
    clients = [f"peer-{i}" for i in range(4)]
    inputs = inputs_for(clients, seed=1)
    result, stores, peers = await run_memory_round(4, 3, inputs, seed=10)
    exact = np.sum([inputs[c].astype(np.float64) for c in clients], axis=0)
    codec = FixedPoint(4, 8.0, 32)
    assert result.total.dtype == np.float32
    assert result.total.shape == (D,)
    assert np.all(np.abs(result.total - exact) <= tolerance(codec, 4, exact))
    np.testing.assert_allclose(result.mean, result.total / 4, rtol=1e-6)
    assert result.survivors == clients
    assert result.dropped == []
    assert result.stats.dropped_clients == []
    assert result.stats.participants == 4
    assert_no_unmasked_vector_stored(stores, inputs)
    # Each client stored exactly its keys, share bundle, sealed masked vector, signed view and
    # sealed unmasking answer.
    for c in clients:
        assert len(stores[c].stored) == 5, c
    # The aggregator stored only its key, its request and its closing notice, and fetched every
    # masked block from the client that stored it.
    assert len(stores[AGG].stored) == 3
    assert {str(cid) for cid in result.masked_cids.values()} <= set(stores[AGG].fetched_remote)
    assert sorted(result.masked_cids) == clients
    assert all(sum(p.drops.values()) == 0 for p in peers.values())


async def test_memory_round_with_one_dropout_recovers_survivor_sum() -> None:
    clients = [f"peer-{i}" for i in range(4)]
    inputs = inputs_for(clients, seed=2)
    result, stores, _ = await run_memory_round(
        4,
        3,
        inputs,
        seed=20,
        drop_before_masking=["peer-2"],
        settings=SecAggSettings(mask_timeout=0.5),
    )
    survivors = ["peer-0", "peer-1", "peer-3"]
    assert result.survivors == survivors
    assert result.dropped == ["peer-2"]
    assert result.stats.dropped_clients == ["peer-2"]
    assert result.stats.missing_clients == ["peer-2"]
    assert result.stats.participants == 3
    exact = np.sum([inputs[c].astype(np.float64) for c in survivors], axis=0)
    codec = FixedPoint(4, 8.0, 32)
    assert np.all(np.abs(result.total - exact) <= tolerance(codec, 3, exact))
    everyone = np.sum([v.astype(np.float64) for v in inputs.values()], axis=0)
    assert np.max(np.abs(result.total - everyone)) > 1.0  # the dropped input is really out
    assert_no_unmasked_vector_stored(stores, inputs)
    assert len(stores["peer-2"].stored) == 2  # keys and shares only: no masked vector


async def test_memory_round_two_of_four_survivors_with_t3_fail_clearly() -> None:
    clients = [f"peer-{i}" for i in range(4)]
    inputs = inputs_for(clients, seed=4)
    with pytest.raises(SecureAggregationError, match="only 2 clients survived masking"):
        await run_memory_round(
            4,
            3,
            inputs,
            seed=40,
            drop_before_masking=["peer-0", "peer-1"],
            settings=SecAggSettings(mask_timeout=0.3, response_timeout=0.3),
        )


async def test_spoofed_and_foreign_announcements_are_dropped() -> None:
    _, peers, _ = make_peers(3, 2, seed=50, subscriber_timeout=0.05)
    agg = peers[AGG]
    await agg.start()
    try:
        cid = Block.new(b"{}").cid
        ch = agg._ch
        good = (
            b'{"cid":"%s","from":"peer-1","kind":"keys","round":3,"session":"sess","v":1}'
            % str(cid).encode()
        )
        ch.accept(PubsubMessage("peer-2", good))  # claims peer-1, signed by peer-2
        ch.accept(PubsubMessage("peer-1", good.replace(b'"round":3', b'"round":4')))
        ch.accept(PubsubMessage("intruder", good.replace(b"peer-1", b"intruder")))
        ch.accept(PubsubMessage("peer-1", good.replace(b'"keys"', b'"done"')))
        ch.accept(PubsubMessage("peer-1", b"not json"))
        assert ch.inbox == {}
        assert dict(agg.drops) == {
            "spoofed_sender": 1,
            "other_round": 1,
            "not_a_party": 2,
            "malformed": 1,
        }
        ch.accept(PubsubMessage("peer-1", good))
        assert ch.inbox == {("keys", "peer-1"): parse_cid(str(cid))}
    finally:
        await agg.aclose()


def test_topic_is_a_session_sub_topic() -> None:
    assert secagg_topic("s1") == "gradfed/v1/s1/secagg"


@pytest.mark.kubo
async def test_secure_round_over_three_kubo_nodes(kubo_swarm3, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ids = [n.peer_id for n in kubo_swarm3]
    cfg = SecureRoundConfig(
        session_id=f"secagg-round-{tmp_path.name}",
        round_id=0,
        clients=tuple(sorted(ids)),
        aggregator=ids[0],
        threshold=2,
        length=D,
        settings=SecAggSettings(phase_timeout=15.0),
        republish_interval=0.3,
    )
    rng = np.random.default_rng(7)
    inputs = {p: rng.normal(0.0, 1.0, D).astype(np.float32) for p in ids}
    stores = [KuboBlockStore(n.api_url, timeout=15.0) for n in kubo_swarm3]
    transports = [KuboPubsub(n.api_url) for n in kubo_swarm3]
    peers = [
        SecureRoundPeer(s, t, cfg, randbytes=rb(70 + i))
        for i, (s, t) in enumerate(zip(stores, transports, strict=True))
    ]
    try:
        await asyncio.gather(*(p.start() for p in peers))
        results = await asyncio.wait_for(
            asyncio.gather(*(p.run(inputs[p.peer_id]) for p in peers)), 30.0
        )
        result = results[0]
        assert isinstance(result, SecureRoundResult)
        assert results[1:] == [None, None]
        assert result.survivors == sorted(ids)
        assert result.dropped == []
        assert result.stats.dropped_clients == []
        exact = np.sum([v.astype(np.float64) for v in inputs.values()], axis=0)
        codec = FixedPoint(3, 8.0, 32)
        assert np.all(np.abs(result.total - exact) <= tolerance(codec, 3, exact))
        # The masked blocks of the other two nodes now sit in the aggregator's daemon, fetched
        # over bitswap; each decodes only to a ring vector, not to the client's gradient.
        server = peers[0]._server
        assert server is not None
        for peer_id, cid in result.masked_cids.items():
            block = await stores[0].get(cid)
            assert not block.data.startswith(b"ARROW1")  # sealed to the aggregator
            rejected, arrow = unpack_masked(server.open_from(peer_id, "masked", block.data))
            assert rejected == []
            masked = decode_masked_block(arrow, ring_bits=32, expected_length=D)
            assert not np.array_equal(masked, codec.encode(inputs[peer_id])), peer_id
            assert inputs[peer_id].astype("<f4").tobytes()[:32] not in block.data, peer_id
    finally:
        await asyncio.gather(*(p.aclose() for p in peers))
        for t in transports:
            await t.aclose()
        for s in stores:
            await s.aclose()
