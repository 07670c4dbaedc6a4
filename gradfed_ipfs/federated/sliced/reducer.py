"""The reduce step of a reduce-scatter round: fetch a slice's rows, reduce, put, announce.

:class:`Reducer` is owned by :class:`~.peer.ReduceScatterPeer` and shared with its other
collaborators (the chained steps of :mod:`.chain` and the check of :mod:`.checks` use its
fetches, records and turns); every method takes the round's :class:`~.context.SliceRound`.
A reducer waits for its turn at a slice as its rank there (see :meth:`Reducer.my_turn`), and
its fault hooks (:mod:`.faults`) are the only place a test or benchmark makes it misbehave.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Hashable
from typing import TypeAlias, cast

from multiformats import CID

from ..._types import FloatArray
from ...cid import cid_to_str
from ...errors import (
    BlockCorrupt,
    BlockStoreError,
    DecodeError,
    GradientError,
    InvalidGradient,
)
from ...formats.sliced.partials import PartialRecord
from ...formats.sliced.slices import SliceInputs, SliceMessage, SliceRecord
from ...storage.base import Block
from ...storage.dag import put_gradient
from ...storage.retention import put_pinned_alone
from ..exchange.fetcher import check_values
from ..exchange.records import carried_or_fetched
from .config import ReduceScatterConfig, SliceWork
from .context import SliceRound
from .faults import SliceFaults
from .plan import reduce_values
from .transport import CountingStore, MemorySliceBoard, fetch_range

__all__ = ["Reducer", "Serving"]

Serving: TypeAlias = tuple[SliceWork, Callable[[], Awaitable[None]]]
"""A slice (or chained step) this peer is ranked for, and how to serve it."""


class Reducer:
    """One peer's reduce operations of a reduce-scatter round.

    Parameters
    ----------
    peer
        This peer's ID (its roster entry).
    store
        Its (counting) block store.
    board
        The round's message board.
    config
        Shared settings.
    faults
        Test and benchmark hooks (:mod:`.faults`); default honest.
    """

    def __init__(
        self,
        peer: str,
        store: CountingStore,
        board: MemorySliceBoard,
        config: ReduceScatterConfig,
        faults: SliceFaults,
    ) -> None:
        self.peer, self.store, self.board, self.config = peer, store, board, config
        self.faults = faults

    async def rows(self, ctx: SliceRound, part: SliceWork, exclude: set[str]) -> None:
        """Fetch slice ``part`` of every roster input not yet held, failed or excluded."""
        await asyncio.gather(
            *(
                self._row(ctx, part, e.peer, e.contribution)
                for e in ctx.roster.entries
                if e.peer not in part.rows
                and e.peer not in part.failed
                and e.peer not in exclude
                and (part.senders is None or e.peer in part.senders)
            )
        )

    async def _row(self, ctx: SliceRound, part: SliceWork, peer: str, cid: CID) -> None:
        if peer == self.peer:
            part.rows[peer] = ctx.own[part.offset : part.offset + part.length]
            return
        if peer in ctx.unfetchable:  # missing from one slice is missing from all anyway
            part.failed.add(peer)  # (the next phase's exclusion): no second fetch timeout
            return
        try:
            values = await fetch_range(
                self.store,
                cid,
                part.offset,
                part.length,
                ctx.d,
                timeout=self.config.fetch_timeout,
                concurrency=self.config.concurrency,
                packing=self.config.packing,
            )
            check_values(values, self.config.max_value, f"contribution {cid_to_str(cid)}")
            part.rows[peer] = values
        except (BlockStoreError, DecodeError, GradientError):
            part.failed.add(peer)  # the sender's fault: it is excluded, not the round
            ctx.unfetchable.add(peer)

    async def false_claims(
        self, ctx: SliceRound, part: SliceWork, claimed: set[str], exclude: set[str]
    ) -> list[str]:
        """Return the senders of ``claimed`` whose slice ``part`` this peer can fetch after all.

        A record's ``missing`` claim ("I could not fetch it") excludes a sender from every
        slice, so it is checked before it counts: the sender's rows of the slice are fetched
        here (once a round per sender and slice; a sender this peer already failed to fetch
        is taken as missing). A sender that serves valid rows was censored, not missing.
        """
        todo = sorted(claimed - exclude - ctx.unfetchable)
        for name in todo:
            # One probe of a sender at a time: a dead one costs one fetch timeout, not N.
            async with ctx.probing.setdefault(name, asyncio.Lock()):
                if (name, part.k) in ctx.served or name in ctx.unfetchable:
                    continue
                probe = SliceWork(part.k, part.offset, part.length, [])
                entry = next((e for e in ctx.roster.entries if e.peer == name), None)
                if entry is not None:
                    await self._row(ctx, probe, name, entry.contribution)
                ctx.served[(name, part.k)] = name in probe.rows
        return [name for name in todo if ctx.served.get((name, part.k))]

    def claimant(self, ctx: SliceRound, phase: int, name: str) -> SliceMessage | None:
        """Return the first announcement of a record of ``phase`` listing ``name`` missing.

        A chained step lists a sender another step reported missing without fetching it
        (:meth:`~.chain.ChainRound._step_rows`), so the first such record is the claim.
        """
        for message in self.board.messages:
            if (
                message.kind not in ("slice", "partial")
                or message.phase != phase
                or message.block is None
                or message.roster != ctx.roster_cid
                or message.sender not in ctx.roster.peer_set
            ):
                continue
            kind = PartialRecord if message.kind == "partial" else SliceRecord
            try:
                record = kind.from_block(Block.from_parts(cast(CID, message.cid), message.block))
            except (DecodeError, BlockCorrupt):
                continue
            if name in record.missing:
                return message
        return None

    async def keep_evidence(self, ctx: SliceRound, message: SliceMessage | None) -> None:
        """Put ``message``'s signed statement and note it in ``ctx.evidence`` (if signed)."""
        if message is None or message.signed is None or message.sender in ctx.evidence:
            return
        ctx.evidence[message.sender] = await put_pinned_alone(self.store, message.signed.block)

    def announced(
        self, ctx: SliceRound, sender: str, kind: str, cid: CID | None
    ) -> SliceMessage | None:
        """Return ``sender``'s first board message of this round of ``kind`` naming ``cid``."""
        for message in self.board.messages:
            if (
                message.sender == sender
                and message.kind == kind
                and message.roster == ctx.roster_cid
                and (cid is None or message.cid == cid)
            ):
                return message
        return None

    async def reduce(
        self, ctx: SliceRound, part: SliceWork, exclude: set[str], *, announced: bool = False
    ) -> tuple[Block, FloatArray]:
        """Reduce slice ``part`` without the ``exclude`` senders; put and return its record.

        ``announced``: this peer serves the slice (the fault hooks may alter it).
        """
        await self.rows(ctx, part, exclude)
        missing = exclude | part.failed
        if announced:
            missing = self.faults.missing(part.k, missing)
        used = [e for e in ctx.roster.entries if e.peer not in missing]
        if not used:
            raise InvalidGradient(f"slice {part.k}: every roster input is missing")
        values = reduce_values(
            self.config.rule,
            ctx.base[part.offset : part.offset + part.length],
            [part.rows[e.peer] for e in used],
            [e.weight for e in used],
            self.config.learning_rate,
        )
        return await self.commit(ctx, part, values, missing, announced=announced)

    async def commit(
        self,
        ctx: SliceRound,
        part: SliceWork,
        values: FloatArray,
        missing: set[str],
        *,
        announced: bool = False,
    ) -> tuple[Block, FloatArray]:
        """Put slice ``part``'s result and record; return both (as the fault hooks leave them)."""
        if announced:
            values = self.faults.alter(part.k, values)
        result = await put_gradient(self.store, values, chunk_bytes=self.config.chunk_bytes)
        used = [e for e in ctx.roster.entries if e.peer not in missing]
        record = SliceRecord(
            roster=ctx.roster_cid,
            base=ctx.roster.base,
            k=part.k,
            offset=part.offset,
            length=part.length,
            rule=self.config.rule,
            learning_rate=float(self.config.learning_rate),
            inputs=tuple((e.peer, e.contribution) for e in used),
            missing=tuple(sorted(missing)),
            weight_sum=sum(e.weight for e in used),
            result=result,
        )
        block = record.to_block()
        await put_pinned_alone(self.store, block)
        return await self.faults.commit(self.store, block, values)

    def records(self, ctx: SliceRound, phase: int, part: SliceWork) -> list[SliceMessage]:
        """Slice messages of ``part`` from its ranked reducers, best rank first.

        Anyone may publish on the board: a sender outside the roster is ignored.
        """
        rank = part.rank
        if part.step is None:
            heard = self.board.records(ctx.roster_cid, phase, part.k)
        else:
            heard = self.board.records(ctx.roster_cid, phase, part.step, "partial")
        found = [m for m in heard if m.sender in rank and m.cid is not None]
        return sorted(found, key=lambda m: rank[m.sender])

    def key(self, ctx: SliceRound, phase: int, part: SliceWork) -> Hashable:
        """Return the board key of ``part``'s records (see ``MemorySliceBoard.record_key``)."""
        if part.step is None:
            return self.board.record_key(ctx.roster_cid, phase, part.k)
        return self.board.record_key(ctx.roster_cid, phase, part.step, "partial")

    def filled(self, ctx: SliceRound, phase: int, parts: list[SliceWork], count: int) -> bool:
        """Return whether ``count`` slices of ``phase`` have a record from one of their reducers.

        The board's own count (records from anyone) bounds it first: this runs on every board
        message for each of a peer's N waiting slices.
        """
        if self.board.filled(ctx.roster_cid, phase) < count:
            return False
        return sum(1 for p in parts if self.records(ctx, phase, p)) >= count

    async def serve(
        self,
        ctx: SliceRound,
        part: SliceWork,
        phase: int,
        exclude: set[str],
        parts: list[SliceWork],
    ) -> None:
        """Reduce slice ``part`` in ``phase`` if no better-ranked reducer did in time.

        Rank ``r ≥ 1`` takes over only ``a · reducer_timeout`` after half of the slices have
        their records, ``a`` being the better-ranked reducers not known gone (on a slow machine
        every reducer is slow alike, and a clock started at the phase's beginning would have
        backups redo every slice). Known gone: a sender whose contribution this peer could not
        fetch, or excluded, or a first reducer replaced in an earlier phase; a dead reducer
        costs ``reducer_timeout`` once a round, not once a phase.
        """
        half = (len(parts) + 1) // 2
        if not await self.my_turn(
            ctx,
            phase,
            part,
            lambda: self.filled(ctx, phase, parts, half),
            lambda: ctx.unfetchable | ctx.replaced | exclude,
        ):
            return
        block, values = await self.reduce(ctx, part, exclude, announced=True)
        await self.announce(ctx, phase, part.k, block, values)

    async def serve_ranked(
        self, ctx: SliceRound, phase: int, work: list[Serving], parts: list[SliceWork]
    ) -> None:
        """Serve ``work``: its first ``backups`` ranks at once, the others late if needed.

        A step this peer ranks ``backups`` or lower for is served (waiting its turn from then)
        only if it has no record ``backups · reducer_timeout`` into the phase, or once every
        slice of ``parts`` has one, not at all: N waiting steps a peer cost O(N) a phase.
        """
        backups = self.config.backups
        near = [serve() for part, serve in work if part.rank[self.peer] < backups]
        deep = [(part, serve) for part, serve in work if part.rank[self.peer] >= backups]
        await asyncio.gather(*near, self._serve_late(ctx, phase, deep, parts))

    async def _serve_late(
        self, ctx: SliceRound, phase: int, deep: list[Serving], parts: list[SliceWork]
    ) -> None:
        config = self.config
        wait = config.backups * config.reducer_timeout
        if not deep or wait >= config.phase_timeout:  # the phase is over by then
            return
        if await self.board.wait_for(lambda: self.filled(ctx, phase, parts, len(parts)), wait):
            return
        await asyncio.gather(
            *(serve() for part, serve in deep if not self.records(ctx, phase, part))
        )

    async def announce(
        self, ctx: SliceRound, phase: int, k: int, block: Block, values: FloatArray
    ) -> None:
        """Keep a slice this peer reduced (its values are not fetched back) and announce it."""
        ctx.local[block.cid] = values
        await self.board.publish(
            SliceMessage("slice", self.peer, ctx.roster_cid, phase, k, block.cid, block=block.data)
        )

    async def my_turn(
        self,
        ctx: SliceRound,
        phase: int,
        part: SliceWork,
        ready: Callable[[], bool],
        gone: Callable[[], set[str]],
        on: Collection[Hashable] = (),
    ) -> bool:
        """Wait as ``part``'s rank ``r``; return whether this peer reduces it.

        Rank 0 goes at once. Rank ``r ≥ 1`` waits until ``ready()`` (its clock's start), then
        ``a · reducer_timeout`` for a better-ranked record, ``a`` being the better-ranked peers
        not in ``gone()``; it goes if none came. A peer whose fault hooks say it does not
        reduce (:meth:`~.faults.SliceFaults.reduces`) never goes. ``on``: the board keys
        (:meth:`~.transport.MemorySliceBoard.wait_for`) that can make ``ready()`` true, besides
        ``part``'s own records; empty: every message re-checks it.
        """
        rank = part.rank[self.peer]
        if rank:

            def mine() -> bool:
                return bool(self.records(ctx, phase, part))

            def ahead() -> int:  # O(gone), not O(rank): a rank is up to N
                ranks = part.rank
                return rank - sum(1 for p in gone() if p in ranks and ranks[p] < rank)

            keys = (self.key(ctx, phase, part), *on) if on else None
            await self.board.wait_for(lambda: mine() or ready(), self.config.phase_timeout, on=keys)
            await self.board.wait_for(
                lambda: mine() or not ahead(), ahead() * self.config.reducer_timeout
            )
            if mine():
                return False
        return self.faults.reduces()

    async def load(
        self, ctx: SliceRound, message: SliceMessage, expected: SliceInputs | None = None
    ) -> SliceRecord:
        """Return the record a ``slice`` message names: its inline bytes, else fetched by CID."""
        cid = cast(CID, message.cid)
        timeout = self.config.fetch_timeout
        block = await carried_or_fetched(self.store, cid, message.block, timeout=timeout)
        record = SliceRecord.from_block(block, expected)
        ctx.records_read[bytes(cid)] = block  # for the retention keeper: put, not fetched
        return record
