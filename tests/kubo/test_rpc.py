"""KuboRpc: pure parsing, the one error boundary, total deadlines and size caps."""

from __future__ import annotations

import asyncio
import json
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from gradfed_ipfs.errors import (
    BlockTimeout,
    DecodeError,
    GradfedError,
    KuboRpcError,
    PubsubRequestError,
    PubsubResponseTooLarge,
    PubsubTimeout,
    PubsubUnavailable,
    ResponseTooLarge,
    RpcTimeout,
    StoreRequestError,
    StoreResponseTooLarge,
    StoreTimeout,
    StoreUnavailable,
)
from gradfed_ipfs.formats.rpc import LineSplitter, iter_ndjson, parse_rpc_error
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.kubo.pubsub import PUBSUB_ERRORS
from gradfed_ipfs.kubo.rpc import DEADLINE_GRACE, MAX_PUBSUB_LINE_BYTES, KuboRpc, max_response_bytes
from gradfed_ipfs.kubo.rpc_errors import KUBO_ERRORS, ErrorFamily
from gradfed_ipfs.kubo.rpc_sync import rpc_call_sync
from gradfed_ipfs.storage import MAX_BLOCK_SIZE, Block, KuboBlockStore
from gradfed_ipfs.storage.kubo import STORE_ERRORS

Handler = Callable[[httpx.Request], httpx.Response]


def rpc_with(handler: Handler, **kwargs: object) -> KuboRpc:
    return KuboRpc("http://kubo.test", transport=httpx.MockTransport(handler), **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- pure parsing


def test_parse_rpc_error() -> None:
    assert parse_rpc_error(200, b'{"Key":"x"}') is None
    assert parse_rpc_error(500, b'{"Message":"boom","Code":0,"Type":"error"}') == "boom"
    assert parse_rpc_error(502, b"bad gateway") == "HTTP 502: bad gateway"
    # block/rm reports failures inside HTTP 200 NDJSON.
    body = b'{"Hash":"a"}\n{"Hash":"b","Error":"pinned: recursive"}\n'
    assert parse_rpc_error(200, body, streamed=True) == "pinned: recursive"
    # Raw block bytes that happen to look like an error are still data, not an error.
    assert parse_rpc_error(200, b'{"Error":"looks like one"}') is None
    # A hostile error body cannot blow the stack.
    assert parse_rpc_error(500, b"[" * 100_000).startswith("HTTP 500")


def test_iter_ndjson() -> None:
    assert list(iter_ndjson(b'{"a":1}\n\n{"b":2}\n')) == [{"a": 1}, {"b": 2}]
    with pytest.raises(DecodeError):
        list(iter_ndjson(b"[1,2]\n"))
    with pytest.raises(DecodeError):
        list(iter_ndjson(b"{nope\n"))
    with pytest.raises(DecodeError):
        list(iter_ndjson(b"[" * 100_000 + b"\n"))


def test_line_splitter_joins_chunks_and_drops_long_lines() -> None:
    # Prepare: lines cut across chunk boundaries, one line over the cap, cut in three.
    splitter = LineSplitter(max_line=5)
    chunks = [b"ab", b"c\nde", b"\n0123", b"456789", b"XY\nok\nta", b"il"]
    # Execute
    lines = [line for chunk in chunks for line in splitter.feed(chunk)]
    lines += splitter.close()
    # Assert
    assert lines == [b"abc", b"de", b"ok", b"tail"]
    assert splitter.oversized == 1


def test_line_splitter_counts_each_long_line_once() -> None:
    splitter = LineSplitter(max_line=3)
    assert splitter.feed(b"toolong\nx\n" + b"y" * 10) == [b"x"]
    assert splitter.feed(b"y" * 10 + b"\n") == []
    assert splitter.close() == []
    assert splitter.oversized == 2


def test_caps_per_endpoint() -> None:
    assert MAX_BLOCK_SIZE < max_response_bytes("block/get") <= MAX_BLOCK_SIZE + 128 * 1024
    assert max_response_bytes("pubsub/sub") == MAX_PUBSUB_LINE_BYTES < 128 * 1024
    assert max_response_bytes("id") == 4 * 1024 * 1024


# ---------------------------------------------------------------------------- error boundary


def connect_error(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("refused", request=request)


def read_timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("slow", request=request)


def kubo_error(request: httpx.Request) -> httpx.Response:
    return httpx.Response(500, json={"Message": "permission denied", "Code": 0, "Type": "error"})


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        (STORE_ERRORS, (StoreUnavailable, StoreTimeout, StoreRequestError)),
        (PUBSUB_ERRORS, (PubsubUnavailable, PubsubTimeout, PubsubRequestError)),
        (KUBO_ERRORS, (KuboRpcError, KuboRpcError, KuboRpcError)),
    ],
    ids=["store", "pubsub", "kubo"],
)
async def test_foreign_failures_map_to_the_family(
    family: ErrorFamily, expected: tuple[type[GradfedError], ...]
) -> None:
    for handler, kind in zip((connect_error, read_timeout, kubo_error), expected, strict=True):
        async with rpc_with(handler, errors=family) as rpc:
            with pytest.raises(kind) as info:
                await rpc.post("pin/add", {"arg": "x"})
        assert isinstance(info.value, GradfedError)
        assert isinstance(info.value.__cause__, httpx.HTTPError) or handler is kubo_error
        assert getattr(info.value, "api_url", None) == "http://kubo.test"
    async with rpc_with(read_timeout, errors=family) as rpc:
        with pytest.raises(RpcTimeout):
            await rpc.post("id")


