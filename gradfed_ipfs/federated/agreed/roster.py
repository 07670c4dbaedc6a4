"""The roster phase of :class:`~gradfed_ipfs.federated.agreed.session.AgreedSession`.

A mixin holding what a peer does between contributing and aggregating: deciding which
contributions are ready, building, publishing or deriving the roster, and adopting the
best-ranked valid roster heard (directly, or through another peer's ``done`` record).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Final, cast

import numpy as np
from multiformats import CID

from ..._types import FloatArray
from ...block import Block
from ...errors import (
    BlockNotFound,
    BlockStoreError,
    BlockTimeout,
    DecodeError,
    RoundVerificationFailed,
)
from ...formats.pubsub import PubsubMessage
from ...formats.roster import MAX_INLINE_BYTES, AgreedMessage, AgreedRecord, MessageKind, Roster
from ...storage.base import BlockStore
from ...tensor.deterministic import deterministic_update
from ..exchange.announcer import Reannouncer
from ..exchange.fetcher import ContributionFetcher, is_transient
from ..sliced.peer import ReduceScatterResult
from ..sliced.retention import SliceBlocks
from ..sliced.transport import CountingStore
from .config import AgreedConfig
from .coordinator import MAX_ROUNDS_AHEAD, RoundBoard, roster_problem
from .finished import check_finished_round
from .history import load_record
from .slicing import SliceStep

__all__ = ["RosterPhase"]

logger = logging.getLogger("gradfed_ipfs.federated.agreed")

_TICK: Final = 0.05
MAX_WALK_BACK: Final = MAX_ROUNDS_AHEAD
"""Most records walked back from a later round's ``done`` to find a missed round's roster."""
"""Longest wait between checks for other peers' records of a sliced round (seconds)."""


