"""The check step of a reduce-scatter round: all-gather the slice results, check, prove lies.

:class:`SliceChecker` is owned by :class:`~.reduce_scatter.ReduceScatterPeer` (see that
module's docstring, steps 3 and 4) and works on the round's :class:`~.context.SliceRound`
through the peer's :class:`~.reducer.Reducer`: every peer fetches the chosen slice results,
checks them with :func:`~.slice_check.check_slices` (projections for fedavg, spot checks for
median and trimmed mean; an input without published values has them computed from its
blocks), and recomputes each suspect slice from the contribution blocks. A different CID is a
proven lie: a :class:`~gradfed_ipfs.formats.sliced.slices.FraudRecord` is put and announced, the
next honest reducer re-announces the correct record, and the liar is returned; the same CID means
some sender published false check values. A slice result that cannot be read (a well-formed
record naming garbage, or a result nobody serves) is recomputed the same way before the check,
so a reducer's bytes cost a recompute and convict it; they never fail the round.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np
from multiformats import CID

from ..._types import FloatArray
from ...errors import BlockStoreError, DecodeError, GradientError
from ...formats.sliced.slices import FraudRecord, SliceMessage, SliceRecord
from ...storage.dag import fetch_gradient
from ...storage.retention import put_pinned_alone
from .chain import ChainRound
from .config import SliceWork
from .context import SliceRound
from .plan import projection_seed
from .reducer import Reducer
from .spot import VERIFIERS, AuthorCheck, CheckPlan, CheckWait, SliceCheck, check_slices
from .transport import fetch_range, fetch_whole

__all__ = ["CheckOutcome", "Chosen", "SliceChecker"]

logger = logging.getLogger("gradfed_ipfs.federated.reduce_scatter")

UNREADABLE = (BlockStoreError, DecodeError, GradientError, TimeoutError)
"""What reading a slice result may raise when its reducer put garbage or does not serve it."""

Chosen = tuple[CID, SliceRecord, str]
"""A slice's chosen record: its CID, the record, and who announced it."""


@dataclass
class CheckOutcome:
    """What the check of a round's slices settled.

    ``records`` are the slice records' CIDs (a proven lie's replaced by the recomputed one);
    ``false_values`` the senders whose published check values their own blocks contradict.
    """

    results: list[FloatArray]
    records: list[CID]
    liars: set[str] = field(default_factory=set)
    frauds: list[CID] = field(default_factory=list)
    redone: list[int] = field(default_factory=list)
    false_values: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class _Checking:
    """One check in progress: the slices, their chosen records, and the outcome so far."""

    parts: list[SliceWork]
    chosen: list[Chosen]
    checked: list[SliceRecord]  # a lie's replaced by the recomputed record
    outcome: CheckOutcome
    chain: ChainRound | None
    phase: int


