"""Reduce-scatter rounds under retention: what a sliced round leaves in a repo, and its pins.

A sliced round must not pin what it does not hold: a slice record links every contribution
(whose chunks a peer holds only for its own slice), and a fraud record links slice records, so
a recursive pin of either would make Kubo fetch whole contributions, or make ``repo/gc`` fail
on the missing links. Under retention the reduce-scatter step therefore holds the keeper's gate
for its whole run (no collection in between), puts everything unpinned through
:class:`UnpinnedPuts`, and then :func:`keep_slice_blocks` pins

- every slice and fraud record (own, fetched, and the lying records fraud records name)
  **directly**: they are kept like rosters and round records (a few hundred bytes each);
- this peer's own slice results **recursively** (a raw block, or a manifest of chunks it put):
  they, and the fetched slice results, go to the keeper with the round's contributions and are
  unpinned ``keep_rounds`` later, like the contributions of an all-to-all round.

Other peers' contributions are not pinned at all (a peer holds only a slice of each): within
``keep_rounds`` their owners keep them, so a sliced round re-aggregates from the network, not
from this node alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from multiformats import CID

from ...block import Block
from ...cid import DAG_CBOR
from ...errors import DecodeError
from ...formats.sliced.slices import FraudRecord, SliceRecord
from ...storage.base import BlockStore, StoreWrapper, put_many
from ...storage.retention import Collectable
from .peer import ReduceScatterResult

__all__ = ["SliceBlocks", "UnpinnedPuts", "keep_slice_blocks"]


class UnpinnedPuts(StoreWrapper):
    """A :class:`~gradfed_ipfs.storage.BlockStore` that puts every block unpinned.

    The blocks a caller asked to pin (roots: slice results, records) are remembered in
    :attr:`roots` for :func:`keep_slice_blocks` to pin the right way.
    """

    def __init__(self, inner: BlockStore) -> None:
        super().__init__(inner)
        self.roots: dict[bytes, Block] = {}

    async def put(self, block: Block, *, pin: bool = True) -> CID:
        """Store ``block`` unpinned; remember it if it was to be pinned."""
        cid = await self.store.put(block, pin=False)
        if pin:
            self.roots[bytes(cid)] = block
        return cid

    async def put_many(self, blocks: Sequence[Block], *, pin: bool = True) -> list[CID]:
        """Store ``blocks`` unpinned in one batch; remember them if they were to be pinned."""
        cids = await put_many(self.store, blocks, pin=False)
        if pin:
            self.roots.update((bytes(b.cid), b) for b in blocks)
        return cids


@dataclass(frozen=True)
class SliceBlocks:
    """What a sliced round adds for the keeper.

    Attributes
    ----------
    results
        Slice result roots (own and fetched): kept ``keep_rounds``, then unpinned.
    records
        Slice records, fraud records and the records they prove wrong: kept, pinned directly.
    """

    results: tuple[CID, ...]
    records: tuple[CID, ...]


def _is_record(block: Block) -> bool:
    if block.cid.codec.code != DAG_CBOR:
        return False
    for kind in (SliceRecord, FraudRecord):
        try:
            kind.from_block(block)
        except DecodeError:
            continue
        return True
    return False


async def keep_slice_blocks(
    store: BlockStore, puts: UnpinnedPuts, sliced: ReduceScatterResult, *, timeout: float
) -> SliceBlocks:
    """Pin what this peer put in a sliced round; return the round's blocks for the keeper.

    ``store`` must be :class:`~gradfed_ipfs.storage.retention.Collectable` (as the session's
    store under retention: direct pins). The round's final slice records are stored from the
    blocks the step read (announcements carry them) or fetched; fraud records are local (put or
    fetched by the step).

    Raises
    ------
    BlockStoreError, DecodeError
        If a record of the round cannot be read back.
    """
    records: dict[bytes, CID] = {}
    results: dict[bytes, CID] = {}
    for key, block in puts.roots.items():
        if _is_record(block):
            records[key] = block.cid
        else:
            results[key] = block.cid
            await store.pin(block.cid)  # its chunks are local: this peer put them
    for cid in sliced.records:
        read = sliced.record_blocks.get(bytes(cid))
        if read is None:
            read = await store.get(cid, timeout=timeout)
        else:  # read from its announcement: stored here so that the direct pin finds it
            await store.put(read, pin=False)
        record = SliceRecord.from_block(read)
        records[bytes(cid)] = cid
        results.setdefault(bytes(record.result), record.result)
    for cid in sliced.frauds:
        fraud = FraudRecord.from_block(await store.get(cid, timeout=timeout))
        records[bytes(cid)] = cid
        records[bytes(fraud.claimed)] = fraud.claimed
    for cid in records.values():
        await cast(Collectable, store).pin(cid, recursive=False)
    return SliceBlocks(tuple(results.values()), tuple(records.values()))
