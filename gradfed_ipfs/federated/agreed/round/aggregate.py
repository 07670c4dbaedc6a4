"""The aggregate step of an agreed round: the adopted roster's model, all-to-all or sliced.

:class:`AggregateStep` is owned by :class:`~gradfed_ipfs.federated.agreed.session.AgreedSession`
and handed each round's :class:`~.context.RoundContext` and
:class:`~.context.AdoptedRoster`. All-to-all, it applies the rule to the roster's contributions
(:func:`~gradfed_ipfs.tensor.deterministic.deterministic_update` by default). In a
reduce-scatter round it runs the session's :class:`~.slicing.SliceStep`; a peer that joins a
sliced round the others have finished hears none of its slice messages (each is re-announced
only until its reducer's next round starts), so once another peer's ``done`` of the round has
been known for a grace it re-verifies that record instead
(:func:`~.finished.check_finished_round`: every contribution fetched whole) and takes its
slices, frauds and proven liars.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from multiformats import CID

from ....errors import BlockStoreError, DecodeError, RoundVerificationFailed
from ....storage.base import BlockStore
from ....tensor.deterministic import deterministic_update
from ...sliced.peer import ReduceScatterResult
from ...sliced.retention import SliceBlocks
from ...sliced.transport import CountingStore
from ..context import AdoptedRoster, Aggregated, RoundContext
from ..finished import check_finished_round
from ..slicing import SliceStep
from .coordinator import RoundBoard
from .roster import MAX_WALK_BACK, walk_back

__all__ = ["AggregateStep"]

logger = logging.getLogger("gradfed_ipfs.federated.agreed")

_TICK: Final = 1.0
"""Longest wait between checks for other peers' records of a sliced round (seconds); a
``done`` heard (a change of the round board) or the end of the grace wakes it sooner."""


@dataclass
class _Fallback:
    """What one sliced round's wait for other peers' records has seen so far."""

    tried: set[str] = field(default_factory=set)  # one re-verification (N·d fetched) per peer
    refused: dict[bytes, str] = field(default_factory=dict)
    walked: dict[bytes, CID | None] = field(default_factory=dict)  # later record -> round r's
    since: float | None = None


class AggregateStep:
    """Compute an adopted roster's model (see the module docstring).

    Parameters
    ----------
    store
        The peer's block store (records are re-verified from it).
    board
        What the peer has heard (other peers' ``done`` records).
    slicing
        The session's reduce-scatter step; ``None``: all-to-all rounds.
    """

    def __init__(self, store: BlockStore, board: RoundBoard, slicing: SliceStep | None) -> None:
        self._store, self._board, self._slicing = store, board, slicing

    async def run(self, ctx: RoundContext, adopted: AdoptedRoster) -> Aggregated:
        """Return the round's model (and rule state, and reduce-scatter outcome)."""
        if adopted.gradients is not None:
            return self._all_to_all(ctx, adopted)
        if self._slicing is None:  # pragma: no cover - gradients are None only when slicing
            raise RuntimeError("no contributions and no reduce-scatter step")
        step = self._slicing
        run = asyncio.ensure_future(
            step.run(ctx.number, adopted.roster, adopted.cid, ctx.base_model, ctx.own.values)
        )
        try:
            sliced = await self._slices_or_record(ctx, adopted, run)
        finally:
            run.cancel()  # a no-op once done; gathered so that its error is retrieved
            await asyncio.gather(run, return_exceptions=True)
        rejected = ctx.rejected
        rejected.update({p: "missing from the slices" for p in sliced.missing})
        rejected.update({p: "published false slice-check values" for p in sliced.false_values})
        rejected.update({p: f"announced garbage: {why}" for p, why in sliced.garbage.items()})
        rejected.update({p: "proven lying reducer" for p in sliced.liars})
        kept = step.held.pop(bytes(adopted.cid), None)
        return Aggregated(sliced.model, None, sliced, kept)

    def _all_to_all(self, ctx: RoundContext, adopted: AdoptedRoster) -> Aggregated:
        rule, lr = ctx.config.rule, ctx.config.learning_rate
        gradients = list(adopted.gradients or ())
        if rule is not None:
            model, state = rule.apply(ctx.base_model, adopted.roster, gradients, lr, ctx.rule_state)
            return Aggregated(np.ascontiguousarray(model, np.float32).reshape(-1), state, None)
        weights = [e.weight for e in adopted.roster.entries]
        return Aggregated(deterministic_update(ctx.base_model, gradients, weights, lr), None, None)

    async def _slices_or_record(
        self,
        ctx: RoundContext,
        adopted: AdoptedRoster,
        run: asyncio.Future[ReduceScatterResult],
    ) -> ReduceScatterResult:
        """Await the reduce-scatter ``run``, or re-verify another peer's record of the round.

        Once another peer's ``done`` of the round has been known for a grace (twice
        ``max_announce_interval`` if no slice message of this roster was heard, else
        ``reducer_timeout``) and ``run`` has not ended, the record is re-verified.
        """
        config, seen = ctx.config, _Fallback()
        step = self._slicing
        while not run.done():
            changed = self._board.changed  # taken before the check: no change is missed
            pending = self._may_have_heads(ctx, seen)
            now = time.monotonic()
            seen.since = None if not pending else (now if seen.since is None else seen.since)
            heard = step is not None and step.heard(adopted.cid)
            grace = config.reducer_timeout if heard else 2 * config.max_announce_interval
            if seen.since is None or now - seen.since < grace:
                left = _TICK if seen.since is None else grace - (now - seen.since)
                await _first_of(run, changed, min(_TICK, left))
                continue
            for peer, record_cid in await self._finished_heads(ctx, seen):
                found = await self._reverify(ctx, adopted, peer, record_cid, seen)
                if found is not None:
                    logger.info(
                        "round %d: %s re-verified %s's record %s (its slices incomplete %.1fs "
                        "after)", ctx.number, ctx.peer, peer, record_cid, now - seen.since,
                    )  # fmt: skip
                    found.seconds = time.monotonic() - now
                    return found
            seen.since = None
        return run.result()

    def _may_have_heads(self, ctx: RoundContext, seen: _Fallback) -> bool:
        """Whether :meth:`_finished_heads` may find one: O(1) but once peers were tried.

        Asked every tick while the slices run (for minutes at N = 1,024): walking every
        member's ``done`` and head at each was most of a waiting member's work.
        """
        done = self._board.state(ctx.number).done
        others = len(done) - (ctx.peer in done)
        if others > len(seen.tried):
            return True  # one of them is not tried yet
        if others and any(p != ctx.peer and p not in seen.tried for p in done):
            return True
        return self._board.heads_from(ctx.number + 1, but=ctx.peer) > 0

    async def _finished_heads(self, ctx: RoundContext, seen: _Fallback) -> list[tuple[str, CID]]:
        """Other peers' records of the round not yet tried (through later records if need be)."""
        r = ctx.number
        heads = [
            (peer, head.record)
            for peer, head in list(self._board.state(r).done.items())
            if peer != ctx.peer and peer not in seen.tried
        ]
        if heads:
            return heads
        # Round r's done messages missed too: a later record leads back to it.
        for peer, head in list(self._board.heads.items()):
            if peer == ctx.peer or peer in seen.tried or not r < head.round <= r + MAX_WALK_BACK:
                continue
            key = bytes(head.record)
            if key not in seen.walked:
                seen.walked[key] = None
                with contextlib.suppress(BlockStoreError, DecodeError):
                    found = await walk_back(self._store, r, head.record, ctx.config.fetch_timeout)
                    seen.walked[key] = None if found is None else found[0]
            if (cid := seen.walked[key]) is not None:
                heads.append((peer, cid))
        return heads

    async def _reverify(
        self, ctx: RoundContext, adopted: AdoptedRoster, peer: str, record_cid: CID, seen: _Fallback
    ) -> ReduceScatterResult | None:
        """Re-verify ``peer``'s record of the round; its outcome, or ``None`` (it is rejected)."""
        seen.tried.add(peer)
        if bytes(record_cid) in seen.refused:
            ctx.rejected[peer] = seen.refused[bytes(record_cid)]
            return None
        counted = CountingStore(self._store)
        roster, config = adopted.roster, ctx.config
        try:
            held = bytes(roster.base) == bytes(ctx.base)  # never rebuilt then
            finished = await check_finished_round(
                counted, record_cid, roster, adopted.cid, prev=ctx.head, rule=config.rule,
                base=(ctx.base_model, ctx.rule_state) if held else None,
                encoding=None if config.packing is None else config.packing.label,
            )  # fmt: skip
        except RoundVerificationFailed as exc:
            why = f"record {record_cid}: {exc}"
            ctx.rejected[peer] = seen.refused[bytes(record_cid)] = why
            return None
        step = self._slicing
        if step is not None and step.gate is not None:  # kept like a run's (slice_retention)
            kept = tuple(e.contribution for e in roster.entries)
            step.held[bytes(adopted.cid)] = SliceBlocks(kept, finished.records)
        record = finished.record
        return ReduceScatterResult(
            model=finished.model,
            model_cid=record.result,
            records=list(record.slices or ()),
            missing=finished.missing,
            liars=set(finished.liars),
            frauds=list(record.frauds or ()),
            downloaded=counted.downloaded,
        )


async def _first_of(run: asyncio.Future[Any], changed: asyncio.Event, timeout: float) -> None:
    """Wait until ``run`` ends, ``changed`` is set or ``timeout`` seconds pass."""
    waiter = asyncio.ensure_future(changed.wait())
    try:
        await asyncio.wait({run, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
