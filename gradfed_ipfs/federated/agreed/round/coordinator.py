"""What an agreed-round peer has heard: the coordinator ranking and the message board.

:func:`coordinator_ranking` orders a round's members by rendezvous hash of (session, genesis,
round, peer): rank 0 publishes the roster, rank k takes over ``k`` takeover timeouts later.
:class:`RoundBoard` is the pure receiving side of the agreed-round topic: it checks each pubsub
message (:class:`~gradfed_ipfs.formats.agreed.roster.AgreedMessage`, signed by its sender:
:func:`~gradfed_ipfs.formats.agreed.roster.open_message`), drops and counts by reason what is
unsigned, wrongly signed, malformed, foreign, forged, from a non-member, one's own, out of the
round window or an equivocation, and keeps per round the contributions (with their
signatures, which rosters carry), roster CIDs and ``done`` heads heard.
Waiters use :meth:`RoundBoard.changed` (grab the event, check, then wait) so no change is missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Final

from multiformats import CID

from ....cid import cid_to_str
from ....errors import BadSignature, DecodeError, MalformedManifest
from ....formats.agreed.evidence import is_equivocation
from ....formats.agreed.roster import AgreedMessage, Roster, open_message, verify_roster_entries
from ....formats.pubsub import PubsubMessage
from ....formats.statement import KeyBook
from ..config import AgreedConfig
from ..members import MemberTracker

__all__ = [
    "best_head",
    "effective_quorum",
    "roster_problem",
    "MAX_ROUNDS_AHEAD",
    "Contribution",
    "Head",
    "RoundBoard",
    "RoundState",
    "coordinator_ranking",
    "model_holders",
]

MAX_ROUNDS_AHEAD: Final = 16
"""Rounds beyond the current one whose messages are kept (later ones are dropped)."""
logger = logging.getLogger("gradfed_ipfs.federated.agreed")
_REASONS: Final[dict[type[DecodeError], str]] = {
    BadSignature: "bad-signature",
    MalformedManifest: "unsigned",  # not a statement at all (or a bad one)
}
"""Drop reasons of a message that does not decode, by error (else ``malformed``)."""
_HELD_STATEMENTS: Final = 1024
"""Signed statements (and published proofs) a board holds for its peer's equivocation watch
until the session takes them (it does after every message)."""
_REPEATS_PER_MEMBER: Final = 16
"""Recorded messages a board remembers per member to drop their re-publications undecoded
(an honest member sends three a round; the board holds two rounds)."""
_MAX_IGNORED: Final = 4096
"""Head records a board ignores (:meth:`RoundBoard.ignore_heads`) before it forgets the oldest."""


def coordinator_ranking(
    session: str, genesis: CID, round_number: int, members: tuple[str, ...]
) -> list[str]:
    """Return ``members`` in coordinator order for a round (rendezvous hashing, SHA-256)."""
    prefix = f"{session}\0{cid_to_str(genesis)}\0{round_number}\0"  # str(CID): ~1 ms each

    def score(peer: str) -> bytes:
        return hashlib.sha256(f"{prefix}{peer}".encode()).digest()

    return sorted(set(members), key=lambda peer: (score(peer), peer))


def model_holders(
    session: str,
    genesis: CID,
    round_number: int,
    members: tuple[str, ...],
    roster_peers: Collection[str],
    replicas: int | None,
) -> tuple[str, ...]:
    """Return the roster peers that store round ``round_number``'s model, in ranking order.

    They are the first ``replicas`` roster peers of the round's :func:`coordinator_ranking`
    (every roster peer when ``replicas`` is ``None``): every peer, and any third party that
    knows the roster, names the same holders, so a reader knows whose daemon serves the model.
    """
    ranked = [
        p for p in coordinator_ranking(session, genesis, round_number, members) if p in roster_peers
    ]
    return tuple(ranked if replicas is None else ranked[:replicas])


@dataclass(frozen=True, slots=True)
class Contribution:
    """A peer's announced contribution for a round: its CID, weight and base model CID.

    ``signature`` is the peer's of its ``agreed/contrib`` statement (``None`` on an unsigned
    board): what a roster entry listing it carries.
    """

    cid: CID
    weight: int
    base: CID
    signature: bytes | None = None


@dataclass(frozen=True, slots=True)
class Head:
    """A peer's latest ``done``: the round, its result model CID and its round record CID."""

    round: int
    result: CID
    record: CID


