"""The control plane of an agreed session: who decides a round's roster and its final record.

:class:`AgreedSession` owns one :class:`RoundControl`, chosen by ``AgreedConfig.control``:

- ``"pubsub"``: :class:`PubsubControl`, the ranked coordinators' rosters over pubsub
  (:class:`~..round.roster.RosterPhase`); a round is over once this peer's record is written (the
  others' ``done`` messages are counted, and checked when the next round starts);
- ``"cometbft"``: :class:`~.comet.CometControl`, a CometBFT chain of the members
  decides the roster and, from ``2f + 1`` equal results, the final record.

Everything else (contributions and models over IPFS, aggregation, records) is the same.
"""

from __future__ import annotations

from typing import Protocol

from ..context import AdoptedRoster, RoundContext
from ..round.roster import RosterPhase
from ..storage import FinishedRound

__all__ = ["PubsubControl", "RoundControl"]


class RoundControl(Protocol):
    """Decides one round's roster, then whether this peer's record of it is final."""

    async def take(self, ctx: RoundContext) -> AdoptedRoster:
        """Return the round's adopted roster (its contributions fetched and verified)."""
        ...

    async def settle(self, ctx: RoundContext, finished: FinishedRound) -> None:
        """Return once this peer's record of the round is final; raise if another one is."""
        ...


class PubsubControl:
    """The pubsub control plane: rosters through :class:`~..round.roster.RosterPhase`."""

    def __init__(self, roster: RosterPhase) -> None:
        self.roster = roster

    async def take(self, ctx: RoundContext) -> AdoptedRoster:
        """Adopt the best-ranked valid roster (:meth:`~.roster.RosterPhase.take`)."""
        return await self.roster.take(ctx)

    async def settle(self, ctx: RoundContext, finished: FinishedRound) -> None:
        """Nothing to wait for: ``done`` messages are checked by the session itself."""
