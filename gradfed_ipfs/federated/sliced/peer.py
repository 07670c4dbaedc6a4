"""Reduce-scatter / all-gather over CIDs for an agreed roster (issue 14).

Given an agreed :class:`~gradfed_ipfs.formats.roster.Roster` of N contributions on d values,
:meth:`ReduceScatterPeer.run` computes the same model as the all-to-all agreed round
(``float32(base + lr · Σ (w_i/W) g_i)``, same bytes, same CID) while each peer downloads about
``2·(N−1)/N·d`` floats instead of ``(N−1)·d``:

1. **reduce**: slice k (:func:`~.slices.plan_slices`, chunk-aligned) is reduced by the first
   peer of :func:`~.slices.reducer_ranking`; rank ``r`` takes over if no record of slice k
   arrived ``r · reducer_timeout`` after half of the slices had theirs (a silent reducer).
   The reducer fetches only the chunks covering slice k of every contribution, reduces them in
   roster order (:func:`~.slices.reduce_values`), puts the result block and a
   :class:`~gradfed_ipfs.formats.slices.SliceRecord` (no reducer name in it: two honest
   reducers write the same CID) and announces it on the :class:`SliceBoard`.
2. **missing senders**: a contribution a reducer cannot fetch is listed ``missing``. The
   exclusion set of phase ``p+1`` is the union of ``missing`` over every phase-``p`` record;
   reducers redo their slice with it (from the rows they already hold) until a phase adds no
   one, so every slice of the result excludes the same senders and the weights agree.
3. **check** (:mod:`.reduce_scatter_check`): every peer publishes ``⟨z_k, g_i[k]⟩`` for every
   k, with ``z_k`` seeded from the hash of all final slice-record CIDs
   (:func:`~.slices.projection_seed`; unknown to reducers when they commit), and checks
   ``⟨z_k, R_k⟩`` against ``⟨z_k, base_k⟩ + lr·Σ (w_i/W)⟨z_k, g_i[k]⟩`` within float32
   rounding (``fedavg``; median and trimmed-mean slices are spot checked at ``s`` coordinates
   of the same seed, :mod:`.slice_check`). A failing slice is recomputed by the checker (d/N
   values of each input); a different CID is a proven lie: the checker puts and announces a
   :class:`~gradfed_ipfs.formats.slices.FraudRecord` (the same bytes from every honest
   checker), the next-ranked honest reducer announces the correct record, and the liar is
   reported in :attr:`ReduceScatterResult.liars`.
4. **all-gather**: every peer fetches the N slice results, concatenates them and puts the model
   (:func:`~gradfed_ipfs.storage.dag.put_gradient`): the CID is the same on every honest peer.

With ``ReduceScatterConfig(chained=True)`` (``fedavg``) step 1 runs in ``G`` steps per slice
along the roster instead, passing float64 partial sums (:mod:`.reduce_chain`): the same
records and model with ~N^1.5 blocks a round instead of ~2·N²; steps 2 to 4 are unchanged.

The board is :class:`PubsubSliceBoard` (one per peer, over pubsub) or, for peers simulated in
one process, the shared :class:`MemorySliceBoard`; its messages are small (CIDs, N floats, and
a slice record's bytes, which spare every reader one fetch per slice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import cast

import numpy as np
from multiformats import CID

from ..._types import FloatArray
from ...errors import (
    BlockCorrupt,
    BlockStoreError,
    DecodeError,
    GradientError,
    InvalidGradient,
    MalformedManifest,
)
from ...formats.roster import Roster
from ...formats.slices import SliceInputs, SliceMessage, SliceRecord
from ...storage.base import Block, BlockStore
from ...storage.dag import put_gradient
from ...storage.retention import put_pinned_alone
from ..exchange.encoded import encode_gradient
from .chain import ChainSteps
from .checks import SliceChecks
from .config import ReduceScatterConfig, ReduceScatterResult, SliceWork
from .faults import SliceFaults
from .plan import (
    chain_groups,
    plan_slices,
    reduce_values,
    reducer_rankings,
)
from .transport import (
    CountingStore,
    MemorySliceBoard,
    PubsubSliceBoard,
    fetch_range,
)

logger = logging.getLogger("gradfed_ipfs.federated.reduce_scatter")

__all__ = [
    "CountingStore",
    "MemorySliceBoard",
    "PubsubSliceBoard",
    "ReduceScatterConfig",
    "ReduceScatterPeer",
    "ReduceScatterResult",
    "SliceMessage",
    "fetch_range",
]


class ReduceScatterPeer(SliceChecks, ChainSteps):
    """One roster peer's side of a reduce-scatter round; see the module docstring.

    Parameters
    ----------
    peer
        This peer's ID (its roster entry).
    store
        Its block store (wrapped in a :class:`CountingStore` to measure downloads).
    board
        The round's message board.
    config
        Shared settings.
    faults
        Test and benchmark hooks (:mod:`.faults`: a lying or a dead reducer); default honest.
    """

    def __init__(
        self,
        peer: str,
        store: BlockStore,
        board: MemorySliceBoard,
        config: ReduceScatterConfig | None = None,
        *,
        faults: SliceFaults | None = None,
    ) -> None:
        self.peer = peer
        self.store = CountingStore(store)
        self.board = board
        self.config = config or ReduceScatterConfig()
        self.faults = faults or SliceFaults()

    # ------------------------------------------------------------------ reduce

    async def _rows(
        self, roster: Roster, part: SliceWork, own: FloatArray, d: int, exclude: set[str]
    ) -> None:
        """Fetch slice ``part`` of every roster input not yet held, failed or excluded."""

        async def one(peer: str, cid: CID) -> None:
            if peer == self.peer:
                part.rows[peer] = own[part.offset : part.offset + part.length]
                return
            if peer in self._unfetchable:  # missing from one slice is missing from all anyway
                part.failed.add(peer)  # (the next phase's exclusion): no second fetch timeout
                return
            try:
                values = await fetch_range(
                    self.store,
                    cid,
                    part.offset,
                    part.length,
                    d,
                    timeout=self.config.fetch_timeout,
                    concurrency=self.config.concurrency,
                )
                if not np.isfinite(values).all():
                    raise InvalidGradient(f"contribution {cid} has non-finite values")
                part.rows[peer] = values
            except (BlockStoreError, DecodeError, GradientError):
                part.failed.add(peer)  # the sender's fault: it is excluded, not the round
                self._unfetchable.add(peer)

        await asyncio.gather(
            *(
                one(e.peer, e.contribution)
                for e in roster.entries
                if e.peer not in part.rows
                and e.peer not in part.failed
                and e.peer not in exclude
                and (part.senders is None or e.peer in part.senders)
            )
        )

    async def _reduce(
        self,
        roster: Roster,
        roster_cid: CID,
        base: FloatArray,
        own: FloatArray,
        part: SliceWork,
        exclude: set[str],
        *,
        announced: bool = False,
    ) -> tuple[Block, FloatArray]:
        """Reduce slice ``part`` without the ``exclude`` senders; put and return its record.

        ``announced``: this peer serves the slice (the fault hooks may alter it).
        """
        await self._rows(roster, part, own, base.size, exclude)
        missing = exclude | part.failed
        used = [e for e in roster.entries if e.peer not in missing]
        if not used:
            raise InvalidGradient(f"slice {part.k}: every roster input is missing")
        values = reduce_values(
            self.config.rule,
            base[part.offset : part.offset + part.length],
            [part.rows[e.peer] for e in used],
            [e.weight for e in used],
            self.config.learning_rate,
        )
        return await self._commit_slice(roster, roster_cid, part, values, missing, announced)

    async def _commit_slice(
        self,
        roster: Roster,
        roster_cid: CID,
        part: SliceWork,
        values: FloatArray,
        missing: set[str],
        announced: bool = False,
    ) -> tuple[Block, FloatArray]:
        """Put slice ``part``'s result and record; return both (as the fault hooks leave them)."""
        if announced:
            values = self.faults.alter(part.k, values)
        result = await put_gradient(self.store, values, chunk_bytes=self.config.chunk_bytes)
        used = [e for e in roster.entries if e.peer not in missing]
        record = SliceRecord(
            roster=roster_cid,
            base=roster.base,
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

    def _records(self, roster_cid: CID, phase: int, part: SliceWork) -> list[SliceMessage]:
        """Slice messages of ``part`` from its ranked reducers, best rank first.

        Anyone may publish on the board: a sender outside the roster is ignored.
        """
        rank = part.rank
        if part.step is None:
            heard = self.board.records(roster_cid, phase, part.k)
        else:
            heard = self.board.records(roster_cid, phase, part.step, "partial")
        found = [m for m in heard if m.sender in rank and m.cid is not None]
        return sorted(found, key=lambda m: rank[m.sender])

    def _filled(self, roster_cid: CID, phase: int, parts: list[SliceWork], count: int) -> bool:
        """Return whether ``count`` slices of ``phase`` have a record from one of their reducers.

        The board's own count (records from anyone) bounds it first: this runs on every board
        message for each of a peer's N waiting slices.
        """
        if self.board.filled(roster_cid, phase) < count:
            return False
        return sum(1 for p in parts if self._records(roster_cid, phase, p)) >= count

    async def _serve(
        self,
        roster: Roster,
        roster_cid: CID,
        base: FloatArray,
        own: FloatArray,
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
        if not await self._my_turn(
            roster_cid,
            phase,
            part,
            lambda: self._filled(roster_cid, phase, parts, half),
            lambda: self._unfetchable | self._replaced | exclude,
        ):
            return
        block, values = await self._reduce(
            roster, roster_cid, base, own, part, exclude, announced=True
        )
        await self._announce_slice(roster_cid, phase, part.k, block, values)

    async def _announce_slice(
        self, roster_cid: CID, phase: int, k: int, block: Block, values: FloatArray
    ) -> None:
        """Keep a slice this peer reduced (its values are not fetched back) and announce it."""
        self._local[block.cid] = values
        await self.board.publish(
            SliceMessage("slice", self.peer, roster_cid, phase, k, block.cid, block=block.data)
        )

    async def _my_turn(
        self,
        roster_cid: CID,
        phase: int,
        part: SliceWork,
        ready: Callable[[], bool],
        gone: Callable[[], set[str]],
    ) -> bool:
        """Wait as ``part``'s rank ``r``; return whether this peer reduces it (not ``silent``).

        Rank 0 goes at once. Rank ``r ≥ 1`` waits until ``ready()`` (its clock's start), then
        ``a · reducer_timeout`` for a better-ranked record, ``a`` being the better-ranked peers
        not in ``gone()``; it goes if none came.
        """
        rank = part.rank[self.peer]
        if rank:

            def mine() -> bool:
                return bool(self._records(roster_cid, phase, part))

            def ahead() -> int:
                known = gone()
                return sum(1 for p in part.ranking[:rank] if p not in known)

            await self.board.wait_for(lambda: mine() or ready(), self.config.phase_timeout)
            await self.board.wait_for(
                lambda: mine() or not ahead(), ahead() * self.config.reducer_timeout
            )
            if mine():
                return False
        return self.faults.reduces()

    async def _load(
        self, message: SliceMessage, expected: SliceInputs | None = None
    ) -> SliceRecord:
        """Return the record a ``slice`` message names: its inline bytes, else fetched by CID."""
        cid = cast(CID, message.cid)
        block = None
        if message.block is not None:
            with contextlib.suppress(BlockCorrupt):  # a forged inline copy: fetch the record
                block = Block.from_parts(cid, message.block)
        if block is None:
            block = await self.store.get(cid, timeout=self.config.fetch_timeout)
        record = SliceRecord.from_block(block, expected)
        self._records_read[bytes(cid)] = block  # for the retention keeper: put, not fetched
        return record

    # ------------------------------------------------------------------ round

    async def run(
        self,
        roster: Roster,
        roster_cid: CID,
        base: FloatArray,
        own: FloatArray,
        *,
        put_model: bool = True,
    ) -> ReduceScatterResult:
        """Run one round on ``roster`` (this peer's ``own`` contribution held locally).

        Parameters
        ----------
        roster, roster_cid
            The agreed roster and its CID.
        base
            The base model (float32, d values; every peer holds it).
        own
            This peer's gradient (float32, d values), the one its roster entry names.
        put_model
            Store the assembled model (else only its CID is computed; the caller stores it).

        Raises
        ------
        TimeoutError
            If not every slice record (of some phase) arrived within ``phase_timeout``.
        InvalidGradient
            If every roster input of a slice is missing.
        """
        started = time.monotonic()
        before = self.store.downloaded
        base = np.ascontiguousarray(base, np.float32).reshape(-1)
        own = np.ascontiguousarray(own, np.float32).reshape(-1)
        d, peers = base.size, roster.peers
        self._local: dict[CID, FloatArray] = {}
        self._records_read: dict[bytes, Block] = {}
        self._unfetchable: set[str] = set()  # senders a fetch of this peer failed for
        self._replaced: set[str] = set()  # first reducers a backup replaced, earlier phases
        self._garbage: dict[str, str] = {}  # reducers whose announced records were refused
        chains, groups = None, min(self.config.chain_groups or chain_groups(len(peers)), len(peers))
        if self.config.chained and self.config.rule == "fedavg" and groups > 1:
            chains = self._chains(roster, roster_cid, d, groups)
            parts = [chain[-1] for chain in chains]  # the steps that write the slice records
        else:
            plan = plan_slices(d, len(peers), self.config.chunk_bytes)
            rankings = reducer_rankings(bytes(roster_cid), len(plan), peers)
            parts = [
                SliceWork(k, off, n, ranking)
                for k, ((off, n), ranking) in enumerate(zip(plan, rankings, strict=True))
            ]
        exclude: set[str] = set()
        phase = 0
        while True:
            chosen = await self._phase(roster, roster_cid, base, own, parts, phase, exclude, chains)
            found = set().union(*(set(r.missing) for _, r, _ in chosen))
            pairs = zip(parts, chosen, strict=True)
            self._replaced |= {p.ranking[0] for p, (_, _, by) in pairs if by != p.ranking[0]}
            if found == exclude:
                break
            exclude, phase = found, phase + 1
        records = [cid for cid, _, _ in chosen]
        blame = None if chains is None else partial(self._blame, roster, roster_cid, chains, phase)
        results, liars, frauds, redone, false_values = await self._check(
            roster, roster_cid, base, own, parts, chosen, records,
            partial(self._reduce, roster, roster_cid, base, own), blame,
        )  # fmt: skip
        model = np.concatenate(results)
        encoded = await encode_gradient(model)  # put_gradient's CID; its chunks in one batch
        model_cid = await encoded.store(self.store) if put_model else encoded.cid
        return ReduceScatterResult(
            model=model,
            model_cid=model_cid,
            records=records,
            missing=tuple(sorted(exclude)),
            liars=liars,
            frauds=frauds,
            recomputed=redone,
            false_values=false_values,
            garbage=dict(self._garbage),
            downloaded=self.store.downloaded - before,
            seconds=time.monotonic() - started,
            record_blocks={
                bytes(c): self._records_read[bytes(c)]
                for c in records
                if bytes(c) in self._records_read
            },
        )

    async def _phase(
        self,
        roster: Roster,
        roster_cid: CID,
        base: FloatArray,
        own: FloatArray,
        parts: list[SliceWork],
        phase: int,
        exclude: set[str],
        chains: list[list[SliceWork]] | None = None,
    ) -> list[tuple[CID, SliceRecord, str]]:
        """Serve this peer's slices (or chain steps) of ``phase``; return each slice's record."""
        if chains is None:
            serving = [
                asyncio.create_task(
                    self._serve(roster, roster_cid, base, own, p, phase, exclude, parts)
                )
                for p in parts
                if self.peer in p.rank
            ]
        else:
            levels = [list(level) for level in zip(*chains, strict=True)]
            serving = [
                asyncio.create_task(
                    self._serve_step(
                        roster,
                        roster_cid,
                        base,
                        own,
                        chain,
                        step.j,
                        phase,
                        exclude,
                        levels[step.j],
                    )
                )
                for chain in chains
                for step in chain
                if self.peer in step.rank
            ]
        try:
            ok = await self.board.wait_for(
                lambda: self._filled(roster_cid, phase, parts, len(parts)),
                self.config.phase_timeout,
            )
            if not ok:
                raise TimeoutError(f"phase {phase}: not every slice record arrived")
        finally:
            await asyncio.gather(*serving)

        # What every record of this phase names unless its reducer missed a sender: checked
        # once here instead of N times per record.
        try:
            expected: SliceInputs | None = SliceInputs.of(
                (e.peer, e.contribution) for e in roster.entries if e.peer not in exclude
            )
        except MalformedManifest:  # a roster entry no record may name: decode each in full
            expected = None

        async def best_valid(p: SliceWork) -> tuple[CID, SliceRecord, str]:
            for m in self._records(roster_cid, phase, p):  # the best-ranked valid record
                cid = cast(CID, m.cid)
                try:
                    record = await self._load(m, expected)
                except DecodeError as exc:
                    self._garbage[m.sender] = f"slice record {cid}: {exc}"
                    continue  # a reducer's garbage: the next-ranked record, if any, counts
                except BlockStoreError:
                    continue  # not served: the next-ranked record, if any, counts
                if record.roster == roster_cid and (record.k, record.offset, record.length) == (
                    p.k,
                    p.offset,
                    p.length,
                ):
                    return cid, record, m.sender
                self._garbage[m.sender] = f"slice record {cid} is not slice {p.k} of this round"
            # All garbage, and its backups stood aside on seeing one: each honest peer reduces it.
            logger.warning("slice %d: every announced record refused; reducing it here", p.k)
            fresh = SliceWork(p.k, p.offset, p.length, p.ranking)
            block, values = await self._reduce(roster, roster_cid, base, own, fresh, exclude)
            self._local[block.cid], self._records_read[bytes(block.cid)] = values, block
            return block.cid, SliceRecord.from_block(block), self.peer

        # Concurrently: one after another, N small fetches cost N bitswap round trips.
        chosen = list(await asyncio.gather(*(best_valid(p) for p in parts)))
        return chosen
