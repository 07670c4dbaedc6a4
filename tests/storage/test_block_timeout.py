"""Slow is not missing (issue 18): a chunk that times out while others arrive is asked again.

A mock store sends one block at a time, ``pace`` seconds each (as a bitswap peer does), and
answers a ``get`` that is not served within its ``timeout`` with :class:`BlockTimeout`, as
Kubo's ``block/get`` does ("context deadline exceeded").
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from gradfed_ipfs import BlockNotFound, BlockTimeout
from gradfed_ipfs.storage import UNSET, Block, MemoryBlockStore, Unset
from gradfed_ipfs.storage.dag import fetch_gradient, fetch_manifest, put_gradient, values_per_chunk

CHUNK = 65_536
N = 8 * values_per_chunk(CHUNK)  # eight chunks


class OneAtATimeStore(MemoryBlockStore):
    """Blocks leave the 'peer' one at a time, ``pace`` s each; ``never`` blocks never do."""

    def __init__(self, pace: float) -> None:
        super().__init__()
        self.pace = pace
        self.never: set[bytes] = set()
        self.requests = 0
        self._wire = asyncio.Lock()

    async def get(self, cid: Any, *, timeout: float | Unset = UNSET) -> Block:
        assert isinstance(timeout, float)
        self.requests += 1

        async def send() -> None:
            if bytes(cid) in self.never:
                await asyncio.Event().wait()
            async with self._wire:
                await asyncio.sleep(self.pace)  # emulated transfer time of one block

        try:
            await asyncio.wait_for(send(), timeout)
        except TimeoutError:
            raise BlockTimeout("context deadline exceeded", cid=cid, deadline=timeout) from None
        return await super().get(cid)


async def gradient(store: OneAtATimeStore) -> tuple[Any, np.ndarray]:
    values = np.random.default_rng(3).standard_normal(N).astype(np.float32)
    return await put_gradient(store, values, chunk_bytes=CHUNK), values


async def test_chunks_waiting_behind_others_are_asked_again_not_reported_missing() -> None:
    # Prepare: 8 chunks in flight, 0.1 s each one after the other (0.8 s), 0.35 s per block:
    # the last chunks wait longer than their timeout behind the others.
    store = OneAtATimeStore(pace=0.1)
    cid, values = await gradient(store)
    # Execute
    fetched = await fetch_gradient(store, cid, concurrency=8, timeout=0.35, retries=0)
    # Assert: bit for bit, and some chunks were indeed asked again.
    np.testing.assert_array_equal(fetched, values)
    assert store.requests > 1 + 8


async def test_each_chunk_clock_starts_with_its_own_request() -> None:
    # One chunk in flight: the whole fetch (0.9 s) exceeds the timeout, no single block does.
    store = OneAtATimeStore(pace=0.1)
    cid, values = await gradient(store)
    fetched = await fetch_gradient(store, cid, concurrency=1, timeout=0.35, retries=0)
    np.testing.assert_array_equal(fetched, values)
    assert store.requests == 1 + 8  # manifest + chunks, none repeated


async def test_a_chunk_that_never_comes_ends_in_block_timeout_with_bytes_received() -> None:
    # Prepare: chunk 5 never leaves the peer; the others arrive.
    store = OneAtATimeStore(pace=0.02)
    cid, _ = await gradient(store)
    manifest = await fetch_manifest(store, cid, timeout=1.0)
    store.never.add(bytes(manifest.chunks[5].cid))
    started = time.monotonic()
    # Execute
    with pytest.raises(BlockTimeout) as info:
        await fetch_gradient(store, cid, concurrency=8, timeout=0.3, retries=0)
    # Assert: typed, never BlockNotFound, says what arrived, bounded by the stall (not 8 x 0.3 s).
    error = info.value
    assert not isinstance(error, BlockNotFound)
    assert isinstance(error, TimeoutError)
    assert bytes(error.cid) == bytes(manifest.chunks[5].cid)  # type: ignore[arg-type]
    assert error.received >= 7 * 4 * manifest.chunks[0].length  # the other seven chunks
    assert "chunk 5" in str(error)
    assert f"{error.received} bytes of the gradient had arrived" in str(error)
    assert time.monotonic() - started < 5.0


async def test_a_lone_block_that_times_out_is_not_retried_without_progress() -> None:
    store = OneAtATimeStore(pace=0.0)
    cid, _ = await gradient(store)
    store.never.add(bytes(cid))  # the manifest itself never comes
    with pytest.raises(BlockTimeout, match="manifest") as info:
        await fetch_gradient(store, cid, timeout=0.2, retries=2)
    assert info.value.received == 0
    assert store.requests == 1
