"""Region votes: who said which record is its region's, what a peer heard, and the vote-set rule.

After its region round every member of a combined region signs one
:data:`~gradfed_ipfs.formats.regional.VOTE_KIND` statement naming its region's record
(:func:`sign_vote`) and re-announces the same bytes on the top-level topic until the next
round. A region record counts only with votes of more than half of its region's members and at
least ``min_peers`` (:func:`~.config.votes_needed`): one member, or any minority, cannot make
a record of its region count, and two records of one region cannot both count unless a
majority of its members signed both.

**The vote-set rule** (what makes honest peers write the same top-level bytes). The evidence a
top-level record names for a region is the vote set
(:class:`~gradfed_ipfs.formats.regional.RegionVotes`) of the *first* ``need`` members, in
sorted order, that voted for the record (:func:`vote_quorum`). Ed25519 signatures are
deterministic, so the same voters give the same block and CID on every peer. A peer that holds
``need`` votes but is missing the vote of a member sorted before the last one chosen waits
for it up to ``takeover_timeout`` (the member may be slow, or its vote lost and about to be
re-announced), then skips it. Every peer also relays the vote sets it adopted
(:class:`VoteBoard` takes votes out of a relayed set as out of the voter's own message), so a
vote that reached one honest peer reaches the others even if its author sent it to one only.
With the default ``min_peers`` (all members) a vote set holds every member's vote and there is
nothing to choose.

Limit: a member that votes so late (or sends its vote so selectively) that some honest peers
skip it after ``takeover_timeout`` while others had it in time can make them name different
vote sets; exact agreement against that needs a consensus engine. A region whose majority
does not vote (in a 2-member region: either member) is not combined.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from multiformats import CID

from ...block import Block
from ...errors import DecodeError, RoundVerificationFailed
from ...formats.agreed.roster import MAX_RECORD_BYTES
from ...formats.pubsub import PubsubMessage
from ...formats.regional import VOTE_KIND, RegionVote, RegionVotes
from ...formats.statement import KeyBook, Signer, decode_statement, sign_statement

__all__ = [
    "MAX_VOTES_PER_AUTHOR",
    "Vote",
    "VoteBoard",
    "check_vote_set",
    "decode_vote",
    "sign_vote",
    "vote_quorum",
    "vote_set",
]

MAX_VOTES_PER_AUTHOR: Final = 4
"""Distinct records one member's votes may name per round that a board keeps (honest: 1)."""
_MAX_ROUNDS_AHEAD: Final = 16
_SEEN_PER_MEMBER: Final = 64


@dataclass(frozen=True, slots=True)
class Vote:
    """A checked vote: its author, what it says, and its statement block's bytes."""

    author: str
    body: RegionVote
    data: bytes


async def sign_vote(signer: Signer, keys: KeyBook, body: RegionVote) -> Vote:
    """Sign ``body`` as a :data:`VOTE_KIND` statement of ``signer`` (one signature)."""
    statement = await sign_statement(signer, VOTE_KIND, body.encode(), keys=keys)
    return Vote(statement.author, body, statement.block.data)


def decode_vote(data: bytes, keys: KeyBook) -> Vote:
    """Decode and check one vote statement's bytes (signature included).

    Raises
    ------
    DecodeError
        If it is not a signed region vote (``BadSignature``, ``MalformedManifest``).
    """
    statement = decode_statement(Block.new(bytes(data), "dag-cbor"), kind=VOTE_KIND, keys=keys)
    return Vote(statement.author, RegionVote.decode(statement.body), statement.block.data)


def vote_quorum(
    members: tuple[str, ...], need: int, voters: Collection[str]
) -> tuple[tuple[str, ...], bool] | None:
    """Return the voters a vote set names and whether no member before them is missing.

    The voters are the first ``need`` of ``members`` (sorted) in ``voters``; ``None`` if fewer
    voted. The flag is ``False`` when a member sorted before the last voter chosen has not
    voted (yet): a peer waits for it a while before skipping it.
    """
    chosen = tuple(m for m in members if m in voters)[:need]
    if len(chosen) < need or not chosen:
        return None
    return chosen, members.index(chosen[-1]) + 1 == len(chosen)


def vote_set(votes: Iterable[Vote]) -> RegionVotes:
    """Return the vote set of ``votes`` (all for one record), sorted by author."""
    ordered = sorted(votes, key=lambda vote: vote.author)
    first = ordered[0].body
    return RegionVotes(first.region, first.record, tuple(vote.data for vote in ordered))


