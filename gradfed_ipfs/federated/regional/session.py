"""``RegionalSession``: region-level agreed rounds, then a content-addressed top-level combine.

Peers are tagged with regions (:class:`~.regional_config.RegionalConfig`). Round ``r``:

1. **region round**: each region runs an agreed round of its own
   (:class:`~gradfed_ipfs.federated.agreed.session.AgreedSession`, session
   ``<session>/region/<region>``, members = the region's peers): its own coordinator
   (:func:`~.coordinator.coordinator_ranking` over the region) publishes its own roster, and
   every region peer aggregates exactly that roster with :class:`~.regional_config.RegionMeanRule`
   (:func:`~gradfed_ipfs.tensor.regional.region_mean`: roster order, roster weights). The
   region's :class:`~gradfed_ipfs.formats.agreed.roster.AgreedRecord` names its roster and its
   aggregate; a member absent from the region round is absent from its roster only.
   Contributions are announced on the region's topic and fetched by its peers alone.
2. **vote**: every peer of a combined region signs one ``regional/vote`` statement naming its
   region's record (:mod:`.votes`) and re-announces the same bytes on the top-level topic
   (:func:`~.config.regional_topic`) until the next round. A region that ``in-regions`` does
   not combine announces nothing there: nothing of it is ever fetched outside it.
3. **combine**: a peer adopts, for every combined region (its own included), the record with
   votes of more than half of that region's members and at least its ``min_peers``
   (:meth:`~.config.RegionalConfig.votes_needed`) that checks out (session, round, rule, a
   roster of that region's members). Its evidence is the vote set of the first such voters in
   member order (the rule and its limit: :mod:`.votes`), which the peer stores and relays.
   It fetches the aggregates and combines them (:func:`~.config.combine_regions`, regions
   sorted), and stores the result and a
   :class:`~gradfed_ipfs.formats.regional.RegionalRecord` (per region its record and vote
   set, the mode, the result): honest peers write the same bytes, so the same top-level CID.
   A record without enough votes is never fetched; its voters are named in ``rejected``.

:func:`verify_regional_round` re-checks a top-level record from its CID alone: each region's
votes are checked (signatures, members, round, enough of them), each region record is
re-aggregated from its roster's contributions
(:func:`~.agreed_history.verify_agreed_round`), then the combine is recomputed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from multiformats import CID

from ..._types import CIDLike, FloatArray, GradientLike
from ...cid import parse_cid
from ...errors import (
    BlockNotFound,
    BlockStoreError,
    DecodeError,
    DimensionMismatch,
    GenesisMismatch,
    InvalidGradient,
    QuorumNotReached,
    RoundVerificationFailed,
)
from ...formats.agreed.roster import AgreedRecord
from ...formats.regional import RegionalRecord, RegionVote, RegionVotes, region_session
from ...formats.statement import PEER_ID_KEYS, KeyBook, Signer
from ...kubo.pubsub import PubsubTransport
from ...storage.base import BlockStore
from ...storage.dag import fetch_gradient
from ...storage.retention import put_all_pinned_alone, put_pinned_alone
from ..agreed.history import load_record, load_roster, model_cid, verify_agreed_round
from ..agreed.session import AgreedSession
from ..exchange.announcer import Reannouncer
from ..exchange.encoded import encode_gradient
from .config import (
    REGION_MEAN,
    RegionalConfig,
    RegionalRoundResult,
    RegionMeanRule,
    combine_regions,
    regional_topic,
    votes_needed,
)
from .votes import VoteBoard, check_vote_set, sign_vote, vote_quorum, vote_set

__all__ = [
    "RegionMeanRule",
    "RegionalConfig",
    "RegionalRoundResult",
    "RegionalSession",
    "regional_topic",
    "verify_regional_round",
]

logger = logging.getLogger("gradfed_ipfs.federated.regional")


class RegionalSession:
    """One peer of a regional session (see the module docstring).

    Parameters
    ----------
    store
        This peer's block store (its daemon).
    pubsub
        This peer's pubsub transport.
    session
        Session name.
    genesis
        CID of the session's initial model (d values; see
        :meth:`AgreedSession.commit_genesis`): it fixes d and names every region session.
    config
        Regions, combine mode and timing.
    validator_rpc
        With ``config.control == "cometbft"``: ``http://127.0.0.1:PORT`` of this peer's own
        validator of its region's chain (:meth:`~.config.RegionalConfig.chain_genesis`).
    """

    def __init__(
        self,
        store: BlockStore,
        pubsub: PubsubTransport,
        session: str,
        genesis: CIDLike,
        config: RegionalConfig,
        *,
        validator_rpc: str | None = None,
    ) -> None:
        self.store = store
        self.validator_rpc = validator_rpc
        self.pubsub = pubsub
        self.session = session
        self.genesis = parse_cid(genesis)
        self.config = config
        self.topic = regional_topic(session, self.genesis)
        self.peer_id = ""
        self.region = ""
        self._region: AgreedSession | None = None
        self._board: VoteBoard | None = None
        self._identity: Signer | None = None
        self._announcer = Reannouncer(
            pubsub, self.topic, config.announce_interval, config.max_announce_interval
        )
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def round(self) -> int:
        """The next round's number (its region session's)."""
        return 0 if self._region is None else self._region.round

    @property
    def region_session(self) -> AgreedSession:
        """The agreed session of this peer's region (after :meth:`start`)."""
        if self._region is None:
            raise RuntimeError("RegionalSession.start() has not been called")
        return self._region

    async def start(self, model: GradientLike | None = None) -> None:
        """Join this peer's region session and listen on the top-level topic.

        Raises
        ------
        GenesisMismatch
            If this peer has no region, or ``model`` is not the genesis model.
        """
        self.peer_id = await self.pubsub.local_peer_id()
        region = self.config.regions.get(self.peer_id)
        if region is None:
            raise GenesisMismatch(f"peer {self.peer_id} has no region in {self.session!r}")
        self.region = region
        self._region = AgreedSession(
            self.store,
            self.pubsub,
            region_session(self.session, region),
            self.genesis,
            self.config.agreed(region),
            validator_rpc=self.validator_rpc,
        )
        self._board = VoteBoard(self.session, self.genesis, self.config.regions, self.pubsub.keys)
        await self._region.start(model)
        board, messages = self._board, self.pubsub.subscribe(self.topic)

        async def listen() -> None:
            async for message in messages:
                board.accept(message)

        self._tasks = [asyncio.create_task(listen()), asyncio.create_task(self._announcer.run())]

    async def aclose(self) -> None:
        """Stop the region session, announcing and listening (store and transport stay open)."""
        try:
            if self._region is not None:
                await self._region.aclose()
        finally:
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=5.0)
            self._tasks = []

    async def run_round(self, gradient: GradientLike, *, weight: int = 1) -> RegionalRoundResult:
        """Contribute ``gradient`` (d values) to this round; return the combined result.

        Raises
        ------
        QuorumNotReached
            If this region adopted no roster, or a combined region's record did not gather
            enough signed votes, by ``round_timeout``.
        RoundMismatch
            As :meth:`AgreedSession.run_round` (this peer's region disagreed).
        """
        board, r, config = self._require_board(), self.round, self.config
        started = time.monotonic()
        board.advance(r)
        mine = await self.region_session.run_round(gradient, weight=weight)
        if self.region in config.combined:
            body = RegionVote(self.session, self.genesis, r, self.region, mine.record)
            vote = await sign_vote(await self._signer(), self.pubsub.keys, body)
            board.add(vote.data)
            await self._announcer.post("vote", vote.data)  # signed once, re-announced as is
        else:
            self._announcer.withdraw("vote")
        rejected: dict[str, str] = {}
        found = await self._gather(r, rejected)
        means = {region: adopted.values for region, adopted in found.items()}
        sums = {region: adopted.total for region, adopted in found.items()}
        aggregate = combine_regions(config.combine, means, sums, config.allowed)
        encoded = await encode_gradient(aggregate)
        ordered = sorted(found)
        regions = tuple((region, found[region].record) for region in ordered)
        votes = [found[region].votes.to_block() for region in ordered]
        top = RegionalRecord(
            self.session, self.genesis, r, config.combine, config.allowed, regions,
            encoded.cid, tuple(block.cid for block in votes),
        )  # fmt: skip
        await encoded.store(self.store)
        await put_all_pinned_alone(self.store, votes)
        record_cid = await put_pinned_alone(self.store, top.to_block())
        return RegionalRoundResult(
            round=r,
            region=self.region,
            region_record=mine.record,
            region_roster=mine.roster,
            region_result=mine.model,
            regions=regions,
            result=encoded.cid,
            record=record_cid,
            aggregate=aggregate,
            rejected=rejected,
            seconds=time.monotonic() - started,
        )

    # ------------------------------------------------------------------ helpers

    async def _signer(self) -> Signer:
        if self._identity is None:
            self._identity = await self.pubsub.signer()
        return self._identity

    async def _gather(self, r: int, rejected: dict[str, str]) -> dict[str, _Adopted]:
        """Adopt a voted record of every combined region (``round_timeout`` s)."""
        board, combined = self._require_board(), self.config.combined
        deadline = time.monotonic() + self.config.round_timeout
        found: dict[str, _Adopted] = {}
        tried: set[bytes] = set()
        waiting: dict[tuple[str, bytes], float] = {}  # a gap in the first voters: since when
        while True:
            event = board.changed
            for region in combined:
                if region not in found:
                    adopted = await self._adopt(r, region, rejected, tried, waiting)
                    if adopted is not None:
                        found[region] = adopted
                        # Relayed, so a vote its author sent to this peer only reaches all.
                        await self._announcer.post(f"votes/{region}", adopted.votes.to_block().data)
            if len(found) == len(combined):
                self._name_other_votes(r, found, rejected)
                return found
            if time.monotonic() >= deadline:
                missing = ", ".join(c for c in combined if c not in found)
                raise QuorumNotReached(r, len(found), len(combined), detail=(
                    f"no record of region(s) {missing} had enough signed votes by the deadline"
                ))  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), 0.05)

    def _name_other_votes(
        self, r: int, found: Mapping[str, _Adopted], rejected: dict[str, str]
    ) -> None:
        """Name in ``rejected`` every member that voted for a record of its region not adopted."""
        board = self._require_board()
        for region, adopted in found.items():
            for raw, by_author in board.votes(r, region).items():
                if raw != bytes(adopted.record):
                    for author, vote in by_author.items():
                        rejected.setdefault(
                            author, f"voted for region record {vote.body.record}, not counted"
                        )

    def _require_board(self) -> VoteBoard:
        if self._board is None:
            raise RuntimeError("RegionalSession.start() has not been called")
        return self._board

    async def _adopt(
        self,
        r: int,
        region: str,
        rejected: dict[str, str],
        tried: set[bytes],
        waiting: dict[tuple[str, bytes], float],
    ) -> _Adopted | None:
        """Adopt ``region``'s round-``r`` record with enough votes, if one checks out.

        A record or aggregate not stored yet (peers store them after voting) is retried.
        """
        members, need = self.config.members(region), self.config.votes_needed(region)
        by_record = self._require_board().votes(r, region)
        for raw, by_author in sorted(by_record.items(), key=lambda item: (-len(item[1]), item[0])):
            quorum = vote_quorum(members, need, by_author)
            if raw in tried or quorum is None or not self._settled(region, raw, quorum, waiting):
                continue
            cid = next(iter(by_author.values())).body.record
            try:
                record = await load_record(self.store, cid, timeout=self.config.fetch_timeout)
                problem, total = await self._record_problem(record, r, region)
                values = None if problem else await self._fetch(record.result)
                if values is not None and not np.isfinite(values).all():
                    problem, values = "its aggregate is not finite", None
            except BlockNotFound as exc:
                logger.debug("round %d: region %s record %s not fetched: %s", r, region, cid, exc)
                continue
            except (BlockStoreError, DecodeError, DimensionMismatch) as exc:
                problem, values = str(exc), None  # the voters' fault, not the round's
            tried.add(raw)
            if values is None:
                for peer in by_author:
                    rejected[peer] = f"region record {cid}: {problem}"
                continue
            chosen = vote_set(by_author[peer] for peer in quorum[0])
            return _Adopted(cid, chosen, values, total)
        return None

    def _settled(
        self,
        region: str,
        raw: bytes,
        quorum: tuple[tuple[str, ...], bool],
        waiting: dict[tuple[str, bytes], float],
    ) -> bool:
        """Whether the vote set is final: no earlier member missing, or waited for long enough."""
        if quorum[1]:
            return True
        since = waiting.setdefault((region, raw), time.monotonic())
        return time.monotonic() - since >= self.config.takeover_timeout

    async def _fetch(self, cid: CID) -> FloatArray:
        values = await fetch_gradient(
            self.store,
            cid,
            timeout=self.config.fetch_timeout,
            expected_length=self.region_session.model.size,
        )
        return np.ascontiguousarray(values, np.float32).reshape(-1)

    async def _record_problem(self, record: AgreedRecord, r: int, region: str) -> tuple[str, int]:
        """Why ``record`` is not ``region``'s round-``r`` record (``""``), and its weight total."""
        if record.session != region_session(self.session, region) or bytes(record.genesis) != bytes(
            self.genesis
        ):
            return "another session", 0
        if record.round != r or record.rule != REGION_MEAN.LABEL:
            return f"round {record.round} with rule {record.rule!r}", 0
        roster = await load_roster(self.store, record.roster, timeout=self.config.fetch_timeout)
        if not set(roster.peers) <= set(self.config.members(region)) or not roster.entries:
            return "its roster lists a peer of another region", 0
        return "", sum(entry.weight for entry in roster.entries)


