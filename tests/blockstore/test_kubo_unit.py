"""KuboBlockStore against httpx.MockTransport: every foreign failure maps to our errors."""

from __future__ import annotations

import json

import httpx
import pytest

from gradfed_ipfs.errors import (
    BlockCorrupt,
    BlockNotFound,
    BlockStoreError,
    BlockTooLarge,
    StoreRequestError,
    StoreUnavailable,
)
from gradfed_ipfs.storage import Block, KuboBlockStore
from gradfed_ipfs.storage.kubo import encode_block_put


def store_with(handler: object, **kwargs: object) -> KuboBlockStore:
    transport = httpx.MockTransport(handler)  # type: ignore[arg-type]
    return KuboBlockStore("http://kubo.test", transport=transport, **kwargs)  # type: ignore[arg-type]


def test_encode_block_put() -> None:
    params, files = encode_block_put(Block.new(b"abc", "dag-cbor"), pin=True)
    assert params == {"cid-codec": "dag-cbor", "mhtype": "sha2-256", "pin": "true"}
    assert files["file"][1] == b"abc"


async def test_connect_error_retries_then_unavailable() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("refused", request=request)

    store = store_with(handler, retries=2, backoff=0.001)
    with pytest.raises(StoreUnavailable) as info:
        await store.has(Block.new(b"a").cid)
    assert calls == 3
    assert info.value.api_url == "http://kubo.test"
    assert info.value.endpoint == "block/stat"
    await store.aclose()


async def test_retry_succeeds_after_transient_failure() -> None:
    block = Block.new(b"data")
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, content=block.data)

    store = store_with(handler, retries=2, backoff=0.001)
    assert (await store.get(block.cid)).data == b"data"
    await store.aclose()


async def test_read_timeout_maps_to_unavailable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    store = store_with(handler)
    with pytest.raises(StoreUnavailable):
        await store.get(Block.new(b"a").cid, timeout=0.1)
    await store.aclose()


async def test_kubo_error_body_maps_to_request_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = {"Message": "permission denied", "Code": 0, "Type": "error"}
        return httpx.Response(500, content=json.dumps(body).encode())

    store = store_with(handler)
    with pytest.raises(StoreRequestError, match="permission denied"):
        await store.pin(Block.new(b"a").cid)
    await store.aclose()


async def test_deadline_exceeded_maps_to_not_found_and_timeout_is_sent() -> None:
    seen: dict[str, str] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(request.url.params)
        assert request.method == "POST"
        return httpx.Response(500, json={"Message": "context deadline exceeded", "Type": "error"})

    store = store_with(handler, timeout=2.5)
    cid = Block.new(b"missing").cid
    with pytest.raises(BlockNotFound) as info:
        await store.get(cid)
    assert seen["timeout"] == "2.500s"
    assert info.value.cid == cid
    assert str(cid) in str(info.value)
    with pytest.raises(ValueError, match="needs a timeout"):
        await store.get(cid, timeout=None)  # type: ignore[arg-type]
    await store.aclose()


async def test_altered_bytes_raise_corrupt() -> None:
    block = Block.new(b"the real gradient")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"the fake gradient")

    store = store_with(handler)
    with pytest.raises(BlockCorrupt):
        await store.get(block.cid)
    await store.aclose()


async def test_put_checks_returned_key_and_size() -> None:
    block = Block.new(b"abc")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"Key": str(Block.new(b"other").cid), "Size": 3})

    store = store_with(handler, max_block_size=16)
    with pytest.raises(BlockCorrupt):
        await store.put(block)
    with pytest.raises(BlockTooLarge):
        await store.put(Block.new(b"x" * 17))
    await store.aclose()


async def test_block_rm_error_inside_200_body() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/pin/rm"):
            return httpx.Response(500, json={"Message": "not pinned or pinned indirectly"})
        return httpx.Response(200, content=b'{"Hash":"x","Error":"some disk failure"}\n')

    store = store_with(handler)
    with pytest.raises(StoreRequestError, match="disk failure"):
        await store.delete(Block.new(b"a").cid)
    await store.aclose()


def test_every_store_error_is_a_block_store_error() -> None:
    for cls in (BlockNotFound, BlockCorrupt, BlockTooLarge, StoreUnavailable, StoreRequestError):
        assert issubclass(cls, BlockStoreError)


async def test_hash_on_read_refusal_maps_to_corrupt() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = {"Message": "block in storage has different hash than requested", "Type": "error"}
        return httpx.Response(500, json=body)

    store = store_with(handler)
    with pytest.raises(BlockCorrupt):
        await store.get(Block.new(b"a").cid)
    await store.aclose()
