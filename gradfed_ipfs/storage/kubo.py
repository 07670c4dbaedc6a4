"""``KuboBlockStore``: a :class:`BlockStore` on a Kubo daemon's HTTP RPC API (``/api/v0``).

This module and ``pubsub.py`` are the only places that catch ``httpx`` errors; every failure
leaves here as a :class:`~gradfed_ipfs.errors.BlockStoreError` with ``api_url``, ``endpoint`` and
``cid`` set. Facts about the RPC API this module respects:

- every call is a POST;
- ``block/get`` of a missing block waits forever unless given ``timeout=`` (we always give one);
- ``block/stat`` with ``offline=true`` answers from the local repo only (that is ``has``);
- ``block/rm`` reports per-block errors inside an HTTP 200 NDJSON body;
- ``block/put`` refuses blocks over 2 MiB, which we refuse before sending.

The request building and answer parsing are pure functions (``encode_block_put``,
``parse_rpc_error``, ``iter_ndjson``) tested on bytes; each store method is one POST plus one
of those.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any, Final

import httpx
from multiformats import CID

from .._types import CIDLike
from ..cid import DAG_CBOR, RAW, parse_cid
from ..errors import (
    BlockCorrupt,
    BlockNotFound,
    BlockStoreError,
    BlockTooLarge,
    DecodeError,
    StoreRequestError,
    StoreUnavailable,
)
from .base import MAX_BLOCK_SIZE, UNSET, AsyncClosing, Block, Unset

__all__ = [
    "KuboBlockStore",
    "encode_block_put",
    "iter_ndjson",
    "parse_rpc_error",
    "rpc_context",
]

logger = logging.getLogger("gradfed_ipfs.storage")

_CODEC_PARAM: Final = {RAW: "raw", DAG_CBOR: "dag-cbor"}
# Markers in Kubo's error messages that mean "this block is not here" rather than a failure.
_NOT_FOUND_MARKERS: Final = ("not found", "could not find", "context deadline exceeded")
# With Datastore.HashOnRead, Kubo itself detects a corrupted block on disk and says so.
_CORRUPT_MARKERS: Final = ("different hash than requested",)


def encode_block_put(block: Block, *, pin: bool) -> tuple[dict[str, str], dict[str, Any]]:
    """Return the query parameters and multipart files of a ``block/put`` for ``block``."""
    codec = _CODEC_PARAM.get(block.cid.codec.code)
    if codec is None:
        raise BlockStoreError(f"unsupported codec {block.cid.codec.name}", cid=block.cid)
    params = {"cid-codec": codec, "mhtype": "sha2-256", "pin": "true" if pin else "false"}
    files = {"file": ("block", block.data, "application/octet-stream")}
    return params, files


def iter_ndjson(body: bytes | str) -> Iterator[dict[str, Any]]:
    """Yield each JSON object of a newline-delimited JSON body (blank lines skipped).

    Raises
    ------
    DecodeError
        If a line is not a JSON object.
    """
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise DecodeError(f"not NDJSON: {line[:80]!r}") from exc
        if not isinstance(item, dict):
            raise DecodeError(f"NDJSON line is not an object: {line[:80]!r}")
        yield item


def parse_rpc_error(status: int, body: bytes | str, *, streamed: bool = False) -> str | None:
    """Return Kubo's error message for an answer, or ``None`` when it is a success.

    Kubo signals errors either with a non-200 status and a ``{"Message", "Type": "error"}`` body,
    or (streaming endpoints such as ``block/rm``, flagged by ``streamed``) with HTTP 200 and
    ``Error`` fields in NDJSON lines. A 200 answer of any other endpoint is a success whatever
    its bytes are (``block/get`` returns raw block data, which must not be parsed).
    """
    if status == 200 and not streamed:
        return None
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    if status != 200:
        try:
            answer = json.loads(text)
        except ValueError:
            return f"HTTP {status}: {text.strip()[:500]}"
        if isinstance(answer, dict) and answer.get("Message"):
            return str(answer["Message"])
        return f"HTTP {status}: {text.strip()[:500]}"
    with contextlib.suppress(DecodeError):
        for item in iter_ndjson(text):
            if item.get("Error"):
                return str(item["Error"])
            if item.get("Type") == "error" and item.get("Message"):
                return str(item["Message"])
    return None


@contextlib.contextmanager
def rpc_context(api_url: str, endpoint: str, cid: object | None = None) -> Iterator[None]:
    """Stamp ``api_url``, ``endpoint`` and ``cid`` onto any ``BlockStoreError`` raised inside."""
    try:
        yield
    except BlockStoreError as exc:
        exc.api_url = exc.api_url or api_url
        exc.endpoint = exc.endpoint or endpoint
        if exc.cid is None:
            exc.cid = cid
        raise


def _is_not_found(message: str) -> bool:
    lowered = message.lower()
    return any(marker in lowered for marker in _NOT_FOUND_MARKERS)


class KuboBlockStore(AsyncClosing):
    """A block store on a Kubo daemon, over one shared ``httpx.AsyncClient``.

    Parameters
    ----------
    api_url
        The daemon's RPC base URL, e.g. ``http://127.0.0.1:5001``.
    timeout
        Default seconds a ``get`` may wait for a block (passed to Kubo as ``timeout=``; fetching
        from peers over bitswap happens inside it) and the bound of every other call.
    retries
        Connection attempts after the first one before :class:`StoreUnavailable`.
    backoff
        First retry delay in seconds; doubles per attempt.
    transport
        An ``httpx`` transport to use instead of the network (e.g. ``httpx.MockTransport``).
    max_block_size
        Largest block accepted by ``put`` (Kubo's limit, 2 MiB).
    """

    def __init__(
        self,
        api_url: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.1,
        transport: httpx.AsyncBaseTransport | None = None,
        max_block_size: int = MAX_BLOCK_SIZE,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if timeout is None or not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        self.api_url = api_url.rstrip("/")
        self.timeout = float(timeout)
        self.retries = retries
        self.backoff = backoff
        self.max_block_size = max_block_size
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            base_url=f"{self.api_url}/api/v0",
            transport=transport,
            timeout=httpx.Timeout(self.timeout + 10.0, connect=5.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )

    # ------------------------------------------------------------------ BlockStore

    async def put(self, block: Block, *, pin: bool = True) -> CID:
        """``block/put`` (codec from the CID, sha2-256, pinned by default); return the CID.

        Raises
        ------
        BlockTooLarge
            If the block is over ``max_block_size`` (nothing is sent).
        BlockCorrupt
            If Kubo computed a different CID for the bytes.
        StoreUnavailable, StoreRequestError
            If the daemon is unreachable or refuses the block.
        """
        with rpc_context(self.api_url, "block/put", block.cid):
            if len(block.data) > self.max_block_size:
                raise BlockTooLarge(
                    f"block of {len(block.data)} bytes exceeds Kubo's {self.max_block_size}-byte "
                    "limit; commit large gradients as chunked DAGs"
                )
            params, files = encode_block_put(block, pin=pin)
            response = await self._post("block/put", params, files=files)
            key = parse_cid(str(_json(response).get("Key", "")))
            if bytes(key) != bytes(block.cid):
                raise BlockCorrupt(f"daemon stored the bytes as {key}, expected {block.cid}")
            return block.cid

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        """``block/get`` with a timeout, then re-hash the bytes against the CID.

        Raises
        ------
        BlockNotFound
            If neither this daemon nor its peers produce the block within ``timeout`` seconds.
        BlockCorrupt
            If the bytes do not hash to ``cid``.
        """
        if timeout is None:
            raise ValueError("block/get needs a timeout; a missing block would wait forever")
        seconds = self.timeout if isinstance(timeout, Unset) else float(timeout)
        parsed = parse_cid(cid)
        with rpc_context(self.api_url, "block/get", parsed):
            response = await self._post(
                "block/get",
                {"arg": str(parsed), "timeout": f"{seconds:.3f}s"},
                read_timeout=seconds + 10.0,
            )
            return Block.from_parts(parsed, response.content)

    async def has(self, cid: CIDLike) -> bool:
        """Return whether the block is in the local repo (``block/stat`` with ``offline=true``)."""
        parsed = parse_cid(cid)
        with rpc_context(self.api_url, "block/stat", parsed):
            try:
                await self._post("block/stat", {"arg": str(parsed), "offline": "true"})
            except BlockNotFound:
                return False
            return True

    async def delete(self, cid: CIDLike) -> None:
        """Unpin (if pinned) and ``block/rm`` the block.

        Raises
        ------
        BlockNotFound
            If the block is not in the local repo.
        """
        parsed = parse_cid(cid)
        with rpc_context(self.api_url, "block/rm", parsed):
            with contextlib.suppress(StoreRequestError):
                await self._post("pin/rm", {"arg": str(parsed)})
            await self._post("block/rm", {"arg": str(parsed)}, streamed=True)

    async def pin(self, cid: CIDLike, *, recursive: bool = True) -> None:
        """``pin/add``: recursive by default (a dag-cbor root pins every block it links)."""
        parsed = parse_cid(cid)
        with rpc_context(self.api_url, "pin/add", parsed):
            await self._post(
                "pin/add",
                {
                    "arg": str(parsed),
                    "recursive": "true" if recursive else "false",
                    "timeout": f"{self.timeout:.3f}s",
                },
            )

    async def unpin(self, cid: CIDLike) -> None:
        """``pin/rm``; unpinning a block that is not pinned is a no-op."""
        parsed = parse_cid(cid)
        with rpc_context(self.api_url, "pin/rm", parsed):
            try:
                await self._post("pin/rm", {"arg": str(parsed)})
            except StoreRequestError as exc:
                if "not pinned" not in str(exc):
                    raise

    async def is_pinned(self, cid: CIDLike) -> bool:
        """Return whether the CID is pinned directly, recursively or indirectly (``pin/ls``)."""
        parsed = parse_cid(cid)
        with rpc_context(self.api_url, "pin/ls", parsed):
            try:
                await self._post("pin/ls", {"arg": str(parsed)})
            except StoreRequestError as exc:
                if "not pinned" in str(exc):
                    return False
                raise
            return True

    async def list_cids(self) -> list[CID]:
        """``refs/local``: every block in the local repo."""
        with rpc_context(self.api_url, "refs/local"):
            response = await self._post("refs/local", {})
            return [
                parse_cid(item["Ref"]) for item in iter_ndjson(response.content) if item.get("Ref")
            ]

    async def gc(self) -> int:
        """``repo/gc``: remove every unpinned block from the repo; return how many went.

        Callers must not run it while one of their own multi-block writes is unpinned halfway
        (``put_gradient`` stores chunks before the pinned manifest).
        """
        with rpc_context(self.api_url, "repo/gc"):
            response = await self._post("repo/gc", {}, streamed=True, read_timeout=600.0)
            return sum(1 for item in iter_ndjson(response.content) if item.get("Key"))

    async def peer_id(self) -> str:
        """Return the daemon's peer ID (``id``)."""
        with rpc_context(self.api_url, "id"):
            return str(_json(await self._post("id", {}))["ID"])

    async def aclose(self) -> None:
        """Close the HTTP client (if this store created it)."""
        if self._owns_client:
            await self._client.aclose()

    # ------------------------------------------------------------------ transport

    async def _post(
        self,
        endpoint: str,
        params: Mapping[str, str],
        *,
        files: Mapping[str, Any] | None = None,
        read_timeout: float | None = None,
        streamed: bool = False,
    ) -> httpx.Response:
        """POST with bounded retries on connection failures; map every failure to our errors."""
        timeout = httpx.Timeout(read_timeout or self.timeout + 10.0, connect=5.0)
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                response = await self._client.post(
                    f"/{endpoint}", params=dict(params), files=files, timeout=timeout
                )
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as exc:
                if attempt == self.retries:
                    raise StoreUnavailable(
                        f"Kubo daemon unreachable after {attempt + 1} attempts: {exc}"
                    ) from exc
                logger.debug("POST %s failed (%s); retrying in %.2fs", endpoint, exc, delay)
                await asyncio.sleep(delay)  # backoff between reconnect attempts, not a sync
                delay *= 2
                continue
            except httpx.TimeoutException as exc:
                raise StoreUnavailable(f"Kubo daemon did not answer in time: {exc!r}") from exc
            except httpx.HTTPError as exc:
                raise StoreUnavailable(f"HTTP error talking to Kubo: {exc!r}") from exc
            logger.debug("POST %s %s -> %d", endpoint, params.get("arg", ""), response.status_code)
            message = parse_rpc_error(response.status_code, response.content, streamed=streamed)
            if message is None:
                return response
            if any(marker in message for marker in _CORRUPT_MARKERS):
                raise BlockCorrupt(f"daemon reports a corrupted block: {message}")
            if _is_not_found(message):
                raise BlockNotFound(f"block not found: {message}")
            raise StoreRequestError(f"Kubo refused {endpoint}: {message}")
        raise AssertionError("unreachable")  # pragma: no cover


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        answer = response.json()
    except ValueError as exc:
        raise StoreRequestError(f"Kubo answered with non-JSON: {response.text[:200]!r}") from exc
    if not isinstance(answer, dict):
        raise StoreRequestError(f"Kubo answered with unexpected JSON: {answer!r:.200}")
    return answer
