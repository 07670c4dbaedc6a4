"""What one agreed round carries from step to step, and how a peer's messages are announced.

:class:`RoundContext` is fixed when the round starts (its base, the proven liars it excludes,
this peer's contribution, the coordinator ranking) and handed to every collaborator of
:class:`~.session.AgreedSession`; only its ``rejected`` map grows as the round goes on.
:class:`AdoptedRoster` and :class:`Aggregated` are what the roster and aggregate steps hand on.
:class:`SessionMessages` builds this peer's
:class:`~gradfed_ipfs.formats.agreed.roster.AgreedMessage`,
signs each once (the transport's signer) and keeps re-announcing the ones it still owes, as the
same statement bytes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from multiformats import CID

from ..._types import FloatArray
from ...block import Block
from ...formats.agreed.membership import MemberSet
from ...formats.agreed.roster import AgreedMessage, MessageKind, Roster, sign_message
from ...formats.statement import KeyBook, Signer, Statement
from ..exchange.announcer import Reannouncer
from ..sliced.peer import ReduceScatterResult
from ..sliced.retention import SliceBlocks
from .config import AgreedConfig

__all__ = ["AdoptedRoster", "Aggregated", "OwnContribution", "RoundContext", "SessionMessages"]


@dataclass(frozen=True)
class OwnContribution:
    """A peer's own contribution to a round: its CID, values and weight, and its put."""

    cid: CID
    values: FloatArray
    weight: int
    stored: asyncio.Future[CID]
    """The put of its blocks (started with the announcement; its failure is the round's)."""
    nbytes: int = 0
    """Bytes of its blocks (what this peer sends)."""
    signature: bytes | None = None
    """This peer's signature of its ``agreed/contrib`` statement (its roster entry's)."""


@dataclass(frozen=True)
class RoundContext:
    """One agreed round as this peer started it.

    Attributes
    ----------
    number
        The round.
    config
        The session's settings as the round started (a caller may replace
        ``AgreedSession.config`` between rounds, e.g. to raise ``min_peers``).
    peer
        This peer's ID.
    base, base_model, rule_state
        The model the round starts from (CID and values) and the update rule's state.
    head
        The record the round follows (``None`` before the first round's record).
    excluded
        Proven liars (the head record's): no roster of this round may list them.
    own
        This peer's contribution.
    ranking
        The round's coordinator ranking (rank 0 publishes the roster).
    started
        ``time.monotonic()`` when the round started.
    rejected
        Peer (or ``roster <cid>``) → reason, for what was refused this round (grows).
    proven
        Members this peer holds an equivocation proof against as the round starts: out of the
        ranking, and no roster of theirs or listing them is taken.
    awaited
        In a round re-run after an equivocation (:meth:`~.session.AgreedSession.resync`
        rewound to it): the members the proof's rosters listed, whose contributions the
        round waits for (:meth:`~.round.roster.RosterPhase.take`); empty otherwise.
    """

    number: int
    config: AgreedConfig
    peer: str
    base: CID
    base_model: FloatArray
    rule_state: FloatArray | None
    head: CID | None
    excluded: frozenset[str]
    own: OwnContribution
    ranking: tuple[str, ...]
    started: float
    rejected: dict[str, str] = field(default_factory=dict)
    proven: frozenset[str] = frozenset()
    awaited: frozenset[str] = frozenset()

    @property
    def barred(self) -> frozenset[str]:
        """Members no roster of this round may list: proven liars and equivocators."""
        return self.excluded | self.proven if self.proven else self.excluded

    @property
    def rank(self) -> int:
        """Return this peer's coordinator rank in the round.

        A peer left out of the ranking (proven an equivocator, by its own session too) ranks
        after every member: its turn never comes before theirs.
        """
        if self.peer not in self.ranking:
            return len(self.ranking)
        return self.ranking.index(self.peer)

    @property
    def d(self) -> int:
        """The model's length."""
        return int(self.base_model.size)


@dataclass(frozen=True)
class AdoptedRoster:
    """The roster a round adopted, with its block and (all-to-all) its contributions' values.

    ``gradients`` is ``None`` in a reduce-scatter round: only the roots were checked.
    """

    cid: CID
    roster: Roster
    block: Block
    gradients: tuple[FloatArray, ...] | None
    member_set: tuple[MemberSet, CID] | None = None
    """The next member set the roster names (checked) and its CID; ``None``: unchanged."""
    signature: bytes | None = None
    """Its coordinator's signature of its ``roster`` message, checked, when the roster leaves
    an expected peer out (the record carries it:
    :func:`~gradfed_ipfs.formats.agreed.roster.verify_roster_coordinator`); else ``None``."""


@dataclass(frozen=True)
class Aggregated:
    """A round's new model, the update rule's new state, and the reduce-scatter outcome."""

    model: FloatArray
    state: FloatArray | None
    sliced: ReduceScatterResult | None
    kept: SliceBlocks | None = None
    """Under retention, what a sliced round leaves for the keeper."""


class SessionMessages:
    """Build this peer's messages of one session and re-announce those it owes.

    Parameters
    ----------
    session, genesis
        The session's name and genesis CID.
    peer
        This peer's ID.
    announcer
        The session's re-announcer (its ``run`` task is the session's).
    signer, keys
        This peer's signer and where verifiers find its key (the transport's).
    """

    def __init__(
        self,
        session: str,
        genesis: CID,
        peer: str,
        announcer: Reannouncer,
        *,
        signer: Signer,
        keys: KeyBook,
    ) -> None:
        self._session, self._genesis, self._peer = session, genesis, peer
        self._announcer = announcer
        self._signer, self._keys = signer, keys
        self._signed: dict[str, Statement] = {}  # key -> the last statement posted under it

    def make(
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
        """Return this peer's message of ``kind`` about ``cid`` in ``round_number``."""
        return AgreedMessage(
            kind, self._session, self._genesis, round_number, self._peer, cid, base, weight,
            record, inline,
        )  # fmt: skip

    async def sign(self, key: str, message: AgreedMessage) -> Statement:
        """Return ``message`` signed (once: the last statement under ``key`` is reused)."""
        body = message.encode()
        known = self._signed.get(key)
        if known is None or known.body != body:
            known = self._signed[key] = await sign_message(message, self._signer, self._keys)
        return known

    async def post(self, key: str, message: AgreedMessage) -> Statement:
        """Announce now and keep re-announcing under ``key`` until replaced or withdrawn."""
        statement = await self.sign(key, message)
        await self._announcer.post(key, statement.block.data)
        return statement

    async def post_now(self, key: str, message: AgreedMessage) -> Statement:
        """Announce before returning (the daemon has it), then re-announce like :meth:`post`."""
        statement = await self.sign(key, message)
        await self._announcer.post_now(key, statement.block.data)
        return statement

    def withdraw(self, key: str) -> None:
        """Stop re-announcing ``key``."""
        self._announcer.withdraw(key)

    async def done(self, round_number: int, result: CID, record: CID) -> None:
        """Announce (and keep announcing) this peer's head: round ``round_number``'s record."""
        await self.post("done", self.make("done", round_number, result, record=record))
