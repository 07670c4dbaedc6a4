"""Content-addressed block stores: the protocol, an in-memory store and a Kubo-backed store."""

from .base import MAX_BLOCK_SIZE, UNSET, Block, BlockStore, Unset
from .kubo import KuboBlockStore
from .memory import MemoryBlockStore

__all__ = [
    "MAX_BLOCK_SIZE",
    "UNSET",
    "Block",
    "BlockStore",
    "KuboBlockStore",
    "MemoryBlockStore",
    "Unset",
]
