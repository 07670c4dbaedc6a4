"""Chained reduce-scatter: each slice reduced in steps along the roster (issue 14).

:class:`ChainRound` runs one round's chained steps for :class:`~.peer.ReduceScatterPeer` (one
per round, over the peer's :class:`~.reducer.Reducer` and the round's
:class:`~.context.SliceRound`).

The one-level round (:mod:`.reduce_scatter`) has each of N reducers read its slice from each of
N senders: 2·N² blocks of d/N values a round (N² pieces, N² in the all-gather), and at d = 1M
that per-block cost, not the bytes, is what grows (N^1.3–1.4 per round at N = 8…64).

Chained (``ReduceScatterConfig(chained=True)``, ``fedavg`` only): the roster is cut into
``G`` runs of consecutive peers (:func:`~.slices.chain_groups`: ≈ √N, at least 5 slices;
:func:`~.slices.chain_senders`) and d
into ``S = ⌈N/G⌉`` slices. Slice ``k`` is reduced in ``G`` steps: step ``(k, j)`` reads slice
``k`` of group ``j``'s senders, adds them in roster order to the float64 partial sum step
``(k, j−1)`` left (:func:`~gradfed_ipfs.tensor.deterministic.partial_update`, coefficients
``w_i / W`` of the whole roster), and puts a
:class:`~gradfed_ipfs.formats.sliced.partials.PartialRecord` (announced as a ``partial`` message of
index ``k·G + j``); the last step finishes the slice
(:func:`~gradfed_ipfs.tensor.deterministic.finish_update`) and writes the ordinary
:class:`~gradfed_ipfs.formats.sliced.slices.SliceRecord`. The same float64 operations run in the
same order as :func:`~gradfed_ipfs.tensor.deterministic.deterministic_update`, so the slice record,
the model and the round record are byte-identical to the one-level round's (with ``S`` slices):
checks, verification and resync are unchanged. Blocks a round: N·S pieces, N·S partials and
N·S results, N^1.5 at G = √N; bytes per peer ≈ d (pieces) + 2·d/S (the partial) + d (results).
Latency: ``G`` sequential steps per slice.

Each step has its own reducer ranking (:func:`~.slices.reducer_rankings` over ``S·G`` steps:
about one step per peer). A backup takes over step ``(k, j)`` when its better-ranked peers
have not announced ``reducer_timeout`` after the step's input was ready (for ``j = 0``: half
of the first steps announced; for ``j > 0``: a valid partial of ``(k, j−1)``). A sender a step
cannot fetch is ``missing`` in its partial and every later one, so the slice record lists it
and the next phase excludes it everywhere, as in the one-level round. A partial that is not
one (garbage values, another step's record) is refused by the step that reads it; when every
partial announced for ``(k, j−1)`` was refused and none came ``reducer_timeout`` after, step
``j`` computes ``(k, j−1)`` itself (its backups saw a record and stood aside).

A lie anywhere in a chain makes the slice result wrong, which the check step catches
(:mod:`.reduce_scatter_check`). The checker then recomputes the slice from the contribution
blocks and, with the same rows, every partial sum of the chain (:meth:`ChainRound.blame`):
the announced partial of the earliest step whose values differ from the recomputed ones is
the lie (it was built on right values, or on values never announced), so its announcer, not
the honest steps after it, is named in the fraud record (``claimed`` = that partial record).
:func:`~.chain_proof.partial_fraud_fits` is what a fraud record naming a partial must fit
(checked with every record, like a one-level fraud record);
:func:`~.chain_proof.check_partial_frauds` re-checks its values from the contributions when a
round is recomputed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
from multiformats import CID

from ...errors import (
    BlockCorrupt,
    BlockStoreError,
    DecodeError,
    GradientError,
)
from ...formats.agreed.roster import RosterEntry
from ...formats.sliced.partials import PartialRecord, partial_blocks, partial_values
from ...formats.sliced.slices import SliceMessage, SliceRecord
from ...storage.base import Block, put_many
from ...tensor.deterministic import finish_update
from ..exchange.records import carried_or_fetched
from .config import SliceWork
from .context import SliceRound
from .plan import chain_senders, chain_sum, plan_slices, reducer_rankings
from .reducer import Reducer, Serving

__all__ = ["ChainRound"]

logger = logging.getLogger("gradfed_ipfs.federated.reduce_scatter")

_Loaded = tuple[CID, PartialRecord, np.ndarray]


@dataclass(frozen=True)
class _Sum:
    """A step's partial sum: the senders it added, who is missing, the roster's weight sum."""

    group: list[RosterEntry]
    missing: set[str]
    weight_sum: int
    acc: np.ndarray


class ChainRound:
    """The chained steps of one peer's reduce-scatter round (see the module docstring).

    Parameters
    ----------
    reducer
        The peer's reduce operations (fetches, records, turns, slice commits).
    ctx
        The round.
    groups
        The chain's ``G`` (steps per slice).
    """

    def __init__(self, reducer: Reducer, ctx: SliceRound, groups: int) -> None:
        self._reducer, self._ctx, self._groups = reducer, ctx, groups
        self._heard_upto, self._heard_missing = 0, dict[int, set[str]]()  # _reported_missing's
        self._partials: dict[bytes, np.ndarray] = {}  # own and loaded partial sums, by CID
        # (phase, j) -> (board list, its length, steps of level j with a record): _level_heard's
        self._level_counts: dict[tuple[int, int], tuple[list[SliceMessage], int, int]] = {}
        self.chains = self._plan()
        """Every slice's ``groups`` steps, in chain order (the last writes the record)."""
        reducer.board.count_levels(ctx.roster_cid, groups, len(self.chains), ctx.roster.peers)

    def _plan(self) -> list[list[SliceWork]]:
        ctx, groups = self._ctx, self._groups
        peers = ctx.roster.peers
        count = -(-len(peers) // groups)
        rankings = reducer_rankings(bytes(ctx.roster_cid), count * groups, peers)
        senders = chain_senders(peers, groups)
        chunk_bytes = self._reducer.config.chunk_bytes
        return [
            [
                SliceWork(
                    k,
                    offset,
                    length,
                    rankings[k * groups + j],
                    senders=senders[j],
                    step=k * groups + j if j < groups - 1 else None,
                    j=j,
                )
                for j in range(groups)
            ]
            for k, (offset, length) in enumerate(plan_slices(ctx.d, count, chunk_bytes))
        ]

    def serving(self, phase: int, exclude: set[str]) -> list[Serving]:
        """Return this peer's steps of ``phase`` (it is ranked for each), with how to run each."""
        levels = [list(level) for level in zip(*self.chains, strict=True)]
        peer = self._reducer.peer
        return [
            (step, functools.partial(
                self._serve_step, chain, step.j, phase, exclude, levels[step.j]
            ))
            for chain in self.chains
            for step in chain
            if peer in step.rank
        ]  # fmt: skip

    async def _serve_step(
        self,
        chain: list[SliceWork],
        j: int,
        phase: int,
        exclude: set[str],
        level: list[SliceWork],
    ) -> None:
        """Run step ``j`` of a chain in ``phase`` if no better-ranked peer did in time.

        ``level`` is step ``j`` of every chain. A backup's clock starts once the step's input
        is announced and half of its level is: a step slow for a reason all share (a sender
        that makes every step of its group wait ``fetch_timeout``) is not taken over by backups
        that would wait for the same sender.
        """
        ctx, reducer, step = self._ctx, self._reducer, chain[j]

        def ready() -> bool:  # (announced: a backup loads the input only if it takes over)
            if j and not reducer.records(ctx, phase, chain[j - 1]):
                return False
            return self._level_heard(phase, j, level) >= (len(level) + 1) // 2

        def gone() -> set[str]:
            known = ctx.unfetchable | ctx.replaced | exclude
            return known | self._reported_missing(phase)

        # Woken by what ready() reads: the input's records and the level reaching half.
        half = (len(level) + 1) // 2
        on = [reducer.board.level_key(ctx.roster_cid, phase, j, half)]
        if j:
            on.append(reducer.key(ctx, phase, chain[j - 1]))
        if not await reducer.my_turn(ctx, phase, step, ready, gone, on):
            return
        await self._compute_step(chain, j, phase, exclude)

    async def _compute_step(
        self, chain: list[SliceWork], j: int, phase: int, exclude: set[str]
    ) -> _Loaded | None:
        """Compute and announce step ``j`` of a chain; return its partial sum.

        ``None`` for the last step, which writes the slice record instead.
        """
        step = chain[j]
        # The rows are fetched while the previous step runs: a chain costs one fetch, not G.
        rows = asyncio.create_task(self._step_rows(phase, step, exclude))
        try:
            prev = await self._prev(chain, j - 1, phase, exclude) if j else None
            await rows
        finally:
            if not rows.done():
                rows.cancel()
                await asyncio.gather(rows, return_exceptions=True)
        used = [e for e in self._ctx.roster.entries if e.peer not in exclude]
        weight_sum = sum(e.weight for e in used)
        missing = set(exclude) | step.failed | set(() if prev is None else prev[1].missing)
        missing = self._reducer.faults.missing(step.k, missing)  # (a test's false claim)
        group = [e for e in used if e.peer in cast(frozenset[str], step.senders)]
        group = [e for e in group if e.peer not in missing]
        acc = chain_sum(
            None if prev is None else prev[2],
            [step.rows[e.peer] for e in group],
            [e.weight for e in group],
            weight_sum,
            step.length,
        )
        if step.step is not None:
            return await self._put_partial(phase, step, prev, _Sum(group, missing, weight_sum, acc))
        await self._put_slice(phase, step, acc, missing)
        return None

    async def _step_rows(self, phase: int, step: SliceWork, exclude: set[str]) -> None:
        """Fetch a step's rows, not waiting for a sender reported missing in ``phase``.

        Such a sender is missing from this step too (the next phase excludes it anyway).
        One-level reducers each fetch from every sender, so each learns a dead sender from its
        own fetch at once; a step fetches only its group, and a backup that took over a dead
        peer's step would otherwise wait a second ``fetch_timeout`` for that peer's rows.
        """
        ctx, reducer = self._ctx, self._reducer

        def wanted() -> set[str]:
            group = cast(frozenset[str], step.senders) - exclude - step.failed
            return set(group) - set(step.rows) - {reducer.peer}

        def reported() -> set[str]:
            return wanted() & self._reported_missing(phase)

        step.failed |= reported()  # known before this step starts: not asked at all
        ctx.unfetchable.update(step.failed)
        fetch = asyncio.create_task(reducer.rows(ctx, step, exclude))
        watch = asyncio.create_task(
            reducer.board.wait_for(lambda: bool(reported()), reducer.config.phase_timeout)
        )
        try:
            await asyncio.wait({fetch, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not fetch.done() and reported():
                fetch.cancel()
                await asyncio.gather(fetch, return_exceptions=True)
                step.failed |= reported()
                ctx.unfetchable.update(step.failed)
                await reducer.rows(ctx, step, exclude)  # the others still wanted
            else:
                await fetch
        finally:
            for task in (fetch, watch):
                task.cancel()
            await asyncio.gather(fetch, watch, return_exceptions=True)

    def _level_heard(self, phase: int, j: int, level: list[SliceWork]) -> int:
        """Return how many steps of ``level`` (step ``j`` of every chain) have a record.

        Counted again only once the board has grown: every waiting step of a peer asks on
        every board message (about N steps, S = ⌈N/G⌉ records looked up each time).
        """
        messages = self._reducer.board.messages  # appended to; forget() makes a new list
        known = self._level_counts.get((phase, j))
        if known is not None and known[0] is messages and known[1] == len(messages):
            return known[2]
        heard = sum(1 for s in level if self._reducer.records(self._ctx, phase, s))
        self._level_counts[(phase, j)] = (messages, len(messages), heard)
        return heard

    def _reported_missing(self, phase: int) -> set[str]:
        """Senders a roster peer's partial or slice record of ``phase`` lists ``missing``.

        Read from the records' inline bytes as the board grows (each message once).
        """
        messages = self._reducer.board.messages
        if self._heard_upto > len(messages):  # the board forgot other rounds: read it again
            self._heard_upto, self._heard_missing = 0, {}
        members = self._ctx.roster.peer_set
        for message in messages[self._heard_upto :]:
            if (
                message.kind not in ("partial", "slice")
                or message.block is None
                or message.roster != self._ctx.roster_cid
                or message.sender not in members
            ):
                continue
            kind = PartialRecord if message.kind == "partial" else SliceRecord
            with contextlib.suppress(DecodeError, BlockCorrupt):
                record = kind.from_block(Block.from_parts(cast(CID, message.cid), message.block))
                self._heard_missing.setdefault(message.phase, set()).update(record.missing)
        self._heard_upto = len(messages)
        return self._heard_missing.get(phase, set())

    async def _put_partial(
        self, phase: int, step: SliceWork, prev: _Loaded | None, total: _Sum
    ) -> _Loaded:
        reducer = self._reducer
        acc = reducer.faults.alter(step.k, total.acc)
        forged = reducer.faults.partial_blocks(step.k, acc)
        blocks = partial_blocks(acc) if forged is None else forged
        await put_many(reducer.store, blocks, pin=False)  # transient: retention drops it
        record = PartialRecord(
            roster=self._ctx.roster_cid,
            k=step.k,
            j=step.j,
            groups=self._groups,
            offset=step.offset,
            length=step.length,
            prev=None if prev is None else prev[0],
            inputs=tuple((e.peer, e.contribution) for e in total.group),
            missing=tuple(sorted(total.missing)),
            weight_sum=total.weight_sum,
            values=tuple(b.cid for b in blocks),
        )
        block = record.to_block()
        await reducer.store.put(block, pin=False)
        if forged is None:  # else read back like any other peer's (a fault hook's)
            self._partials[bytes(block.cid)] = acc
        await reducer.board.publish(
            SliceMessage(
                "partial", reducer.peer, self._ctx.roster_cid, phase, cast(int, step.step),
                block.cid, block=block.data,
            )
        )  # fmt: skip
        return block.cid, record, acc

    async def _put_slice(
        self, phase: int, step: SliceWork, acc: np.ndarray, missing: set[str]
    ) -> None:
        ctx, reducer = self._ctx, self._reducer
        values = finish_update(
            acc, ctx.base[step.offset : step.offset + step.length], reducer.config.learning_rate
        )
        block, values = await reducer.commit(ctx, step, values, missing, announced=True)
        await reducer.announce(ctx, phase, step.k, block, values)

    async def _prev(self, chain: list[SliceWork], j: int, phase: int, exclude: set[str]) -> _Loaded:
        """Wait for the best-ranked valid partial sum of step ``j`` of ``chain`` in ``phase``.

        When every partial announced for the step was refused (garbage, or not this step's)
        and none came for ``reducer_timeout`` after, this peer computes the step itself
        (recursively for a garbage step before it): its backups saw a record and stood aside,
        so one member's bytes would otherwise stall the slice.

        Raises
        ------
        TimeoutError
            If none arrived within ``phase_timeout``.
        """
        ctx, reducer, step = self._ctx, self._reducer, chain[j]
        config = reducer.config
        tried: set[bytes] = set()
        deadline = time.monotonic() + config.phase_timeout

        def untried() -> list[SliceMessage]:
            return [
                m for m in reducer.records(ctx, phase, step) if bytes(cast(CID, m.cid))
                not in tried
            ]  # fmt: skip

        while True:
            for message in untried():
                tried.add(bytes(cast(CID, message.cid)))
                loaded = await self._load_partial(message, step)
                if loaded is not None and set(exclude) <= set(loaded[1].missing):
                    if message.sender != step.ranking[0]:
                        ctx.replaced.add(step.ranking[0])
                    return loaded
            left = deadline - time.monotonic()
            wait = min(left, config.reducer_timeout) if tried else left
            if left > 0 and await reducer.board.wait_for(lambda: bool(untried()), wait):
                continue
            if tried and left > 0:  # every announced partial refused, and no other came
                logger.warning("slice %d step %d: partials refused; computing it", step.k, step.j)
                built = await self._compute_step(chain, j, phase, exclude)
                if built is not None:
                    return built
            raise TimeoutError(
                f"phase {phase}: no partial sum of slice {step.k} step {step.j} arrived"
            )

    async def _load_partial(self, message: SliceMessage, step: SliceWork) -> _Loaded | None:
        """Return an announced partial sum of ``step`` with its values; ``None`` if it is not."""
        ctx, store = self._ctx, self._reducer.store
        timeout = self._reducer.config.fetch_timeout
        cid = cast(CID, message.cid)
        try:
            block = await carried_or_fetched(store, cid, message.block, timeout=timeout)
            record = PartialRecord.from_block(block)
            place = (record.roster, record.k, record.j, record.groups, record.offset, record.length)
            if place != (ctx.roster_cid, step.k, step.j, self._groups, step.offset, step.length):
                ctx.garbage[message.sender] = f"partial {cid} is not step {step.step}'s"
                await self._reducer.keep_evidence(ctx, message)
                return None
            values = self._partials.get(bytes(cid))
            if values is None:
                blocks = await asyncio.gather(
                    *(store.get(c, timeout=timeout) for c in record.values)
                )
                values = partial_values(blocks, record.length)
                self._partials[bytes(cid)] = values  # a blame read of it fetches nothing again
        except (BlockStoreError, DecodeError, GradientError, TimeoutError) as exc:
            logger.warning("partial %s from %s refused: %s", cid, message.sender, exc)
            if isinstance(exc, DecodeError | GradientError):  # its bytes, not the network
                ctx.garbage[message.sender] = f"partial {cid}: {exc}"
                await self._reducer.keep_evidence(ctx, message)
            return None
        return cid, record, values

    async def blame(
        self, phase: int, k: int, rows: dict[str, np.ndarray], missing: Sequence[str]
    ) -> tuple[str, CID] | None:
        """Return the announcer and CID of the earliest wrong partial of slice ``k``'s chain.

        ``rows`` are every used sender's values of slice ``k`` (the check's recompute);
        ``None`` if every announced partial is right (the slice record's author lied).
        """
        used = [e for e in self._ctx.roster.entries if e.peer not in missing]
        weight_sum = sum(e.weight for e in used)
        acc: np.ndarray | None = None
        for step in self.chains[k][:-1]:
            group = [e for e in used if e.peer in cast(frozenset[str], step.senders)]
            acc = chain_sum(
                acc, [rows[e.peer] for e in group], [e.weight for e in group], weight_sum,
                step.length,
            )  # fmt: skip
            for message in self._reducer.records(self._ctx, phase, step):
                loaded = await self._load_partial(message, step)
                if loaded is None or loaded[1].missing != tuple(sorted(missing)):
                    continue  # refused by every step after it, or of another exclusion set
                if loaded[2].tobytes() != acc.tobytes():
                    return message.sender, loaded[0]
        return None
