"""``KuboBlockStore``: a :class:`BlockStore` on a Kubo daemon's HTTP RPC API (``/api/v0``).

Every call goes through the one RPC client, :class:`~gradfed_ipfs.kubo.rpc.KuboRpc`, with the
block store's error family: every failure leaves as a
:class:`~gradfed_ipfs.errors.BlockStoreError` with ``api_url``, ``endpoint`` and ``cid`` set, a
``block/get`` answer is capped at Kubo's block limit plus slack while it streams in, and each
call has a total deadline. Facts about the RPC API this module respects:

- ``block/get`` of a missing block waits forever unless given ``timeout=`` (we always give one,
  and our own deadline is that timeout plus :data:`~gradfed_ipfs.kubo.rpc.DEADLINE_GRACE`);
- ``block/stat`` with ``offline=true`` answers from the local repo only (that is ``has``);
- ``block/rm`` reports per-block errors inside an HTTP 200 NDJSON body;
- ``block/put`` refuses blocks over 2 MiB, which we refuse before sending;
- ``block/put`` takes several multipart files in one call (one codec for all) and answers one
  JSON line per stored block; a refused block ends the answer early (its error goes into a
  trailer), so an answer with fewer lines than blocks is a refusal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from multiformats import CID

from .._types import CIDLike
from ..cid import DAG_CBOR, RAW, cid_to_str, parse_cid
from ..errors import (
    BlockCorrupt,
    BlockNotFound,
    BlockStoreError,
    BlockTimeout,
    BlockTooLarge,
    GradfedError,
    StoreRequestError,
    StoreResponseTooLarge,
    StoreTimeout,
    StoreUnavailable,
)
from ..formats.rpc import iter_ndjson
from ..kubo.http1 import QueryParams
from ..kubo.rpc import DEADLINE_GRACE, KuboRpc, Transport
from ..kubo.rpc_errors import ErrorFamily
from .base import MAX_BLOCK_SIZE, UNSET, AsyncClosing, Block, Unset

__all__ = [
    "MAX_PUT_BATCH_BYTES",
    "STORE_ERRORS",
    "KuboBlockStore",
    "encode_block_put",
    "encode_block_put_many",
    "rpc_context",
]

MAX_PUT_BATCH_BYTES: Final = 8 * 1024 * 1024
"""Most block bytes one batched ``block/put`` call carries (:meth:`KuboBlockStore.put_many`)."""
GC_DEADLINE: Final = 600.0
"""Seconds one ``repo/gc`` may take (it walks every pin; the retention gate bounds the rest)."""

_CODEC_PARAM: Final = {RAW: "raw", DAG_CBOR: "dag-cbor"}
# Markers in Kubo's error messages that mean "this block is not here" rather than a failure.
_NOT_FOUND_MARKERS: Final = ("not found", "could not find")
# Kubo's answer when a block did not arrive within `timeout=`: slow or missing, it cannot tell.
_TIMEOUT_MARKERS: Final = ("context deadline exceeded",)
# With Datastore.HashOnRead, Kubo itself detects a corrupted block on disk and says so.
_CORRUPT_MARKERS: Final = ("different hash than requested",)


def _refused(message: str) -> GradfedError:
    """Classify Kubo's refusal: a corrupted block, a missing one, or another error."""
    lowered = message.lower()
    if any(marker in lowered for marker in _CORRUPT_MARKERS):
        return BlockCorrupt(f"daemon reports a corrupted block: {message}")
    if any(marker in lowered for marker in _NOT_FOUND_MARKERS):
        return BlockNotFound(f"block not found: {message}")
    if any(marker in lowered for marker in _TIMEOUT_MARKERS):
        return BlockTimeout(f"{message} (still on its way, or nowhere: Kubo cannot tell)")
    return StoreRequestError(message)


STORE_ERRORS: Final = ErrorFamily(
    unavailable=StoreUnavailable,
    timeout=StoreTimeout,
    too_large=StoreResponseTooLarge,
    refused=_refused,
)
"""The block store's error family for :class:`~gradfed_ipfs.kubo.rpc.KuboRpc` calls."""


