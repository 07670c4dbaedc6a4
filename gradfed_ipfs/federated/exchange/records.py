"""Records a pubsub message names: the bytes it carried inline, else fetched by CID."""

from __future__ import annotations

import contextlib

from multiformats import CID

from ...block import Block
from ...errors import BlockCorrupt
from ...storage.base import BlockStore

__all__ = ["carried_or_fetched"]


async def carried_or_fetched(
    store: BlockStore, cid: CID, carried: bytes | None, *, timeout: float
) -> Block:
    """Return the block ``cid`` names: the bytes a message carried, else fetched from ``store``.

    A message may carry a small record inline, which saves a fetch. Carried bytes that do not
    hash to ``cid`` are a forged copy: they are ignored and the record is fetched by CID.

    Raises
    ------
    BlockStoreError
        If the record has to be fetched and cannot be (within ``timeout`` seconds).
    """
    if carried is not None:
        with contextlib.suppress(BlockCorrupt):
            return Block.from_parts(cid, carried)
    return await store.get(cid, timeout=timeout)
