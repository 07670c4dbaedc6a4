"""examples/torch_interop.py: the NumPy core always; the torch adapters only where torch imports."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

from gradfed_ipfs.errors import ChecksumFailed
from gradfed_ipfs.storage import Block, MemoryBlockStore
from gradfed_ipfs.storage.delta_store import load_delta, store_delta
from gradfed_ipfs.tensor.codecs import TopKInt8

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from torch_interop import delta_from_arrays, grads_from_delta

BASE = str(Block.new(b"base model").cid)


def grads() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        ("0.weight", rng.standard_normal((8, 4)).astype(np.float32)),
        ("0.bias", rng.standard_normal(8).astype(np.float32)),
        ("2.weight", rng.standard_normal((3, 8)).astype(np.float64)),
    ]


async def _through_store(delta_grads: list[tuple[str, np.ndarray]]) -> dict[str, np.ndarray]:
    async with MemoryBlockStore() as store:
        cid = await store_delta(delta_from_arrays(delta_grads, BASE, timestamp=1), store)
        return grads_from_delta(await load_delta(cid, store))


def test_arrays_round_trip_through_a_store_with_their_shapes() -> None:
    back = asyncio.run(_through_store(grads()))
    assert sorted(back) == sorted(name for name, _ in grads())
    for name, grad in grads():
        assert back[name].shape == grad.shape
        np.testing.assert_array_equal(back[name], grad.astype(np.float32))


def test_compressed_layers_stay_within_the_codec_bound() -> None:
    codec = TopKInt8(ratio=0.5)
    delta = delta_from_arrays(grads(), BASE, codec=codec)
    back = grads_from_delta(delta)
    for name, grad in grads():
        flat = grad.astype(np.float32).reshape(-1)
        assert np.abs(back[name].reshape(-1) - flat).max() <= codec.error_bound(flat)


def test_tampered_delta_is_refused() -> None:
    delta = delta_from_arrays(grads(), BASE)
    delta.layer_gradients["0.bias"] = delta_from_arrays(
        [("0.bias", np.zeros(8, np.float32))], BASE
    ).layer_gradients["0.bias"]
    with pytest.raises(ChecksumFailed):
        grads_from_delta(delta)


def test_torch_module_grads_round_trip() -> None:
    torch = pytest.importorskip("torch")
    from torch_interop import round_trip

    assert asyncio.run(round_trip(MemoryBlockStore())) == 0.0
    assert torch.nn is not None
