"""``Block``: immutable bytes plus the CID of those bytes, and the 2 MiB block limit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from multiformats import CID

from ._types import CIDLike
from .cid import CodecName, make_cid, parse_cid, verify_cid
from .errors import BlockTooLarge, InvalidGradient

__all__ = ["MAX_BLOCK_SIZE", "Block"]

MAX_BLOCK_SIZE: Final = 2 * 1024 * 1024
"""Largest block in bytes (2 MiB): Kubo's ``block/put`` limit, and the seed's ``Block`` limit."""


@dataclass(frozen=True, eq=False, slots=True)
class Block:
    """Immutable block bytes with their CID. Equality and hashing are by CID.

    Use :meth:`new` to hash data into a block; the constructor trusts the given CID.
    """

    cid: CID
    data: bytes = field(repr=False)
    hashed: bool = field(default=False, init=False, repr=False)
    """Whether this process hashed ``data`` into ``cid`` (:meth:`new`, a verifying
    :meth:`from_parts`): a store's ``put`` need not hash these bytes again. Not an argument
    (nor copied by ``dataclasses.replace``): a constructed block is never taken as hashed."""

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
        return cls(make_cid(data, codec), bytes(data))._hashed()

    @classmethod
    def from_parts(cls, cid: CIDLike, data: bytes, *, verify: bool = True) -> Block:
        """Build a block from a CID and bytes, re-hashing unless ``verify`` is false."""
        parsed = verify_cid(cid, data) if verify else parse_cid(cid)
        block = cls(parsed, bytes(data))
        return block._hashed() if verify else block

    def _hashed(self) -> Block:
        object.__setattr__(self, "hashed", True)  # frozen: set once, by new and from_parts
        return self

    def verify(self) -> None:
        """Re-hash the data; raise :class:`BlockCorrupt` if it does not match the CID."""
        verify_cid(self.cid, self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Block) and bytes(self.cid) == bytes(other.cid)

    def __hash__(self) -> int:
        return hash(bytes(self.cid))
