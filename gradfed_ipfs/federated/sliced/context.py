"""What one reduce-scatter round carries: :class:`SliceRound`, handed to every step of it.

:class:`~.peer.ReduceScatterPeer` makes one per :meth:`~.peer.ReduceScatterPeer.run` and passes
it to its collaborators (:class:`~.reducer.Reducer`, :class:`~.chain.ChainRound`,
:class:`~.checks.SliceChecker`) instead of threading the roster, its CID, the base and the own
contribution through every call. The inputs are fixed; the sets and maps below them are what
the round learns as it goes (who could not be fetched, who was replaced, whose bytes were
refused, which records were read and which slices this peer computed).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from multiformats import CID

from ..._types import FloatArray
from ...formats.agreed.roster import Roster
from ...storage.base import Block

__all__ = ["SliceRound"]


@dataclass(frozen=True)
class SliceRound:
    """One roster peer's reduce-scatter round.

    Attributes
    ----------
    roster, roster_cid
        The agreed roster and its CID.
    base
        The base model (float32, d values).
    own
        This peer's gradient (float32, d values), the one its roster entry names.
    local
        Slice record CID → values of the slices this peer computed (not fetched back).
    records_read
        Slice record CID (bytes) → block, of the records this peer read or wrote.
    unfetchable
        Senders a fetch of this peer failed for (missing from one slice: missing from all).
    replaced
        First reducers a backup replaced (in earlier phases: likely gone).
    garbage
        Reducers whose announced records were refused, with why.
    served
        ``(sender, k)`` → whether this peer fetched that sender's slice ``k`` when a record
        claimed it missing (:meth:`~.reducer.Reducer.false_claims`).
    """

    roster: Roster
    roster_cid: CID
    base: FloatArray
    own: FloatArray
    local: dict[CID, FloatArray] = field(default_factory=dict)
    records_read: dict[bytes, Block] = field(default_factory=dict)
    unfetchable: set[str] = field(default_factory=set)
    replaced: set[str] = field(default_factory=set)
    garbage: dict[str, str] = field(default_factory=dict)
    served: dict[tuple[str, int], bool] = field(default_factory=dict)
    probing: dict[str, asyncio.Lock] = field(default_factory=dict)
    """Sender → the lock its claim probes take (one at a time)."""
    evidence: dict[str, CID] = field(default_factory=dict)
    """Member → the CID of its signed board statement this round showed false (put)."""

    @property
    def d(self) -> int:
        """The model's length."""
        return int(self.base.size)