def encode_block_put(block: Block, *, pin: bool) -> tuple[dict[str, str], dict[str, Any]]:
    """Return the query parameters and multipart files of a ``block/put`` for ``block``."""
    codec = _CODEC_PARAM.get(block.cid.codec.code)
    if codec is None:
        raise BlockStoreError(f"unsupported codec {block.cid.codec.name}", cid=block.cid)
    params = {"cid-codec": codec, "mhtype": "sha2-256", "pin": "true" if pin else "false"}
    files = {"file": ("block", block.data, "application/octet-stream")}
    return params, files


def encode_block_put_many(
    blocks: Sequence[Block], *, pin: bool
) -> tuple[dict[str, str], dict[str, Any]]:
    """Return the query parameters and multipart files of one ``block/put`` for ``blocks``.

    Every block must have the first one's codec (``cid-codec`` is one parameter per call).
    """
    params, _ = encode_block_put(blocks[0], pin=pin)
    if any(b.cid.codec.code != blocks[0].cid.codec.code for b in blocks):
        raise BlockStoreError("one block/put call takes blocks of one codec", cid=blocks[0].cid)
    kind = "application/octet-stream"
    files = {f"file{i}": ("block", b.data, kind) for i, b in enumerate(blocks)}
    return params, files


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


def _check_stored(answer: Mapping[str, Any], block: Block) -> None:
    """Raise ``BlockCorrupt`` unless Kubo's ``block/put`` answer names the block's CID."""
    key = parse_cid(str(answer.get("Key", "")))
    if bytes(key) != bytes(block.cid):
        raise BlockCorrupt(f"daemon stored the bytes as {key}, expected {block.cid}")