@dataclass(frozen=True)
class _Adopted:
    """A region's adopted record: its CID, its vote set, its aggregate and weight total."""

    record: CID
    votes: RegionVotes
    values: FloatArray
    total: int


async def verify_regional_round(
    store: BlockStore,
    record_cid: CIDLike,
    *,
    session: str | None = None,
    regions: Mapping[str, str] | None = None,
    config: RegionalConfig | None = None,
    keys: KeyBook = PEER_ID_KEYS,
) -> RegionalRecord:
    """Re-verify a regional round from its top-level record's CID alone.

    Every region record must carry enough signed votes of its region's members (its vote
    set), is re-aggregated from its roster's contributions (and must belong to its region and
    round), then the combine is recomputed; both must hash to the recorded CIDs.

    Parameters
    ----------
    store
        Where to fetch the records, vote sets, rosters, contributions and aggregates.
    record_cid
        The top-level record's CID.
    session
        The session it must belong to (any when ``None``).
    regions
        Peer ID → region (the session's :attr:`RegionalConfig.regions`): when given, every
        roster may list only peers of its own region and votes count against those members.
    config
        The session's settings: as ``regions``, and each region's votes must reach
        :meth:`RegionalConfig.votes_needed` (``min_peers`` included). Without ``config`` or
        ``regions`` a region's members are those its roster expects (a record that forges its
        roster's member list too is caught only by passing them).
    keys
        Where voters' keys are found (default: in their Ed25519 peer IDs; memory-bus
        sessions pass ``bus.keys``).

    Raises
    ------
    RoundVerificationFailed
        If anything is missing, malformed, short of votes or recomputes to another CID.
    """
    cid = parse_cid(record_cid)
    if config is not None:
        regions = config.regions
    try:
        top = RegionalRecord.from_block(await store.get(cid))
        if session is not None and top.session != session:
            raise RoundVerificationFailed(f"record {cid} belongs to {top.session!r}")
        means: dict[str, FloatArray] = {}
        sums: dict[str, int] = {}
        for (region, region_cid), votes_cid in zip(top.regions, top.votes, strict=True):
            check = _RegionCheck(top, region, region_cid, regions, config, keys)
            means[region], sums[region] = await check.run(store, votes_cid)
        combined = combine_regions(top.combine, means, sums, top.allowed)
    except (BlockStoreError, DecodeError, DimensionMismatch, InvalidGradient) as exc:
        raise RoundVerificationFailed(f"regional record {cid}: {exc}") from exc
    recomputed = await model_cid(combined)
    if bytes(recomputed) != bytes(top.result):
        raise RoundVerificationFailed(
            f"round {top.round}: the regions combine to {recomputed}, record says {top.result}"
        )
    return top


