"""DistributedGradientAccumulator on MemoryBlockStore and on real Kubo (same test bodies)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from gradfed_ipfs.errors import (
    BlockCorrupt,
    BlockNotFound,
    BlockTimeout,
    DimensionMismatch,
    EmptyGradients,
    InvalidGradient,
    MalformedArrow,
)
from gradfed_ipfs.federated.accumulate import DistributedGradientAccumulator
from gradfed_ipfs.formats import store_gradient_as_arrow
from gradfed_ipfs.seed import AggregationMethod, BackwardPassConfig
from gradfed_ipfs.storage import Block, BlockStore, KuboBlockStore, MemoryBlockStore


@pytest.fixture(params=["memory", pytest.param("kubo", marks=pytest.mark.kubo)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[BlockStore]:
    if request.param == "memory":
        yield MemoryBlockStore()
        return
    node = request.getfixturevalue("kubo_node")
    async with KuboBlockStore(node.api_url, timeout=5.0) as kubo:
        yield kubo


async def put_gradient(store: BlockStore, values: list[float]) -> object:
    return await store.put(Block.new(store_gradient_as_arrow(values)))


def make(method: object = None, **kwargs: object) -> DistributedGradientAccumulator:
    config = BackwardPassConfig(aggregation=method or AggregationMethod.FedAvg(), **kwargs)  # type: ignore[arg-type]
    return DistributedGradientAccumulator("session-1", config)


async def test_seed_fedavg_example(store: BlockStore) -> None:
    acc = make()
    cid = await acc.commit_local([1.0, 2.0, 3.0], store)
    assert str(cid).startswith("bafkrei")
    assert acc.is_ready(0)
    assert not acc.is_ready(1)
    await acc.add_peer_gradient("peer-a", await put_gradient(store, [3, 4, 5]), store)
    assert acc.is_ready(1)
    assert not acc.is_ready(2)
    await acc.add_peer_gradient("peer-b", await put_gradient(store, [5, 6, 7]), store)
    assert acc.is_ready(2)
    assert acc.peer_count == 2
    assert acc.session_id == "session-1"
    np.testing.assert_array_equal(acc.aggregate(), [3, 4, 5])
    np.testing.assert_array_equal(acc.local_gradient, [1, 2, 3])
    np.testing.assert_array_equal(acc.peer_gradients["peer-b"], [5, 6, 7])


async def test_sum_and_mean(store: BlockStore) -> None:
    for method, expected in [(AggregationMethod.Sum(), [4, 6]), (AggregationMethod.Mean(), [2, 3])]:
        acc = make(method)
        await acc.commit_local([1, 2], store)
        await acc.add_peer_gradient("p", await put_gradient(store, [3, 4]), store)
        np.testing.assert_array_equal(acc.aggregate(), expected)


async def test_weighted_mean_maps_weights_by_peer_id(store: BlockStore) -> None:
    # Peers are inserted out of sorted order; positional weights follow local, then sorted IDs.
    acc = make(AggregationMethod.WeightedMean([0.0, 1.0, 3.0]))
    await acc.commit_local([100.0], store)
    await acc.add_peer_gradient("zeta", await put_gradient(store, [8.0]), store)
    await acc.add_peer_gradient("alpha", await put_gradient(store, [0.0]), store)
    np.testing.assert_allclose(acc.aggregate(), [6.0])  # 1·alpha(0) + 3·zeta(8), over 4
    by_id = make(AggregationMethod.WeightedMean({"local": 1.0, "zeta": 1.0, "alpha": 2.0}))
    await by_id.commit_local([4.0], store)
    await by_id.add_peer_gradient("zeta", await put_gradient(store, [8.0]), store)
    await by_id.add_peer_gradient("alpha", await put_gradient(store, [0.0]), store)
    np.testing.assert_allclose(by_id.aggregate(), [3.0])
    wrong = make(AggregationMethod.WeightedMean([1.0]))
    await wrong.commit_local([1.0], store)
    await wrong.add_peer_gradient("p", await put_gradient(store, [1.0]), store)
    with pytest.raises(InvalidGradient, match="weight count"):
        wrong.aggregate()


async def test_fedavg_weighted_by_sample_counts(store: BlockStore) -> None:
    acc = make()
    await acc.commit_local([0.0, 0.0], store, num_samples=100)
    await acc.add_peer_gradient("p", await put_gradient(store, [2.0, 4.0]), store, num_samples=300)
    np.testing.assert_allclose(acc.aggregate(), [1.5, 3.0])


async def test_gradient_clipping_is_applied(store: BlockStore) -> None:
    acc = make(AggregationMethod.Mean(), gradient_clipping=1.0)
    await acc.commit_local([3.0, 4.0], store)
    out = acc.aggregate()
    assert np.linalg.norm(out) == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_array_equal(acc.local_gradient, [3.0, 4.0])  # state is not clipped


async def test_length_checked_at_insert_and_state_untouched(store: BlockStore) -> None:
    acc = make()
    await acc.commit_local([1, 2, 3], store)
    with pytest.raises(DimensionMismatch):
        await acc.add_peer_gradient("p", await put_gradient(store, [1, 2]), store)
    assert acc.peer_count == 0


async def test_non_finite_peer_gradient_rejected(store: BlockStore) -> None:
    acc = make()
    await acc.commit_local([1, 2], store)
    with pytest.raises(InvalidGradient, match="Non-finite"):
        await acc.add_peer_gradient("p", await put_gradient(store, [1.0, float("nan")]), store)
    with pytest.raises(InvalidGradient, match="Non-finite"):
        await acc.commit_local([float("inf"), 0.0], store)
    assert acc.peer_count == 0
    np.testing.assert_array_equal(acc.local_gradient, [1, 2])


async def test_aggregate_needs_local_gradient(store: BlockStore) -> None:
    acc = make()
    with pytest.raises(EmptyGradients):
        acc.aggregate()


async def test_max_peers_enforced_and_resend_replaces(store: BlockStore) -> None:
    acc = make(max_peers=1)
    await acc.commit_local([0.0], store)
    await acc.add_peer_gradient("p", await put_gradient(store, [1.0]), store)
    await acc.add_peer_gradient("p", await put_gradient(store, [2.0]), store)  # same peer: replace
    assert acc.peer_count == 1
    np.testing.assert_array_equal(acc.peer_gradients["p"], [2.0])
    with pytest.raises(InvalidGradient, match="max_peers"):
        await acc.add_peer_gradient("q", await put_gradient(store, [3.0]), store)


async def test_missing_and_malformed_blocks(store: BlockStore) -> None:
    acc = make(timeout=1.0)
    await acc.commit_local([0.0], store)
    with pytest.raises((BlockNotFound, BlockTimeout)):  # memory knows; Kubo cannot tell
        await acc.add_peer_gradient("p", Block.new(b"never stored").cid, store)
    not_arrow = await store.put(Block.new(b"this is not an arrow file"))
    with pytest.raises(MalformedArrow):
        await acc.add_peer_gradient("p", not_arrow, store)
    assert acc.peer_count == 0


async def test_corrupted_block_in_memory_store_raises() -> None:
    store = MemoryBlockStore()
    acc = make()
    await acc.commit_local([1.0], store)
    cid = await put_gradient(store, [2.0])
    key = bytes(cid)  # type: ignore[arg-type]
    store.blocks[key] = (store.blocks[key][0], store_gradient_as_arrow([999.0]))
    with pytest.raises(BlockCorrupt):
        await acc.add_peer_gradient("p", cid, store)  # type: ignore[arg-type]
    assert acc.peer_count == 0


# ------------------------------------------------------------------ chunked (large) gradients


def make_chunked(**kwargs: object) -> DistributedGradientAccumulator:
    return DistributedGradientAccumulator("session-1", chunk_bytes=65_536, **kwargs)  # type: ignore[arg-type]


async def test_commit_local_picks_chunked_form_and_peers_accept_both_kinds(
    store: BlockStore,
) -> None:
    from gradfed_ipfs.cid import DAG_CBOR, RAW
    from gradfed_ipfs.storage.dag import put_gradient, values_per_chunk

    n = 2 * values_per_chunk(65_536) + 7
    rng = np.random.default_rng(5)
    local, peer_big = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    progress: list[tuple[int, int]] = []
    acc = make_chunked(progress=lambda done, total: progress.append((done, total)))
    cid = await acc.commit_local(local, store)
    assert cid.codec.code == DAG_CBOR
    assert progress[-1] == (4 * n, 4 * n)
    big_cid = await put_gradient(store, peer_big, chunk_bytes=65_536)
    await acc.add_peer_gradient("big", big_cid, store)
    np.testing.assert_array_equal(acc.peer_gradients["big"], peer_big)
    small = make_chunked()
    small_cid = await small.commit_local([1.0, 2.0], store)
    assert small_cid.codec.code == RAW
    expected = (local.astype(np.float64) + peer_big) / 2
    np.testing.assert_allclose(acc.aggregate(), expected.astype(np.float32), rtol=1e-6)


async def test_chunked_length_mismatch_raises_before_fetching_chunks() -> None:
    from gradfed_ipfs.storage.dag import fetch_manifest, put_gradient, values_per_chunk

    store = MemoryBlockStore()
    acc = make_chunked()
    await acc.commit_local([1.0, 2.0, 3.0], store)
    big = await put_gradient(store, np.zeros(values_per_chunk(65_536) + 1), chunk_bytes=65_536)
    for chunk in (await fetch_manifest(store, big)).chunks:
        del store.blocks[bytes(chunk.cid)]  # a fetch of any chunk would fail with BlockNotFound
    with pytest.raises(DimensionMismatch):
        await acc.add_peer_gradient("p", big, store)
    assert acc.peer_count == 0