class KuboBlockStore(AsyncClosing):
    """A block store on a Kubo daemon, over one :class:`~gradfed_ipfs.kubo.rpc.KuboRpc`.

    Parameters
    ----------
    api_url
        The daemon's RPC base URL, e.g. ``http://127.0.0.1:5001``.
    timeout
        Default seconds a ``get`` may wait for a block (passed to Kubo as ``timeout=``; fetching
        from peers over bitswap happens inside it) and the deadline of every other call.
    retries
        Connection attempts after the first one before :class:`StoreUnavailable`.
    backoff
        First retry delay in seconds; doubles per attempt.
    transport
        An ``httpx`` transport to use instead of the network (e.g. ``httpx.MockTransport``).
    max_block_size
        Largest block accepted by ``put`` (Kubo's limit, 2 MiB).
    rpc
        A shared RPC client (e.g. a :class:`~gradfed_ipfs.Node`'s); the store then does not
        close it. By default the store makes and owns one.
    """

    def __init__(
        self,
        api_url: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.1,
        transport: Transport | None = None,
        max_block_size: int = MAX_BLOCK_SIZE,
        rpc: KuboRpc | None = None,
    ) -> None:
        if timeout is None or not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        self.api_url = api_url.rstrip("/")
        self.timeout = float(timeout)
        self.retries = retries
        self.backoff = backoff
        self.max_block_size = max_block_size
        self._owns_rpc = rpc is None
        self.rpc = rpc or KuboRpc(
            self.api_url, timeout=self.timeout + DEADLINE_GRACE, transport=transport
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
            self._refuse_oversized(block, "commit large gradients as chunked DAGs")
            params, files = encode_block_put(block, pin=pin)
            _check_stored(await self._post_json("block/put", params, files=files), block)
            return block.cid

    def _refuse_oversized(self, block: Block, advice: str) -> None:
        """Raise ``BlockTooLarge`` for a block over ``max_block_size`` (before anything is sent)."""
        if len(block.data) > self.max_block_size:
            raise BlockTooLarge(
                f"block of {len(block.data)} bytes exceeds Kubo's {self.max_block_size}-byte "
                f"limit; {advice}"
            )

    async def put_many(self, blocks: Sequence[Block], *, pin: bool = True) -> list[CID]:
        """``block/put`` several blocks per call (one codec and up to ``MAX_PUT_BATCH_BYTES``).

        A commit of a chunked gradient is one call instead of one per chunk. Calls go one after
        another; each checks that Kubo stored every block under the expected CID.

        Raises
        ------
        BlockTooLarge
            If a block is over ``max_block_size`` (nothing is sent).
        BlockCorrupt
            If Kubo computed a different CID for a block.
        StoreRequestError
            If Kubo refused a block (those before it in its call are stored).
        StoreUnavailable
            If the daemon is unreachable.
        """
        for block in blocks:
            with rpc_context(self.api_url, "block/put", block.cid):
                self._refuse_oversized(block, "nothing of the batch was sent")
        batch: list[Block] = []
        size = 0
        for block in blocks:
            if batch and (
                size + len(block.data) > MAX_PUT_BATCH_BYTES
                or block.cid.codec.code != batch[0].cid.codec.code
            ):
                await self._put_batch(batch, pin)
                batch, size = [], 0
            batch.append(block)
            size += len(block.data)
        if batch:
            await self._put_batch(batch, pin)
        return [block.cid for block in blocks]

    async def _put_batch(self, blocks: list[Block], pin: bool) -> None:
        """One ``block/put`` call storing ``blocks`` (one codec); check every answer line."""
        with rpc_context(self.api_url, "block/put", blocks[0].cid):
            params, files = encode_block_put_many(blocks, pin=pin)
            answers = await self.rpc.post_ndjson(
                "block/put",
                params,
                files=files,
                retries=self.retries,
                backoff=self.backoff,
                errors=STORE_ERRORS,
                deadline=self.timeout + DEADLINE_GRACE,
            )
        for i, block in enumerate(blocks):
            with rpc_context(self.api_url, "block/put", block.cid):
                if i >= len(answers):
                    raise StoreRequestError(
                        f"Kubo stored {len(answers)} of {len(blocks)} blocks of one block/put "
                        f"call and refused block {i} ({len(block.data)} bytes)"
                    )
                _check_stored(answers[i], block)
        if len(answers) != len(blocks):
            raise StoreRequestError(
                f"Kubo answered {len(answers)} lines to a block/put of {len(blocks)} blocks"
            )

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        """``block/get`` with a timeout, then re-hash the bytes against the CID.

        The whole call ends within ``timeout`` + :data:`~gradfed_ipfs.kubo.rpc.DEADLINE_GRACE`
        seconds (per connection attempt), and an answer over the block cap is refused unread.

        Raises
        ------
        BlockTimeout
            If neither this daemon nor its peers produce the block within ``timeout`` seconds
            (Kubo cannot tell a slow block from a missing one; never ``BlockNotFound``).
        BlockCorrupt
            If the bytes do not hash to ``cid``.
        StoreTimeout
            If the answer did not complete within the deadline (a stalled or trickling daemon).
        StoreResponseTooLarge
            If the answer is larger than any block can be.
        """
        if timeout is None:
            raise ValueError("block/get needs a timeout; a missing block would wait forever")
        seconds = self.timeout if isinstance(timeout, Unset) else float(timeout)
        parsed = parse_cid(cid)
        with rpc_context(self.api_url, "block/get", parsed):
            try:
                data = await self._post(
                    "block/get",
                    {"arg": cid_to_str(parsed), "timeout": f"{seconds:.3f}s"},
                    deadline=seconds + DEADLINE_GRACE,
                )
            except BlockTimeout as exc:
                exc.args = (f"block did not arrive within {seconds:g} s; {exc.args[0]}",)
                exc.deadline = seconds
                raise
            return Block.from_parts(parsed, data)

    async def has(self, cid: CIDLike) -> bool:
        """Return whether the block is in the local repo (``block/stat`` with ``offline=true``)."""
        parsed = parse_cid(cid)
        with rpc_context(self.api_url, "block/stat", parsed):
            try:
                await self._post("block/stat", {"arg": cid_to_str(parsed), "offline": "true"})
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
                await self._post("pin/rm", {"arg": cid_to_str(parsed)})
            await self._post("block/rm", {"arg": cid_to_str(parsed)}, streamed=True)

    async def pin(self, cid: CIDLike, *, recursive: bool = True) -> None:
        """``pin/add``: recursive (a dag-cbor root pins every block it links) or direct."""
        await self.pin_many([cid], recursive=recursive)

    async def pin_many(self, cids: Sequence[CIDLike], *, recursive: bool = True) -> None:
        """One ``pin/add`` call for ``cids`` (each pinned as :meth:`pin` pins it)."""
        parsed = [parse_cid(cid) for cid in cids]
        if not parsed:
            return
        with rpc_context(self.api_url, "pin/add", parsed[0]):
            await self._post(
                "pin/add",
                {
                    "arg": [cid_to_str(cid) for cid in parsed],
                    "recursive": "true" if recursive else "false",
                    "timeout": f"{self.timeout:.3f}s",
                },
            )

    async def unpin(self, cid: CIDLike) -> None:
        """``pin/rm``; unpinning a block that is not pinned is a no-op."""
        parsed = parse_cid(cid)
        with rpc_context(self.api_url, "pin/rm", parsed):
            try:
                await self._post("pin/rm", {"arg": cid_to_str(parsed)})
            except StoreRequestError as exc:
                if "not pinned" not in str(exc):
                    raise

    async def is_pinned(self, cid: CIDLike) -> bool:
        """Return whether the CID is pinned directly, recursively or indirectly (``pin/ls``)."""
        parsed = parse_cid(cid)
        with rpc_context(self.api_url, "pin/ls", parsed):
            try:
                await self._post("pin/ls", {"arg": cid_to_str(parsed)})
            except StoreRequestError as exc:
                if "not pinned" in str(exc):
                    return False
                raise
            return True

    async def list_cids(self) -> list[CID]:
        """``refs/local``: every block in the local repo."""
        with rpc_context(self.api_url, "refs/local"):
            data = await self._post("refs/local", {})
            return [parse_cid(item["Ref"]) for item in iter_ndjson(data) if item.get("Ref")]

    async def collect_garbage(self) -> int:
        """``repo/gc``: remove every unpinned block from the repo; return how many went.

        Run it through :class:`~gradfed_ipfs.storage.retention.GcGate` so it never races a
        fetch or a multi-block put (Kubo drops fetched-but-unpinned blocks too).
        """
        with rpc_context(self.api_url, "repo/gc"):
            removed = await self.rpc.post_ndjson(
                "repo/gc",
                {},
                retries=self.retries,
                backoff=self.backoff,
                errors=STORE_ERRORS,
                deadline=GC_DEADLINE,
            )
            return sum(1 for item in removed if isinstance(item, dict) and item.get("Key"))

    async def repo_size(self) -> int:
        """``repo/stat``: the repo's size on disk in bytes (``RepoSize``)."""
        with rpc_context(self.api_url, "repo/stat"):
            answer = await self._post_json("repo/stat", {"size-only": "true"})
            size = answer.get("RepoSize")
            if not isinstance(size, int) or size < 0:
                raise StoreRequestError(
                    f"Kubo answered repo/stat without a RepoSize: {answer!r:.200}"
                )
            return size

    async def peer_id(self) -> str:
        """Return the daemon's peer ID (``id``)."""
        with rpc_context(self.api_url, "id"):
            return str((await self._post_json("id", {}))["ID"])

    async def aclose(self) -> None:
        """Close the RPC client (if this store created it)."""
        if self._owns_rpc:
            await self.rpc.aclose()

    # ------------------------------------------------------------------ transport

    async def _post(self, endpoint: str, params: QueryParams, **options: Any) -> bytes:
        """One call with the store's retries and error family."""
        return await self.rpc.post(
            endpoint,
            params,
            retries=self.retries,
            backoff=self.backoff,
            errors=STORE_ERRORS,
            deadline=options.pop("deadline", self.timeout + DEADLINE_GRACE),
            **options,
        )

    async def _post_json(self, endpoint: str, params: dict[str, str], **options: Any) -> Any:
        answer = await self.rpc.post_json(
            endpoint,
            params,
            retries=self.retries,
            backoff=self.backoff,
            errors=STORE_ERRORS,
            deadline=self.timeout + DEADLINE_GRACE,
            **options,
        )
        if not isinstance(answer, dict):
            raise StoreRequestError(
                f"Kubo answered {endpoint} with unexpected JSON: {answer!r:.200}"
            )
        return answer
