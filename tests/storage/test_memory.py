from __future__ import annotations

import asyncio
import time

import pytest

from gradfed_ipfs.errors import BlockCorrupt, BlockNotFound, BlockTooLarge, InvalidGradient
from gradfed_ipfs.storage import Block, MemoryBlockStore


async def test_put_get_has_delete_pin(memory_store: MemoryBlockStore) -> None:
    block = Block.new(b"gradient bytes")
    assert await memory_store.put(block) == block.cid
    assert await memory_store.has(block.cid)
    assert await memory_store.is_pinned(block.cid)
    assert (await memory_store.get(str(block.cid))).data == b"gradient bytes"
    await memory_store.unpin(block.cid)
    assert not await memory_store.is_pinned(block.cid)
    assert await memory_store.list_cids() == [block.cid]
    assert len(memory_store) == 1
    await memory_store.delete(block.cid)
    assert not await memory_store.has(block.cid)
    with pytest.raises(BlockNotFound):
        await memory_store.get(block.cid)
    with pytest.raises(BlockNotFound):
        await memory_store.delete(block.cid)


async def test_tampered_bytes_raise_corrupt(memory_store: MemoryBlockStore) -> None:
    block = Block.new(b"original")
    await memory_store.put(block)
    key = bytes(block.cid)
    memory_store.blocks[key] = (block.cid, b"tampered")
    with pytest.raises(BlockCorrupt):
        await memory_store.get(block.cid)


async def test_size_limits() -> None:
    with pytest.raises(BlockTooLarge):
        Block.new(b"x" * (2 * 1024 * 1024 + 1))
    with pytest.raises(InvalidGradient):
        Block.new(b"")
    store = MemoryBlockStore(max_block_size=10)
    with pytest.raises(BlockTooLarge):
        await store.put(Block.new(b"x" * 11))


def test_block_equality_is_by_cid() -> None:
    assert Block.new(b"a") == Block.new(b"a")
    assert Block.new(b"a") != Block.new(b"b")
    assert len({Block.new(b"a"), Block.new(b"a")}) == 1
    assert Block.new(b"a", "dag-cbor") != Block.new(b"a")


async def test_with_wait_for_puts_a_get_before_the_put_returns_the_block_once_put() -> None:
    store = MemoryBlockStore(wait_for_puts=30.0)
    block = Block.new(b"announced before it was put")
    got = asyncio.create_task(store.get(block.cid, timeout=30.0))
    done, _ = await asyncio.wait({got}, timeout=0.05)
    assert not done  # waiting, not BlockNotFound
    await store.put(block)
    assert (await asyncio.wait_for(got, 5.0)).data == block.data


async def test_a_wait_for_a_put_ends_with_block_not_found_at_the_shorter_of_both_bounds() -> None:
    store = MemoryBlockStore(wait_for_puts=30.0)
    missing = Block.new(b"never put").cid
    started = time.monotonic()
    with pytest.raises(BlockNotFound):
        await store.get(missing, timeout=0.05)
    assert time.monotonic() - started < 5.0
    with pytest.raises(BlockNotFound):
        await MemoryBlockStore().get(missing, timeout=30.0)  # default: at once
    assert not store._puts  # the expired wait is forgotten