@dataclass
class RoundState:
    """Everything heard about one round."""

    contributions: dict[str, Contribution] = field(default_factory=dict)
    rosters: dict[str, CID] = field(default_factory=dict)
    done: dict[str, Head] = field(default_factory=dict)
    roster_signatures: dict[str, bytes] = field(default_factory=dict)
    """Each member's signature of its ``roster`` message (the one :attr:`rosters` keeps)."""
    _records: Counter[bytes] = field(default_factory=Counter, repr=False)
    """How many of :attr:`done` name each record (kept by :meth:`set_done`, :meth:`drop_done`)."""

    def set_done(self, peer: str, head: Head) -> None:
        """Keep ``head`` as ``peer``'s ``done`` of this round (replacing an earlier one)."""
        self.drop_done(peer)
        self.done[peer] = head
        self._records[bytes(head.record)] += 1

    def drop_done(self, peer: str) -> None:
        """Forget ``peer``'s ``done`` of this round (if any)."""
        known = self.done.pop(peer, None)
        if known is not None:
            key = bytes(known.record)
            self._records[key] -= 1
            if not self._records[key]:
                del self._records[key]

    def all_done_name(self, record: bytes) -> bool:
        """Whether every ``done`` heard of this round names ``record`` (O(1), not O(peers)).

        Asked at each ``done`` a peer hears (:meth:`AgreedSession._relay_if_split`): walking
        :attr:`done` there was O(N) a message, O(N²) a round for each of N members.
        """
        return not self._records or set(self._records) == {record}


