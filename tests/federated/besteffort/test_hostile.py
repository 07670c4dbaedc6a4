"""A hostile peer cannot hurt a round (issue 15, round level): each attack at its smallest size.

In memory: one shared block store (the 'network') and a pubsub bus; each test names the attack.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import gradfed_ipfs.storage.dag as dag
from gradfed_ipfs import MemoryPubsubBus, NormBounded
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import BlockCorrupt, InsufficientPeers, InvalidGradient
from gradfed_ipfs.federated.accumulate import (
    DEFAULT_MAX_WEIGHT,
    AccumulatorConfig,
    DistributedGradientAccumulator,
    StreamingAccumulator,
)
from gradfed_ipfs.federated.besteffort import GossipModelSync, RoundConfig, RoundRunner
from gradfed_ipfs.storage import MemoryBlockStore
from gradfed_ipfs.storage.dag import fetch_manifest, put_gradient, values_per_chunk
from gradfed_ipfs.tensor import SampleWeightedMean, Sum
from tests.federated.besteffort.test_runner import HangingStore, nodes

CHUNK = 65_536
N = 2 * values_per_chunk(CHUNK)  # two chunks per gradient

FAST = RoundConfig(
    min_peers=1,
    collect_timeout=5.0,
    fetch_timeout=1.0,
    subscriber_timeout=0.2,
    republish_interval=0.02,
)


async def close(*gossips: GossipModelSync) -> None:
    for gossip in gossips:
        await gossip.aclose()


# ------------------------------------------------------------- (4) exact streaming rollback


@pytest.mark.parametrize("num_samples", [1, 2])
async def test_rejected_chunked_peer_leaves_the_streaming_sum_exact(num_samples: int) -> None:
    # Prepare: the attacker's first chunk is finite 3e38 values, its second chunk is junk.
    store = MemoryBlockStore()
    rng = np.random.default_rng(4)
    local, honest = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    bad = await put_gradient(store, np.full(N, 3e38, dtype=np.float32), chunk_bytes=CHUNK)
    junk = (await fetch_manifest(store, bad)).chunks[1].cid
    store.blocks[bytes(junk)] = (junk, b"junk" * 100)
    good = await put_gradient(store, honest, chunk_bytes=CHUNK)
    config = AccumulatorConfig(aggregation=SampleWeightedMean())
    streaming = StreamingAccumulator("s", config, chunk_bytes=CHUNK, concurrency=1)
    holding = DistributedGradientAccumulator("s", config, chunk_bytes=CHUNK)
    # Execute: the attacker is refused, then the honest peer folds in.
    for acc in (streaming, holding):
        await acc.commit_local(local, store, num_samples=num_samples)
        with pytest.raises(BlockCorrupt):
            await acc.add("attacker", bad, store, num_samples=num_samples)
        await acc.add("honest", good, store, num_samples=num_samples)
    # Assert: exactly the honest mean, as the holding accumulator has it (not 0, not NaN).
    result = streaming.finalize()
    assert streaming.peer_count == 1
    np.testing.assert_allclose(result, holding.finalize(), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(result, (local + honest) / np.float32(2))


async def test_a_non_finite_aggregate_is_refused() -> None:
    # Two finite float32 maxima sum to inf: the final check refuses to return it.
    store = MemoryBlockStore()
    acc = DistributedGradientAccumulator("s", AccumulatorConfig(aggregation=Sum()))
    await acc.commit_local(np.full(4, 3e38, dtype=np.float32), store)
    await acc.add("p", await put_gradient(store, np.full(4, 3e38, dtype=np.float32)), store)
    with pytest.raises(InvalidGradient, match="Non-finite value in aggregate"):
        acc.finalize()


async def test_a_peer_that_would_overflow_the_running_sum_is_refused_and_the_sum_kept() -> None:
    # Prepare: the second chunk of the peer overflows the running sum, its first does not.
    store = MemoryBlockStore()
    local = np.full(N, 3e38, dtype=np.float32)
    local[: N // 2] = 1.0
    acc = StreamingAccumulator("s", AccumulatorConfig(aggregation=Sum()), chunk_bytes=CHUNK)
    await acc.commit_local(local, store)
    peer = await put_gradient(store, np.full(N, 3e38, dtype=np.float32), chunk_bytes=CHUNK)
    # Execute / Assert: refused with a typed error; the sum is the local gradient again.
    with pytest.raises(InvalidGradient, match="overflow"):
        await acc.add("p", peer, store)
    assert acc.peer_count == 0
    np.testing.assert_array_equal(acc.finalize(), local)


# --------------------------------------------------------- (5) future-round buffer per peer


async def test_one_peer_flooding_future_rounds_cannot_push_out_an_honest_announcement() -> None:
    # Prepare: a runner whose total buffer is small, and a peer flooding rounds 1e9 + i.
    bus = MemoryPubsubBus()
    me, flooder, honest = nodes(bus, ["me", "flooder", "honest"], "flood")
    runner = RoundRunner(MemoryBlockStore(), me, FAST)
    cid = make_cid(b"any gradient")
    # Execute: 5000 far-future announcements, then one honest early one.
    for i in range(5000):
        runner.defer(flooder.make_announcement(cid, 10**9 + i, length=4))
    runner.defer(honest.make_announcement(cid, 1, length=4))
    # Assert: the flooder holds at most its share; the honest announcement is kept.
    assert len(runner.future) == runner.MAX_DEFERRED_PER_PEER + 1
    assert me.drops["deferred_peer_overflow"] == 5000 - runner.MAX_DEFERRED_PER_PEER
    assert me.drops["deferred_overflow"] == 0
    assert [a.peer_id for a in runner.future.take(1)] == ["honest"]
    await close(me, flooder, honest)


async def test_future_buffer_still_has_a_total_cap() -> None:
    bus = MemoryPubsubBus()
    me, *peers = nodes(bus, ["me", *(f"p{i}" for i in range(6))], "cap")
    runner = RoundRunner(MemoryBlockStore(), me, FAST)
    runner.future.max_total = 10
    cid = make_cid(b"g")
    for peer in peers:
        for r in range(3):
            runner.defer(peer.make_announcement(cid, 5 + r, length=4))
    assert len(runner.future) == 10
    assert me.drops["deferred_overflow"] == 18 - 10
    await close(me, *peers)


# ------------------------------------------------------------------- (10) weight cap


@pytest.mark.parametrize(
    "rule", [SampleWeightedMean(), NormBounded(inner=SampleWeightedMean(), max_norm=10.0)]
)
async def test_a_huge_sample_count_no_longer_flips_fedavg(rule: Any) -> None:
    # Prepare: three honest contributions (2**19 samples each) along +u; one liar along -u.
    store = MemoryBlockStore()
    u = np.ones(8, dtype=np.float32)
    liar = await put_gradient(store, -u)
    peers = {f"h{i}": await put_gradient(store, u * (1 + i / 10)) for i in range(2)}

    async def aggregate(max_weight: int | None) -> tuple[np.ndarray, dict[str, int]]:
        acc = DistributedGradientAccumulator(
            "w", AccumulatorConfig(aggregation=rule, max_weight=max_weight)
        )
        await acc.commit_local(u, store, num_samples=2**19)
        for peer, cid in peers.items():
            await acc.add(peer, cid, store, num_samples=2**19)
        await acc.add("liar", liar, store, num_samples=2**62)
        return acc.finalize(), acc.clipped_weights

    # Execute: with the default cap, and (the old behaviour) without one.
    capped, clipped = await aggregate(DEFAULT_MAX_WEIGHT)
    uncapped, _ = await aggregate(None)
    # Assert: the cap keeps the honest direction and reports the clipped claim.
    cosine = float(capped @ u / np.linalg.norm(capped) / np.linalg.norm(u))
    assert cosine > 0.99
    assert float(uncapped @ u) < 0  # without a cap the liar wins
    assert clipped == {"liar": 2**62}


async def test_runner_reports_clipped_weights() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    a, b = nodes(bus, ["a", "b"], "weights")
    config = replace(FAST, max_weight=100)
    grads = [np.full(4, v, dtype=np.float32) for v in (1.0, 3.0)]
    results = await asyncio.gather(
        RoundRunner(store, a, config).run_round(0, grads[0], num_samples=100),
        RoundRunner(store, b, config).run_round(0, grads[1], num_samples=2**62),
    )
    assert results[0].clipped_weights == {"b": 2**62}
    assert results[1].clipped_weights == {}
    np.testing.assert_allclose(results[0].aggregate, np.full(4, 2.0))  # 100 vs 100 samples
    await close(a, b)


# ----------------------------------------------- (11) stragglers are bounded by the deadline


async def test_unserved_cid_costs_at_most_the_round_deadline_not_fetch_timeout() -> None:
    # Prepare: a ghost announces a CID nobody serves; fetch_timeout is a minute.
    store, bus = HangingStore(), MemoryPubsubBus()
    a, b, ghost = nodes(bus, ["a", "b", "ghost"], "straggler")
    ghost_cid = make_cid(b"served by nobody")
    store.never.add(bytes(ghost_cid))
    config = replace(FAST, collect_timeout=1.0, fetch_timeout=60.0)
    closed = asyncio.Event()
    haunting = asyncio.create_task(
        ghost.announce_until(ghost.make_announcement(ghost_cid, 0, length=4), closed, interval=0.02)
    )
    grads = [np.full(4, v, dtype=np.float32) for v in (1.0, 3.0)]
    started = time.monotonic()
    # Execute: a waits for both (expected), b for anyone.
    results = await asyncio.gather(
        RoundRunner(store, a, config).run_round(0, grads[0], expected_peers=["b", "ghost"]),
        RoundRunner(store, b, config).run_round(0, grads[1]),
    )
    elapsed = time.monotonic() - started
    closed.set()
    await haunting
    # Assert: the round closed by its deadline (plus slack), ghost dropped, b aggregated.
    assert elapsed < 10.0
    assert results[0].dropped == ["ghost"]
    assert "deadline" in results[0].failures["ghost"]
    assert results[0].participants == ["a", "b"]
    np.testing.assert_allclose(results[0].aggregate, np.full(4, 2.0))
    await close(a, b, ghost)


async def test_round_without_min_peers_raises_after_its_deadline() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    (a,) = nodes(bus, ["a"], "alone")
    config = replace(FAST, collect_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(InsufficientPeers) as caught:
        await RoundRunner(store, a, config).run_round(0, np.ones(4), expected_peers=["b", "c"])
    assert time.monotonic() - started >= 0.3
    assert (caught.value.needed, caught.value.got, caught.value.absent) == (1, 0, ["b", "c"])
    await close(a)


# ---------------------------------------- a decoder's foreign error rejects only that peer


@pytest.mark.parametrize("error", [RecursionError, MemoryError, OverflowError, ValueError])
@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("decoder", ["template", "full"])
async def test_decoder_raising_anything_rejects_that_peer_not_the_round(
    monkeypatch: pytest.MonkeyPatch, error: type[Exception], streaming: bool, decoder: str
) -> None:
    # Prepare: a decoder (the canonical-bytes template or the full one) raises a foreign
    # error on the attacker's block only.
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    a, b, evil = nodes(bus, ["a", "b", "evil"], f"decoder-{error.__name__}-{decoder}")
    poison = np.full(4, 7.0, dtype=np.float32)
    evil_cid = await put_gradient(store, poison)
    real, real_template = dag.load_layer_from_arrow, dag.decode_dense_block

    def decode(data: bytes, **limits: Any) -> Any:
        layer, rest = real(data, **limits)
        if np.array_equal(layer.values, poison):
            raise error("decoder blew up on hostile bytes")
        return layer, rest

    def template(data: bytes, length: int, **layout: Any) -> Any:
        values = real_template(data, length, **layout)
        if values is not None and np.array_equal(values, poison):
            if decoder == "template":
                raise error("template blew up on hostile bytes")
            return None  # the full decoder's turn
        return values

    monkeypatch.setattr(dag, "load_layer_from_arrow", decode)
    monkeypatch.setattr(dag, "decode_dense_block", template)
    closed = asyncio.Event()
    announcing = asyncio.create_task(
        evil.announce_until(evil.make_announcement(evil_cid, 0, length=4), closed, interval=0.02)
    )
    grads = [np.full(4, v, dtype=np.float32) for v in (1.0, 3.0)]
    config = replace(FAST, streaming=streaming)
    # Execute
    results = await asyncio.gather(
        RoundRunner(store, a, config).run_round(0, grads[0], expected_peers=["b", "evil"]),
        RoundRunner(store, b, config).run_round(0, grads[1]),
    )
    closed.set()
    await announcing
    # Assert: a typed rejection counted by reason; the round aggregates the honest peers.
    assert list(results[0].rejected) == ["evil"]
    assert error.__name__ in results[0].rejected["evil"]
    assert results[0].rejections == {"DecodeError": 1}
    np.testing.assert_allclose(results[0].aggregate, np.full(4, 2.0))
    await close(a, b, evil)
