"""Content-addressed storage: block stores (memory, Kubo), chunked gradient DAGs, deltas."""

from __future__ import annotations

from .base import MAX_BLOCK_SIZE, UNSET, Block, BlockStore, Unset, fetch_all
from .dag import (
    DEFAULT_CHUNK_BYTES,
    ChunkManifest,
    ChunkRef,
    fetch_chunks,
    fetch_gradient,
    fetch_manifest,
    put_gradient,
)
from .delta_store import load_delta, store_delta
from .kubo import KuboBlockStore
from .memory import MemoryBlockStore
from .retention import GcGate, Retention, RetentionKeeper, RoundBlocks

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "MAX_BLOCK_SIZE",
    "UNSET",
    "Block",
    "BlockStore",
    "ChunkManifest",
    "ChunkRef",
    "GcGate",
    "KuboBlockStore",
    "MemoryBlockStore",
    "Retention",
    "RetentionKeeper",
    "RoundBlocks",
    "Unset",
    "fetch_all",
    "fetch_chunks",
    "fetch_gradient",
    "fetch_manifest",
    "load_delta",
    "put_gradient",
    "store_delta",
]
