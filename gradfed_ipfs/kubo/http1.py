"""A lean HTTP/1.1 client pool for one Kubo daemon's RPC port (plain TCP, keep-alive).

:class:`~gradfed_ipfs.kubo.rpc.KuboRpc` sends its plain calls through :class:`Http1Pool`
(:func:`encode_request`, :meth:`Http1Pool.call`) unless a test injects an httpx transport.
httpx, httpcore, h11 and anyio cost ~1-2 ms of CPU per call (this pool ~0.2 ms), and
httpcore's pool re-checks every idle connection with a ``select`` call on each request start
and end: a sliced round makes ~5N calls per peer, so that overhead was most of a round's CPU
(``benchmarks/bench_load.py``). This module speaks only what Kubo answers: a status line,
headers, then a ``Content-Length`` or chunked body (trailers dropped); no TLS, no proxies,
no redirects, no compression, no pipelining.

Failures are its own small exceptions (``rpc.py`` retries and maps them as it does httpx's):
a refused or slow connect, a malformed, cut or oversized answer, a body over the caller's cap.
A reused connection the daemon closed meanwhile is replaced once, transparently, when nothing
of the answer had arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable, Mapping
from typing import Any, Final
from urllib.parse import quote, urlencode

__all__ = [
    "MAX_HEAD_BYTES",
    "Http1Answer",
    "Http1ConnectError",
    "Http1ConnectTimeout",
    "Http1Error",
    "Http1Pool",
    "Http1ProtocolError",
    "Http1TooLarge",
    "QueryParams",
    "encode_request",
]

MAX_HEAD_BYTES: Final = 64 * 1024
"""Longest status line plus headers (and longest chunk-size line) read, in bytes."""
_CHUNK: Final = 256 * 1024


class Http1Error(Exception):
    """The exchange failed (base)."""


class Http1ConnectError(Http1Error):
    """The daemon's port refused or dropped the connection attempt."""


class Http1ConnectTimeout(Http1Error):
    """No connection within the connect timeout."""


class Http1ProtocolError(Http1Error):
    """The answer was cut short, malformed, or its head too long."""


class Http1TooLarge(Http1Error):
    """The answer exceeded the caller's cap; reading stopped."""

    def __init__(self, seen: int) -> None:
        super().__init__(f"answer over its cap ({seen} bytes seen)")
        self.seen = seen


QueryParams = Mapping[str, str | list[str]]
"""A call's query parameters; a list repeats its key (``pin/add?arg=a&arg=b``)."""


