"""A gradient or model encoded once: its CID known before any I/O, its blocks stored later.

:func:`encode_gradient` runs :func:`~gradfed_ipfs.storage.dag.put_gradient` against a
collecting stand-in store, so the CID is exactly what ``put_gradient`` gives (raw block or
chunked DAG) and each block is encoded and hashed once; :meth:`EncodedGradient.store` then
writes the same blocks to a real store (chunks unpinned, the root pinned: recursive).
With ``compression`` the blocks are packed (:mod:`gradfed_ipfs.formats.packed`), and
:meth:`EncodedGradient.decoded` is what every peer decodes them to (the sent values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
from multiformats import CID

from ..._types import CIDLike, FloatArray, GradientLike
from ...block import Block
from ...cid import RAW
from ...formats.manifest import ChunkManifest
from ...formats.packed import decode_packed_chunk
from ...storage.base import UNSET, BlockStore, Unset, put_many
from ...storage.dag import DEFAULT_CHUNK_BYTES, put_gradient
from ...tensor.codecs import Codec
from ...tensor.packing import PackSpec

__all__ = ["EncodedGradient", "encode_gradient"]


class _Collector:
    """Receives ``put`` calls only, keeping the blocks and whether each was to be pinned."""

    def __init__(self) -> None:
        self.blocks: list[tuple[Block, bool]] = []

    async def put(self, block: Block, *, pin: bool = True) -> CID:
        self.blocks.append((block, pin))
        return block.cid

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        raise NotImplementedError  # pragma: no cover - put_gradient only puts


@dataclass(frozen=True)
class EncodedGradient:
    """A gradient's CID and its blocks (the root last)."""

    cid: CID
    blocks: tuple[tuple[Block, bool], ...]

    async def store(self, store: BlockStore) -> CID:
        """Put every block into ``store`` (the chunks in one batch, then the root); return the CID.

        On Kubo the chunks go in one ``block/put`` call
        (:func:`~gradfed_ipfs.storage.base.put_many`), not one per chunk: a sliced round's
        contributions have N chunks each.
        """
        *chunks, (root, pin) = self.blocks
        for keep in (False, True):  # put_gradient puts chunks unpinned; grouped by pin anyway
            group = [block for block, p in chunks if p is keep]
            if group:
                await put_many(store, group, pin=keep)
        await store.put(root, pin=pin)
        return self.cid

    @property
    def nbytes(self) -> int:
        """Bytes of every block (chunks and root): what storing it sends."""
        return sum(len(block.data) for block, _ in self.blocks)

    def decoded(self, packing: PackSpec, length: int) -> FloatArray:
        """Return the ``length`` float32 values the packed blocks decode to (on any peer)."""
        root = self.blocks[-1][0]
        if root.cid.codec.code == RAW:
            return decode_packed_chunk(root.data, packing, 0, length, length)
        data = {bytes(block.cid): block.data for block, _ in self.blocks}
        out = np.empty(length, np.float32)
        for ref in ChunkManifest.decode(root.data, max_length=length).chunks:
            values = decode_packed_chunk(
                data[bytes(ref.cid)], packing, ref.offset, ref.length, length
            )
            out[ref.offset : ref.stop] = values
        return out


async def encode_gradient(
    values: GradientLike,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    compression: Codec | None = None,
    exact_tail: int = 0,
) -> EncodedGradient:
    """Encode a flat float32 gradient exactly as ``put_gradient`` stores it; no I/O."""
    collector = _Collector()
    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    cid = await put_gradient(
        cast(BlockStore, collector), flat, chunk_bytes=chunk_bytes,
        compression=compression, exact_tail=exact_tail,
    )  # fmt: skip
    return EncodedGradient(cid, tuple(collector.blocks))
