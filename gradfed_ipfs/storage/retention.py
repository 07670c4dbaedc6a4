"""Retention: a node that runs for months keeps its repo bounded (issue 13, item 8).

Each agreed round adds this peer's contribution, the contributions it fetched, the roster, the
round record and the new model to its repo: at d = 10M that is 40 MB+ a round, forever, unless
something lets go. :class:`RetentionKeeper` is told each round's blocks (:class:`RoundBlocks`,
by :class:`~gradfed_ipfs.federated.agreed.session.AgreedSession`'s ``retention=`` hook) and:

- **pins** the round's fetched contributions once the round is stored, for ``keep_rounds``
  rounds (Kubo keeps only pinned blocks through ``repo/gc``: a fetched-but-unpinned block is
  garbage at once). While the round is live they are not pinned, and need not be: the session
  aggregates the fetched values it holds in memory, so a collection can never change or stall
  a round's result (a fetch holds the gate, so a collection never cuts one short). If a
  collection dropped them in between, the pin fetches them again from their owners (who keep
  their own contributions pinned for ``keep_rounds`` too). The pins are what let this node
  re-verify the last ``keep_rounds`` rounds alone and serve their inputs to a peer catching up;
- **unpins** contributions (own and fetched) ``keep_rounds`` rounds later, and the round's
  base model then too unless ``keep_models`` (so the kept rounds keep their base models; the
  latest model and the genesis stay pinned). A base that was not stored (an agreed session's
  ``model_every``) is rebuilt from the rounds before it, so those are kept back to the last
  round whose base was stored;
- **keeps** every round record and roster pinned (a few hundred bytes each: the history's
  backbone), and a reduce-scatter round's slice and fraud records (``RoundBlocks.records``),
  with *direct* pins: a record links its roster, models and the previous record, and a roster
  (or slice record) its contributions, so a recursive pin would keep the whole history (and
  Kubo's ``repo/gc`` fails outright on a recursive pin whose linked blocks are gone). It hands
  records, rosters and models to a durability provider when one is given (any object with an
  async ``pin(cid)``, e.g. :class:`~gradfed_ipfs.storage.replication.ClusterPinning`) before
  dropping anything locally;
- **collects** (Kubo ``repo/gc``) every ``gc_every`` rounds, or when ``repo/stat`` exceeds
  ``gc_above_bytes``, through a :class:`GcGate` so a collection never races a fetch or a
  multi-block put: transfers hold a shared "in flight" count, a collection waits (at most
  ``gc_wait`` seconds, else it is skipped until the next schedule) until none is in flight and
  holds new ones back while it runs.

What stays verifiable: :func:`~gradfed_ipfs.federated.agreed.history.verify_agreed_round`
re-aggregates a round from its roster's contributions and base model. Rounds within the last
``keep_rounds`` re-verify from this node alone; an older round's record and roster are still
here (so the chain of records still verifies its links and genesis), but its contributions
were dropped, so re-aggregating it reports ``RoundVerificationFailed`` (naming the missing
block) unless some peer or the durability provider still holds its inputs. A reduce-scatter
round never holds other peers' contributions whole (it reports its slice results and its own
contribution instead, and its slice and fraud records as ``records``), so it re-aggregates
from the network within ``keep_rounds`` and keeps its record-level checks forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from multiformats import CID

from .._types import CIDLike
from ..cid import parse_cid
from ..errors import ConfigError
from .base import UNSET, Block, BlockStore, StoreWrapper, Unset, put_many

__all__ = [
    "Collectable",
    "DurableProvider",
    "GatedStore",
    "GcGate",
    "GcReport",
    "Retention",
    "RetentionHook",
    "RetentionKeeper",
    "RoundBlocks",
    "put_all_pinned_alone",
    "put_pinned_alone",
]

logger = logging.getLogger("gradfed_ipfs.storage.retention")


@dataclass(frozen=True)
class Retention:
    """A node's retention policy.

    Attributes
    ----------
    keep_rounds
        Rounds (K) a round's contributions stay pinned after it; at round ``r`` those of round
        ``r - K`` and older are unpinned.
    keep_models
        Keep every round's result model pinned (grows by ``4·d`` bytes a round); by default a
        model is unpinned with its round's contributions (the latest one always stays). Only
        models that were stored are kept: an agreed session that should keep every one needs
        ``AgreedConfig(model_every=1)``.
    gc_every
        Collect garbage every this many rounds (``None``: not on a round count).
    gc_above_bytes
        Collect garbage after a round when the repo is larger than this (``None``: never).
    gc_wait
        Seconds a collection waits for in-flight transfers before it is skipped.
    pin_fetched
        Pin fetched contributions while their round is kept (see the module docstring).
    """

    keep_rounds: int = 5
    keep_models: bool = False
    gc_every: int | None = 5
    gc_above_bytes: int | None = None
    gc_wait: float = 30.0
    pin_fetched: bool = True

    def __post_init__(self) -> None:
        if self.keep_rounds < 1:
            raise ConfigError(f"keep_rounds must be >= 1, got {self.keep_rounds}")
        if self.gc_every is not None and self.gc_every < 1:
            raise ConfigError(f"gc_every must be >= 1 or None, got {self.gc_every}")
        if self.gc_above_bytes is not None and self.gc_above_bytes < 0:
            raise ConfigError(f"gc_above_bytes must be >= 0 or None, got {self.gc_above_bytes}")
        if not self.gc_wait > 0:
            raise ConfigError(f"gc_wait must be a positive number of seconds, got {self.gc_wait}")


@dataclass(frozen=True)
class RoundBlocks:
    """What one agreed round added to a peer's repo.

    Attributes
    ----------
    round
        The round number.
    contributions
        Roster contributions (fetched ones and this peer's own) plus this peer's own if the
        roster left it out: dropped after ``keep_rounds``.
    roster, record
        The round's roster and record CIDs: kept.
    base, model
        The round's base and result model CIDs, ``None`` when that model was not stored (an
        agreed session's ``model_every``): a base is dropped with its round's contributions,
        unless ``keep_models``. A round whose base was not stored keeps the round before it
        (its contributions and base) past ``keep_rounds``: its base is rebuilt from them.
    records
        More small records of the round that link blocks this peer need not hold (a
        reduce-scatter round's slice and fraud records): kept with direct pins, like ``roster``.
    """

    round: int
    contributions: tuple[CID, ...]
    roster: CID
    record: CID
    base: CID | None
    model: CID | None
    records: tuple[CID, ...] = ()

    def merge(self, other: RoundBlocks) -> RoundBlocks:
        """Both reports of one round (two sessions sharing a store): every contribution."""
        unique = {bytes(c): c for c in (*self.contributions, *other.contributions)}
        contributions = tuple(unique.values())
        records = tuple({bytes(c): c for c in (*self.records, *other.records)}.values())
        return RoundBlocks(
            self.round, contributions, self.roster, self.record, self.base, self.model, records
        )

    def cids(self) -> set[bytes]:
        """Every CID of the round, as bytes."""
        links = (*self.contributions, self.roster, self.record, self.base, self.model)
        return {bytes(c) for c in (*links, *self.records) if c is not None}


@runtime_checkable
class Collectable(Protocol):
    """A store that can pin directly, garbage-collect and report its size (Kubo, memory)."""

    async def pin(self, cid: CIDLike, *, recursive: bool = True) -> None:
        """Pin ``cid``: with every block it links, or (``recursive=False``) alone."""
        ...

    async def collect_garbage(self) -> int:
        """Remove unpinned blocks; return how many."""
        ...

    async def repo_size(self) -> int:
        """Return the repo's size in bytes."""
        ...


async def put_pinned_alone(store: BlockStore, block: Block) -> CID:
    """Put a block that links blocks this peer may not hold; pin it alone where ``store`` can.

    Records, rosters and slice records link history and other peers' blocks (a model this
    peer is not a holder of, the parts of contributions a sliced round never fetched). A
    recursive pin over a missing block makes Kubo's ``repo/gc`` fail on the whole daemon.
    The put goes through ``store`` (wrappers count it); the direct pin goes to the first
    :class:`Collectable` store under its :class:`~.base.StoreWrapper` layers. A store with
    none (a plain :class:`BlockStore`) pins it as ``put`` does.
    """
    return (await put_all_pinned_alone(store, [block]))[0]


async def put_all_pinned_alone(store: BlockStore, blocks: Sequence[Block]) -> list[CID]:
    """:func:`put_pinned_alone` for several blocks, in as few calls as the stores allow.

    On Kubo that is one ``block/put`` per codec and one ``pin/add`` for all (a finished
    round's roster and record: two calls instead of four, on every peer and round).
    """
    inner: object = store
    while not isinstance(inner, Collectable) and isinstance(inner, StoreWrapper):
        inner = inner.store
    if not isinstance(inner, Collectable):
        return await put_many(store, blocks)
    cids = await put_many(store, blocks, pin=False)
    pin_many = getattr(inner, "pin_many", None)
    if pin_many is not None:
        await pin_many(cids, recursive=False)
    else:
        for cid in cids:
            await inner.pin(cid, recursive=False)
    return cids


class DurableProvider(Protocol):
    """Somewhere kept CIDs are handed for durability (e.g. ``ClusterPinning``)."""

    async def pin(self, cid: CIDLike) -> object:
        """Keep ``cid`` (and its DAG)."""
        ...


class RetentionHook(Protocol):
    """What an agreed session reports its rounds to (:class:`RetentionKeeper`)."""

    gate: GcGate

    async def round_done(self, blocks: RoundBlocks) -> object:
        """Take one finished round's blocks (called once they are stored)."""
        ...


@dataclass(frozen=True)
class GcReport:
    """One garbage collection: the round after which it ran, blocks removed, bytes after."""

    round: int
    removed: int
    size_after: int


class GcGate:
    """Fetches and puts hold a shared in-flight count; a collection waits until it is zero.

    While a collection runs, new transfers wait (bounded by the ``repo/gc`` call's deadline).
    While it only *waits* for a moment with nothing in flight, they do not: a fetch in flight
    may be waiting for another peer's put, which waits for that peer's collection, which waits
    for that peer's fetch of our put — held back, that cycle stood until ``timeout`` on every
    peer (30 s by default). A collection that finds no such moment within ``timeout`` is
    skipped (the next due one tries again).
    """

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self.in_flight = 0
        self.collecting = False

    @contextlib.asynccontextmanager
    async def transfer(self) -> AsyncIterator[None]:
        """Hold the in-flight count for one fetch or put (waits while a collection runs)."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self.collecting)
            self.in_flight += 1
        try:
            yield
        finally:
            async with self._cond:
                self.in_flight -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def collection(self, timeout: float) -> AsyncIterator[bool]:
        """Exclude transfers; yield ``True`` once none is in flight, ``False`` after ``timeout``."""
        async with self._cond:
            try:  # one collection at a time, and none while a transfer is in flight
                await asyncio.wait_for(
                    self._cond.wait_for(lambda: not self.collecting and self.in_flight == 0),
                    timeout,
                )
                self.collecting = clear = True
            except TimeoutError:
                clear = False
        try:
            yield clear
        finally:
            if clear:
                async with self._cond:
                    self.collecting = False
                    self._cond.notify_all()


class GatedStore(StoreWrapper):
    """A :class:`~gradfed_ipfs.storage.BlockStore` whose ``get``, ``put`` and ``pin`` hold a gate.

    Give it to code whose calls are each complete on their own (a fetch keeps its bytes in
    memory); wrap multi-block puts in :meth:`GcGate.transfer` instead, around the whole put.
    """

    def __init__(self, store: BlockStore, gate: GcGate) -> None:
        super().__init__(store)
        self.gate = gate

    async def put(self, block: Block, *, pin: bool = True) -> CID:
        """``put`` inside the gate."""
        async with self.gate.transfer():
            return await self.store.put(block, pin=pin)

    async def put_many(self, blocks: Sequence[Block], *, pin: bool = True) -> list[CID]:
        """:func:`~gradfed_ipfs.storage.base.put_many` inside the gate (one batch, one hold)."""
        async with self.gate.transfer():
            return await put_many(self.store, blocks, pin=pin)

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        """``get`` inside the gate."""
        async with self.gate.transfer():
            return await self.store.get(cid, timeout=timeout)

    async def pin(self, cid: CIDLike) -> None:
        """``pin`` inside the gate (a recursive pin may fetch)."""
        async with self.gate.transfer():
            await self.store.pin(cid)


@dataclass
class _Window:
    rounds: deque[RoundBlocks] = field(default_factory=deque)
    kept: set[bytes] = field(default_factory=set)


class RetentionKeeper:
    """Applies a :class:`Retention` to one node's store, round by round.

    Parameters
    ----------
    store
        The node's store; it must be :class:`Collectable` (Kubo or memory).
    policy
        What to keep and when to collect.
    durable
        Optional durability provider for records, rosters and models.
    keep
        CIDs never to unpin (e.g. the session's genesis model: round 0's base).

    Raises
    ------
    ConfigError
        If ``store`` cannot collect garbage.
    """

    def __init__(
        self,
        store: BlockStore,
        policy: Retention | None = None,
        *,
        durable: DurableProvider | None = None,
        keep: Iterable[CIDLike] = (),
    ) -> None:
        if not isinstance(store, Collectable):
            raise ConfigError(f"{type(store).__name__} cannot collect garbage (no repo/gc)")
        self.store = store
        self.collectable: Collectable = store
        self.policy = policy or Retention()
        self.durable = durable
        self.gate = GcGate()
        self.unpinned: list[tuple[int, CID]] = []
        self.collections: list[GcReport] = []
        self._window = _Window()
        self._window.kept.update(bytes(parse_cid(c)) for c in keep)
        self._rounds_seen = 0
        # One report at a time: a session stores round r+1 while round r's store (and report)
        # may still be running; interleaved, the schedule counter was read after another
        # report had moved it (an extra collection, seen under load) and the window's order
        # could follow finishing times instead of rounds.
        self._reporting = asyncio.Lock()

    @property
    def kept_rounds(self) -> list[int]:
        """The rounds whose contributions are still pinned, oldest first."""
        return [blocks.round for blocks in self._window.rounds]

    async def round_done(self, blocks: RoundBlocks) -> GcReport | None:
        """Pin and hand over ``blocks``, unpin what fell out of the window, collect if due.

        Several sessions may share one store and keeper: their reports of one round merge,
        and a collection is due on the first report of a round. Reports run one at a time, in
        the order they are made. Returns the collection's report when one ran.
        """
        async with self._reporting:
            return await self._round_done(blocks)

    async def _round_done(self, blocks: RoundBlocks) -> GcReport | None:
        policy, window = self.policy, self._window
        await self._pin_round(blocks)
        fresh = not window.rounds or window.rounds[-1].round != blocks.round
        if fresh:
            self._rounds_seen += 1
        else:
            blocks = window.rounds.pop().merge(blocks)  # another session on this store
        window.rounds.append(blocks)
        # Rounds up to blocks.round - K go, but the oldest round kept must re-verify here: if
        # its base was not stored, it is rebuilt from the rounds since the last stored base.
        oldest = next(
            i for i, b in enumerate(window.rounds) if b.round > blocks.round - policy.keep_rounds
        )
        anchor = max((i for i in range(oldest + 1) if window.rounds[i].base is not None), default=0)
        old = [window.rounds.popleft() for _ in range(anchor)]
        live = set(window.kept).union(*(b.cids() for b in window.rounds))
        for gone in old:
            for cid in (*gone.contributions, *(() if gone.base is None else (gone.base,))):
                if bytes(cid) not in live:
                    await self.store.unpin(cid)
                    self.unpinned.append((gone.round, cid))
                    live.add(bytes(cid))  # unpinned once
        if fresh and await self._due():
            return await self.collect(blocks.round)
        return None

    async def _pin_round(self, blocks: RoundBlocks) -> None:
        """Pin a round's blocks as the policy says (records and rosters alone, kept for good)."""
        policy, window = self.policy, self._window
        if policy.pin_fetched:
            for cid in blocks.contributions:
                async with self.gate.transfer():
                    await self.store.pin(cid)
        for cid in (blocks.roster, blocks.record, *blocks.records):  # direct: module docstring
            async with self.gate.transfer():
                await self.store.unpin(cid)
                await self.collectable.pin(cid, recursive=False)
            window.kept.add(bytes(cid))
        if policy.keep_models:
            window.kept.update(bytes(c) for c in (blocks.base, blocks.model) if c is not None)
        if self.durable is not None:
            for handed in (blocks.record, blocks.roster, blocks.model):
                if handed is not None:
                    await self.durable.pin(handed)

    async def _due(self) -> bool:
        every, above = self.policy.gc_every, self.policy.gc_above_bytes
        if every is not None and self._rounds_seen % every == 0:
            return True
        return above is not None and await self.collectable.repo_size() > above

    async def collect(self, round_number: int = -1) -> GcReport | None:
        """Run garbage collection through the gate; ``None`` if transfers did not drain in time."""
        async with self.gate.collection(self.policy.gc_wait) as clear:
            if not clear:
                logger.warning(
                    "round %d: garbage collection skipped: transfers still in flight after %.1fs",
                    round_number,
                    self.policy.gc_wait,
                )
                return None
            removed = await self.collectable.collect_garbage()
        report = GcReport(round_number, removed, await self.collectable.repo_size())
        self.collections.append(report)
        logger.debug(
            "round %d: collected %d blocks, repo %d bytes", round_number, removed, report.size_after
        )
        return report