def encode_request(
    endpoint: str, params: QueryParams | None, files: Mapping[str, Any] | None
) -> tuple[bytes, list[tuple[bytes, bytes]], bytes] | None:
    """Return ``(path and query, headers, body)`` of a call, or ``None`` if it needs httpx.

    ``files`` become one multipart body when each is a ``(filename, bytes, content type)``
    tuple (``block/put``, ``pubsub/pub``); any other form is left to httpx.
    """
    headers = []
    body = b""
    if files:
        boundary = os.urandom(16).hex()  # unknown to whoever chose the bytes
        parts = []
        for name, value in files.items():
            if not (isinstance(value, tuple) and len(value) == 3 and type(value[1]) is bytes):
                return None
            filename, data, kind = value
            parts.append(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
                f'filename="{filename}"\r\nContent-Type: {kind}\r\n\r\n'.encode()
                + data
                + b"\r\n"
            )
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        headers.append((b"Content-Type", f"multipart/form-data; boundary={boundary}".encode()))
    headers.append((b"Content-Length", str(len(body)).encode()))
    query = urlencode(params, doseq=True, quote_via=quote) if params else ""
    return endpoint.encode() + (b"?" + query.encode() if query else b""), headers, body


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reused = False

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class Http1Answer:
    """One answer: status, raw headers, and its body as an async iterator of byte chunks.

    :meth:`aclose` must be called (``rpc.py`` always does): it returns a fully read
    keep-alive connection to the pool, closes any other, and frees the pool slot.
    """

    def __init__(
        self,
        pool: Http1Pool,
        conn: _Connection,
        status: int,
        headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
    ) -> None:
        self.status = status
        self.headers = headers
        self._pool = pool
        self._conn: _Connection | None = conn
        self._keep = keep_alive
        self._done = False
        length = b""
        chunked = False
        for name, value in headers:
            lowered = name.lower()
            if lowered == b"content-length":
                length = value.strip()
            elif lowered == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        self._chunked = chunked
        self._length = int(length) if length.isdigit() and not chunked else None
        self.length = self._length
        """The declared body length (``None``: chunked or until close)."""
        if status in (204, 304):
            self._length, self._chunked = 0, False
        if not chunked and self._length is None:
            self._keep = False  # the body runs until the daemon closes the connection

    async def body(self) -> AsyncIterator[bytes]:
        """Yield the body's bytes as they arrive.

        Raises
        ------
        Http1ProtocolError
            If the connection ends before the body does, or a chunk header is malformed.
        """
        conn = self._conn
        if conn is None:
            return
        reader = conn.reader
        if self._chunked:
            parts = _chunked_body(reader)
        elif self._length is not None:
            parts = _sized_body(reader, self._length)
        else:
            parts = _body_until_close(reader)
        try:
            async for data in parts:
                yield data
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise Http1ProtocolError(f"answer body cut or malformed: {exc!r}") from None
        except OSError as exc:
            raise Http1ProtocolError(f"connection broke while reading: {exc!r}") from None
        finally:
            await parts.aclose()  # a reader that stops early leaves no generator pending
        self._done = True

    async def aclose(self) -> None:
        """Give the connection back (fully read keep-alive) or close it; free the slot."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._keep and not self._pool.closed:
            conn.reused = True
            self._pool._idle.append(conn)
        else:
            conn.close()
        self._pool._slots.release()


class Http1Pool:
    """Keep-alive connections to ``host:port``, at most ``max_connections`` busy at once.

    Parameters
    ----------
    host, port
        The daemon's RPC address.
    max_connections
        Requests in flight at once; more wait for a free slot (under the caller's deadline).
    path
        Prefix of every :meth:`call`'s endpoint, e.g. ``/api/v0``.
    """

    def __init__(
        self, host: str, port: int, max_connections: int = 64, *, path: bytes = b""
    ) -> None:
        self.host = host
        self.port = port
        self._prefix = path.rstrip(b"/") + b"/"
        self._host = host.encode() if port == 80 else f"{host}:{port}".encode()
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self.opened = 0
        """Connections opened so far (tests check reuse)."""
        self.closed = False
        """Set by :meth:`aclose`; answers that end afterwards close their connections."""

    async def request(
        self,
        method: str,
        target: bytes,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes | AsyncIterable[bytes],
        *,
        connect_timeout: float | None = None,
    ) -> Http1Answer:
        """Send one request; return its answer once the status line and headers arrived.

        ``headers`` must include ``Host`` and, with a body, ``Content-Length`` or
        ``Transfer-Encoding: chunked`` (``httpx`` sets them); the body is sent as given.

        Raises
        ------
        Http1ConnectError, Http1ConnectTimeout
            If no connection could be opened.
        Http1ProtocolError
            If the connection broke or the answer's head is malformed or too long.
        """
        await self._slots.acquire()
        try:
            head = [f"{method} ".encode() + target + b" HTTP/1.1\r\n"]
            chunked = False
            for name, value in headers:
                head.append(name + b": " + value + b"\r\n")
                chunked |= name.lower() == b"transfer-encoding" and b"chunked" in value.lower()
            head.append(b"\r\n")
            parts = [b"".join(head)]
            if isinstance(body, bytes):
                parts.append(body)
            else:
                async for piece in body:
                    if chunked and piece:
                        parts.append(b"%x\r\n" % len(piece) + piece + b"\r\n")
                    elif piece:
                        parts.append(piece)
                if chunked:
                    parts.append(b"0\r\n\r\n")
            message = b"".join(parts)
            while True:
                conn = self._idle.pop() if self._idle else await self._open(connect_timeout)
                try:
                    return await self._exchange(conn, message)
                except _Stale:
                    continue  # a reused connection the daemon had closed: a fresh one
        except BaseException:
            self._slots.release()
            raise

    async def call(
        self,
        method: str,
        endpoint: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        cap: int,
        connect_timeout: float | None,
        received: list[int],
    ) -> tuple[int, bytes]:
        """Send one request to ``path/endpoint``; return its status and whole body.

        ``received[0]`` counts the body's bytes as they arrive (for a caller's timeout message).

        Raises
        ------
        Http1TooLarge
            If the body is (or is declared) longer than ``cap`` bytes.
        Http1ConnectError, Http1ConnectTimeout, Http1ProtocolError
            As :meth:`request`, or if the body is cut.
        """
        target = self._prefix + endpoint
        answer = await self.request(
            method, target, [(b"Host", self._host), *headers], body, connect_timeout=connect_timeout
        )
        try:
            if answer.length is not None and answer.length > cap:
                raise Http1TooLarge(answer.length)
            chunks = []
            async for chunk in answer.body():
                received[0] += len(chunk)
                if received[0] > cap:
                    raise Http1TooLarge(received[0])
                chunks.append(chunk)
        finally:
            await answer.aclose()
        return answer.status, b"".join(chunks)

    async def _open(self, timeout: float | None) -> _Connection:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=MAX_HEAD_BYTES), timeout
            )
        except TimeoutError:
            raise Http1ConnectTimeout(f"no connection to {self.host}:{self.port}") from None
        except OSError as exc:
            raise Http1ConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        self.opened += 1
        return _Connection(reader, writer)

    async def _exchange(self, conn: _Connection, message: bytes) -> Http1Answer:
        try:
            conn.writer.write(message)
            await conn.writer.drain()
            head = await conn.reader.readuntil(b"\r\n\r\n")  # one read: status and headers
        except (OSError, asyncio.IncompleteReadError) as exc:
            conn.close()
            if conn.reused and not getattr(exc, "partial", b""):
                raise _Stale from None
            raise Http1ProtocolError(f"connection broke before the answer: {exc!r}") from None
        except asyncio.LimitOverrunError:
            conn.close()
            raise Http1ProtocolError(f"answer head over {MAX_HEAD_BYTES} bytes") from None
        except BaseException:
            conn.close()  # cancelled mid-exchange: the connection's state is unknown
            raise
        status_line, *lines = head[:-4].split(b"\r\n")
        version, _, rest = status_line.partition(b" ")
        status = int(rest[:3]) if rest[:3].isdigit() else 0
        if not version.startswith(b"HTTP/1.") or not 100 <= status <= 599:
            conn.close()
            raise Http1ProtocolError(f"malformed status line {status_line[:60]!r}")
        headers = []
        for line in lines:
            name, sep, value = line.partition(b":")
            if sep:
                headers.append((name.strip(), value.strip()))
        keep = version == b"HTTP/1.1" and not any(
            n.lower() == b"connection" and v.lower() == b"close" for n, v in headers
        )
        return Http1Answer(self, conn, status, headers, keep)

    async def aclose(self) -> None:
        """Close the idle connections (busy ones close when their answers do)."""
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _Stale(Exception):
    """Internal: a reused connection was closed by the daemon before answering."""


async def _chunked_body(reader: asyncio.StreamReader) -> AsyncGenerator[bytes, None]:
    """Yield a chunked body's bytes (trailers are read and dropped)."""
    while True:
        line = await reader.readuntil(b"\r\n")
        size = int(line.split(b";", 1)[0].strip() or b"x", 16)
        if size < 0:
            raise ValueError(f"chunk size {size}")
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass  # trailers (Kubo's X-Stream-Error): the body decides
            return
        async for data in _sized_body(reader, size):
            yield data
        if await reader.readexactly(2) != b"\r\n":
            raise Http1ProtocolError("chunk not followed by CRLF")


async def _sized_body(reader: asyncio.StreamReader, left: int) -> AsyncGenerator[bytes, None]:
    """Yield exactly ``left`` bytes as they arrive."""
    while left:
        data = await reader.read(min(left, _CHUNK))
        if not data:
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(data)
        yield data


async def _body_until_close(reader: asyncio.StreamReader) -> AsyncGenerator[bytes, None]:
    """Yield bytes until the daemon closes the connection."""
    while data := await reader.read(_CHUNK):
        yield data
