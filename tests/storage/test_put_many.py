"""put_many: one block/put call for many blocks on Kubo, a loop of put elsewhere."""

from __future__ import annotations

import json
import os
from typing import Any

import dag_cbor
import httpx
import pytest
from multiformats import CID

from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import BlockCorrupt, BlockStoreError, BlockTooLarge, StoreRequestError
from gradfed_ipfs.federated.sliced.retention import UnpinnedPuts
from gradfed_ipfs.storage import Block, KuboBlockStore, MemoryBlockStore
from gradfed_ipfs.storage import kubo as kubo_module
from gradfed_ipfs.storage.base import StoreWrapper, put_many
from gradfed_ipfs.storage.kubo import encode_block_put_many
from gradfed_ipfs.storage.retention import GatedStore, GcGate, put_all_pinned_alone


def oversized() -> Block:
    """A block one byte over Kubo's limit (``Block.new`` refuses to make one)."""
    data = os.urandom(2 * 1024 * 1024 + 1)
    return Block(make_cid(data), data)


def count_calls(store: KuboBlockStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the store's block/put calls and the files each carried."""
    calls: list[int] = []
    post = store.rpc.post

    async def counting(endpoint: str, *args: Any, **kwargs: Any) -> bytes:
        if endpoint == "block/put":
            calls.append(len(kwargs.get("files") or {}))
        return await post(endpoint, *args, **kwargs)

    monkeypatch.setattr(store.rpc, "post", counting)
    return calls


@pytest.mark.kubo
async def test_a_batch_is_one_call_per_codec_and_every_block_is_stored(
    kubo_store: KuboBlockStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_calls(kubo_store, monkeypatch)
    raw = [Block.new(os.urandom(70_000)) for _ in range(5)]
    records = [Block.new(dag_cbor.encode({"n": os.urandom(8)}), "dag-cbor") for _ in range(2)]
    blocks = [*raw, *records]
    assert await put_many(kubo_store, blocks, pin=False) == [b.cid for b in blocks]
    assert calls == [5, 2]
    for block in blocks:
        assert (await kubo_store.get(block.cid)).data == block.data
        assert not await kubo_store.is_pinned(block.cid)
    pinned = [Block.new(os.urandom(100)) for _ in range(3)]
    await kubo_store.put_many(pinned, pin=True)
    assert [await kubo_store.is_pinned(b.cid) for b in pinned] == [True] * 3


@pytest.mark.kubo
async def test_blocks_pinned_alone_take_one_put_and_one_pin_call(
    kubo_store: KuboBlockStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A roster and a record: each links a block this daemon does not hold (a recursive pin
    # would fail), so both are pinned directly, in one pin/add call.
    missing = make_cid(os.urandom(64))
    blocks = [Block.new(dag_cbor.encode({"n": i, "link": missing}), "dag-cbor") for i in (1, 2)]
    endpoints: list[str] = []
    post = kubo_store.rpc.post

    async def counting(endpoint: str, *args: Any, **kwargs: Any) -> bytes:
        endpoints.append(endpoint)
        return await post(endpoint, *args, **kwargs)

    monkeypatch.setattr(kubo_store.rpc, "post", counting)
    cids = await put_all_pinned_alone(StoreWrapper(kubo_store), blocks)
    assert cids == [block.cid for block in blocks]
    assert sorted(endpoints) == ["block/put", "pin/add"]
    direct = json.loads(await post("pin/ls", {"type": "direct"}))["Keys"]
    assert {str(block.cid) for block in blocks} <= set(direct)
    await kubo_store.pin_many([])  # nothing to pin: no call
    assert len(endpoints) == 2


@pytest.mark.kubo
async def test_batches_split_at_the_byte_budget(
    kubo_store: KuboBlockStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubo_module, "MAX_PUT_BATCH_BYTES", 250_000)
    calls = count_calls(kubo_store, monkeypatch)
    blocks = [Block.new(os.urandom(100_000)) for _ in range(5)]
    await kubo_store.put_many(blocks, pin=False)
    assert calls == [2, 2, 1]
    assert all([await kubo_store.has(b.cid) for b in blocks])


@pytest.mark.kubo
async def test_a_block_kubo_refuses_mid_batch_fails_the_put(kubo_store: KuboBlockStore) -> None:
    # A store that believes in larger blocks than Kubo takes: Kubo stores the first block,
    # refuses the second (over its 2 MiB limit) and answers one line.
    lax = KuboBlockStore(kubo_store.api_url, max_block_size=4 * 1024 * 1024)
    first, big, last = Block.new(os.urandom(1000)), oversized(), Block.new(os.urandom(1000))
    try:
        with pytest.raises(StoreRequestError, match="stored 1 of 3 blocks") as info:
            await lax.put_many([first, big, last], pin=False)
    finally:
        await lax.aclose()
    assert info.value.cid == big.cid
    assert await kubo_store.has(first.cid)
    assert not await kubo_store.has(last.cid)
    await kubo_store.put(first)  # the store still works
    assert await kubo_store.is_pinned(first.cid)


@pytest.mark.kubo
async def test_an_oversized_block_sends_nothing(
    kubo_store: KuboBlockStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_calls(kubo_store, monkeypatch)
    small = Block.new(os.urandom(1000))
    with pytest.raises(BlockTooLarge) as info:
        await kubo_store.put_many([small, oversized()])
    assert calls == []
    assert info.value.endpoint == "block/put"
    assert not await kubo_store.has(small.cid)


def answering(lines: list[str]) -> KuboBlockStore:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content="".join(f"{line}\n" for line in lines).encode())

    return KuboBlockStore("http://kubo.test", transport=httpx.MockTransport(handler))


def key(cid: CID) -> str:
    return json.dumps({"Key": str(cid), "Size": 3})


async def test_an_answer_naming_another_cid_is_corrupt() -> None:
    blocks = [Block.new(bytes([i]) * 3) for i in range(3)]
    store = answering([key(blocks[0].cid), key(blocks[0].cid), key(blocks[2].cid)])
    with pytest.raises(BlockCorrupt) as info:
        await store.put_many(blocks)
    assert info.value.cid == blocks[1].cid
    await store.aclose()


@pytest.mark.parametrize("answered", [0, 2, 4])
async def test_an_answer_with_the_wrong_number_of_lines_is_refused(answered: int) -> None:
    blocks = [Block.new(bytes([i]) * 3) for i in range(3)]
    lines = [key(b.cid) for b in blocks] + [key(blocks[0].cid)]
    store = answering(lines[:answered])
    with pytest.raises(StoreRequestError):
        await store.put_many(blocks)
    await store.aclose()


async def test_an_error_line_is_refused() -> None:
    blocks = [Block.new(b"a"), Block.new(b"b")]
    store = answering([key(blocks[0].cid), json.dumps({"Message": "disk full", "Type": "error"})])
    with pytest.raises(StoreRequestError, match="disk full"):
        await store.put_many(blocks)
    await store.aclose()


def test_encode_block_put_many_takes_one_codec() -> None:
    params, files = encode_block_put_many([Block.new(b"a"), Block.new(b"b")], pin=False)
    assert params == {"cid-codec": "raw", "mhtype": "sha2-256", "pin": "false"}
    assert [f[1] for f in files.values()] == [b"a", b"b"]
    with pytest.raises(BlockStoreError, match="one codec"):
        encode_block_put_many([Block.new(b"a"), Block.new(b"{}", "dag-cbor")], pin=False)


class _Recording(StoreWrapper):
    """A wrapper that changes ``put``: batching must not go around it."""

    def __init__(self, store: MemoryBlockStore) -> None:
        super().__init__(store)
        self.puts: list[CID] = []

    async def put(self, block: Block, *, pin: bool = True) -> CID:
        self.puts.append(block.cid)
        return await self.store.put(block, pin=pin)


async def test_other_stores_and_wrappers_put_block_by_block() -> None:
    memory = MemoryBlockStore()
    blocks = [Block.new(bytes([i])) for i in range(4)]
    assert await put_many(memory, blocks[:2]) == [b.cid for b in blocks[:2]]
    assert await StoreWrapper(memory).put_many(blocks[2:3]) == [blocks[2].cid]
    recording = _Recording(memory)
    assert await put_many(recording, blocks[3:]) == [blocks[3].cid]
    assert recording.puts == [blocks[3].cid]
    assert all([await memory.has(b.cid) for b in blocks])


async def test_a_gated_batch_holds_the_gate_once_and_unpinned_puts_remember_roots() -> None:
    gate = GcGate()
    seen: list[int] = []

    class Watching(MemoryBlockStore):
        async def put(self, block: Block, *, pin: bool = True) -> CID:
            seen.append(gate.in_flight)
            return await super().put(block, pin=pin)

    inner = Watching()
    blocks = [Block.new(bytes([i])) for i in range(3)]
    assert await GatedStore(inner, gate).put_many(blocks) == [b.cid for b in blocks]
    assert seen == [1, 1, 1]
    assert gate.in_flight == 0
    unpinned = UnpinnedPuts(inner)
    more = [Block.new(bytes([i, i])) for i in range(2)]
    await unpinned.put_many(more, pin=True)
    await unpinned.put_many(blocks, pin=False)
    assert set(unpinned.roots) == {bytes(b.cid) for b in more}
    assert not any([await inner.is_pinned(b.cid) for b in more])
