"""The lean HTTP/1.1 pool behind KuboRpc: bodies, keep-alive, stale connections, hostile heads."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gradfed_ipfs.errors import StoreUnavailable
from gradfed_ipfs.kubo.http1 import (
    MAX_HEAD_BYTES,
    Http1ConnectError,
    Http1Pool,
    Http1ProtocolError,
    Http1TooLarge,
    encode_request,
)
from gradfed_ipfs.storage import KuboBlockStore

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def server(answer: Handler) -> AsyncIterator[int]:
    """A loopback server running ``answer`` for each connection; yield its port."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await answer(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        srv.close()
        await srv.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """Read one request (head plus a Content-Length body); return its request line."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return head.split(b"\r\n")[0]


async def empty() -> AsyncIterator[bytes]:
    for part in (b"",):
        yield part


async def fetch(pool: Http1Pool, target: bytes = b"/x") -> tuple[int, bytes]:
    answer = await pool.request(
        "POST", target, [(b"Host", b"h"), (b"Content-Length", b"0")], empty()
    )
    try:
        return answer.status, b"".join([chunk async for chunk in answer.body()])
    finally:
        await answer.aclose()


async def test_keep_alive_reuses_one_connection_for_length_and_chunked_bodies() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await read_request(reader) == b"POST /a?arg=1 HTTP/1.1"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nX-Stream-Error: boom\r\n\r\n"
        )
        await writer.drain()
        await reader.read()  # until the client hangs up

    async with server(answer) as port:
        pool = Http1Pool("127.0.0.1", port)
        assert await fetch(pool, b"/a?arg=1") == (200, b"hello")
        assert await fetch(pool) == (500, b"abcde")
        assert pool.opened == 1
        await pool.aclose()


async def test_an_answer_ending_after_the_pool_closed_closes_its_connection() -> None:
    # A request still in flight when its client closes (a re-publisher being cancelled, say)
    # must not park its connection in the closed pool, where nothing would ever close it.
    hung_up = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()
        await reader.read()  # until the client hangs up
        hung_up.set()

    async with server(answer) as port:
        pool = Http1Pool("127.0.0.1", port)
        answer_ = await pool.request(
            "POST", b"/x", [(b"Host", b"h"), (b"Content-Length", b"0")], empty()
        )
        await pool.aclose()
        assert b"".join([chunk async for chunk in answer_.body()]) == b"hello"
        await answer_.aclose()
        assert pool._idle == []
        await asyncio.wait_for(hung_up.wait(), 5.0)


async def test_a_connection_the_daemon_closed_is_replaced_transparently() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()  # then close: the pool still holds the connection as idle

    async with server(answer) as port:
        pool = Http1Pool("127.0.0.1", port)
        assert await fetch(pool) == (200, b"ok")
        assert await fetch(pool) == (200, b"ok")
        assert pool.opened == 2
        await pool.aclose()


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # cut body
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # bad chunk size
        b"SMTP 220 hello\r\n\r\n",  # not HTTP
        b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * MAX_HEAD_BYTES + b"\r\n\r\n",  # head too long
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n",  # no CRLF
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
        + b"0" * (MAX_HEAD_BYTES + 10),  # chunk-size line too long
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40000\r\nabc",  # cut chunk
    ],
)
async def test_hostile_answers_raise_protocol_errors(reply: bytes) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply)
        await writer.drain()

    async with server(answer) as port:
        pool = Http1Pool("127.0.0.1", port, max_connections=1)
        with pytest.raises(Http1ProtocolError):
            await fetch(pool)
        assert pool._slots.locked() is False  # its one slot was freed


async def test_refused_port_is_a_connect_error_and_the_store_says_unavailable() -> None:
    async with server(read_request) as port:
        pass  # closed: nothing listens on the port any more
    pool = Http1Pool("127.0.0.1", port)
    with pytest.raises(Http1ConnectError):
        await fetch(pool)
    async with KuboBlockStore(f"http://127.0.0.1:{port}", retries=0) as store:
        with pytest.raises(StoreUnavailable):
            await store.has("bafkreihvmj363y6ghbnwxjqk22raerzk6ohaowlr47h2pppavzgywffx7y")


async def test_requests_beyond_max_connections_wait_for_a_slot() -> None:
    release = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await release.wait()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n1")
        await writer.drain()
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n2")
        await writer.drain()

    async with server(answer) as port:
        pool = Http1Pool("127.0.0.1", port, max_connections=1)
        first = asyncio.create_task(fetch(pool))
        second = asyncio.create_task(fetch(pool))
        release.set()  # one connection serves both, in turn: the second waited for the slot
        assert await asyncio.wait_for(asyncio.gather(first, second), 5.0) == [
            (200, b"1"),
            (200, b"2"),
        ]
        assert pool.opened == 1
        await pool.aclose()


async def test_call_sends_the_encoded_request_and_caps_the_answer() -> None:
    heard: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        heard.append(head + await reader.readexactly(length))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nanswer")
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nlong\r\n")
        await writer.drain()
        await reader.read()

    request = encode_request(
        "block/put", {"arg": "a b/c"}, {"file": ("block", b"\x00bytes", "application/x")}
    )
    assert request is not None
    assert encode_request("x", None, {"file": ("f", "text", "t")}) is None  # httpx encodes it
    async with server(answer) as port:
        pool = Http1Pool("127.0.0.1", port, path=b"/api/v0")
        received = [0]
        assert await pool.call("POST", *request, 100, 5.0, received) == (200, b"answer")
        assert received == [6]
        with pytest.raises(Http1TooLarge) as info:
            await pool.call("POST", b"id", [(b"Content-Length", b"0")], b"", 3, 5.0, [0])
        assert info.value.seen == 4
        await pool.aclose()
    sent = heard[0]
    assert sent.startswith(b"POST /api/v0/block/put?arg=a%20b%2Fc HTTP/1.1\r\nHost: 127.0.0.1:")
    boundary = sent.split(b"boundary=")[1].split(b"\r\n")[0]
    assert sent.endswith(
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="block"'
        b"\r\nContent-Type: application/x\r\n\r\n\x00bytes\r\n--" + boundary + b"--\r\n"
    )


async def test_many_small_chunks_split_anywhere_decode_exactly_and_keep_the_connection() -> None:
    # Kubo writes ~4 KiB chunks; TCP delivers them cut anywhere, mid-size-line and mid-CRLF.
    payload = bytes(range(256)) * 4000  # 1,024,000 bytes
    sizes = [4096, 1, 17, 65_536, 4096, 3] * 13  # 958,737 bytes: a last, longer chunk follows
    body, at = b"", 0
    for size in sizes:
        piece = payload[at : at + size]
        at += len(piece)
        if piece:
            body += b"%x\r\n" % len(piece) + piece + b"\r\n"
    body += b"%x;ext=1\r\n" % (len(payload) - at) + payload[at:] + b"\r\n0\r\nX-T: 1\r\n\r\n"
    cuts = [7, 4099, 4100, 4101, 70_000, 300_001, 300_002, len(body) - 3]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            last = 0
            for cut in [*cuts, len(body)]:
                writer.write(body[last:cut])
                await writer.drain()
                await asyncio.sleep(0)  # let the client read what is there so far
                last = cut
        await reader.read()

    async with server(answer) as port:
        pool = Http1Pool("127.0.0.1", port)
        assert await fetch(pool) == (200, payload)
        assert await fetch(pool) == (200, payload)
        assert pool.opened == 1  # the body ended exactly: the connection was reused
        await pool.aclose()


async def test_a_huge_declared_chunk_meets_the_cap_as_it_streams() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40000000\r\n")
        writer.write(b"x" * 300_000)  # then nothing: the declared 1 GiB never comes
        await writer.drain()
        await reader.read()

    async with server(answer) as port:
        pool = Http1Pool("127.0.0.1", port)
        with pytest.raises(Http1TooLarge):
            await pool.call("POST", b"id", [(b"Content-Length", b"0")], b"", 100_000, 5.0, [0])
        await pool.aclose()


def test_a_list_parameter_repeats_its_key() -> None:
    request = encode_request("pin/add", {"arg": ["a", "b c"], "recursive": "false"}, None)
    assert request is not None
    assert request[0] == b"pin/add?arg=a&arg=b%20c&recursive=false"
