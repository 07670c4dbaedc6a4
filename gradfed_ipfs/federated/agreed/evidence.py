"""Equivocation is evidence: a peer's watch over the statements it has seen, and its proofs.

:class:`EvidenceWatch` keeps, per member and round, the few signed ``roster`` statements a
peer has seen: from their authors, relayed by another member (a
statement handed on keeps its author's signature), or carried by a published proof. Two that
conflict (:func:`~gradfed_ipfs.formats.agreed.evidence.decode_equivocation`) make a proof, which the
watch stores, and the session publishes on the agreed topic; a proof heard there is verified
before it counts. The proven author is then *excluded* by this peer from then on: its
messages are dropped, its votes and heads forgotten, and it leaves the coordinator schedule
(:func:`~.coordinator.coordinator_ranking` of the members without it). A peer whose chain
took one of its rosters rewinds and re-runs that round, waiting for the members the proof's
rosters list (``EquivocationProof.listed``; ``AgreedSession.resync``).

A peer whose round's record differs from another member's ``done`` relays the coordinator's
roster statement it took (:meth:`EvidenceWatch.roster_statement`): a member that sent two
peers two rosters is then proven by both.

Only roster conflicts exclude. Two contributions of one member for one round and base are a
valid proof too (:mod:`~gradfed_ipfs.formats.agreed.evidence`), but they cannot split honest peers
(every peer aggregates the one roster), while an honest peer that retries a round after
``QuorumNotReached`` may re-train and sign a second one: excluding it would punish a crash,
not a lie. A restarted coordinator that publishes a second roster of a round and base it
already published one for is proven, and excluded, like any other.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Final

from multiformats import CID

from ...block import Block
from ...errors import BlockStoreError, DecodeError
from ...formats.agreed.evidence import EquivocationProof, decode_equivocation, equivocation_proof
from ...formats.agreed.roster import AgreedMessage, AgreedRecord, message_kind
from ...formats.statement import KeyBook
from ...storage.base import BlockStore
from .history import load_record, load_roster

__all__ = ["MAX_SEEN_PER_CLAIM", "EvidenceWatch"]

logger = logging.getLogger("gradfed_ipfs.federated.agreed")

MAX_SEEN_PER_CLAIM: Final = 4
"""Statements kept per (author, kind, round): a member flooding claims cannot grow the watch."""
_MAX_CLAIMS: Final = 4096
"""(author, kind, round) keys kept (the oldest are forgotten first)."""
_MAX_WALKED: Final = 65536
"""Records whose taint a watch remembers per proof."""
_MAX_REFUSED: Final = 1024
"""Refused proof bytes remembered (re-announced ones are not verified again)."""

_EXCLUDING: Final = message_kind("roster")
"""The statements whose conflicts exclude their author (see the module docstring)."""

_Claim = tuple[str, str, int]


class EvidenceWatch:
    """One peer's equivocation watch (see the module docstring).

    Parameters
    ----------
    session, genesis
        The session identity: statements and proofs of another are ignored.
    store
        Where proofs are put and rosters not carried inline are fetched.
    keys
        Where authors' keys are found.
    fetch_timeout
        Seconds a roster fetch may take.
    """

    def __init__(
        self, session: str, genesis: CID, store: BlockStore, keys: KeyBook, fetch_timeout: float
    ) -> None:
        self.session, self.genesis, self.store, self.keys = session, genesis, store, keys
        self.fetch_timeout = fetch_timeout
        self.proofs: dict[str, EquivocationProof] = {}  # author -> the first proof held
        self.unpublished: list[EquivocationProof] = []  # built or heard, not yet handed on
        self._seen: OrderedDict[_Claim, list[tuple[bytes, AgreedMessage]]] = OrderedDict()
        self._refused: OrderedDict[bytes, str] = OrderedDict()
        self._taint: dict[bytes, dict[bytes, bool]] = {}  # proof -> record -> took its roster

    @property
    def proven(self) -> frozenset[str]:
        """Members this peer holds a proof against."""
        return frozenset(self.proofs)

    def roster_statement(self, author: str, round_number: int, roster: CID) -> bytes | None:
        """Return the statement of ``author`` announcing ``roster`` in a round, if seen."""
        for data, message in self._seen.get((author, "roster", round_number), []):
            if bytes(message.cid) == bytes(roster):
                return data
        return None

    async def witness(self, message: AgreedMessage, data: bytes) -> EquivocationProof | None:
        """Keep one verified statement; return the new proof if it conflicts with one kept."""
        if message.kind != "roster" or message.peer in self.proofs:
            return None
        if message.session != self.session or bytes(message.genesis) != bytes(self.genesis):
            return None
        claim = (message.peer, message.kind, message.round)
        seen = self._seen.setdefault(claim, [])
        self._seen.move_to_end(claim)
        if any(known == data for known, _ in seen):
            return None
        for known, other in seen:
            if (bytes(other.cid), other.weight) != (bytes(message.cid), message.weight):
                proof = await self._prove(known, other, data, message)
                if proof is not None:
                    return proof
        if len(seen) < MAX_SEEN_PER_CLAIM:
            seen.append((data, message))
        while len(self._seen) > _MAX_CLAIMS:
            self._seen.popitem(last=False)
        return None

    async def _prove(
        self, first: bytes, a: AgreedMessage, second: bytes, b: AgreedMessage
    ) -> EquivocationProof | None:
        """Build, store and hold the proof of two statements (``None``: they do not conflict)."""
        rosters = {}
        for message in (a, b):
            if message.kind == "roster" and message.inline is None:
                try:
                    block = await self.store.get(message.cid, timeout=self.fetch_timeout)
                except BlockStoreError:
                    return None  # its base cannot be shown: not a proof (yet)
                rosters[bytes(message.cid)] = block
        try:
            proof = equivocation_proof(first, second, rosters, keys=self.keys)
        except DecodeError:
            return None  # e.g. rosters of two bases: an honest peer's after a resync
        return await self._hold(proof)

    async def offer(self, data: bytes) -> EquivocationProof | None:
        """Verify a published proof; return it if it is new and proves a member of this session.

        Raises
        ------
        DecodeError
            If ``data`` is not a valid proof (remembered: not verified again).
        """
        known = self._refused.get(bytes(data))
        if known is not None:
            raise DecodeError(known)
        if any(p.block.data == data for p in self.proofs.values()):
            return None  # a re-announcement of one held
        try:
            proof = decode_equivocation(Block.new(data, "dag-cbor"), keys=self.keys)
        except DecodeError as exc:
            self._refused[bytes(data)] = str(exc)
            while len(self._refused) > _MAX_REFUSED:
                self._refused.popitem(last=False)
            raise
        if proof.session != self.session or bytes(proof.genesis) != bytes(self.genesis):
            return None
        if proof.kind != _EXCLUDING or proof.author in self.proofs:
            return None
        return await self._hold(proof)

    async def _hold(self, proof: EquivocationProof) -> EquivocationProof | None:
        """Store and keep a verified proof (the first one per author); ``None`` if held."""
        if proof.author in self.proofs:
            return None
        await self.store.put(proof.block)
        self.proofs[proof.author] = proof
        self.unpublished.append(proof)
        logger.warning(
            "%s equivocated in round %d (%s): proof %s",
            proof.author, proof.round, proof.kind, proof.block.cid,
        )  # fmt: skip
        return proof

    async def tainted(self, head: CID | None) -> EquivocationProof | None:
        """Return the proof one of whose rosters the chain ending at ``head`` took, if any.

        The chain is walked back to each proof's round, and every record walked is remembered
        as tainted or not (per proof), so a later head's walk stops at the first known record.
        A record that cannot be fetched decides nothing (tried again next time).
        """
        if head is None:
            return None
        for proof in list(self.proofs.values()):  # a proof may come in during a fetch
            try:
                if await self._took_claim(head, proof):
                    return proof
            except (BlockStoreError, DecodeError):
                continue
        return None

    async def _took_claim(self, head: CID, proof: EquivocationProof) -> bool:
        """Whether the chain ending at ``head`` names one of ``proof``'s rosters at its round."""
        known = self._taint.setdefault(bytes(proof.block.cid), {})
        walked, cid = [], head
        while True:
            answer = known.get(bytes(cid))
            if answer is not None:
                break
            record = await load_record(self.store, cid, timeout=self.fetch_timeout)
            walked.append(bytes(cid))
            if record.round <= proof.round or record.prev is None:
                answer = await self._proven_roster(record, proof)
                break
            cid = record.prev
        if len(known) + len(walked) > _MAX_WALKED:
            known.clear()  # bounded: walked again from scratch (rarely: one per proof)
        known.update(dict.fromkeys(walked, answer))
        return answer

    async def _proven_roster(self, record: AgreedRecord, proof: EquivocationProof) -> bool:
        """Whether ``record`` is of ``proof``'s round and base, on a roster of its author.

        Any roster of the author for that round and base is one of its conflicting claims (or
        a third one): a peer that heard only its own and holds a proof of two others' is
        tainted alike.
        """
        if record.round != proof.round or bytes(record.base) != bytes(proof.base):
            return False
        if bytes(record.roster) in {bytes(c) for c in proof.claims}:
            return True
        roster = await load_roster(self.store, record.roster, timeout=self.fetch_timeout)
        return roster.coordinator == proof.author

    def known_tainted(self, head: CID) -> bool:
        """Whether :meth:`tainted` found that the chain ending at ``head`` took a proven roster."""
        return any(known.get(bytes(head)) for known in self._taint.values())

    def forget(self, before: int) -> None:
        """Drop the statements of rounds before ``before`` (proofs stay)."""
        for claim in [c for c in self._seen if c[2] < before]:
            del self._seen[claim]
