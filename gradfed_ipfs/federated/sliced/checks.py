"""The check step of a reduce-scatter round: all-gather the slice results, check, prove lies.

A mixin of :class:`~.reduce_scatter.ReduceScatterPeer` (see that module's docstring, steps 3
and 4): every peer fetches the chosen slice results, checks them with
:func:`~.slice_check.check_slices` (projections for fedavg, spot checks for median and trimmed
mean; an input without published values has them computed from its blocks), and recomputes
each suspect slice from the contribution blocks. A different CID is a proven lie: a
:class:`~gradfed_ipfs.formats.slices.FraudRecord` is put and announced, the next honest reducer
re-announces the correct record, and the liar is returned; the same CID means some sender
published false check values. A slice result that cannot be read (a well-formed record naming
garbage, or a result nobody serves) is recomputed the same way before the check, so a
reducer's bytes cost a recompute and convict it; they never fail the round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import numpy as np
from multiformats import CID

from ..._types import FloatArray
from ...errors import BlockStoreError, DecodeError, GradientError
from ...formats.roster import Roster
from ...formats.slices import FraudRecord, SliceMessage, SliceRecord
from ...storage.base import Block
from ...storage.dag import fetch_gradient
from ...storage.retention import put_pinned_alone
from .config import ReduceScatterConfig, SliceWork
from .plan import projection_seed
from .spot import check_slices
from .transport import CountingStore, MemorySliceBoard, fetch_whole

__all__ = ["Blame", "SliceChecks"]

Blame = Callable[[int, dict[str, FloatArray], tuple[str, ...]], Awaitable[tuple[str, CID] | None]]
"""``blame(k, rows, missing)`` of a chained round (:meth:`~.reduce_chain.ChainSteps._blame`)."""

logger = logging.getLogger("gradfed_ipfs.federated.reduce_scatter")

UNREADABLE = (BlockStoreError, DecodeError, GradientError, TimeoutError)
"""What reading a slice result may raise when its reducer put garbage or does not serve it."""


class SliceChecks:
    """The all-gather and check of :class:`~.reduce_scatter.ReduceScatterPeer` (its state)."""

    peer: str
    store: CountingStore
    board: MemorySliceBoard
    config: ReduceScatterConfig
    _local: dict[CID, FloatArray]
    _records_read: dict[bytes, Block]
    _unfetchable: set[str]
    _replaced: set[str]

    async def _values(self, record_cid: CID, record: SliceRecord) -> FloatArray:
        if record_cid in self._local:
            return self._local[record_cid]
        values = await fetch_gradient(
            self.store,
            record.result,
            timeout=self.config.fetch_timeout,
            expected_length=record.length,
        )
        return np.asarray(values, np.float32).reshape(-1)

    async def _check(
        self,
        roster: Roster,
        roster_cid: CID,
        base: FloatArray,
        own: FloatArray,
        parts: list[SliceWork],
        chosen: list[tuple[CID, SliceRecord, str]],
        records: list[CID],
        reduce: Callable[[SliceWork, set[str]], Awaitable[tuple[Block, FloatArray]]],
        blame: Blame | None = None,
    ) -> tuple[list[FloatArray], set[str], list[CID], list[int], set[str]]:
        """All-gather and check the slice results; a proven lie's ``records[k]`` is replaced.

        ``reduce(part, exclude)`` recomputes a slice from the contribution blocks (the peer's).
        ``blame(k, rows, missing)`` (chained rounds) returns the announcer and CID of a wrong
        partial sum of slice ``k`` the wrong record was built on, if any: that one is the lie.

        Returns the results, the proven liars, their fraud records, the recomputed slices, and
        the senders whose published check values their own blocks contradict.
        """
        gathered = await asyncio.gather(
            *(self._values(cid, rec) for cid, rec, _ in chosen), return_exceptions=True
        )
        results: list[FloatArray] = []
        broken: list[int] = []  # results a reducer's bytes broke, or nobody served
        for k, got in enumerate(gathered):
            if isinstance(got, BaseException):
                if not isinstance(got, UNREADABLE):
                    raise got
                logger.warning("slice %d: result of %s unreadable: %s", k, chosen[k][2], got)
                broken.append(k)
                got = np.zeros(0, np.float32)  # settled below, before the check reads it
            results.append(got)
        self._unfetchable.clear()  # a recompute excludes the records' missing, tries the rest
        liars, frauds, redone, false_values = set[str](), list[CID](), list[int](), set[str]()
        seed = projection_seed([bytes(cid) for cid, _, _ in chosen])
        weights = {e.peer: e.weight for e in roster.entries}
        checked = [rec for _, rec, _ in chosen]  # a lie's replaced by the recomputed record

        async def settle(k: int) -> SliceWork | None:
            """Recompute slice ``k`` (a different CID is a proven lie); ``None``: it failed."""
            (cid, record, sender), p = chosen[k], parts[k]
            redone.append(p.k)
            fresh = SliceWork(p.k, p.offset, p.length, p.ranking)
            recomputed, values = await reduce(fresh, set(record.missing))
            correct = recomputed.cid
            if fresh.failed - set(record.missing):
                return None  # the recompute failed
            results[p.k] = values
            if correct == cid:  # the slice is right (a suspect's check values were false)
                return fresh
            records[p.k], checked[p.k] = correct, SliceRecord.from_block(recomputed)
            self._records_read[bytes(correct)] = recomputed
            liar, claimed = sender, cid
            if blame is not None:
                liar, claimed = await blame(p.k, fresh.rows, record.missing) or (liar, claimed)
            liars.add(liar)
            fraud = FraudRecord(roster_cid, p.k, liar, claimed, correct)
            fraud_cid = await put_pinned_alone(self.store, fraud.to_block())
            frauds.append(fraud_cid)
            await self.board.publish(
                SliceMessage("fraud", self.peer, roster_cid, k=p.k, cid=fraud_cid)
            )
            honest = [r for r in p.ranking if r not in (sender, liar)]
            if honest and honest[0] == self.peer:  # the next reducer re-announces the slice
                await self.board.publish(
                    SliceMessage(
                        "slice", self.peer, roster_cid, -1, p.k, correct, block=recomputed.data
                    )
                )
            return fresh

        # A result no one can read is settled first, as a suspect is (a reducer that put
        # garbage is a proven liar): the check then reads every slice's true values.
        for k in broken:
            if await settle(k) is None:
                raise TimeoutError(f"slice {k}: result unreadable and its recompute failed")

        async def fetch_absent(names: set[str]) -> dict[str, FloatArray]:
            wanted = {e.peer: e.contribution for e in roster.entries if e.peer in names}
            return await fetch_whole(self.store, wanted, base.size, self.config.fetch_timeout)

        check = await check_slices(
            self.board,
            self.peer,
            roster_cid,
            weights,
            base,
            own,
            [(p.offset, p.length) for p in parts],
            checked,
            results,
            seed=seed,
            rule=self.config.rule,
            learning_rate=self.config.learning_rate,
            timeout=self.config.fetch_timeout,
            fetch_absent=fetch_absent,
            silent=frozenset(self._replaced),  # likely gone: their values are not awaited
            stall=self.config.reducer_timeout,
        )  # slice_check: projections for fedavg, spot checks for median and trimmed mean
        for k in check.suspects:
            if k in broken:
                continue  # recomputed already: its values are the true ones
            fresh = await settle(k)
            if fresh is not None and records[k] == chosen[k][0]:
                # The slice is right: some sender published false check values.
                false = check.false_publishers(k, fresh.rows)
                if false:
                    logger.warning("slice %d: false check values from %s", k, ", ".join(false))
                false_values.update(false)
        return results, liars, frauds, redone, false_values