class RoundBoard:
    """Checks agreed-round messages and keeps what they say, per round and per peer.

    Parameters
    ----------
    session, genesis
        The session identity; messages naming another are dropped.
    local_peer
        This peer (its own messages are dropped).
    members
        The session's peers; messages from others are dropped.
    keys
        Where the senders' keys are (``pubsub.keys``): every message must then be its sender's
        signed statement, else it is dropped as ``unsigned`` or ``bad-signature``. ``None``:
        plain messages (a regional session's top-level board).
    """

    def __init__(
        self,
        session: str,
        genesis: CID,
        local_peer: str,
        members: tuple[str, ...],
        *,
        keys: KeyBook | None = None,
    ) -> None:
        self.session = session
        self.keys = keys
        self.genesis = genesis
        self.local_peer = local_peer
        self.members = frozenset(members)
        self.current = 0
        self.rounds: dict[int, RoundState] = {}
        self.heads: dict[str, Head] = {}
        # roster CID -> (round, block bytes carried in its message)
        self.inline: dict[bytes, tuple[int, bytes]] = {}
        self.dropped: Counter[str] = Counter()
        self._event = asyncio.Event()
        # (from, bytes) of recorded messages -> their round: a re-publication is dropped
        # before it is decoded (recording it again would change nothing). Bounded: rounds
        # before the previous one are forgotten, and at most _REPEATS_PER_MEMBER a member.
        self._repeats: dict[tuple[str, bytes], int] = {}
        self._repeat_cap = _REPEATS_PER_MEMBER * len(self.members)
        self.requests: MemberTracker | None = None  # holds join, approve and leave statements
        # For the equivocation watch (a signed board): each member's signed roster statements,
        # its own or relayed by another member, and the proofs members published (from, bytes).
        self.statements: deque[tuple[AgreedMessage, bytes]] = deque(maxlen=_HELD_STATEMENTS)
        self.proofs: deque[tuple[str, bytes]] = deque(maxlen=_HELD_STATEMENTS)
        self.excluded: set[str] = set()  # proven equivocators: everything they say is dropped
        # How many heads are at each round, and a count of the done messages recorded: the
        # roster step asks "how many members are at round r or later" at every board change,
        # and walking every head for it is O(N) a change.
        self._head_rounds: Counter[int] = Counter()
        self.done_heard = 0
        self._ignored: dict[bytes, None] = {}  # head records that count for nobody (tainted)

    def exclude(self, peer: str) -> None:
        """Drop all that ``peer`` (a proven equivocator) said and says: votes, heads, rosters."""
        self.excluded.add(peer)
        known = self.heads.pop(peer, None)
        if known is not None and self._counts(known):
            self._head_rounds[known.round] -= 1
        for state in self.rounds.values():
            state.contributions.pop(peer, None)
            state.rosters.pop(peer, None)
            state.drop_done(peer)
        self._notify()

    def ignore_heads(self, records: Iterable[bytes]) -> None:
        """Stop counting the heads on ``records`` (chains that took a proven equivocator's roster).

        They stay their members' heads (a resync refuses them by itself) but count in no
        :meth:`heads_from` (else rewound members' old heads would tell a re-run round it is
        over elsewhere), and their member's next ``done`` replaces them whatever its round
        (its re-run of the round).
        """
        new = [r for r in records if r not in self._ignored]
        if not new:
            return
        self._ignored.update(dict.fromkeys(new))
        while len(self._ignored) > _MAX_IGNORED:
            del self._ignored[next(iter(self._ignored))]
        self._head_rounds = Counter(h.round for h in self.heads.values() if self._counts(h))
        self._notify()

    def _counts(self, head: Head) -> bool:
        """Whether ``head`` counts as its member's (its record is not ignored)."""
        return bytes(head.record) not in self._ignored

    def rewind(self, round_number: int) -> None:
        """Make ``round_number`` current again, forgetting what was heard of it and later rounds.

        A peer re-running a round after an equivocation (their re-announced messages are
        taken again; heads stay: they are every member's latest).
        """
        self.current = round_number
        for old in [r for r in self.rounds if r >= round_number]:
            del self.rounds[old]
        self._repeats = {k: r for k, r in self._repeats.items() if r < round_number}
        self._notify()

    def set_members(self, members: Collection[str]) -> None:
        """Take messages from ``members`` from now on (a round changed the member set)."""
        self.members = frozenset(members)
        self._repeat_cap = _REPEATS_PER_MEMBER * len(self.members)

    @property
    def changed(self) -> asyncio.Event:
        """An event set at the next change; grab it *before* checking a condition."""
        return self._event

    def state(self, round_number: int) -> RoundState:
        """Return (creating) the state of a round."""
        state = self.rounds.get(round_number)
        if state is None:  # not setdefault: a RoundState is five containers, asked O(N) a round
            state = self.rounds[round_number] = RoundState()
        return state

    def advance(self, round_number: int) -> None:
        """Make ``round_number`` current and forget rounds before its predecessor."""
        self.current = round_number
        for old in [r for r in self.rounds if r < round_number - 1]:
            del self.rounds[old]
        # Rosters of this round heard early (a slow peer hears the next round's) stay: their
        # coordinator did not put them, and a fetch would wait for nothing until fetch_timeout.
        for key in [k for k, (r, _) in self.inline.items() if r < round_number - 1]:
            del self.inline[key]
        self._repeats = {k: r for k, r in self._repeats.items() if r >= round_number - 1}

    def accept(self, message: PubsubMessage) -> AgreedMessage | None:
        """Check one pubsub message and record it; return it, or ``None`` if dropped."""
        repeat = (message.from_peer, message.data)
        requests = self.requests
        if repeat in self._repeats or (requests is not None and requests.known(message.data)):
            return self._drop("repeat")
        opened = self._decode(message)
        if opened is None:
            return None
        decoded, signature = opened
        if decoded.kind == "done":
            head = Head(decoded.round, decoded.cid, decoded.record or decoded.cid)
            self._head(decoded.peer, head)
        if not self.current - 1 <= decoded.round <= self.current + MAX_ROUNDS_AHEAD:
            self._notify()
            return self._drop("window") if decoded.kind != "done" else decoded
        if not self._record(decoded, signature):
            return self._drop("equivocation")  # the first claim stands
        # A contribution of a later round is handed out again (its prefetch waits for it).
        if decoded.round <= self.current + 1 and len(self._repeats) < self._repeat_cap:
            self._repeats[repeat] = decoded.round
        self._notify()
        return decoded

    def _head(self, peer: str, head: Head) -> None:
        """Keep ``head`` as ``peer``'s latest unless it announced a later round already.

        A later round's head on an ignored record is replaced all the same.
        """
        known = self.heads.get(peer)
        if known is None or head.round >= known.round or not self._counts(known):
            if known is not None and self._counts(known):
                self._head_rounds[known.round] -= 1
            self.heads[peer] = head
            if self._counts(head):
                self._head_rounds[head.round] += 1
        self.done_heard += 1

    def heads_from(self, round_number: int, *, but: str = "") -> int:
        """Count the peers (but ``but``) whose latest ``done`` is of ``round_number`` or later.

        Heads on ignored records do not count. O(rounds heard), not O(peers).
        """
        count = sum(n for r, n in self._head_rounds.items() if r >= round_number)
        mine = self.heads.get(but)
        return count - (mine is not None and mine.round >= round_number and self._counts(mine))

    def _decode(self, message: PubsubMessage) -> tuple[AgreedMessage, bytes | None] | None:
        """Decode a message of this session from a member that signed it; else drop it."""
        if message.from_peer == self.local_peer:  # Kubo echoes ours back: not worth decoding
            self._drop("own")
            return None
        try:
            decoded, signature = self._open(message.data)
        except DecodeError as exc:
            if self.requests is not None and self.requests.offer(message.data, message.from_peer):
                self._notify()  # a membership request (a stranger's join among them), held
                return None
            if self._proof(message):
                return None
            self._drop(_REASONS.get(type(exc), "malformed"), message.from_peer)
            return None
        if decoded.session != self.session or bytes(decoded.genesis) != bytes(self.genesis):
            self._drop("foreign", message.from_peer)
            return None
        members = self.members
        relayed = {decoded.peer, message.from_peer} <= members  # its author's, however it came
        if decoded.kind == "roster" and signature is not None and relayed:
            self.statements.append((decoded, message.data))  # evidence (EvidenceWatch)
        if decoded.peer != message.from_peer:
            # a relayed statement is evidence only, not a message
            self._drop("forged", message.from_peer)
            return None
        if decoded.peer not in members:
            self._drop("stranger", message.from_peer)
            return None
        if decoded.peer in self.excluded:
            self._drop("excluded", message.from_peer)
            return None
        return decoded, signature

    def _proof(self, message: PubsubMessage) -> bool:
        """Hold a member's published equivocation proof for the session to verify."""
        if self.keys is None or message.from_peer not in self.members:
            return False
        if not is_equivocation(message.data):
            return False
        self.proofs.append((message.from_peer, message.data))
        self.dropped["evidence"] += 1  # not a round message: counted, handed to the watch
        return True

    def _open(self, data: bytes) -> tuple[AgreedMessage, bytes | None]:
        """Decode a message (and its statement's signature, on a signed board)."""
        if self.keys is None:
            return AgreedMessage.decode(data), None
        return open_message(data, self.keys)

    def _record(self, decoded: AgreedMessage, signature: bytes | None) -> bool:
        """Keep what a message in the round window says; ``False``: a second contribution."""
        state = self.state(decoded.round)
        if decoded.kind == "contrib":
            known = state.contributions.get(decoded.peer)
            if known is not None and bytes(known.cid) != bytes(decoded.cid):
                return False
            if known is None and decoded.base is not None and decoded.weight is not None:
                state.contributions[decoded.peer] = Contribution(
                    decoded.cid, decoded.weight, decoded.base, signature
                )
        elif decoded.kind == "roster":
            first = state.rosters.setdefault(decoded.peer, decoded.cid)
            # Only the roster a member's state records keeps its bytes: at most one per member
            # and round in the window, so a member flooding rosters cannot push others' out.
            if bytes(first) == bytes(decoded.cid):
                if signature is not None:  # a record of a roster leaving peers out carries it
                    state.roster_signatures.setdefault(decoded.peer, signature)
                if decoded.inline is not None:
                    self.inline.setdefault(bytes(decoded.cid), (decoded.round, decoded.inline))
        else:
            state.set_done(
                decoded.peer, Head(decoded.round, decoded.cid, decoded.record or decoded.cid)
            )
        return True

    def _drop(self, reason: str, sender: str = "") -> AgreedMessage | None:
        self.dropped[reason] += 1
        if sender:  # a message a peer should not have sent (or not to us): worth a trace
            logger.debug("dropped a message from %s: %s", sender, reason)
        return None

    def _notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait_until(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Check ``ready()`` at every change (and every 50 ms) until true or ``timeout`` s pass."""
        deadline = time.monotonic() + timeout
        while True:
            event = self._event  # grabbed before the check, so no change is missed
            if ready():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), min(0.05, left))

    async def gather_heads(
        self, others: list[str], *, grace: float, timeout: float
    ) -> dict[str, Head]:
        """Wait for every peer's head, or ``grace`` s after the first one, or ``timeout`` s."""
        first: list[float] = []

        def heard_enough() -> bool:
            if self.heads and not first:
                first.append(time.monotonic())
            everyone = all(p in self.heads for p in others)
            return everyone or bool(first and time.monotonic() - first[0] >= grace)

        await self.wait_until(heard_enough, timeout)
        return dict(self.heads)

    def poke(self) -> None:
        """Wake every waiter (after a local change, e.g. a finished fetch)."""
        self._notify()


def best_head(heads: Iterable[Head]) -> Head | None:
    """Pick the highest round, then the record most peers announce, then the smallest CID."""
    pool = list(heads)
    if not pool:
        return None
    votes = Counter(bytes(h.record) for h in pool)
    return min(pool, key=lambda h: (-h.round, -votes[bytes(h.record)], bytes(h.record)))


def effective_quorum(config: AgreedConfig, excluded: Collection[str] = ()) -> int:
    """Return ``min_peers``, or when it is unset every member not proven a lying reducer."""
    if config.min_peers is not None:
        return config.min_peers
    return max(1, len(set(config.members) - set(excluded)))


def roster_problem(
    roster: Roster,
    session: str,
    genesis: CID,
    round_number: int,
    base: CID,
    config: AgreedConfig,
    excluded: Collection[str] = (),
    keys: KeyBook | None = None,
) -> str:
    """Return why ``roster`` cannot be this round's (``""`` when it can).

    ``excluded`` are the peers the session's agreed history proves lying reducers
    (:attr:`~gradfed_ipfs.formats.agreed.roster.AgreedRecord.excluded` of the round's base record):
    a roster listing one is refused, as is one listing a weight above ``config.max_weight``.
    With ``keys``, every entry must carry its owner's signature of the contribution it lists
    (:func:`~gradfed_ipfs.formats.agreed.roster.verify_roster_entries`).
    """
    if roster.session != session or bytes(roster.genesis) != bytes(genesis):
        return "another session"
    if roster.round != round_number or bytes(roster.base) != bytes(base):
        return f"round {roster.round} on {roster.base}, not round {round_number} on {base}"
    members = set(config.members)
    if roster.coordinator not in members or not set(roster.peers) <= members:
        return "lists a non-member"
    heavy = [e for e in roster.entries if e.weight > config.max_weight]
    if heavy:
        return (
            f"lists {heavy[0].peer} with weight {heavy[0].weight} > max_weight {config.max_weight}"
        )
    liars = sorted(set(roster.peers) & set(excluded))
    if liars:
        return f"lists proven lying reducer(s) {', '.join(liars)}"
    quorum = effective_quorum(config, excluded)
    if len(roster.entries) < quorum:
        return f"{len(roster.entries)} entries < min_peers {quorum}"
    if keys is not None:
        try:
            verify_roster_entries(roster, keys)
        except BadSignature as exc:
            return str(exc)
    return ""
