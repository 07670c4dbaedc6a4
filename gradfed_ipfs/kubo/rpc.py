"""``KuboRpc``: the one HTTP client of gradfed-ipfs, for a Kubo daemon's RPC API (``/api/v0``).

Only this module imports ``httpx`` (an import-linter contract keeps it so). Every other part —
the block store, pubsub, daemon management, the CLI's node commands, :class:`~gradfed_ipfs.Node`
— calls Kubo through it. It owns:

- **One error boundary.** ``httpx`` errors, Kubo error bodies (a non-200 status, or ``Error``
  lines inside a 200 NDJSON body such as ``block/rm``'s) and broken limits leave here as
  typed errors of the caller's :class:`~gradfed_ipfs.kubo.rpc_errors.ErrorFamily` (block
  store, pubsub or Kubo control plane), built by :mod:`gradfed_ipfs.kubo.rpc_errors`.
- **Limits on every answer.** A *total* deadline per call (``httpx`` timeouts bound each read,
  so a daemon trickling one byte per 0.5 s would never trip them) raises an
  :class:`~gradfed_ipfs.errors.RpcTimeout` saying how many bytes arrived; a size cap per
  endpoint (:func:`max_response_bytes`), enforced while the body streams in, raises a
  :class:`~gradfed_ipfs.errors.ResponseTooLarge` before more than the cap is held in memory.
- **Kubo's RPC facts.** Every call is a POST. ``pubsub/sub`` is an endless NDJSON stream, read
  line by line with a per-line cap (:meth:`KuboRpc.stream_lines`).

The parsing is pure and lives in :mod:`gradfed_ipfs.formats.rpc` (tested on bytes). The
transport is injectable (``httpx.MockTransport`` in unit tests); without one, plain calls to
an ``http://`` daemon go through :class:`~gradfed_ipfs.kubo.http1.Http1Pool` (httpx and
httpcore cost ~1-2 ms of CPU per call, most of a sliced round's), streams through httpx.
Synchronous code calls through :func:`~gradfed_ipfs.kubo.rpc_sync.rpc_call_sync`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import ssl
from collections.abc import AsyncGenerator, Callable, Mapping
from types import TracebackType
from typing import Any, Final, Self, TypeAlias

import httpx

from ..block import MAX_BLOCK_SIZE
from ..errors import DecodeError, GradfedError
from ..formats.announcement import MAX_MESSAGE_BYTES
from ..formats.rpc import LineSplitter, iter_ndjson, parse_rpc_error
from .http1 import (
    Http1ConnectError,
    Http1ConnectTimeout,
    Http1Pool,
    Http1ProtocolError,
    Http1TooLarge,
    QueryParams,
    encode_request,
)
from .rpc_errors import KUBO_ERRORS, ErrorFamily, rpc_error, timeout_error, too_large_error

__all__ = [
    "CONNECT_TIMEOUT",
    "DEADLINE_GRACE",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "MAX_PUBSUB_LINE_BYTES",
    "KuboRpc",
    "Transport",
    "max_response_bytes",
]

logger = logging.getLogger("gradfed_ipfs.kubo.rpc")

Transport: TypeAlias = httpx.AsyncBaseTransport
"""What ``transport=`` accepts (an ``httpx`` async transport), named so callers need no httpx."""

CONNECT_TIMEOUT: Final = 5.0
"""Seconds to open a TCP connection to the daemon."""
DEADLINE_GRACE: Final = 1.0
"""Seconds a call may run past the timeout it hands Kubo (``block/get``'s ``timeout=``), so
that Kubo's own "not found" answer normally arrives before our deadline."""
DEFAULT_MAX_RESPONSE_BYTES: Final = 4 * 1024 * 1024
"""Size cap of an answer from an endpoint not listed in :data:`_MAX_RESPONSE_BYTES`."""
MAX_PUBSUB_LINE_BYTES: Final = (MAX_MESSAGE_BYTES * 4 + 2) // 3 + 4096
"""Longest ``pubsub/sub`` line kept: an announcement-sized payload in base64url plus the
envelope (``from``, ``seqno``, ``topicIDs``). Longer lines are skipped unread."""

_MAX_RESPONSE_BYTES: Final[Mapping[str, int]] = {
    "block/get": MAX_BLOCK_SIZE + 64 * 1024,  # raw block bytes; Kubo refuses larger blocks
    "refs/local": 256 * 1024 * 1024,  # one ~70-byte line per block of the repo
    "pubsub/sub": MAX_PUBSUB_LINE_BYTES,  # per line: the stream itself is endless
}


def max_response_bytes(endpoint: str) -> int:
    """Return the size cap, in bytes, of an answer from ``endpoint``."""
    return _MAX_RESPONSE_BYTES.get(endpoint, DEFAULT_MAX_RESPONSE_BYTES)


class _Abort(Exception):
    """Internal: carry a built error out of the deadline scope unchanged."""

    def __init__(self, error: GradfedError) -> None:
        self.error = error


# --------------------------------------------------------------------------- the client


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """Return the one TLS context of every client.

    httpx otherwise builds (and loads CA files into) a new one per client, ~30-80 ms each: a
    client per simulated peer made that N times per round.
    """
    return httpx.create_ssl_context()


class KuboRpc:
    """An async client of one Kubo daemon's RPC API, with deadlines, size caps and typed errors.

    Parameters
    ----------
    api_url
        The daemon's RPC base URL, e.g. ``http://127.0.0.1:5001``.
    timeout
        Default total deadline of a call, in seconds.
    errors
        Default error family of calls that do not pass their own.
    transport
        An ``httpx`` transport to use instead of the network (e.g. ``httpx.MockTransport``).
    max_connections
        Most concurrent connections to the daemon.
    base_path
        Path every endpoint is relative to: Kubo's ``/api/v0`` (default), or ``""`` for a REST
        API such as IPFS Cluster's.

    Examples
    --------
    >>> async def peer_id(api: str) -> str:  # doctest: +SKIP
    ...     async with KuboRpc(api) as rpc:
    ...         return str((await rpc.post_json("id"))["ID"])
    """

    def __init__(
        self,
        api_url: str,
        *,
        timeout: float = 30.0,
        errors: ErrorFamily = KUBO_ERRORS,
        transport: Transport | None = None,
        max_connections: int = 64,
        base_path: str = "/api/v0",
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        self.api_url = api_url.rstrip("/")
        self.timeout = float(timeout)
        self.errors = errors
        url = httpx.URL(f"{self.api_url}{base_path}")
        self._lean = (  # plain calls to a plain http daemon, when no transport is injected
            Http1Pool(url.host, url.port or 80, max_connections, path=url.raw_path)
            if transport is None and url.scheme == "http" and url.host
            else None
        )
        self._client = httpx.AsyncClient(
            base_url=f"{self.api_url}{base_path}",
            transport=transport,
            verify=_ssl_context(),
            timeout=httpx.Timeout(self.timeout, connect=CONNECT_TIMEOUT),
            # Every connection stays open between calls: a closed one costs a new TCP connect
            # and HTTP set-up on the next call, and a round's bursts (N chunk fetches at once)
            # closed all but 16 of them each time (benchmarks/bench_load.py).
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections; open streams end."""
        if self._lean is not None:
            await self._lean.aclose()
        await self._client.aclose()

    # ------------------------------------------------------------------ calls

    async def post(  # noqa: PLR0913 - the one RPC entry point: keyword-only request options
        self,
        endpoint: str,
        params: QueryParams | None = None,
        *,
        files: Mapping[str, Any] | None = None,
        deadline: float | None = None,
        max_bytes: int | None = None,
        streamed: bool = False,
        retries: int = 0,
        backoff: float = 0.1,
        errors: ErrorFamily | None = None,
        method: str = "POST",
    ) -> bytes:
        """POST ``/api/v0/<endpoint>`` and return the body of its successful answer.

        Parameters
        ----------
        endpoint
            E.g. ``block/get``.
        params
            Query parameters.
        files
            Multipart files (``block/put``, ``pubsub/pub``).
        deadline
            Total seconds for the whole exchange, body included (default: ``timeout``).
        max_bytes
            Size cap of the answer (default :func:`max_response_bytes` of ``endpoint``).
        streamed
            The endpoint reports errors inside a 200 NDJSON body (``block/rm``).
        retries
            Attempts after the first when the connection fails (refused, reset).
        backoff
            First retry delay in seconds; doubles per attempt.
        errors
            The error family (default: the client's).
        method
            The HTTP method: Kubo takes only POST; IPFS Cluster's REST API also GET.

        Returns
        -------
        bytes
            The answer's body, at most ``max_bytes`` long.

        Raises
        ------
        GradfedError
            Of ``errors``' family: unavailable, timeout (an ``RpcTimeout``), too large (a
            ``ResponseTooLarge``) or refused.
        """
        family = errors or self.errors
        seconds = self.timeout if deadline is None else float(deadline)
        cap = max_response_bytes(endpoint) if max_bytes is None else max_bytes
        delay = backoff
        for attempt in range(retries + 1):
            try:
                status, body = await self._exchange(
                    endpoint, params, files, seconds, cap, family, method
                )
            except (
                httpx.ConnectError,
                httpx.ConnectTimeout,
                httpx.RemoteProtocolError,
                Http1ConnectError,
                Http1ConnectTimeout,
                Http1ProtocolError,
            ) as exc:
                if attempt == retries:
                    raise rpc_error(
                        family.unavailable,
                        f"Kubo daemon unreachable after {attempt + 1} attempts: {exc}",
                        self.api_url,
                        endpoint,
                    ) from exc
                logger.debug("%s %s failed (%s); retrying in %.2fs", method, endpoint, exc, delay)
                await asyncio.sleep(delay)  # backoff between reconnect attempts, not a sync
                delay *= 2
                continue
            except httpx.TimeoutException as exc:
                raise rpc_error(
                    family.timeout,
                    f"Kubo did not answer {endpoint} in time: {exc!r}",
                    self.api_url,
                    endpoint,
                ) from exc
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                raise rpc_error(
                    family.unavailable,
                    f"HTTP error calling {endpoint}: {exc!r}",
                    self.api_url,
                    endpoint,
                ) from exc
            except _Abort as abort:
                raise abort.error from None
            logger.debug("%s %s %s -> %d", method, endpoint, (params or {}).get("arg", ""), status)
            message = parse_rpc_error(status, body, streamed=streamed)
            if message is not None:
                raise rpc_error(
                    family.refused, f"Kubo refused {endpoint}: {message}", self.api_url, endpoint
                )
            return body
        raise AssertionError("unreachable")  # pragma: no cover

    async def post_json(
        self, endpoint: str, params: QueryParams | None = None, **options: Any
    ) -> Any:
        """:meth:`post`, then decode the JSON answer (``None`` for an empty body).

        Raises
        ------
        GradfedError
            As :meth:`post`; a body that is not JSON is ``refused`` of the family.
        """
        body = await self.post(endpoint, params, **options)
        text = body.decode("utf-8", errors="replace").strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            family = options.get("errors") or self.errors
            raise rpc_error(
                family.refused,
                f"{endpoint} answered non-JSON: {text[:200]!r}",
                self.api_url,
                endpoint,
            ) from None

    async def post_ndjson(
        self, endpoint: str, params: QueryParams | None = None, **options: Any
    ) -> list[dict[str, Any]]:
        """:meth:`post` a streaming endpoint (errors inside 200 bodies); return its objects."""
        body = await self.post(endpoint, params, streamed=True, **options)
        try:
            return list(iter_ndjson(body))
        except DecodeError as exc:
            family = options.get("errors") or self.errors
            raise rpc_error(family.refused, f"{endpoint}: {exc}", self.api_url, endpoint) from None

    async def stream_lines(
        self,
        endpoint: str,
        params: QueryParams | None = None,
        *,
        max_line: int | None = None,
        errors: ErrorFamily | None = None,
        on_oversized: Callable[[], None] | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """POST an endless streaming endpoint (``pubsub/sub``) and yield its non-empty lines.

        No total deadline applies (the stream is meant to stay open); lines over ``max_line``
        bytes (default :func:`max_response_bytes` of ``endpoint``) are skipped as they arrive,
        never held whole, and reported through ``on_oversized``.

        Raises
        ------
        GradfedError
            Of ``errors``' family: ``unavailable`` when the stream cannot open or breaks,
            ``refused`` when Kubo answers with an error status.
        """
        family = errors or self.errors
        splitter = LineSplitter(max_response_bytes(endpoint) if max_line is None else max_line)
        request = self._client.build_request(
            "POST",
            f"/{endpoint}",
            params=dict(params or {}),
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT),
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise rpc_error(
                family.unavailable, f"{endpoint} failed: {exc!r}", self.api_url, endpoint
            ) from exc
        try:
            if response.status_code != 200:
                body = await _read_capped(response, DEFAULT_MAX_RESPONSE_BYTES)
                message = parse_rpc_error(response.status_code, body) or "error"
                raise rpc_error(
                    family.refused, f"Kubo refused {endpoint}: {message}", self.api_url, endpoint
                )
            async for chunk in response.aiter_bytes():
                before = splitter.oversized
                lines = splitter.feed(chunk)
                if on_oversized is not None:
                    for _ in range(splitter.oversized - before):
                        on_oversized()
                for line in lines:
                    if line.strip():
                        yield line
            for line in splitter.close():
                if line.strip():
                    yield line
        except httpx.HTTPError as exc:
            raise rpc_error(
                family.unavailable, f"{endpoint} stream broke: {exc!r}", self.api_url, endpoint
            ) from exc
        finally:
            with contextlib.suppress(httpx.HTTPError):
                await response.aclose()

    # ------------------------------------------------------------------ internals

    async def _exchange(
        self,
        endpoint: str,
        params: QueryParams | None,
        files: Mapping[str, Any] | None,
        seconds: float,
        cap: int,
        family: ErrorFamily,
        method: str = "POST",
    ) -> tuple[int, bytes]:
        """One request under a total deadline; the body is read up to ``cap`` bytes."""
        received = [0]  # bytes of the answer so far, for the timeout's message
        scope = asyncio.timeout(seconds)
        try:
            async with scope:
                request = None if self._lean is None else encode_request(endpoint, params, files)
                if self._lean is not None and request is not None:
                    try:  # without httpx's models (URL parsing, header objects): ~0.2 ms a call
                        return await self._lean.call(
                            method, *request, cap, min(CONNECT_TIMEOUT, seconds), received
                        )
                    except Http1TooLarge as exc:
                        raise _Abort(
                            too_large_error(family, self.api_url, endpoint, cap, exc.seen)
                        ) from None
                built = self._client.build_request(
                    method,
                    f"/{endpoint}",
                    params=dict(params or {}),
                    files=files,
                    timeout=httpx.Timeout(seconds, connect=min(CONNECT_TIMEOUT, seconds)),
                )
                response = await self._client.send(built, stream=True)
                try:
                    declared = response.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > cap:
                        raise _Abort(
                            too_large_error(family, self.api_url, endpoint, cap, int(declared))
                        )
                    chunks: list[bytes] = []
                    async for chunk in response.aiter_bytes():
                        received[0] += len(chunk)
                        if received[0] > cap:
                            raise _Abort(
                                too_large_error(family, self.api_url, endpoint, cap, received[0])
                            )
                        chunks.append(chunk)
                finally:
                    await response.aclose()
        except TimeoutError:
            if not scope.expired():
                raise
            raise _Abort(
                timeout_error(family, self.api_url, endpoint, seconds, received[0])
            ) from None
        return response.status_code, b"".join(chunks)


async def _read_capped(response: httpx.Response, cap: int) -> bytes:
    """Read at most ``cap`` bytes of a streamed body (an error answer)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk[: cap - size])
        size += len(chunks[-1])
        if size >= cap:
            break
    return b"".join(chunks)
