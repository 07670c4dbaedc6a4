"""KuboBlockStore against real Kubo daemons (loopback only)."""

from __future__ import annotations

import os
import time

import httpx
import pytest

from gradfed_ipfs.errors import BlockCorrupt, BlockNotFound, BlockTooLarge, StoreUnavailable
from gradfed_ipfs.kubo import KuboDaemon
from gradfed_ipfs.storage import Block, KuboBlockStore

pytestmark = pytest.mark.kubo


@pytest.mark.docker
async def test_put_get_has_pin_delete_round_trip(kubo_store: KuboBlockStore) -> None:
    block = Block.new(os.urandom(4096))
    assert not await kubo_store.has(block.cid)
    assert await kubo_store.put(block) == block.cid
    assert await kubo_store.has(block.cid)
    assert await kubo_store.is_pinned(block.cid)
    assert (await kubo_store.get(block.cid)).data == block.data
    assert block.cid in await kubo_store.list_cids()
    await kubo_store.unpin(block.cid)
    assert not await kubo_store.is_pinned(block.cid)
    await kubo_store.unpin(block.cid)  # unpinning twice is a no-op
    await kubo_store.pin(block.cid)
    assert await kubo_store.is_pinned(block.cid)
    await kubo_store.delete(block.cid)  # unpins first, then block/rm
    assert not await kubo_store.has(block.cid)
    with pytest.raises(BlockNotFound):
        await kubo_store.delete(block.cid)


@pytest.mark.docker
async def test_dag_cbor_block(kubo_store: KuboBlockStore) -> None:
    import dag_cbor

    block = Block.new(dag_cbor.encode({"hello": "world"}), "dag-cbor")
    assert str(await kubo_store.put(block)).startswith("bafyrei")
    assert (await kubo_store.get(block.cid)).data == block.data


@pytest.mark.docker
async def test_largest_block_accepted_and_larger_refused(kubo_store: KuboBlockStore) -> None:
    block = Block.new(os.urandom(2 * 1024 * 1024))
    assert await kubo_store.put(block, pin=False) == block.cid
    with pytest.raises(BlockTooLarge):
        await kubo_store.put(Block(block.cid, block.data + b"x"))


@pytest.mark.docker
async def test_missing_cid_raises_not_found_within_timeout(kubo_store: KuboBlockStore) -> None:
    missing = Block.new(os.urandom(64)).cid
    started = time.monotonic()
    with pytest.raises(BlockNotFound) as info:
        await kubo_store.get(missing, timeout=1.0)
    assert time.monotonic() - started < 8.0
    assert info.value.cid == missing


@pytest.mark.docker
async def test_peer_fetches_block_over_bitswap(kubo_swarm3: list[object]) -> None:
    owner, fetcher = kubo_swarm3[0], kubo_swarm3[1]
    async with (
        KuboBlockStore(owner.api_url, timeout=10) as owner_store,  # type: ignore[attr-defined]
        KuboBlockStore(fetcher.api_url, timeout=10) as fetch_store,  # type: ignore[attr-defined]
    ):
        block = Block.new(os.urandom(100_000))
        await owner_store.put(block)
        assert not await fetch_store.has(block.cid)
        fetched = await fetch_store.get(block.cid)
        assert fetched.data == block.data
        assert await fetch_store.has(block.cid)  # now cached by the fetcher's daemon


async def test_stopped_daemon_raises_unavailable(fresh_daemon: KuboDaemon) -> None:
    store = KuboBlockStore(fresh_daemon.api_url, timeout=2, retries=2, backoff=0.01)
    block = Block.new(b"before the crash")
    await store.put(block)
    fresh_daemon.stop(remove_repo=False)
    with pytest.raises(StoreUnavailable) as info:
        await store.get(block.cid)
    assert info.value.api_url == fresh_daemon.api_url
    with pytest.raises(StoreUnavailable):
        await store.put(Block.new(b"after"))
    await store.aclose()


async def test_killed_daemon_keeps_pinned_blocks_after_restart(fresh_daemon: KuboDaemon) -> None:
    block = Block.new(os.urandom(1000))
    async with KuboBlockStore(fresh_daemon.api_url) as store:
        await store.put(block)
    fresh_daemon.kill()
    fresh_daemon.start()
    async with KuboBlockStore(fresh_daemon.api_url) as store:
        assert (await store.get(block.cid, timeout=2)).data == block.data


class TamperingTransport(httpx.AsyncBaseTransport):
    """Forwards to the real daemon but flips one bit of every ``block/get`` answer."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        if not request.url.path.endswith("/block/get"):
            return response
        body = bytearray(await response.aread())
        body[len(body) // 2] ^= 0x01
        return httpx.Response(response.status_code, headers=response.headers, content=bytes(body))

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_daemon_answering_altered_bytes_raises_corrupt(kubo_node: object) -> None:
    api = kubo_node.api_url  # type: ignore[attr-defined]
    block = Block.new(os.urandom(5000))
    async with KuboBlockStore(api) as honest:
        await honest.put(block)
    async with KuboBlockStore(api, transport=TamperingTransport()) as tampered:
        with pytest.raises(BlockCorrupt) as info:
            await tampered.get(block.cid)
    assert info.value.cid == block.cid
    assert info.value.endpoint == "block/get"
