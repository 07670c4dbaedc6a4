"""``MemoryBlockStore``: an in-process block store for offline use and unit tests."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import dag_cbor
from multiformats import CID

from .._types import CIDLike
from ..cid import DAG_CBOR, cid_to_str, parse_cid
from ..errors import BlockNotFound, BlockTooLarge
from .base import MAX_BLOCK_SIZE, UNSET, AsyncClosing, Block, Unset

__all__ = ["MemoryBlockStore"]


class MemoryBlockStore(AsyncClosing):
    """A dict of CID → bytes that behaves like a :class:`~gradfed_ipfs.storage.BlockStore`.

    Blocks are verified on ``put`` (unless this process hashed them: ``Block.hashed``) and
    again on ``get``, always (so tests that tamper with
    :attr:`blocks` see ``BlockCorrupt``). ``get`` of a missing block raises ``BlockNotFound`` at
    once (there is no network to wait for) unless ``wait_for_puts`` says to wait for its put.
    Pins are tracked; :meth:`collect_garbage` drops the blocks no pin protects (a pinned
    dag-cbor block protects what it links, as in Kubo).

    Parameters
    ----------
    max_block_size
        Largest accepted block in bytes (default 2 MiB, as Kubo).
    wait_for_puts
        Seconds (at most the call's ``timeout``) a ``get`` of a missing block waits for a put
        of it before ``BlockNotFound``, as Kubo's waits for bitswap: simulated members that
        announce a CID before its put lands (``AgreedSession`` does) then fetch it once, not
        fail and retry. 0: not at all.
    """

    def __init__(self, *, max_block_size: int = MAX_BLOCK_SIZE, wait_for_puts: float = 0.0) -> None:
        self.max_block_size = max_block_size
        self.wait_for_puts = wait_for_puts
        self._puts: dict[bytes, asyncio.Event] = {}  # a missing block's get -> set by its put
        self.blocks: dict[bytes, tuple[CID, bytes]] = {}
        self.pins: set[bytes] = set()
        self.direct: set[bytes] = set()  # pins that do not protect linked blocks

    async def put(self, block: Block, *, pin: bool = True) -> CID:
        """Store a verified block; see :meth:`BlockStore.put`."""
        if len(block.data) > self.max_block_size:
            raise BlockTooLarge(
                f"block of {len(block.data)} bytes exceeds {self.max_block_size}", cid=block.cid
            )
        if not block.hashed:  # a block this process hashed (Block.new) is not hashed twice
            block.verify()
        key = bytes(block.cid)
        self.blocks[key] = (block.cid, block.data)
        waited = self._puts.pop(key, None)
        if waited is not None:
            waited.set()
        if pin:
            self.pins.add(key)
            self.direct.discard(key)
        await asyncio.sleep(0)  # yield like real I/O, so concurrency bugs show up in unit tests
        return block.cid

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        """Return the verified block; ``BlockNotFound`` if absent (see ``wait_for_puts``)."""
        parsed = parse_cid(cid)
        key = bytes(parsed)
        await asyncio.sleep(0)
        found = self.blocks.get(key)
        if found is None and self.wait_for_puts > 0:
            wait = self.wait_for_puts
            if not isinstance(timeout, Unset):
                wait = min(timeout, wait)
            put = self._puts.setdefault(key, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(put.wait(), wait)
            if self._puts.get(key) is put and not put.is_set():
                del self._puts[key]  # not put in time: forget the wait
            found = self.blocks.get(key)
        if found is None:
            raise BlockNotFound(f"Block not found for CID {cid_to_str(parsed)}", cid=parsed)
        return Block.from_parts(parsed, found[1])

    async def has(self, cid: CIDLike) -> bool:
        """Return whether the block is stored."""
        return bytes(parse_cid(cid)) in self.blocks

    async def delete(self, cid: CIDLike) -> None:
        """Remove a block and its pin; ``BlockNotFound`` if absent."""
        parsed = parse_cid(cid)
        key = bytes(parsed)
        if key not in self.blocks:
            raise BlockNotFound(f"Block not found for CID {cid_to_str(parsed)}", cid=parsed)
        del self.blocks[key]
        self.pins.discard(key)
        self.direct.discard(key)

    async def pin(self, cid: CIDLike, *, recursive: bool = True) -> None:
        """Pin a stored block (a direct pin protects it alone); ``BlockNotFound`` if absent."""
        parsed = parse_cid(cid)
        if bytes(parsed) not in self.blocks:
            raise BlockNotFound(f"cannot pin missing block {cid_to_str(parsed)}", cid=parsed)
        self.pins.add(bytes(parsed))
        if recursive:
            self.direct.discard(bytes(parsed))
        else:
            self.direct.add(bytes(parsed))

    async def unpin(self, cid: CIDLike) -> None:
        """Remove a pin (a no-op for an unpinned block)."""
        self.pins.discard(bytes(parse_cid(cid)))
        self.direct.discard(bytes(parse_cid(cid)))

    async def is_pinned(self, cid: CIDLike) -> bool:
        """Return whether the block is pinned."""
        return bytes(parse_cid(cid)) in self.pins

    async def list_cids(self) -> list[CID]:
        """Return every stored CID, in insertion order."""
        return [cid for cid, _ in self.blocks.values()]

    async def collect_garbage(self) -> int:
        """Drop the blocks no pin protects (directly or via dag-cbor links); return how many."""
        live: set[bytes] = set()
        todo = [key for key in self.pins if key in self.blocks]
        while todo:
            key = todo.pop()
            if key in live:
                continue
            live.add(key)
            cid, data = self.blocks[key]
            if cid.codec.code == DAG_CBOR and key not in self.direct:
                todo.extend(k for k in _links(dag_cbor.decode(data)) if k in self.blocks)
        dead = [key for key in self.blocks if key not in live]
        for key in dead:
            del self.blocks[key]
        await asyncio.sleep(0)
        return len(dead)

    async def repo_size(self) -> int:
        """Return the bytes of every stored block."""
        return sum(len(data) for _, data in self.blocks.values())

    def __len__(self) -> int:
        return len(self.blocks)


def _links(value: Any) -> list[bytes]:
    """Return the CID bytes of every link inside a decoded dag-cbor value."""
    if isinstance(value, CID):
        return [bytes(value)]
    if isinstance(value, dict):
        return [key for item in value.values() for key in _links(item)]
    if isinstance(value, list):
        return [key for item in value for key in _links(item)]
    return []
