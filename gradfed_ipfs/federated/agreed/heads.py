"""Which announced head a peer adopts: votes of the head's roster, then its verified chain.

A ``done`` is one member's word. :class:`HeadChooser` takes the heads a board heard (one per
member, its latest) best first (:func:`ranked_heads`) and adopts the first that

1. has a record of this session and genesis, of the announced round and result (a bounded
   fetch: a head whose record is missing costs one fetch, then is forgotten);
2. has ``done`` votes from more than half of its roster's peers (:func:`count_votes`, whose
   votes are the board's per-peer heads; a member whose head is a later record that links this
   one votes for it too);
3. verifies (:func:`~.history.verify_head`: the records this peer has not followed, their
   exclusions, and the last rounds re-aggregated as ``verify_agreed_history`` does).

A head refused at step 1 or 3 is remembered (bounded) and skipped when re-announced; one
refused for its votes is counted again next time (its votes may still be on their way). A head
refused because a fetch timed out, the daemon was unreachable or the walk ran out of time (a
newcomer not yet connected, a slow link) is tried again once its back-off has passed: the fetch
timeout, doubled at each failure up to :data:`MAX_RETRY_FACTOR` times it (a head whose record
nobody serves costs a bounded share of the resyncs' time).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar

from multiformats import CID

from ...cid import cid_to_str
from ...errors import (
    BlockStoreError,
    BlockTimeout,
    ChainDeadlineExceeded,
    DecodeError,
    FederatedError,
    GradientError,
    StoreUnavailable,
)
from ...formats.agreed.roster import AgreedRecord
from ...formats.statement import PEER_ID_KEYS, KeyBook
from ...storage.base import BlockStore
from .history import ResultLoad, VerifiedHead, load_record, load_roster, verify_head
from .round.coordinator import Head, best_head

__all__ = [
    "MAX_REFUSED_HEADS",
    "MAX_RETRY_FACTOR",
    "HeadChoice",
    "HeadChooser",
    "count_votes",
    "has_majority",
    "ranked_heads",
]

MAX_REFUSED_HEADS: Final = 1024
"""Refused head records a :class:`HeadChooser` remembers (the oldest are forgotten first)."""
_V = TypeVar("_V")
MAX_RETRY_FACTOR: Final = 64
"""A head refused for a transient failure waits at most this many fetch timeouts to be retried."""
_FEW_VOTES: Final = "done votes from"
_TRANSIENT: Final = (BlockTimeout, StoreUnavailable, ChainDeadlineExceeded)
"""Failures that say nothing about the head (slow, unreachable, out of time): retried later."""


@dataclass
class _Failure:
    """A head refused for a transient failure: why, how often, and when it is due again."""

    why: str
    count: int
    due: float  # time.monotonic() seconds


def ranked_heads(heads: Iterable[Head]) -> list[Head]:
    """Return one head per distinct record, best first (see :func:`~.coordinator.best_head`)."""
    pool, ordered = list(heads), []
    while (best := best_head(pool)) is not None:
        ordered.append(best)
        pool = [h for h in pool if bytes(h.record) != bytes(best.record)]
    return ordered


def count_votes(
    heads: Mapping[str, Head],
    record: CID,
    roster: Collection[str],
    links: Mapping[bytes, bytes | None] | None = None,
) -> frozenset[str]:
    """Return the roster peers whose head is ``record``, or a later record linking back to it.

    ``heads`` are the board's per-peer heads (each member's latest ``done``); ``links`` maps
    record CIDs (bytes) to their ``prev`` for the records the caller loaded, so a member that
    went on to the next round still votes for the record it built on.
    """
    target, hops = bytes(record), links or {}
    voters = set()
    for peer, head in heads.items():
        if peer not in roster:
            continue
        cid: bytes | None = bytes(head.record)
        for _ in range(len(hops) + 1):  # each hop is a loaded record: no cycle runs forever
            if cid is None or cid == target:
                break
            cid = hops.get(cid)
        if cid == target:
            voters.add(peer)
    return frozenset(voters)


def has_majority(voters: Collection[str], roster: Collection[str]) -> bool:
    """Whether ``voters`` are more than half of ``roster``."""
    return 2 * len(set(voters) & set(roster)) > len(set(roster))


@dataclass
class HeadChoice:
    """What :meth:`HeadChooser.choose` found: the adopted head (if any) and what it refused.

    ``refused`` maps each member whose head was refused to why; ``endorsed`` is set when a
    refused head had the votes of more than half of its roster (its chain did not verify),
    ``outvoted`` when one lacked them (more votes may still come).
    """

    head: Head | None = None
    verified: VerifiedHead | None = None
    refused: dict[str, str] = field(default_factory=dict)
    endorsed: bool = False
    outvoted: bool = False


class HeadChooser:
    """Chooses the head a peer adopts (see the module docstring); remembers refused records.

    Parameters
    ----------
    store
        Where records, rosters and models are fetched.
    session, genesis
        The session identity: a record of another is refused.
    members
        The session's members: a roster listing another is refused.
    timeout
        Seconds each fetch of a candidate's record and roster may take.
    """

    def __init__(
        self,
        store: BlockStore,
        session: str,
        genesis: CID,
        members: Collection[str] | None,
        timeout: float,
        *,
        keys: KeyBook = PEER_ID_KEYS,
    ) -> None:
        self.store, self.session, self.genesis = store, session, genesis
        self.members = None if members is None else frozenset(members)  # None: sets change
        self.timeout, self.keys = timeout, keys
        self._refused: OrderedDict[bytes, str] = OrderedDict()
        self._failed: OrderedDict[bytes, _Failure] = OrderedDict()
        self._links: dict[bytes, bytes | None] = {}

    async def choose(
        self,
        heads: Mapping[str, Head],
        own: CID | None,
        *,
        history: Collection[bytes],
        result: ResultLoad,
        deadline: float | None = None,
        check: Callable[[VerifiedHead], Awaitable[None]] | None = None,
    ) -> HeadChoice:
        """Return the best head of ``heads`` ranked above ``own`` that checks out (see above).

        ``heads`` are every member's latest head, this peer's own included (it votes too);
        ``own`` is this peer's head record (``None`` at the genesis); ``history``, ``result``
        and ``deadline`` are :func:`~.history.verify_head`'s. ``check`` is the caller's own
        check of a verified head (e.g. its chain's member sets); a head it raises
        ``FederatedError`` for is refused like one that does not verify, and the next tried.
        """
        choice = HeadChoice()
        for head in ranked_heads(heads.values()):
            if own is not None and bytes(head.record) == bytes(own):
                break  # this peer's own head ranks above every one left
            why = await self._refusal(head, heads)
            if why.startswith(_FEW_VOTES):
                choice.outvoted = True
            elif not why:
                why = await self._verify(head, history, result, deadline, choice, check)
            if not why:
                choice.head = head
                return choice
            for peer, theirs in heads.items():
                if bytes(theirs.record) == bytes(head.record):
                    text = cid_to_str(head.record)
                    choice.refused[peer] = f"head {text} (round {head.round}): {why}"
        return choice

    async def _refusal(self, head: Head, heads: Mapping[str, Head]) -> str:
        """Why ``head`` is not worth verifying (``""`` when it is): its record or its votes."""
        known = self._known(head)
        if known is not None:
            return known
        try:
            record = await load_record(self.store, head.record, timeout=self.timeout)
            problem = self._record_problem(head, record)
            if not problem:
                self._link(head.record, record)  # its author's vote for what it extends
                roster = await load_roster(self.store, record.roster, timeout=self.timeout)
                outside = sorted(set(roster.peers) - (self.members or set(roster.peers)))
                problem = f"its roster lists non-member(s) {', '.join(outside)}" if outside else ""
        except (BlockStoreError, DecodeError) as exc:
            return self._remember(head, exc)
        if problem:
            return self._remember(head, problem)
        votes = count_votes(heads, head.record, roster.peers, self._links)
        if not has_majority(votes, roster.peers):
            return f"{_FEW_VOTES} {len(votes)} of its roster's {len(roster.peers)} peers"
        return ""

    def _link(self, cid: CID, record: AgreedRecord) -> None:
        """Keep ``record``'s ``prev`` (bounded): a vote for it is a vote for what it extends.

        Also for a head refused later (its roster is missing): its author still built on it.
        """
        self._links[bytes(cid)] = None if record.prev is None else bytes(record.prev)
        while len(self._links) > MAX_REFUSED_HEADS:
            del self._links[next(iter(self._links))]

    def _record_problem(self, head: Head, record: AgreedRecord) -> str:
        """Why a head's record is not the announced round of this session (``""``: it is)."""
        if record.session != self.session or bytes(record.genesis) != bytes(self.genesis):
            return f"its record belongs to {record.session}/{record.genesis}"
        if record.round != head.round or bytes(record.result) != bytes(head.result):
            return f"its record is round {record.round} with result {record.result}"
        return ""

    async def _verify(
        self,
        head: Head,
        history: Collection[bytes],
        result: ResultLoad,
        deadline: float | None,
        choice: HeadChoice,
        check: Callable[[VerifiedHead], Awaitable[None]] | None = None,
    ) -> str:
        """Verify ``head``'s chain into ``choice`` (``""``), or return why it does not verify."""
        try:
            verified = await verify_head(
                self.store, head.record, session=self.session, genesis=self.genesis,
                history=history, result=result, deadline=deadline, keys=self.keys,
            )  # fmt: skip
            if check is not None:
                await check(verified)
            choice.verified = verified
        except (FederatedError, BlockStoreError, DecodeError, GradientError) as exc:
            choice.verified = None
            choice.endorsed = True
            return self._remember(head, exc)
        self._failed.pop(bytes(head.record), None)
        return ""

    def retry_in(self) -> float | None:
        """Seconds until a head refused for a transient failure is due again (``None``: none)."""
        if not self._failed:
            return None
        return max(0.0, min(f.due for f in self._failed.values()) - time.monotonic())

    def _known(self, head: Head) -> str | None:
        """Why ``head`` was refused before, unless it was never or is due to be tried again."""
        key = bytes(head.record)
        failure = self._failed.get(key)
        if failure is not None and time.monotonic() < failure.due:
            return failure.why
        return self._refused.get(key)

    def _remember(self, head: Head, why: str | Exception) -> str:
        """Keep why ``head`` was refused (bounded): for good, or until its back-off passes."""
        key = bytes(head.record)
        text = why if isinstance(why, str) else f"{type(why).__name__}: {why}"
        if isinstance(why, _TRANSIENT):
            count = self._failed[key].count + 1 if key in self._failed else 1
            wait = self.timeout * min(2 ** (count - 1), MAX_RETRY_FACTOR)
            self._failed[key] = _Failure(text, count, time.monotonic() + wait)
            _bound(self._failed)
            return text
        self._failed.pop(key, None)
        self._refused[key] = text
        _bound(self._refused)
        return text


def _bound(table: OrderedDict[bytes, _V]) -> None:
    """Forget the oldest entries past :data:`MAX_REFUSED_HEADS`."""
    while len(table) > MAX_REFUSED_HEADS:
        table.popitem(last=False)
