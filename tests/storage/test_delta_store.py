from __future__ import annotations

import subprocess
import sys

import dag_cbor
import numpy as np
import pytest

from gradfed_ipfs import Block, MemoryBlockStore
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import BlockNotFound, ChecksumFailed, MalformedArrow, MalformedManifest
from gradfed_ipfs.storage import load_delta, store_delta
from gradfed_ipfs.tensor import GradientCompressor, GradientDelta, QuantizedGradient, SparseGradient

BASE = make_cid(b"model v1")


def sample_delta() -> GradientDelta:
    rng = np.random.default_rng(1)
    delta = GradientDelta(BASE, timestamp=1_700_000_000)
    delta.add_dense_gradient("conv.weight", rng.normal(size=(4, 3)).astype(np.float32))
    delta.add_sparse_gradient("embed", SparseGradient([2, 40], [0.5, -1.5], [10, 5]))
    delta.add_quantized_gradient("fc.bias", QuantizedGradient.from_dense([1, 2, 3, 4, 5]))
    delta.add_quantized_gradient(
        "fc.int4", QuantizedGradient.from_dense(np.arange(7, dtype=np.float32), bits=4)
    )
    delta.add_layer(
        "fc.weight", GradientCompressor.top_k_quantized(rng.normal(size=100), [10, 10], 5)
    )
    return delta


async def test_delta_round_trip() -> None:
    store = MemoryBlockStore()
    delta = sample_delta()
    cid = await store_delta(delta, store)
    assert str(cid).startswith("bafyrei")
    loaded = await load_delta(cid, store)
    assert loaded.base_model == BASE
    assert loaded.timestamp == delta.timestamp
    assert loaded.checksum == delta.checksum
    assert sorted(loaded.layer_gradients) == sorted(delta.layer_gradients)
    for name, layer in delta.layer_gradients.items():
        got = loaded.layer_gradients[name]
        assert type(got) is type(layer)
        assert got.shape == layer.shape
        np.testing.assert_array_equal(got.to_dense(), layer.to_dense())
    # six blocks (five layers and the record), all pinned
    assert len(store.blocks) == 6
    assert len(store.pins) == 6


async def test_record_layout() -> None:
    store = MemoryBlockStore()
    cid = await store_delta(sample_delta(), store)
    record = dag_cbor.decode((await store.get(cid)).data)
    assert record["type"] == "gradfed/gradient-delta"
    assert record["version"] == 1
    assert record["base"] == BASE
    assert len(record["checksum"]) == 64
    assert sorted(record["layers"]) == ["conv.weight", "embed", "fc.bias", "fc.int4", "fc.weight"]
    for link in record["layers"].values():
        assert link.codec.name == "raw"


async def test_empty_delta_round_trips() -> None:
    store = MemoryBlockStore()
    delta = GradientDelta(BASE, timestamp=5)
    loaded = await load_delta(await store_delta(delta, store), store)
    assert loaded.layer_gradients == {}
    assert loaded.checksum == delta.checksum


async def forge(store: MemoryBlockStore, cid: object, **changes: object) -> Block:
    record = dag_cbor.decode((await store.get(cid)).data)  # type: ignore[arg-type]
    record.update(changes)
    block = Block.new(bytes(dag_cbor.encode(record)), codec="dag-cbor")
    await store.put(block)
    return block


async def test_wrong_checksum_is_detected() -> None:
    store = MemoryBlockStore()
    cid = await store_delta(sample_delta(), store)
    forged = await forge(store, cid, checksum="0" * 64)
    with pytest.raises(ChecksumFailed):
        await load_delta(forged.cid, store)


async def test_swapped_layer_links_are_detected() -> None:
    store = MemoryBlockStore()
    cid = await store_delta(sample_delta(), store)
    record = dag_cbor.decode((await store.get(cid)).data)
    layers = dict(record["layers"])
    layers["embed"], layers["fc.bias"] = layers["fc.bias"], layers["embed"]
    forged = await forge(store, cid, layers=layers)
    with pytest.raises(MalformedManifest, match="holds layer"):
        await load_delta(forged.cid, store)


async def test_changed_base_fails_checksum() -> None:
    store = MemoryBlockStore()
    cid = await store_delta(sample_delta(), store)
    forged = await forge(store, cid, base=make_cid(b"model v2"))
    with pytest.raises(ChecksumFailed):
        await load_delta(forged.cid, store)


@pytest.mark.parametrize(
    "changes",
    [
        {"type": "something-else"},
        {"version": 2},
        {"base": "bafk-not-a-link"},
        {"checksum": "XYZ"},
        {"timestamp": "yesterday"},
        {"timestamp": True},
        {"layers": ["a"]},
        {"layers": {"a": "not a cid"}},
        {"layers": {"a": make_cid(b"x", "dag-cbor")}},
    ],
)
async def test_malformed_records_are_refused(changes: dict[str, object]) -> None:
    store = MemoryBlockStore()
    cid = await store_delta(sample_delta(), store)
    forged = await forge(store, cid, **changes)
    with pytest.raises(MalformedManifest):
        await load_delta(forged.cid, store)


async def test_non_records_are_refused() -> None:
    store = MemoryBlockStore()
    raw = await store.put(Block.new(b"raw bytes"))
    with pytest.raises(MalformedManifest, match="not a dag-cbor"):
        await load_delta(raw, store)
    garbage = await store.put(Block.new(b"\xff\x00garbage", codec="dag-cbor"))
    with pytest.raises(MalformedManifest):
        await load_delta(garbage, store)
    a_list = await store.put(Block.new(bytes(dag_cbor.encode([1, 2])), codec="dag-cbor"))
    with pytest.raises(MalformedManifest, match="must be a map"):
        await load_delta(a_list, store)


async def test_layer_block_that_is_not_arrow() -> None:
    store = MemoryBlockStore()
    cid = await store_delta(sample_delta(), store)
    junk = await store.put(Block.new(b"not arrow"))
    forged = await forge(store, cid, layers={"embed": junk})
    with pytest.raises(MalformedArrow):
        await load_delta(forged.cid, store)


async def test_missing_layer_block() -> None:
    store = MemoryBlockStore()
    cid = await store_delta(sample_delta(), store)
    record = dag_cbor.decode((await store.get(cid)).data)
    await store.delete(record["layers"]["embed"])
    with pytest.raises(BlockNotFound):
        await load_delta(cid, store)


@pytest.mark.parametrize(
    "module",
    ["gradfed_ipfs.formats.arrow", "gradfed_ipfs.storage.delta_store", "gradfed_ipfs.tensor"],
)
def test_each_module_imports_first(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
