"""Reduce-scatter / all-gather over CIDs for an agreed roster (issue 14).

Given an agreed :class:`~gradfed_ipfs.formats.agreed.roster.Roster` of N contributions on d values,
:meth:`ReduceScatterPeer.run` computes the same model as the all-to-all agreed round
(``float32(base + lr · Σ (w_i/W) g_i)``, same bytes, same CID) while each peer downloads about
``2·(N−1)/N·d`` floats instead of ``(N−1)·d``:

1. **reduce**: slice k (:func:`~.slices.plan_slices`, chunk-aligned) is reduced by the first
   peer of :func:`~.slices.reducer_ranking`; rank ``r`` takes over if no record of slice k
   arrived ``r · reducer_timeout`` after half of the slices had theirs (a silent reducer).
   The reducer fetches only the chunks covering slice k of every contribution, reduces them in
   roster order (:func:`~.slices.reduce_values`), puts the result block and a
   :class:`~gradfed_ipfs.formats.sliced.slices.SliceRecord` (no reducer name in it: two honest
   reducers write the same CID) and announces it on the :class:`SliceBoard`.
2. **missing senders**: a contribution a reducer cannot fetch is listed ``missing``. Every
   peer checks such a claim before it counts (:meth:`~.reducer.Reducer.false_claims`: it
   fetches the sender's slice itself); a record whose claim is false is refused like
   garbage (the next-ranked record counts, else each peer reduces the slice) and its
   claimant named in ``garbage``. The
   exclusion set of phase ``p+1`` is the union of ``missing`` over every phase-``p`` record;
   reducers redo their slice with it (from the rows they already hold) until a phase adds no
   one, so every slice of the result excludes the same senders and the weights agree.
3. **check** (:mod:`.reduce_scatter_check`): every peer publishes ``⟨z_k, g_i[k]⟩`` for every
   k, with ``z_k`` seeded from the hash of all final slice-record CIDs
   (:func:`~.slices.projection_seed`; unknown to reducers when they commit), and checks
   ``⟨z_k, R_k⟩`` against ``⟨z_k, base_k⟩ + lr·Σ (w_i/W)⟨z_k, g_i[k]⟩`` within float32
   rounding (``fedavg``; median and trimmed-mean slices are spot checked at ``s`` coordinates
   of the same seed, :mod:`.slice_check`). A slice author's own values are not taken on its
   word (:class:`~.spot.AuthorCheck`: another peer computes them from its blocks). A failing
   slice is recomputed by the checker (d/N
   values of each input); a different CID is a proven lie: the checker puts and announces a
   :class:`~gradfed_ipfs.formats.sliced.slices.FraudRecord` (the same bytes from every honest
   checker), the next-ranked honest reducer announces the correct record, and the liar is
   reported in :attr:`ReduceScatterResult.liars`.
4. **all-gather**: every peer fetches the N slice results, concatenates them and puts the model
   (:func:`~gradfed_ipfs.storage.dag.put_gradient`): the CID is the same on every honest peer.

With ``ReduceScatterConfig(chained=True)`` (``fedavg``) step 1 runs in ``G`` steps per slice
along the roster instead, passing float64 partial sums (:mod:`.reduce_chain`): the same
records and model with ~N^1.5 blocks a round instead of ~2·N²; steps 2 to 4 are unchanged.

The peer owns a :class:`~.reducer.Reducer` (step 1's fetches, reduces, records and turns) and a
:class:`~.checks.SliceChecker` (steps 3 and 4), and makes a :class:`~.chain.ChainRound` for
a chained round; each round's inputs and what it learns are one :class:`~.context.SliceRound`
handed to them.

The board is :class:`PubsubSliceBoard` (one per peer, over pubsub) or, for peers simulated in
one process, the shared :class:`MemorySliceBoard`; its messages are small (CIDs, N floats, and
a slice record's bytes, which spare every reader one fetch per slice).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import cast

import numpy as np
from multiformats import CID

from ..._types import FloatArray
from ...errors import BlockStoreError, DecodeError, MalformedManifest
from ...formats.agreed.roster import Roster
from ...formats.sliced.slices import SliceInputs, SliceMessage, SliceRecord
from ...storage.base import BlockStore
from ..exchange.encoded import encode_gradient
from .chain import ChainRound
from .checks import CheckOutcome, Chosen, SliceChecker
from .config import ReduceScatterConfig, ReduceScatterResult, SliceWork
from .context import SliceRound
from .faults import SliceFaults
from .plan import chain_groups, plan_slices, reducer_rankings
from .reducer import Reducer, Serving
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


class ReduceScatterPeer:
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
        self._reducer = Reducer(peer, self.store, board, self.config, faults or SliceFaults())
        self._checker = SliceChecker(self._reducer)

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
        ctx = SliceRound(
            roster,
            roster_cid,
            np.ascontiguousarray(base, np.float32).reshape(-1),
            np.ascontiguousarray(own, np.float32).reshape(-1),
        )
        chain, parts = self._plan(ctx)
        exclude, phase, chosen = await self._reduce_phases(ctx, parts, chain)
        checked = await self._checker.check(ctx, parts, chosen, chain=chain, phase=phase)
        model = np.concatenate(checked.results)
        encoded = await encode_gradient(model)  # put_gradient's CID; its chunks in one batch
        model_cid = await encoded.store(self.store) if put_model else encoded.cid
        return self._result(ctx, checked, model, model_cid, exclude, started, before)

    def _plan(self, ctx: SliceRound) -> tuple[ChainRound | None, list[SliceWork]]:
        """Return the round's chain (``None``: one level) and the steps that write its records."""
        peers = ctx.roster.peers
        groups = min(self.config.chain_groups or chain_groups(len(peers)), len(peers))
        if self.config.chained and self.config.rule == "fedavg" and groups > 1:
            chain = ChainRound(self._reducer, ctx, groups)
            return chain, [steps[-1] for steps in chain.chains]
        plan = plan_slices(ctx.d, len(peers), self.config.chunk_bytes)
        rankings = reducer_rankings(bytes(ctx.roster_cid), len(plan), peers)
        parts = [
            SliceWork(k, off, n, ranking)
            for k, ((off, n), ranking) in enumerate(zip(plan, rankings, strict=True))
        ]
        return None, parts

    async def _reduce_phases(
        self, ctx: SliceRound, parts: list[SliceWork], chain: ChainRound | None
    ) -> tuple[set[str], int, list[Chosen]]:
        """Reduce phase after phase until one adds no missing sender.

        Returns the excluded senders, the last phase and each slice's chosen record.
        """
        exclude: set[str] = set()
        phase = 0
        while True:
            chosen = await self._phase(ctx, parts, phase, exclude, chain)
            found = set().union(*(set(r.missing) for _, r, _ in chosen))
            pairs = zip(parts, chosen, strict=True)
            ctx.replaced.update(p.ranking[0] for p, (_, _, by) in pairs if by != p.ranking[0])
            if found == exclude:
                return exclude, phase, chosen
            exclude, phase = found, phase + 1

    def _result(
        self,
        ctx: SliceRound,
        checked: CheckOutcome,
        model: FloatArray,
        model_cid: CID,
        exclude: set[str],
        started: float,
        before: int,
    ) -> ReduceScatterResult:
        records = checked.records
        return ReduceScatterResult(
            model=model,
            model_cid=model_cid,
            records=records,
            missing=tuple(sorted(exclude)),
            liars=checked.liars,
            frauds=checked.frauds,
            recomputed=checked.redone,
            false_values=checked.false_values,
            garbage=dict(ctx.garbage),
            evidence=dict(ctx.evidence),
            downloaded=self.store.downloaded - before,
            seconds=time.monotonic() - started,
            record_blocks={
                bytes(c): ctx.records_read[bytes(c)]
                for c in records
                if bytes(c) in ctx.records_read
            },
        )

    async def _phase(
        self,
        ctx: SliceRound,
        parts: list[SliceWork],
        phase: int,
        exclude: set[str],
        chain: ChainRound | None,
    ) -> list[Chosen]:
        """Serve this peer's slices (or chain steps) of ``phase``; return each slice's record."""
        reducer = self._reducer
        if chain is None:
            work: list[Serving] = [
                (p, functools.partial(reducer.serve, ctx, p, phase, exclude, parts))
                for p in parts
                if self.peer in p.rank
            ]
        else:
            work = chain.serving(phase, exclude)
        serving = asyncio.create_task(reducer.serve_ranked(ctx, phase, work, parts))
        try:
            ok = await self.board.wait_for(
                lambda: reducer.filled(ctx, phase, parts, len(parts)),
                self.config.phase_timeout,
            )
            if not ok:
                raise TimeoutError(f"phase {phase}: not every slice record arrived")
        finally:
            await serving
        # What every record of this phase names unless its reducer missed a sender: checked
        # once here instead of N times per record.
        try:
            expected: SliceInputs | None = SliceInputs.of(
                (e.peer, e.contribution) for e in ctx.roster.entries if e.peer not in exclude
            )
        except MalformedManifest:  # a roster entry no record may name: decode each in full
            expected = None
        # Concurrently: one after another, N small fetches cost N bitswap round trips.
        return list(
            await asyncio.gather(
                *(self._best_valid(ctx, p, phase, exclude, expected) for p in parts)
            )
        )

    async def _best_valid(
        self,
        ctx: SliceRound,
        p: SliceWork,
        phase: int,
        exclude: set[str],
        expected: SliceInputs | None,
    ) -> Chosen:
        """Return slice ``p``'s best-ranked valid record of ``phase`` (reducing it if none is)."""
        reducer = self._reducer
        for m in reducer.records(ctx, phase, p):
            cid = cast(CID, m.cid)
            try:
                record = await reducer.load(ctx, m, expected)
            except DecodeError as exc:
                ctx.garbage[m.sender] = f"slice record {cid}: {exc}"
                await reducer.keep_evidence(ctx, m)  # its signed announcement of the bytes
                continue  # a reducer's garbage: the next-ranked record, if any, counts
            except BlockStoreError:
                continue  # not served: the next-ranked record, if any, counts
            place = (record.k, record.offset, record.length)
            if record.roster != ctx.roster_cid or place != (p.k, p.offset, p.length):
                ctx.garbage[m.sender] = f"slice record {cid} is not slice {p.k} of this round"
                await reducer.keep_evidence(ctx, m)
                continue
            censored = await reducer.false_claims(ctx, p, set(record.missing), exclude)
            if not censored:
                return cid, record, m.sender
            for name in censored:  # refused: the next-ranked record, if any, counts
                claim = reducer.claimant(ctx, phase, name) or m
                ctx.garbage[claim.sender] = f"false missing claim: {name} serves slice {p.k}"
                await reducer.keep_evidence(ctx, claim)
                logger.warning("slice %d: %s claimed %s missing: false", p.k, claim.sender, name)
        # All garbage, and its backups stood aside on seeing one: each honest peer reduces it.
        logger.warning("slice %d: every announced record refused; reducing it here", p.k)
        fresh = SliceWork(p.k, p.offset, p.length, p.ranking)
        block, values = await reducer.reduce(ctx, fresh, exclude)
        ctx.local[block.cid], ctx.records_read[bytes(block.cid)] = values, block
        return block.cid, SliceRecord.from_block(block), self.peer