class SliceChecker:
    """The all-gather and check of one peer's reduce-scatter rounds (see the module docstring).

    Parameters
    ----------
    reducer
        The peer's reduce operations (recomputes, fetches, the board).
    """

    def __init__(self, reducer: Reducer) -> None:
        self._reducer = reducer

    async def check(
        self,
        ctx: SliceRound,
        parts: list[SliceWork],
        chosen: list[Chosen],
        *,
        chain: ChainRound | None = None,
        phase: int = 0,
    ) -> CheckOutcome:
        """All-gather and check the slice results of the last ``phase``.

        A suspect slice is recomputed from the contribution blocks; a different CID is a
        proven lie (in a chained round, ``chain`` names the wrong partial sum the wrong record
        was built on, if any: that one is the lie).
        """
        pairs = self._verifiers(ctx, parts, chosen, chain, phase)
        mine = [pair for pair, (peers, _) in pairs.items() if self._reducer.peer in peers]
        # The authors' rows this peer verifies are fetched with the results, not after them
        # (a chained step's rows are at hand already).
        rows_task = asyncio.gather(
            *(self._row(ctx, parts[k], name, pairs[(k, name)][1]) for k, name in mine)
        )
        results, broken = await self._gather(ctx, chosen)
        fetched = await rows_task
        rows = {pair: row for pair, row in zip(mine, fetched, strict=True) if row is not None}
        authors = AuthorCheck(
            {pair: peers for pair, (peers, _) in pairs.items()},
            rows,
            lambda k, name: self._row(ctx, parts[k], name),
            self._reducer.faults.check_values,
        )
        ctx.unfetchable.clear()  # a recompute excludes the records' missing, tries the rest
        outcome = CheckOutcome(results, [cid for cid, _, _ in chosen])
        state = _Checking(parts, chosen, [rec for _, rec, _ in chosen], outcome, chain, phase)
        # A result no one can read is settled first, as a suspect is (a reducer that put
        # garbage is a proven liar): the check then reads every slice's true values.
        for k in broken:
            if await self._settle(ctx, state, k) is None:
                raise TimeoutError(f"slice {k}: result unreadable and its recompute failed")
        check = await self._check(ctx, state, authors)
        if check.false:
            logger.warning(
                "false check values of slice authors: %s", ", ".join(sorted(check.false))
            )
        outcome.false_values.update(check.false)
        for name in sorted(check.false):
            await self._reducer.keep_evidence(ctx, self._reducer.announced(ctx, name, "proj", None))
        for k in check.suspects:
            if k in broken:
                continue  # recomputed already: its values are the true ones
            fresh = await self._settle(ctx, state, k)
            if fresh is not None and outcome.records[k] == chosen[k][0]:
                # The slice is right: some sender published false check values.
                false = check.false_publishers(k, fresh.rows)
                if false:
                    logger.warning("slice %d: false check values from %s", k, ", ".join(false))
                outcome.false_values.update(false)
        return outcome

    async def _gather(
        self, ctx: SliceRound, chosen: list[Chosen]
    ) -> tuple[list[FloatArray], list[int]]:
        """Fetch the chosen slice results; return them and the slices whose result is unreadable."""
        gathered = await asyncio.gather(
            *(self._values(ctx, cid, rec) for cid, rec, _ in chosen), return_exceptions=True
        )
        results: list[FloatArray] = []
        broken: list[int] = []  # results a reducer's bytes broke, or nobody served
        for k, got in enumerate(gathered):
            if isinstance(got, BaseException):
                if not isinstance(got, UNREADABLE):
                    raise got
                logger.warning("slice %d: result of %s unreadable: %s", k, chosen[k][2], got)
                broken.append(k)
                got = np.zeros(0, np.float32)  # settled before the check reads it
            results.append(got)
        return results, broken

    async def _values(self, ctx: SliceRound, record_cid: CID, record: SliceRecord) -> FloatArray:
        if record_cid in ctx.local:
            return ctx.local[record_cid]
        values = await fetch_gradient(
            self._reducer.store,
            record.result,
            timeout=self._reducer.config.fetch_timeout,
            expected_length=record.length,
        )
        return np.asarray(values, np.float32).reshape(-1)

    def _verifiers(
        self,
        ctx: SliceRound,
        parts: list[SliceWork],
        chosen: list[Chosen],
        chain: ChainRound | None,
        phase: int,
    ) -> dict[tuple[int, str], tuple[frozenset[str], SliceWork]]:
        """Return ``(k, author)`` → its verifiers and the step that reads its rows.

        The authors of slice ``k`` are its chosen record's announcer and, chained, every
        member that announced a partial sum of its chain in ``phase``. One level, an author's
        verifiers are the first :data:`~.spot.VERIFIERS` other peers of the slice's ranking
        (each peer is ranked so about once a round: ``d/N`` values more to fetch). Chained,
        the peers that announced the step reading the author's group already hold its rows
        and verify it for free; only when the author announced that step itself do the first
        other peers of its ranking fetch them.
        """
        if chain is None:
            return {
                (k, sender): (frozenset([q for q in p.ranking if q != sender][:VERIFIERS]), p)
                for k, (p, (_, record, sender)) in enumerate(zip(parts, chosen, strict=True))
                if sender in set(map(itemgetter(0), record.inputs))  # not missing: its values count
            }
        out: dict[tuple[int, str], tuple[frozenset[str], SliceWork]] = {}
        for k, steps in enumerate(chain.chains):
            inputs = set(map(itemgetter(0), chosen[k][1].inputs))  # at C speed: N a slice
            announced = [
                {m.sender for m in self._reducer.records(ctx, phase, step)} & inputs
                for step in steps[:-1]
            ] + [{chosen[k][2]} & inputs]
            for author in set().union(*announced):
                g = next(j for j, step in enumerate(steps) if author in (step.senders or ()))
                holders = announced[g] - {author}
                if not holders:  # it announced its own group's step: nobody holds its rows
                    holders = set([q for q in steps[g].ranking if q != author][:VERIFIERS])
                out[(k, author)] = (frozenset(holders), steps[g])
        return out

    async def _row(
        self, ctx: SliceRound, part: SliceWork, name: str, step: SliceWork | None = None
    ) -> FloatArray | None:
        """Fetch ``name``'s values of slice ``part`` from its contribution (``None``: failed).

        ``step``: a chained step of that slice whose rows this peer may hold already.
        """
        if name == self._reducer.peer:
            return ctx.own[part.offset : part.offset + part.length]
        if step is not None and name in step.rows:
            return step.rows[name]
        entry = next((e for e in ctx.roster.entries if e.peer == name), None)
        if entry is None:
            return None
        config = self._reducer.config
        try:
            return await fetch_range(
                self._reducer.store, entry.contribution, part.offset, part.length, ctx.d,
                timeout=config.fetch_timeout, concurrency=config.concurrency,
                packing=config.packing,
            )  # fmt: skip
        except UNREADABLE as exc:
            logger.warning("slice %d of %s unavailable to check: %s", part.k, name, exc)
            return None

    async def _check(self, ctx: SliceRound, state: _Checking, authors: AuthorCheck) -> SliceCheck:
        """Run the cheap check (projections for fedavg, spot checks for median, trimmed mean)."""
        reducer, config = self._reducer, self._reducer.config
        roster = ctx.roster

        async def fetch_absent(names: set[str]) -> dict[str, FloatArray]:
            wanted = {e.peer: e.contribution for e in roster.entries if e.peer in names}
            return await fetch_whole(
                reducer.store, wanted, ctx.d, config.fetch_timeout, config.packing
            )

        plan = CheckPlan(
            roster_cid=ctx.roster_cid,
            weights={e.peer: e.weight for e in roster.entries},
            base=ctx.base,
            ranges=[(p.offset, p.length) for p in state.parts],
            seed=projection_seed([bytes(cid) for cid, _, _ in state.chosen]),
            rule=config.rule,
            learning_rate=config.learning_rate,
        )
        wait = CheckWait(
            timeout=config.fetch_timeout,
            fetch_absent=fetch_absent,
            silent=frozenset(ctx.replaced),  # likely gone: their values are not awaited
            stall=config.reducer_timeout,
        )
        results = state.outcome.results
        return await check_slices(
            reducer.board, reducer.peer, plan, ctx.own, state.checked, results, wait, authors
        )

    async def _settle(self, ctx: SliceRound, state: _Checking, k: int) -> SliceWork | None:
        """Recompute slice ``k`` (a different CID is a proven lie); ``None``: it failed."""
        (cid, record, sender), p = state.chosen[k], state.parts[k]
        outcome = state.outcome
        outcome.redone.append(p.k)
        fresh = SliceWork(p.k, p.offset, p.length, p.ranking)
        recomputed, values = await self._reducer.reduce(ctx, fresh, set(record.missing))
        correct = recomputed.cid
        if fresh.failed - set(record.missing):
            return None  # the recompute failed
        outcome.results[p.k] = values
        if correct == cid:  # the slice is right (a suspect's check values were false)
            return fresh
        outcome.records[p.k], state.checked[p.k] = correct, SliceRecord.from_block(recomputed)
        ctx.records_read[bytes(correct)] = recomputed
        liar, claimed = sender, cid
        if state.chain is not None:
            blamed = await state.chain.blame(state.phase, p.k, fresh.rows, record.missing)
            liar, claimed = blamed or (liar, claimed)
        await self._prove(ctx, p, liar, claimed, correct, outcome)
        honest = [r for r in p.ranking if r not in (sender, liar)]
        reducer = self._reducer
        if honest and honest[0] == reducer.peer:  # the next reducer re-announces the slice
            await reducer.board.publish(
                SliceMessage(
                    "slice", reducer.peer, ctx.roster_cid, -1, p.k, correct, block=recomputed.data
                )
            )
        return fresh

    async def _prove(
        self,
        ctx: SliceRound,
        part: SliceWork,
        liar: str,
        claimed: CID,
        correct: CID,
        outcome: CheckOutcome,
    ) -> None:
        """Put and announce the fraud record proving ``liar``'s ``claimed`` record wrong."""
        reducer = self._reducer
        outcome.liars.add(liar)
        for kind in ("slice", "partial"):  # its signed announcement of the lie
            await reducer.keep_evidence(ctx, reducer.announced(ctx, liar, kind, claimed))
        fraud = FraudRecord(ctx.roster_cid, part.k, liar, claimed, correct)
        fraud_cid = await put_pinned_alone(reducer.store, fraud.to_block())
        outcome.frauds.append(fraud_cid)
        await reducer.board.publish(
            SliceMessage("fraud", reducer.peer, ctx.roster_cid, k=part.k, cid=fraud_cid)
        )