class RosterPhase:
    """Roster steps of an agreed session; :class:`AgreedSession` provides the state."""

    store: BlockStore
    session: str
    genesis: CID
    config: AgreedConfig
    peer_id: str
    round: int
    model: FloatArray
    model_cid: CID
    head: CID | None
    _board: RoundBoard | None
    _announcer: Reannouncer
    _fetcher: ContributionFetcher
    _rosters: dict[bytes, tuple[Roster, Block]]
    rule_state: FloatArray | None
    _adopted_state: FloatArray | None
    _slicing: SliceStep | None = None  # reduce-scatter rounds (agreed_slicing)
    aggregation_reason = ""
    excluded: frozenset[str] = frozenset()  # the head record's proven liars: in no later roster

    @property
    def board(self) -> RoundBoard:
        """What this peer has heard (after :meth:`start`)."""
        if self._board is None:
            raise RuntimeError("AgreedSession.start() has not been called")
        return self._board

    async def _listen(self, messages: AsyncIterator[PubsubMessage]) -> None:
        async for message in messages:
            accepted = self.board.accept(message)
            if accepted is not None and accepted.kind == "contrib":
                self._prefetch(accepted)

    def _prefetch(self, message: AgreedMessage) -> None:
        """Start fetching a contribution as soon as it is heard, the next round's included.

        A peer still finishing round r hears the faster peers' round r+1 contributions; their
        base (its own M_{r+1}) is checked when round r+1 starts, but the blocks are on their
        way meanwhile: the slowest peer of a round otherwise starts every fetch of the next
        one late. At most one per member and round (the board keeps the first claim).
        """
        if message.base is None or message.weight is None or message.peer in self.excluded:
            return
        current = message.round == self.round and bytes(message.base) == bytes(self.model_cid)
        if current or message.round == self.round + 1:
            self._fetch(message.cid)

    def _next_fetches(self) -> set[bytes]:
        """CIDs of the current round's contributions heard so far (kept across the round's end)."""
        return {bytes(c.cid) for c in self.board.state(self.round).contributions.values()}

    async def _post(self, key: str, message: AgreedMessage) -> None:
        """Announce now and keep re-announcing under ``key`` until replaced or withdrawn."""
        await self._announcer.post(key, message.encode())

    def _message(
        self,
        kind: MessageKind,
        round_number: int,
        cid: CID,
        *,
        base: CID | None = None,
        weight: int | None = None,
        record: CID | None = None,
        inline: bytes | None = None,
    ) -> AgreedMessage:
        session, genesis, peer = self.session, self.genesis, self.peer_id
        return AgreedMessage(
            kind, session, genesis, round_number, peer, cid, base, weight, record, inline
        )

    # ------------------------------------------------------------------ fetching

    def _poke(self) -> None:
        if self._board is not None:
            self._board.poke()

    def _fetch(self, cid: CID) -> asyncio.Task[FloatArray]:
        return self._fetcher.fetch(cid, self.model.size)

    def _ready(
        self, r: int, own: tuple[CID, int], rejected: dict[str, str]
    ) -> dict[str, tuple[CID, int]]:
        """Contributions on this round's base whose blocks are fetched and verified."""
        entries = {self.peer_id: own}
        for peer, c in self.board.state(r).contributions.items():
            if bytes(c.base) == bytes(self.model_cid):
                entries[peer] = (c.cid, c.weight)
        for peer in self.excluded:  # proven liars (this one too): no roster may list them
            entries.pop(peer, None)
        ready = {}
        for peer, (cid, weight) in entries.items():
            task = self._fetcher.get(cid)
            if task is None or not task.done() or task.cancelled():
                continue
            if task.exception() is None:
                ready[peer] = (cid, weight)
            elif not is_transient(task):
                rejected[peer] = f"contribution {cid}: {task.exception()}"
        return ready

    def _derive_roster(self, r: int, coordinator: str, ready: dict[str, tuple[CID, int]]) -> CID:
        """Build (and cache) the roster ``coordinator`` would publish from ``ready``."""
        members = self.config.members
        roster = Roster.new(
            self.session, self.genesis, r, self.model_cid, coordinator, members, ready
        )
        block = roster.to_block()
        self._rosters[bytes(block.cid)] = (roster, block)
        self.board.state(r).rosters.setdefault(coordinator, block.cid)
        return block.cid

    async def _publish_roster(self, r: int, ready: dict[str, tuple[CID, int]]) -> None:
        cid = self._derive_roster(r, self.peer_id, ready)
        block = self._rosters[bytes(cid)][1]
        inline = block.data if len(block.data) <= MAX_INLINE_BYTES else None
        if inline is None:
            await self.store.put(block, pin=False)  # peers fetch it now; pinned when done
        await self._post("roster", self._message("roster", r, cid, inline=inline))
        logger.debug(
            "round %d: %s published roster %s (%d entries)", r, self.peer_id, cid, len(ready)
        )

    async def _try_rosters(
        self, r: int, ranking: list[str], rejected: dict[str, str], tried: set[bytes]
    ) -> tuple[CID, Roster, FloatArray | None] | None:
        """Adopt the best-ranked valid roster heard (directly or through a ``done`` record).

        A peer that heard neither round ``r``'s rosters nor its ``done`` messages (they are
        re-announced only until their senders' next round, so a peer busy elsewhere, e.g.
        resyncing, can miss them all) but hears a later round's ``done`` walks that record's
        ``prev`` links back to round ``r`` (at most :data:`MAX_WALK_BACK` records) for its roster.
        """
        state = self.board.state(r)
        candidates = [(ranking.index(p), c) for p, c in state.rosters.items() if p in ranking]
        if not candidates:
            later = [
                (p, h) for p, h in self.board.heads.items() if r < h.round <= r + MAX_WALK_BACK
            ]
            for peer, head in [*state.done.items(), *later]:
                if bytes(head.record) in tried:
                    continue
                tried.add(bytes(head.record))
                try:
                    found = await self._walk_back(r, head.record)
                except (BlockStoreError, DecodeError) as exc:
                    rejected[peer] = f"record {head.record}: {exc}"
                    continue
                if found is not None and bytes(found[1].base) == bytes(self.model_cid):
                    state.rosters.setdefault(peer, found[1].roster)
            candidates = [(ranking.index(p), c) for p, c in state.rosters.items() if p in ranking]
        for _, cid in sorted(candidates, key=lambda item: item[0]):
            if bytes(cid) in tried:
                continue
            adopted = await self._adopt(r, cid, rejected, tried)
            if adopted is not None:
                return cid, *adopted
        return None

    async def _walk_back(self, r: int, head: CID) -> tuple[CID, AgreedRecord] | None:
        """Round ``r``'s record in the chain of records ending at ``head`` (a later round's).

        ``None`` if the chain skips round ``r``. Raises ``BlockStoreError`` or ``DecodeError``.
        """
        cid, record = head, await load_record(self.store, head, timeout=self.config.fetch_timeout)
        while record.round > r and record.prev is not None:
            prev = await load_record(self.store, record.prev, timeout=self.config.fetch_timeout)
            if prev.round != record.round - 1:
                return None  # not a chain of rounds: no record of round r in it
            cid, record = record.prev, prev
        return (cid, record) if record.round == r else None

    async def _adopt(
        self, r: int, cid: CID, rejected: dict[str, str], tried: set[bytes]
    ) -> tuple[Roster, FloatArray | None] | None:
        """Validate a roster and aggregate it; ``None`` while its blocks are still coming.

        Reduce-scatter rounds check only the roots here; the model is then ``None``.
        """
        try:
            roster = await self._load_roster(cid)
        except BlockTimeout as exc:
            # Waited fetch_timeout for it: a coordinator puts its roster before announcing it
            # (or sends it inline), so a member announcing one nobody serves must not hold the
            # round until round_timeout; later ranks may now publish theirs.
            tried.add(bytes(cid))
            rejected[f"roster {cid}"] = f"not served: {exc}"
            return None
        except (BlockNotFound, BlockStoreError) as exc:
            logger.debug("round %d: roster %s not fetched yet: %s", r, cid, exc)
            return None
        except DecodeError as exc:
            tried.add(bytes(cid))
            rejected[f"roster {cid}"] = str(exc)
            return None
        problem = roster_problem(
            roster, self.session, self.genesis, r, self.model_cid, self.config, self.excluded
        )
        if problem:
            tried.add(bytes(cid))
            rejected[roster.coordinator] = f"roster {cid}: {problem}"
            return None
        tasks = [self._fetch(entry.contribution) for entry in roster.entries]
        if not all(task.done() for task in tasks):
            return None
        gradients = []
        for entry, task in zip(roster.entries, tasks, strict=True):
            if task.cancelled() or task.exception() is not None:
                if is_transient(task):
                    self._fetch(entry.contribution)  # retry until the round deadline
                    return None
                tried.add(bytes(cid))
                rejected[roster.coordinator] = f"roster {cid} lists a bad {entry.contribution}"
                return None
            gradients.append(task.result())
        if self._slicing is not None:
            return roster, None
        rule, lr = self.config.rule, self.config.learning_rate
        if rule is not None:
            model, self._adopted_state = rule.apply(
                self.model, roster, gradients, lr, self.rule_state
            )
            return roster, np.ascontiguousarray(model, np.float32).reshape(-1)
        model = deterministic_update(self.model, gradients, [e.weight for e in roster.entries], lr)
        return roster, model

    async def _sliced(
        self,
        r: int,
        roster_cid: CID,
        roster: Roster,
        model: FloatArray | None,
        own: FloatArray,
        rejected: dict[str, str],
    ) -> tuple[FloatArray, ReduceScatterResult | None]:
        """Return the adopted roster's model: ``model``, or (``None``) reduce-scatter's."""
        if model is not None:
            return model, None
        if self._slicing is None:  # pragma: no cover - _adopt returns None only when slicing
            raise RuntimeError("no model and no reduce-scatter step")
        run = asyncio.ensure_future(self._slicing.run(r, roster, roster_cid, self.model, own))
        try:
            sliced = await self._slices_or_record(r, roster_cid, roster, run, rejected)
        finally:
            run.cancel()  # a no-op once done; gathered so that its error is retrieved
            await asyncio.gather(run, return_exceptions=True)
        rejected.update({p: "missing from the slices" for p in sliced.missing})
        rejected.update({p: "published false slice-check values" for p in sliced.false_values})
        rejected.update({p: f"announced garbage: {why}" for p, why in sliced.garbage.items()})
        rejected.update({p: "proven lying reducer" for p in sliced.liars})
        return sliced.model, sliced

    async def _slices_or_record(
        self,
        r: int,
        roster_cid: CID,
        roster: Roster,
        run: asyncio.Future[ReduceScatterResult],
        rejected: dict[str, str],
    ) -> ReduceScatterResult:
        """Await the reduce-scatter ``run``, or re-verify another peer's record of the round.

        A peer that joins a sliced round the others have finished hears none of its slice
        messages (each is re-announced only until its reducer's next round starts). So once
        another peer's ``done`` of round ``r`` has been known for a grace (twice
        ``max_announce_interval`` if no slice message of this roster was heard, else
        ``reducer_timeout``) and ``run`` has not ended, this peer re-aggregates the round
        from that record (:func:`~.agreed_history.check_finished_round`: every contribution
        fetched whole) and takes its slices, frauds and proven liars.
        """
        step = cast(SliceStep, self._slicing)
        config = self.config
        tried: set[str] = set()  # one re-verification (N·d fetched) per peer and round, at most
        refused: dict[bytes, str] = {}
        since: float | None = None
        walked: dict[bytes, CID | None] = {}  # a later round's record -> round r's in its chain
        while not run.done():
            heads = [
                (peer, head.record)
                for peer, head in list(self.board.state(r).done.items())
                if peer != self.peer_id and peer not in tried
            ]
            if not heads:  # round r's done messages missed too: a later record leads back to it
                for peer, head in list(self.board.heads.items()):
                    if (
                        peer == self.peer_id
                        or peer in tried
                        or not r < head.round <= r + MAX_WALK_BACK
                    ):
                        continue
                    if bytes(head.record) not in walked:
                        walked[bytes(head.record)] = None
                        with contextlib.suppress(BlockStoreError, DecodeError):
                            found = await self._walk_back(r, head.record)
                            walked[bytes(head.record)] = None if found is None else found[0]
                    if (cid := walked[bytes(head.record)]) is not None:
                        heads.append((peer, cid))
            now = time.monotonic()
            since = None if not heads else (now if since is None else since)
            heard = step.heard(roster_cid)
            grace = config.reducer_timeout if heard else 2 * config.max_announce_interval
            if since is None or now - since < grace:
                await asyncio.wait({run}, timeout=_TICK)
                continue
            for peer, record_cid in heads:
                tried.add(peer)
                if bytes(record_cid) in refused:
                    rejected[peer] = refused[bytes(record_cid)]
                    continue
                counted = CountingStore(self.store)
                try:
                    held = bytes(roster.base) == bytes(self.model_cid)  # never rebuilt then
                    finished = await check_finished_round(
                        counted, record_cid, roster, roster_cid, prev=self.head,
                        rule=config.rule, base=(self.model, self.rule_state) if held else None,
                    )  # fmt: skip
                except RoundVerificationFailed as exc:
                    rejected[peer] = refused[bytes(record_cid)] = f"record {record_cid}: {exc}"
                    continue
                logger.info(
                    "round %d: %s re-verified %s's record %s (its slices incomplete %.1fs after)",
                    r, self.peer_id, peer, record_cid, now - since,
                )  # fmt: skip
                if step.gate is not None:  # kept like the blocks of a run (slice_retention)
                    kept = tuple(e.contribution for e in roster.entries)
                    step.held[bytes(roster_cid)] = SliceBlocks(kept, finished.records)
                record = finished.record
                return ReduceScatterResult(
                    model=finished.model,
                    model_cid=record.result,
                    records=list(record.slices or ()),
                    missing=finished.missing,
                    liars=set(finished.liars),
                    frauds=list(record.frauds or ()),
                    downloaded=counted.downloaded,
                    seconds=time.monotonic() - now,
                )
            since = None
        return run.result()

    async def _load_roster(self, cid: CID) -> Roster:
        """Decode a roster once: from its inline message, else fetched from the store."""
        known = self._rosters.get(bytes(cid))
        if known is None:
            carried = self.board.inline.get(bytes(cid))
            if carried is not None:
                block = Block.from_parts(cid, carried[1])
            else:
                block = await self.store.get(cid, timeout=self.config.fetch_timeout)
            known = self._rosters[bytes(cid)] = (Roster.from_block(block), block)
        return known[0]
