"""StreamingAccumulator: same answers as the holding accumulator, one running sum, rollback."""

from __future__ import annotations

import numpy as np
import pytest

from gradfed_ipfs import Median
from gradfed_ipfs.errors import (
    BlockCorrupt,
    ConfigError,
    DimensionMismatch,
    EmptyGradients,
    InvalidGradient,
)
from gradfed_ipfs.federated.accumulate import DistributedGradientAccumulator, StreamingAccumulator
from gradfed_ipfs.formats import store_gradient_as_arrow
from gradfed_ipfs.seed import AggregationMethod, BackwardPassConfig
from gradfed_ipfs.storage import Block, MemoryBlockStore
from gradfed_ipfs.storage.dag import fetch_manifest, put_gradient, values_per_chunk

CHUNK = 65_536
N = 2 * values_per_chunk(CHUNK) + 100  # three chunks per gradient


def grads(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(N).astype(np.float32) for _ in range(count)]


def config(method: object) -> BackwardPassConfig:
    return BackwardPassConfig(aggregation=method)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("method", "samples"),
    [
        (AggregationMethod.Sum(), None),
        (AggregationMethod.Mean(), None),
        (AggregationMethod.FedAvg(), None),
        (AggregationMethod.FedAvg(), [10, 30, 60, 5]),
        (AggregationMethod.WeightedMean({"local": 1.0, "p0": 2.0, "p1": 0.5, "p2": 4.0}), None),
    ],
)
async def test_streaming_matches_holding_accumulator(
    method: object, samples: list[int] | None
) -> None:
    store = MemoryBlockStore()
    local, *peers = grads(4, seed=1)
    counts = samples or [None] * 4  # type: ignore[list-item]
    streaming = StreamingAccumulator("s", config(method), chunk_bytes=CHUNK, concurrency=2)
    holding = DistributedGradientAccumulator("s", config(method), chunk_bytes=CHUNK)
    await streaming.commit_local(local, store, num_samples=counts[0])
    await holding.commit_local(local, store, num_samples=counts[0])
    for index, peer in enumerate(peers):
        form = peer if index else peer[:N]  # one small and two chunked forms are mixed below
        cid = await put_gradient(store, form, chunk_bytes=CHUNK if index else 2 * 1024 * 1024)
        await streaming.add_peer_gradient(f"p{index}", cid, store, num_samples=counts[index + 1])
        await holding.add_peer_gradient(f"p{index}", cid, store, num_samples=counts[index + 1])
    assert streaming.peer_count == holding.peer_count == 3
    assert streaming.is_ready(3)
    np.testing.assert_allclose(streaming.aggregate(), holding.aggregate(), rtol=2e-6, atol=2e-6)


async def test_corrupt_chunk_rolls_back_and_is_named() -> None:
    store = MemoryBlockStore()
    local, good, bad = grads(3, seed=2)
    acc = StreamingAccumulator("s", chunk_bytes=CHUNK, concurrency=1)
    await acc.commit_local(local, store)
    before = acc.total.copy()  # type: ignore[union-attr]
    cid = await put_gradient(store, bad, chunk_bytes=CHUNK)
    manifest = await fetch_manifest(store, cid)
    last = manifest.chunks[-1].cid
    store.blocks[bytes(last)] = (last, store_gradient_as_arrow(np.zeros(100, np.float32)))
    with pytest.raises(BlockCorrupt, match="chunk 2"):
        await acc.add_peer_gradient("bad", cid, store)
    assert acc.peer_count == 0
    np.testing.assert_allclose(acc.total, before, rtol=0, atol=1e-6)  # type: ignore[arg-type]
    await acc.add_peer_gradient("good", await put_gradient(store, good, chunk_bytes=CHUNK), store)
    expected = (local.astype(np.float64) + good) / 2
    np.testing.assert_allclose(acc.aggregate(), expected, rtol=1e-6, atol=1e-6)


async def test_non_finite_chunk_rolls_back() -> None:
    store = MemoryBlockStore()
    local, peer = grads(2, seed=3)
    peer[-1] = np.nan
    acc = StreamingAccumulator("s", config(AggregationMethod.Sum()), chunk_bytes=CHUNK)
    await acc.commit_local(local, store)
    with pytest.raises(InvalidGradient, match="Non-finite"):
        await acc.add_peer_gradient("p", await put_gradient(store, peer, chunk_bytes=CHUNK), store)
    np.testing.assert_allclose(acc.aggregate(), local, atol=1e-6)


async def test_refusals() -> None:
    store = MemoryBlockStore()
    with pytest.raises(ConfigError, match="streaming"):
        StreamingAccumulator("s", config(Median()))
    with pytest.raises(ConfigError, match="map"):
        StreamingAccumulator("s", config(AggregationMethod.WeightedMean([1.0, 2.0])))
    acc = StreamingAccumulator("s", BackwardPassConfig(max_peers=1))
    with pytest.raises(EmptyGradients):
        acc.aggregate()
    await acc.commit_local([1.0, 2.0], store, num_samples=3)
    with pytest.raises(InvalidGradient, match="already"):
        await acc.commit_local([1.0, 2.0], store)
    one = await store.put(Block.new(store_gradient_as_arrow([1.0, 1.0])))
    with pytest.raises(InvalidGradient, match="every gradient or for none"):
        await acc.add_peer_gradient("p", one, store)
    with pytest.raises(DimensionMismatch):
        await acc.add_peer_gradient(
            "p", await store.put(Block.new(store_gradient_as_arrow([1.0]))), store, num_samples=1
        )
    await acc.add_peer_gradient("p", one, store, num_samples=1)
    with pytest.raises(InvalidGradient, match="counts once"):
        await acc.add_peer_gradient("p", one, store, num_samples=1)
    with pytest.raises(InvalidGradient, match="max_peers"):
        await acc.add_peer_gradient("q", one, store, num_samples=1)
    np.testing.assert_allclose(acc.aggregate(), [1.0, 1.75])  # (3·[1, 2] + 1·[1, 1]) / 4


async def test_finalize_divides_in_place_and_closes() -> None:
    store = MemoryBlockStore()
    local, peer = grads(2, seed=9)
    acc = StreamingAccumulator("s", chunk_bytes=CHUNK)
    await acc.commit_local(local, store)
    await acc.add_peer_gradient("p", await put_gradient(store, peer, chunk_bytes=CHUNK), store)
    expected = acc.aggregate()
    result = acc.finalize()
    assert result is acc.total
    np.testing.assert_array_equal(result, expected)
    np.testing.assert_array_equal(acc.aggregate(), expected)
    with pytest.raises(InvalidGradient, match="finalized"):
        await acc.add_peer_gradient("q", await put_gradient(store, peer), store)