def check_vote_set(
    votes: RegionVotes,
    expected: RegionVote,
    members: Collection[str],
    need: int,
    keys: KeyBook,
) -> tuple[str, ...]:
    """Check that ``votes`` holds ``need`` or more signed votes of ``members`` for ``expected``.

    Returns the voters, sorted.

    Raises
    ------
    RoundVerificationFailed
        If a vote names another session, round, region or record, a voter is not a member,
        voters repeat, or there are fewer than ``need``.
    DecodeError
        If a vote is not a signed region vote.
    """
    where = f"region {expected.region}'s record {expected.record}"
    if votes.region != expected.region or bytes(votes.record) != bytes(expected.record):
        raise RoundVerificationFailed(f"{where}: its vote set is for another region or record")
    authors = []
    for data in votes.votes:
        vote = decode_vote(data, keys)
        if vote.body.encode() != expected.encode():
            raise RoundVerificationFailed(f"{where}: {vote.author}'s vote is for another round")
        if vote.author not in members:
            raise RoundVerificationFailed(f"{where}: {vote.author} is not a member of the region")
        authors.append(vote.author)
    if authors != sorted(set(authors)):
        raise RoundVerificationFailed(f"{where}: its voters are not sorted and unique")
    if len(authors) < need:
        raise RoundVerificationFailed(f"{where}: {len(authors)} votes, {need} needed")
    return tuple(authors)


class VoteBoard:
    """The receiving side of the top-level topic: checked region votes, per round and region.

    A message is a vote statement or a relayed vote set; messages from non-members are
    dropped undecoded, and so are repeats. A vote counts if its signature verifies, its author
    is a member of the region it names and it names this session and a round in the window
    (the previous round up to 16 ahead). At most :data:`MAX_VOTES_PER_AUTHOR` records per author
    and round are kept. Drops are counted by reason in :attr:`dropped`.

    Parameters
    ----------
    session, genesis
        The regional session's identity.
    regions
        Peer ID → region, for every member.
    keys
        Where authors' keys are found (``pubsub.keys``).
    """

    def __init__(
        self, session: str, genesis: CID, regions: Mapping[str, str], keys: KeyBook
    ) -> None:
        self.session = session
        self.genesis = genesis
        self.regions = dict(regions)
        self.keys = keys
        self.current = 0
        self.dropped: Counter[str] = Counter()
        # round -> region -> record bytes -> author -> vote
        self._votes: dict[int, dict[str, dict[bytes, dict[str, Vote]]]] = {}
        self._seen: dict[bytes, int] = {}
        self._event = asyncio.Event()

    @property
    def changed(self) -> asyncio.Event:
        """An event set at the next new vote; grab it *before* checking a condition."""
        return self._event

    def votes(self, round_number: int, region: str) -> dict[bytes, dict[str, Vote]]:
        """Return ``{record CID bytes: {author: vote}}`` heard for ``region`` in a round."""
        return self._votes.get(round_number, {}).get(region, {})

    def advance(self, round_number: int) -> None:
        """Make ``round_number`` current and forget rounds before its predecessor."""
        self.current = round_number
        for old in [r for r in self._votes if r < round_number - 1]:
            del self._votes[old]
        self._seen = {k: r for k, r in self._seen.items() if r >= round_number - 1}

    def accept(self, message: PubsubMessage) -> int:
        """Record the votes one message carries; return how many were new."""
        if message.from_peer not in self.regions:
            self.dropped["stranger"] += 1
            return 0
        digest = hashlib.sha256(message.data).digest()
        if digest in self._seen or len(message.data) > MAX_RECORD_BYTES:
            self.dropped["repeat" if digest in self._seen else "malformed"] += 1
            return 0
        block = Block.new(message.data, "dag-cbor")
        try:
            relayed = RegionVotes.from_block(block)
        except DecodeError:
            carried: tuple[bytes, ...] = (block.data,)  # one vote (checked by add)
        else:
            carried = relayed.votes
            if len(carried) > sum(r == relayed.region for r in self.regions.values()):
                self.dropped["malformed"] += 1  # more votes than voters: no signature checked
                return 0
        early = self.dropped["window"]
        new = sum(self.add(data) for data in carried)
        # A vote of a round beyond the window is not remembered: it counts once the round comes.
        if self.dropped["window"] == early and len(self._seen) < _SEEN_PER_MEMBER * len(
            self.regions
        ):
            self._seen[digest] = self.current
        return new

    def add(self, data: bytes) -> bool:
        """Check and record one vote statement's bytes (this peer's own too); ``True`` if new."""
        try:
            vote = decode_vote(data, self.keys)
        except DecodeError:
            self.dropped["malformed"] += 1
            return False
        body = vote.body
        if body.session != self.session or bytes(body.genesis) != bytes(self.genesis):
            self.dropped["foreign"] += 1
            return False
        if self.regions.get(vote.author) != body.region:
            self.dropped["stranger"] += 1
            return False
        if not self.current - 1 <= body.round <= self.current + _MAX_ROUNDS_AHEAD:
            self.dropped["window"] += 1
            return False
        records = self._votes.setdefault(body.round, {}).setdefault(body.region, {})
        mine = [raw for raw, by in records.items() if vote.author in by]
        if bytes(body.record) in mine:
            return False
        if len(mine) >= MAX_VOTES_PER_AUTHOR:
            self.dropped["flood"] += 1
            return False
        records.setdefault(bytes(body.record), {})[vote.author] = vote
        self._event.set()
        self._event = asyncio.Event()
        return True