async def test_error_inside_a_200_ndjson_body() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'{"Hash":"a"}\n{"Hash":"b","Error":"disk on fire"}\n')

    async with rpc_with(handler, errors=STORE_ERRORS) as rpc:
        assert await rpc.post("block/rm") == b'{"Hash":"a"}\n{"Hash":"b","Error":"disk on fire"}\n'
        with pytest.raises(StoreRequestError, match="disk on fire") as info:
            await rpc.post_ndjson("block/rm")
    assert info.value.endpoint == "block/rm"


async def test_store_family_classifies_refusals() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"Message": "context deadline exceeded", "Type": "error"})

    async with rpc_with(handler, errors=STORE_ERRORS) as rpc:
        with pytest.raises(BlockTimeout):
            await rpc.post("block/get")


async def test_non_json_answer_is_refused() -> None:
    async with rpc_with(lambda request: httpx.Response(200, content=b"<html>")) as rpc:
        with pytest.raises(KuboRpcError, match="non-JSON"):
            await rpc.post_json("id")


async def test_declared_oversize_is_refused_before_reading() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-length": str(10**9)}, content=b"")

    async with rpc_with(handler, errors=STORE_ERRORS) as rpc:
        with pytest.raises(StoreResponseTooLarge) as info:
            await rpc.post("block/get")
    assert info.value.rpc_endpoint == "block/get"
    assert info.value.cap == max_response_bytes("block/get")
    assert str(info.value.cap) in str(info.value)


def test_sync_call_maps_refused_connection() -> None:
    # Port 9 (discard) on loopback: nothing listens there on these machines.
    with pytest.raises(KuboRpcError, match="unreachable"):
        rpc_call_sync("http://127.0.0.1:9", "id", timeout=2.0)


# ---------------------------------------------------------------------------- hostile servers


@asynccontextmanager
async def http_server(
    respond: Callable[[asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[str]:
    """A tiny HTTP/1.1 server on 127.0.0.1 that reads a request head, then runs ``respond``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            await respond(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client hung up: exactly what these tests provoke
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def test_trickling_daemon_hits_the_total_deadline() -> None:
    sent = 0

    async def trickle(writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(1000):
            writer.write(b"x")
            await writer.drain()
            sent += 1
            await asyncio.sleep(0.5)  # the attack: one byte per half second

    async with http_server(trickle) as url, KuboBlockStore(url, retries=0) as store:
        started = time.monotonic()
        with pytest.raises(StoreTimeout) as info:
            await store.get(Block.new(b"wanted").cid, timeout=2.0)
        elapsed = time.monotonic() - started
    assert 2.0 <= elapsed < 2.0 + DEADLINE_GRACE + 1.0
    assert 1 <= info.value.received <= sent
    assert info.value.deadline == 2.0 + DEADLINE_GRACE
    assert f"{info.value.received} bytes" in str(info.value)
    assert isinstance(info.value, StoreUnavailable)  # callers of the store need nothing new


async def test_huge_body_is_cut_at_the_cap_without_buffering() -> None:
    total = 50 * 1024 * 1024
    sent = 0
    piece = b"\0" * 65536

    async def flood(writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        # No Content-Length: the body runs until the connection closes.
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        while sent < total:
            writer.write(piece)
            await writer.drain()
            sent += len(piece)

    cap = max_response_bytes("block/get")
    async with http_server(flood) as url, KuboBlockStore(url, retries=0) as store:
        tracemalloc.start()
        try:
            with pytest.raises(StoreResponseTooLarge) as info:
                await store.get(Block.new(b"wanted").cid, timeout=30.0)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert info.value.cap == cap
    assert info.value.endpoint == "block/get"
    assert peak < 2 * cap + 4 * 1024 * 1024  # chunks up to the cap, never the 50 MB body
    assert sent < total // 2  # the client hung up: the server could not push the rest


async def test_pubsub_stream_skips_a_huge_line_and_keeps_going() -> None:
    good = {"from": "peer", "data": "uMQ", "seqno": "uAA", "topicIDs": []}
    body = b"{" + b" " * (4 * MAX_PUBSUB_LINE_BYTES) + b"}\n" + json.dumps(good).encode() + b"\n"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body)

    client = KuboPubsub("http://kubo.test", transport=httpx.MockTransport(handler))
    stream = client.subscribe("t")
    message = await anext(stream)
    assert message.from_peer == "peer"
    assert client.bad_lines == 1
    await stream.aclose()  # type: ignore[attr-defined]
    await client.aclose()


async def test_pubsub_calls_have_caps_too() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'{"Strings":["' + b"x" * (5 * 1024 * 1024) + b'"]}')

    client = KuboPubsub("http://kubo.test", transport=httpx.MockTransport(handler))
    with pytest.raises(PubsubResponseTooLarge) as info:
        await client.peers("t")
    assert isinstance(info.value, ResponseTooLarge)
    await client.aclose()
