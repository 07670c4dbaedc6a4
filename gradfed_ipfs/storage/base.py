"""``Block`` and the async ``BlockStore`` protocol every store implements.

A block is immutable bytes plus the CID of those bytes. Stores never trust what they hand
back: ``get`` re-hashes and raises :class:`~gradfed_ipfs.errors.BlockCorrupt` on a mismatch.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Final, Protocol, Self, runtime_checkable

from multiformats import CID

from .._types import CIDLike
from ..block import MAX_BLOCK_SIZE, Block

__all__ = [
    "MAX_BLOCK_SIZE",
    "UNSET",
    "StoreWrapper",
    "FETCH_CONCURRENCY",
    "AsyncClosing",
    "Block",
    "BlockStore",
    "Unset",
    "fetch_all",
    "put_many",
]


class Unset(enum.Enum):
    """Sentinel type: an argument that was not given (distinct from ``None``)."""

    UNSET = "UNSET"


UNSET: Final = Unset.UNSET
"""Pass-through default: inherit the store's setting (e.g. its timeout)."""


class AsyncClosing:
    """Mixin: ``async with store:`` closes the store on exit by awaiting ``aclose()``."""

    async def aclose(self) -> None:
        """Release resources; overridden by stores that hold any."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


@runtime_checkable
class BlockStore(Protocol):
    """An async content-addressed block store.

    Implementations: :class:`~gradfed_ipfs.storage.MemoryBlockStore` (in process) and
    :class:`~gradfed_ipfs.storage.KuboBlockStore` (a Kubo daemon over HTTP RPC). Every
    ``get`` verifies the bytes against the CID.
    """

    async def put(self, block: Block, *, pin: bool = True) -> CID:
        """Store a block (pinned by default) and return its CID."""
        ...

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        """Return the verified block for ``cid``.

        Raises ``BlockNotFound`` if no one has it (a local-only store, or Kubo's answer that it
        is not there), ``BlockTimeout`` if it did not arrive within ``timeout`` seconds (the
        store's default when not given; slow is not missing), and ``BlockCorrupt`` if the bytes
        do not match the CID.
        """
        ...

    async def has(self, cid: CIDLike) -> bool:
        """Return whether the block is held locally (never asks the network)."""
        ...

    async def delete(self, cid: CIDLike) -> None:
        """Remove a block (unpinning it first); ``BlockNotFound`` if it is not there."""
        ...

    async def pin(self, cid: CIDLike) -> None:
        """Protect a block (and, for dag-cbor roots, everything it links) from GC."""
        ...

    async def unpin(self, cid: CIDLike) -> None:
        """Remove a pin; the block stays until garbage collection."""
        ...

    async def list_cids(self) -> list[CID]:
        """Return the CIDs of every locally held block."""
        ...

    async def aclose(self) -> None:
        """Release connections; the store must not be used afterwards."""
        ...


class StoreWrapper:
    """A :class:`BlockStore` passing every call to ``store``; subclasses change some of them.

    :meth:`aclose` does nothing: the wrapped store belongs to the caller.
    """

    def __init__(self, store: BlockStore) -> None:
        self.store = store

    async def put(self, block: Block, *, pin: bool = True) -> CID:
        """As the wrapped store's."""
        return await self.store.put(block, pin=pin)

    async def put_many(self, blocks: Sequence[Block], *, pin: bool = True) -> list[CID]:
        """As the wrapped store's :func:`put_many` unless a subclass changes ``put``.

        A subclass that changes ``put`` (a gate, a forced ``pin=False``) gets its ``put`` per
        block instead, so batching never bypasses it.
        """
        if type(self).put is not StoreWrapper.put:
            return await _put_each(self, blocks, pin)
        return await put_many(self.store, blocks, pin=pin)

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        """As the wrapped store's."""
        return await self.store.get(cid, timeout=timeout)

    async def has(self, cid: CIDLike) -> bool:
        """As the wrapped store's."""
        return await self.store.has(cid)

    async def delete(self, cid: CIDLike) -> None:
        """As the wrapped store's."""
        await self.store.delete(cid)

    async def pin(self, cid: CIDLike) -> None:
        """As the wrapped store's."""
        await self.store.pin(cid)

    async def unpin(self, cid: CIDLike) -> None:
        """As the wrapped store's."""
        await self.store.unpin(cid)

    async def list_cids(self) -> list[CID]:
        """As the wrapped store's."""
        return await self.store.list_cids()

    async def aclose(self) -> None:
        """Nothing: the wrapped store belongs to the caller."""


async def put_many(store: BlockStore, blocks: Sequence[Block], *, pin: bool = True) -> list[CID]:
    """Store ``blocks`` and return their CIDs, in as few calls as ``store`` allows.

    A store with a ``put_many`` method (:class:`~gradfed_ipfs.storage.KuboBlockStore`: one
    ``block/put`` call for many blocks) is asked once; any other store gets concurrent ``put``
    calls. Either way every block is stored, or the first failure is raised.
    """
    batched = getattr(store, "put_many", None)
    if batched is not None:
        return list(await batched(blocks, pin=pin))
    return await _put_each(store, blocks, pin)


async def _put_each(store: BlockStore, blocks: Sequence[Block], pin: bool) -> list[CID]:
    return list(await asyncio.gather(*(store.put(block, pin=pin) for block in blocks)))


FETCH_CONCURRENCY: Final = 16
"""Blocks :func:`fetch_all` fetches at once."""


async def fetch_all(store: BlockStore, links: Iterable[CID]) -> list[Block]:
    """Fetch blocks concurrently (at most :data:`FETCH_CONCURRENCY` at once), in order."""
    semaphore = asyncio.Semaphore(FETCH_CONCURRENCY)

    async def fetch(link: CID) -> Block:
        async with semaphore:
            return await store.get(link)

    return list(await asyncio.gather(*(fetch(link) for link in links)))