@dataclass(frozen=True)
class _RegionCheck:
    """The verification of one region entry of a top-level record."""

    top: RegionalRecord
    region: str
    record: CID
    regions: Mapping[str, str] | None
    config: RegionalConfig | None
    keys: KeyBook

    async def run(self, store: BlockStore, votes_cid: CID) -> tuple[FloatArray, int]:
        """Check the votes, then re-aggregate; return the region's aggregate and weight total."""
        top, region = self.top, self.region
        record = await verify_agreed_round(store, self.record, REGION_MEAN)
        roster = await load_roster(store, record.roster)
        if (
            record.session != region_session(top.session, region)
            or bytes(record.genesis) != bytes(top.genesis)
            or record.round != top.round
            or record.rule != REGION_MEAN.LABEL
        ):
            raise RoundVerificationFailed(
                f"region {region}'s record {self.record} is not round {top.round}'s"
            )
        if self.regions is not None and any(self.regions.get(p) != region for p in roster.peers):
            raise RoundVerificationFailed(f"region {region}'s roster lists another region")
        members = roster.expected
        if self.regions is not None:
            members = tuple(sorted(p for p, r in self.regions.items() if r == region))
        need = votes_needed(len(members), 1)  # more than half
        if self.config is not None:
            need = self.config.votes_needed(region)
        expected = RegionVote(top.session, top.genesis, top.round, region, self.record)
        votes = RegionVotes.from_block(await store.get(votes_cid))
        check_vote_set(votes, expected, members, need, self.keys)
        total = sum(entry.weight for entry in roster.entries)
        return np.asarray(await fetch_gradient(store, record.result), np.float32), total
