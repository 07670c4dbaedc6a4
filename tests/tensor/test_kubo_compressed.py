"""A compressed round (top-k 1% + int8) over real Kubo daemons, against the dense round."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gradfed_ipfs.formats import load_gradient_from_arrow, store_layer_as_arrow
from gradfed_ipfs.storage import Block, KuboBlockStore, load_delta, store_delta
from gradfed_ipfs.tensor import Contribution, Dense, GradientDelta, SampleWeightedMean, TopKInt8

pytestmark = pytest.mark.kubo

D = 200_000


async def run_round(swarm: list[Any], codec: Dense | TopKInt8) -> tuple[np.ndarray, int]:
    """Each of 3 peers puts its encoded gradient on its own daemon; peer 0 fetches and averages."""
    rng = np.random.default_rng(7)
    gradients = [rng.normal(size=D).astype(np.float32) for _ in swarm]
    stores = [KuboBlockStore(node.api_url, timeout=30.0) for node in swarm]
    try:
        bytes_put = 0
        cids = []
        for store, gradient in zip(stores, gradients, strict=True):
            block = Block.new(store_layer_as_arrow(codec.encode(gradient)))
            bytes_put += len(block.data)
            cids.append(await store.put(block))
        fetched = {
            f"peer-{i}": Contribution.of(load_gradient_from_arrow((await stores[0].get(cid)).data))
            for i, cid in enumerate(cids)
        }
        return SampleWeightedMean().aggregate(fetched), bytes_put
    finally:
        for store in stores:
            await store.aclose()


async def test_compressed_round_moves_20x_fewer_bytes(kubo_swarm3: list[Any]) -> None:
    dense, dense_bytes = await run_round(kubo_swarm3, Dense())
    codec = TopKInt8(ratio=0.01)
    compressed, compressed_bytes = await run_round(kubo_swarm3, codec)
    assert dense_bytes / compressed_bytes >= 20
    # Documented error: the mean of the peers' codec bounds bounds the aggregate's error.
    rng = np.random.default_rng(7)
    bounds = [codec.error_bound(rng.normal(size=D).astype(np.float32)) for _ in kubo_swarm3]
    assert np.abs(compressed - dense).max() <= np.mean(bounds) + 1e-6


async def test_delta_record_through_kubo(kubo_store: KuboBlockStore) -> None:
    delta = GradientDelta(Block.new(b"base model").cid, timestamp=1)
    delta.add_layer("w", TopKInt8(ratio=0.05).encode(np.arange(400, dtype=np.float32), [20, 20]))
    delta.add_dense_gradient("b", [1.0, 2.0])
    cid = await store_delta(delta, kubo_store)
    assert await kubo_store.is_pinned(cid)
    loaded = await load_delta(cid, kubo_store)
    assert loaded.checksum == delta.checksum
    np.testing.assert_array_equal(loaded.dense_layer("w"), delta.dense_layer("w"))
