"""``Block`` and the async ``BlockStore`` protocol every store implements.

A block is immutable bytes plus the CID of those bytes. Stores never trust what they hand
back: ``get`` re-hashes and raises :class:`~gradfed_ipfs.errors.BlockCorrupt` on a mismatch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final, Protocol, Self, runtime_checkable

from multiformats import CID

from .._types import CIDLike
from ..cid import CodecName, make_cid, parse_cid, verify_cid
from ..errors import BlockTooLarge, InvalidGradient

__all__ = [
    "MAX_BLOCK_SIZE",
    "UNSET",
    "AsyncClosing",
    "Block",
    "BlockStore",
    "Unset",
]

MAX_BLOCK_SIZE: Final = 2 * 1024 * 1024
"""Largest block in bytes (2 MiB): Kubo's ``block/put`` limit, and the seed's ``Block`` limit."""


class Unset(enum.Enum):
    """Sentinel type: an argument that was not given (distinct from ``None``)."""

    UNSET = "UNSET"


UNSET: Final = Unset.UNSET
"""Pass-through default: inherit the store's setting (e.g. its timeout)."""


@dataclass(frozen=True, eq=False, slots=True)
class Block:
    """Immutable block bytes with their CID. Equality and hashing are by CID.

    Use :meth:`new` to hash data into a block; the constructor trusts the given CID.
    """

    cid: CID
    data: bytes = field(repr=False)

    @classmethod
    def new(cls, data: bytes, codec: CodecName | int = "raw") -> Block:
        """Hash ``data`` (1 byte … 2 MiB) into a CIDv1 sha2-256 block of the given codec.

        Raises
        ------
        BlockTooLarge
            If ``data`` is over :data:`MAX_BLOCK_SIZE` bytes.
        InvalidGradient
            If ``data`` is empty (the seed's minimum block size is one byte).
        """
        if len(data) > MAX_BLOCK_SIZE:
            raise BlockTooLarge(
                f"block of {len(data)} bytes exceeds the {MAX_BLOCK_SIZE}-byte limit; "
                "store large gradients as chunked DAGs"
            )
        if len(data) == 0:
            raise InvalidGradient("Block size 0 below minimum 1")
        return cls(make_cid(data, codec), bytes(data))

    @classmethod
    def from_parts(cls, cid: CIDLike, data: bytes, *, verify: bool = True) -> Block:
        """Build a block from a CID and bytes, re-hashing unless ``verify`` is false."""
        parsed = verify_cid(cid, data) if verify else parse_cid(cid)
        return cls(parsed, bytes(data))

    def verify(self) -> None:
        """Re-hash the data; raise :class:`BlockCorrupt` if it does not match the CID."""
        verify_cid(self.cid, self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Block) and bytes(self.cid) == bytes(other.cid)

    def __hash__(self) -> int:
        return hash(bytes(self.cid))


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

    Implementations: :class:`~gradfed_ipfs.blockstore.MemoryBlockStore` (in process) and
    :class:`~gradfed_ipfs.blockstore.KuboBlockStore` (a Kubo daemon over HTTP RPC). Every
    ``get`` verifies the bytes against the CID.
    """

    async def put(self, block: Block, *, pin: bool = True) -> CID:
        """Store a block (pinned by default) and return its CID."""
        ...

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        """Return the verified block for ``cid``.

        Raises ``BlockNotFound`` if it is not found within ``timeout`` seconds (the store's
        default when not given) and ``BlockCorrupt`` if the bytes do not match the CID.
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
