"""How an :class:`~.agreed.AgreedSession` stores a finished round and reports it to retention.

A mixin: after each round the roster, model (and rule state) and record are put off the
critical path; under a ``retention=`` keeper (:mod:`~gradfed_ipfs.storage.retention`) rosters and
records are pinned alone (direct pins: they link history) and the round's blocks are reported
(:class:`~gradfed_ipfs.storage.retention.RoundBlocks`): an all-to-all round's contributions,
or a reduce-scatter round's slice results and slice and fraud records
(:mod:`.slice_retention`), plus this peer's own contribution.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from multiformats import CID

from ..._types import FloatArray
from ...block import Block
from ...formats.roster import Roster
from ...storage.base import BlockStore
from ...storage.retention import RetentionHook, RoundBlocks, put_all_pinned_alone
from ..exchange.encoded import EncodedGradient, encode_gradient
from .config import AgreedConfig
from .slicing import SliceStep

__all__ = ["RoundStorage"]

T = TypeVar("T")


class RoundStorage:
    """Storage steps of an agreed session; :class:`~.agreed.AgreedSession` provides the state."""

    store: BlockStore
    config: AgreedConfig
    retention: RetentionHook | None
    _slicing: SliceStep | None
    round: int
    model: FloatArray
    rule_state: FloatArray | None
    _holds_head: bool

    async def _keep(self, *blocks: Block) -> None:
        """Store rosters and records, pinned alone (under retention inside the gate)."""
        await put_all_pinned_alone(self.store, blocks)

    async def _held(self, work: Awaitable[T]) -> T:
        """Await ``work`` holding the retention gate (no collection mid-way through a put)."""
        if self.retention is None:
            return await work
        async with self.retention.gate.transfer():
            return await work

    async def _store_last_model(self) -> None:
        """Put the last round's model and rule state if this peer holds them and they were not."""
        if not self._holds_head or self.config.stores_model(self.round - 1):
            return
        values = [self.model, *(() if self.rule_state is None else (self.rule_state,))]
        encoded = [await encode_gradient(v) for v in values]
        await self._held(asyncio.gather(*(e.store(self.store) for e in encoded)))
        self._holds_head = False

    async def _store_round(
        self,
        roster_block: Block,
        model: CID,
        encoded: list[EncodedGradient],
        record: Block,
        roster: Roster,
        r: int,
        own: tuple[CID, asyncio.Future[CID]] | None,
    ) -> None:
        """Store a finished round's roster, model, rule state and record; report its blocks.

        ``encoded`` is the model (CID ``model``), then the update rule's state when there is
        one; empty on a peer that does not hold this round's model or when it is not stored
        (``model_every``). Retention is told only the models that are stored.
        """

        async def put_all() -> None:
            await asyncio.gather(
                self._keep(roster_block, record), *(e.store(self.store) for e in encoded)
            )

        await self._held(put_all())
        if self.retention is None:
            return
        # A sliced round holds only a slice of each other contribution: it keeps the slice
        # results instead (and its slice and fraud records, pinned alone).
        held = (
            None if self._slicing is None else self._slicing.held.pop(bytes(roster_block.cid), None)
        )
        contributions = (
            [entry.contribution for entry in roster.entries] if held is None else [*held.results]
        )
        if own is not None:
            own_cid, stored = own
            await asyncio.wait([stored])  # its failure is run_round's to raise
            if not stored.cancelled() and stored.exception() is None:
                contributions.append(own_cid)
        unique = {bytes(c): c for c in contributions}
        kept = self.config.stores_model
        await self.retention.round_done(
            RoundBlocks(
                r, tuple(unique.values()), roster_block.cid, record.cid,
                roster.base if r == 0 or kept(r - 1) else None, model if kept(r) else None,
                () if held is None else held.records,
            )
        )  # fmt: skip
