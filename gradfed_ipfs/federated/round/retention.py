"""Retention for long-running agreed sessions: bounded pins, scheduled garbage collection.

Every round pins this peer's contribution and the new model, and leaves the peers'
contributions it fetched unpinned in the repo; records and rosters are pinned alone
(:func:`pin_alone`), not recursively. :class:`Retention` unpins this peer's
contributions and the models of rounds older than ``keep_rounds`` (round records and rosters,
small, stay pinned: the chain stays walkable and each round's CIDs stay known), and every
``gc_every`` rounds runs the store's garbage collection (Kubo ``repo/gc``). The session calls
:meth:`Retention.collect` only at a quiescent point, between rounds, after every block of the
finished rounds is stored and with no fetch in flight, so a collection never races a
half-written chunked gradient or a fetch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from multiformats import CID

from ...block import Block
from ...errors import InvalidGradient
from ...storage.base import BlockStore
from ...storage.kubo import KuboBlockStore

__all__ = ["Collectable", "Retention", "RetentionPolicy", "pin_alone"]

logger = logging.getLogger("gradfed_ipfs.federated.retention")


async def pin_alone(store: BlockStore, block: Block) -> None:
    """Store ``block`` pinned by itself: its links (models, contributions) stay unpinnable.

    A round record links the models and, through its roster, the contributions; a recursive
    pin would keep the whole history. Kubo gets a direct pin; other stores pin as they do.
    """
    if isinstance(store, KuboBlockStore):
        await store.put(block, pin=False)  # no collection runs before the pin below
        await store.pin(block.cid, recursive=False)
    else:
        await store.put(block)


@runtime_checkable
class Collectable(Protocol):
    """A store that can drop its unpinned blocks (``KuboBlockStore.gc``)."""

    async def gc(self) -> int:
        """Remove unpinned blocks; return how many."""
        ...


@dataclass(frozen=True)
class RetentionPolicy:
    """How much of a session's history a peer keeps pinned.

    Attributes
    ----------
    keep_rounds
        Own contributions and models stay pinned for this many rounds (K ≥ 1).
    gc_every
        Run garbage collection every this many rounds (0: never).
    """

    keep_rounds: int = 5
    gc_every: int = 5

    def __post_init__(self) -> None:
        if self.keep_rounds < 1 or self.gc_every < 0:
            raise InvalidGradient("keep_rounds must be >= 1 and gc_every >= 0")


@dataclass
class Retention:
    """Tracks what each round pinned; unpins and collects per its policy."""

    policy: RetentionPolicy
    pinned: dict[int, list[CID]] = field(default_factory=dict)
    collections: int = 0

    def pinned_in(self, round_number: int, *cids: CID) -> None:
        """Record blocks pinned for ``round_number`` (to unpin ``keep_rounds`` later)."""
        self.pinned.setdefault(round_number, []).extend(cids)

    def due(self, next_round: int) -> bool:
        """Whether :meth:`collect` has work before ``next_round`` starts."""
        old = any(r < next_round - self.policy.keep_rounds for r in self.pinned)
        return old or self._gc_due(next_round)

    def _gc_due(self, next_round: int) -> bool:
        every = self.policy.gc_every
        return every > 0 and next_round > 0 and next_round % every == 0

    async def collect(self, store: BlockStore, next_round: int) -> int:
        """Unpin what is older than ``keep_rounds``; garbage-collect when scheduled.

        Call only when no write or fetch of the session is in flight. Returns the number of
        blocks the collection removed (0 without one).
        """
        for r in sorted(r for r in self.pinned if r < next_round - self.policy.keep_rounds):
            for cid in self.pinned.pop(r):
                await store.unpin(cid)
        every = self.policy.gc_every
        if (
            every == 0
            or next_round == 0
            or next_round % every
            or not isinstance(store, Collectable)
        ):
            return 0
        removed = await store.gc()
        self.collections += 1
        logger.info("before round %d: repo gc removed %d blocks", next_round, removed)
        return removed
