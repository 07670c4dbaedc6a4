"""How an :class:`~.agreed.AgreedSession` stores a finished round and reports it to retention.

:class:`RoundStorage` is owned by the session: after each round the roster, model (and rule
state) and record are put off the critical path (:meth:`RoundStorage.store_round`, settled
before the next round, a resync or close); under a ``retention=`` keeper
(:mod:`~gradfed_ipfs.storage.retention`) every put holds the keeper's gate, rosters and records
are pinned alone (direct pins: they link history) and the round's blocks are reported
(:class:`~gradfed_ipfs.storage.retention.RoundBlocks`): an all-to-all round's contributions,
or a reduce-scatter round's slice results and slice and fraud records
(:mod:`.slice_retention`), plus this peer's own contribution.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from multiformats import CID

from ..._types import FloatArray
from ...block import Block
from ...formats.agreed.roster import Roster
from ...storage.base import BlockStore
from ...storage.retention import RetentionHook, RoundBlocks, put_all_pinned_alone
from ..exchange.encoded import EncodedGradient, encode_gradient
from ..sliced.retention import SliceBlocks
from .config import AgreedConfig
from .context import OwnContribution

__all__ = ["FinishedRound", "RoundStorage"]

T = TypeVar("T")


@dataclass(frozen=True)
class FinishedRound:
    """What a finished round leaves to store.

    ``encoded`` is the model (CID ``model``), then the update rule's state when there is one;
    empty on a peer that does not hold this round's model or when it is not stored
    (``model_every``). ``kept`` is what a sliced round leaves for the keeper.
    """

    number: int
    roster: Roster
    roster_block: Block
    record: Block
    model: CID
    encoded: tuple[EncodedGradient, ...]
    own: OwnContribution
    kept: SliceBlocks | None
    config: AgreedConfig
    """The round's settings (which models are stored: ``model_every``)."""


class RoundStorage:
    """The storage step of one session's peer (see the module docstring).

    Parameters
    ----------
    store
        The peer's block store.
    retention
        The session's retention keeper, if any.
    """

    def __init__(self, store: BlockStore, retention: RetentionHook | None) -> None:
        self._store, self._retention = store, retention
        self._pending: list[asyncio.Future[object]] = []
        self.unstored_head: tuple[FloatArray, FloatArray | None] | None = None
        """The last round's model and rule state if this peer holds them and did not put them
        (``model_every``); put at close."""

    async def held(self, work: Awaitable[T]) -> T:
        """Await ``work`` holding the retention gate (no collection mid-way through a put)."""
        if self._retention is None:
            return await work
        async with self._retention.gate.transfer():
            return await work

    async def settle(self, *, keep: int = 0) -> None:
        """Wait until at most ``keep`` rounds' blocks are still being stored (raising a failure)."""
        while len(self._pending) > keep or (self._pending and self._pending[0].done()):
            await self._pending.pop(0)

    def store_round(self, finished: FinishedRound) -> None:
        """Start storing a finished round (settled by :meth:`settle`)."""
        self._pending.append(asyncio.ensure_future(self._store_round(finished)))

    async def store_last_model(self) -> None:
        """Put the last round's model and rule state if this peer holds them and they were not."""
        if self.unstored_head is None:
            return
        model, state = self.unstored_head
        values = [model, *(() if state is None else (state,))]
        encoded = [await encode_gradient(v) for v in values]
        await self.held(asyncio.gather(*(e.store(self._store) for e in encoded)))
        self.unstored_head = None

    async def _store_round(self, finished: FinishedRound) -> None:
        """Store a finished round's roster, model, rule state and record; report its blocks.

        Retention is told only the models that are stored.
        """
        store = self._store

        async def put_all() -> None:
            await asyncio.gather(
                put_all_pinned_alone(store, (finished.roster_block, finished.record)),
                *(e.store(store) for e in finished.encoded),
            )

        await self.held(put_all())
        if self._retention is None:
            return
        # A sliced round holds only a slice of each other contribution: it keeps the slice
        # results instead (and its slice and fraud records, pinned alone).
        held, roster, r = finished.kept, finished.roster, finished.number
        contributions = (
            [entry.contribution for entry in roster.entries] if held is None else [*held.results]
        )
        own = finished.own
        await asyncio.wait([own.stored])  # its failure is run_round's to raise
        if not own.stored.cancelled() and own.stored.exception() is None:
            contributions.append(own.cid)
        unique = {bytes(c): c for c in contributions}
        kept = finished.config.stores_model
        await self._retention.round_done(
            RoundBlocks(
                r, tuple(unique.values()), finished.roster_block.cid, finished.record.cid,
                roster.base if r == 0 or kept(r - 1) else None,
                finished.model if kept(r) else None, () if held is None else held.records,
            )
        )  # fmt: skip
