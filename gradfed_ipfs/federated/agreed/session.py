"""``AgreedSession``: rounds whose contributions and result are content-addressed and agreed.

Pubsub is lossy, so nothing here needs every message to arrive; lost messages cost time,
never consistency (DESIGN §7, issue 13). A session is named by ``(session, genesis)``: the
genesis is the CID of the initial model, committed once; the topic is
``gradfed/v1/<session>/agreed/<genesis>``. Round ``r`` starts from model CID ``M_r``:

1. **contribute**: commit the local gradient, announce ``contrib{cid, weight, base=M_r}``;
   every message this peer owes is re-announced until its phase ends (its latest ``done``
   forever: that is its head, for late joiners), first after ``announce_interval``, then at
   doubling intervals up to ``max_announce_interval`` (lost messages cost time; a flood of
   re-publications costs every peer CPU);
2. **roster**: the coordinator (rank 0 of :func:`coordinator_ranking`) publishes, as soon as
   every member's contribution is fetched and verified (or at ``collect_timeout`` with at least
   ``min_peers``), the dag-cbor :class:`~gradfed_ipfs.formats.agreed.roster.Roster` of what it
   holds; rank ``k`` does the same ``k · takeover_timeout`` later if no roster has been seen;
3. **aggregate**: every peer aggregates exactly the roster, in roster order, with
   :func:`~gradfed_ipfs.tensor.deterministic.deterministic_update` (the rule
   ``M_{r+1} = float32(M_r + learning_rate · Σ (w_i/W) g_i)``), fetching by CID any listed
   contribution it lacks, so every honest peer gets the same bytes and the same CID;
4. **done**: it commits the model and an :class:`~gradfed_ipfs.formats.agreed.roster.AgreedRecord`
   (``prev``, roster and result CIDs; byte-identical on every peer), announces
   ``done{result, record}``; the other peers' ``done`` are checked (waiting up to
   ``done_timeout``, by default not at all, then again when the next round starts): a
   different record raises :class:`~gradfed_ipfs.errors.RoundMismatch`; the cure is
   :meth:`AgreedSession.resync` (also how a restarted or late peer catches up).

A peer that misses the roster message learns the roster from another peer's ``done`` record;
in a reduce-scatter round the others have finished it also re-verifies that record instead of
waiting for slices nobody announces any more (:class:`~.aggregate.AggregateStep`).
No roster with ``min_peers`` contributions by ``round_timeout`` raises
:class:`~gradfed_ipfs.errors.QuorumNotReached`.

Every message is its sender's signed statement (``agreed/contrib``, ``agreed/roster``,
``agreed/done``; the transport's signer), and a roster entry carries its owner's signature of
the contribution it lists: a coordinator can leave contributions out, not make them up. A
roster message is taken only from the coordinator it names, once that rank's takeover time
has come by the receiver's clock (:meth:`AgreedConfig.takeover_at`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, TypeVar

import numpy as np
from multiformats import CID

from ..._types import CIDLike, FloatArray, GradientLike
from ...block import Block
from ...cid import parse_cid
from ...cometbft.rpc import CometRpc
from ...errors import (
    BlockStoreError,
    ConfigError,
    DecodeError,
    GenesisMismatch,
    GradientError,
    InvalidGradient,
    NotAdmitted,
    NoVerifiableHead,
    QuorumNotReached,
    RoundMismatch,
    RoundVerificationFailed,
)
from ...formats.agreed.evidence import EquivocationProof
from ...formats.agreed.membership import (
    APPROVE,
    JOIN,
    LEAVE,
    MemberSet,
    approve_body,
    join_body,
    join_timing_problem,
    leave_body,
)
from ...formats.agreed.roster import AgreedMessage, AgreedRecord, message_kind
from ...formats.pubsub import PubsubMessage
from ...formats.statement import Statement, sign_statement
from ...kubo.pubsub import PubsubTransport
from ...storage.base import BlockStore
from ...storage.dag import fetch_gradient, put_gradient
from ...storage.retention import GatedStore, RetentionHook
from ...tensor.codecs import ErrorFeedback
from ..exchange.announcer import Reannouncer
from ..exchange.encoded import EncodedGradient, encode_gradient
from ..exchange.fetcher import ContributionFetcher, check_values
from ..sliced.faults import SliceFaults
from .config import AgreedConfig, AgreedRoundResult, ResyncResult, agreed_topic
from .context import AdoptedRoster, Aggregated, OwnContribution, RoundContext, SessionMessages
from .control.comet import CometControl
from .control.pubsub import PubsubControl, RoundControl
from .evidence import EvidenceWatch
from .heads import HeadChoice, HeadChooser
from .history import ResultLoad, VerifiedHead, load_result, verify_head
from .members import HeldRequest, MemberTracker
from .round.aggregate import AggregateStep
from .round.coordinator import (
    MAX_ROUNDS_AHEAD,
    Head,
    RoundBoard,
    best_head,
    coordinator_ranking,
    effective_quorum,
    model_holders,
)
from .round.roster import RosterPhase, walk_back
from .slicing import RootFetcher, SliceStep, choose_slicing, slice_report, slices_topic
from .storage import FinishedRound, RoundStorage

__all__ = ["AgreedConfig", "AgreedRoundResult", "AgreedSession", "ResyncResult", "agreed_topic"]

logger = logging.getLogger("gradfed_ipfs.federated.agreed")


_OWN = "own"  # the error-feedback stream of this peer's contributions
_ROSTER_KIND = message_kind("roster")  # the proofs that exclude (and rewind)
T = TypeVar("T")
_Built = tuple[Block, list[EncodedGradient]]
"""A round's record block and its encoded model (then rule state): :meth:`_record`'s."""


def _feedback_of(config: AgreedConfig) -> ErrorFeedback | None:
    """Return the session's error feedback (``None`` without compression or with it off)."""
    if config.compression is None or not config.error_feedback:
        return None
    return ErrorFeedback(config.compression, config.error_decay)


class _Started:
    """What :meth:`AgreedSession.start` builds: the board and the round's collaborators."""

    def __init__(
        self,
        board: RoundBoard,
        messages: SessionMessages,
        roster: RosterPhase,
        aggregate: AggregateStep,
        slicing: SliceStep | None,
        control: RoundControl,
    ) -> None:
        self.board, self.messages, self.roster = board, messages, roster
        self.aggregate, self.slicing, self.control = aggregate, slicing, control


BEHIND_BY: Final = 2
"""Rounds that ``min_peers`` other members' heads must be past a peer's round for it to stop
waiting for that round and resync (one round past is a peer that is merely slower)."""


class AgreedSession:
    """One peer of an agreed session (see the module docstring).

    The session owns its collaborators: a :class:`~.roster.RosterPhase` (contributions to an
    adopted roster), an :class:`~.aggregate.AggregateStep` (the roster's model, through a
    :class:`~.slicing.SliceStep` in reduce-scatter rounds) and a :class:`~.storage.RoundStorage`
    (the round's blocks, off the critical path); each round's state is one
    :class:`~.context.RoundContext` handed to them.

    Parameters
    ----------
    store
        This peer's block store (its daemon; peers' blocks arrive through it).
    pubsub
        This peer's pubsub transport.
    session
        Session name.
    genesis
        CID of the session's initial model (see :meth:`commit_genesis`).
    config
        Members and timing.
    retention
        Told each round's blocks once stored (a
        :class:`~gradfed_ipfs.storage.retention.RetentionKeeper`, which unpins and collects);
        its gate is held by every fetch and put, so its collections never race them. Records
        and rosters are then pinned alone (direct pins), so they do not keep what they link.
    faults
        Test and benchmark hooks of this peer's reducer in reduce-scatter rounds
        (:mod:`~gradfed_ipfs.federated.sliced.faults`; default: honest).
    validator_rpc
        With ``config.control == "cometbft"``: ``http://127.0.0.1:PORT`` of this member's own
        CometBFT validator (:mod:`~.control.comet`).
    on_request
        With ``config.admission``: called once with each join, approval or leave this peer
        newly holds (a :class:`~.members.HeldRequest`); the next roster it makes can carry it.
    """

    def __init__(  # noqa: PLR0913 - public constructor: keyword-only hooks
        self,
        store: BlockStore,
        pubsub: PubsubTransport,
        session: str,
        genesis: CIDLike,
        config: AgreedConfig,
        *,
        retention: RetentionHook | None = None,
        faults: SliceFaults | None = None,
        validator_rpc: str | None = None,
        on_request: Callable[[HeldRequest], None] | None = None,
    ) -> None:
        if config.control == "cometbft" and validator_rpc is None:
            raise ConfigError("control='cometbft' needs the member's validator_rpc")
        self.validator_rpc = validator_rpc
        self.store = store
        self.retention = retention
        self.pubsub = pubsub
        self.session = session
        self.genesis = parse_cid(genesis)
        self.config = config
        self.topic = agreed_topic(session, self.genesis)
        self.peer_id = ""
        self.round = 0
        self.model_cid = self.genesis
        self.model: FloatArray = np.zeros(0, np.float32)
        self.head: CID | None = None
        self.history: dict[bytes, int] = {}  # record CID -> round, of records this peer followed
        self.excluded: frozenset[str] = frozenset()  # the head record's proven liars
        self.rule_state: FloatArray | None = None  # state of config.rule after the last round
        self.aggregation_reason = ""
        self._faults = faults
        self._announcer = Reannouncer(
            pubsub, self.topic, config.announce_interval, config.max_announce_interval
        )
        self._tasks: list[asyncio.Task[None]] = []
        fetch_store = store if retention is None else GatedStore(store, retention.gate)
        self._fetcher = ContributionFetcher(
            fetch_store, config.fetch_timeout, self._poke, max_value=config.max_value,
            packing=config.packing,
        )  # fmt: skip
        self._feedback = _feedback_of(config)
        self._unsent: tuple[FloatArray, FloatArray] | None = None  # (corrected, sent) this round
        self._storage = RoundStorage(store, retention)
        self._started: _Started | None = None
        fixed = None if config.admission is not None else config.members  # else sets change
        self._heads = HeadChooser(
            store, session, self.genesis, fixed, config.fetch_timeout, keys=pubsub.keys
        )  # remembers the heads it refused
        self._members = MemberTracker(
            session, self.genesis, config.members, config.admission, pubsub.keys,
            on_request=on_request,
        )  # fmt: skip
        self.left = False  # this peer's leave took effect (it is no longer a member)
        self._evidence = EvidenceWatch(
            session, self.genesis, store, pubsub.keys, config.fetch_timeout
        )
        # round -> (record, roster coordinator, roster) of the rounds this peer finished last
        self._took: dict[int, tuple[CID, str, CID]] = {}
        self._relayed: set[int] = set()  # rounds whose roster statement this peer handed on
        self._rerun: tuple[int, frozenset[str]] | None = None  # (round, awaited) after a rewind
        self._split = asyncio.Event()  # set: a proof taints the running round's base
        self._head_watch: asyncio.Future[None] | None = None  # :meth:`_watch_heads`
        self._approving: dict[str, str] = {}  # joiner -> announcer key of this peer's approval

    # ------------------------------------------------------------------ lifecycle

    @staticmethod
    async def commit_genesis(store: BlockStore, model: GradientLike) -> CID:
        """Commit (and pin) the initial model; its CID names the session."""
        return await put_gradient(store, np.asarray(model, np.float32).reshape(-1))

    @property
    def residual(self) -> FloatArray | None:
        """Error feedback: what this peer's contributions have not sent yet, ``(d,)`` float32.

        ``None`` before the first compressed round, or without compression or error feedback.
        """
        return None if self._feedback is None else self._feedback.residual(_OWN)

    @property
    def board(self) -> RoundBoard:
        """What this peer has heard (after :meth:`start`)."""
        return self._parts.board

    @property
    def _parts(self) -> _Started:
        if self._started is None:
            raise RuntimeError("AgreedSession.start() has not been called")
        return self._started

    async def start(self, model: GradientLike | None = None, *, joining: bool = False) -> None:
        """Subscribe and start announcing; begin at the genesis model.

        Parameters
        ----------
        model
            This peer's initial model; it must hash to the genesis CID. When ``None`` the
            genesis model is fetched by CID.
        joining
            Start as a non-member (:meth:`join` does, then waits for its admission).

        Raises
        ------
        GenesisMismatch
            If ``model`` is not the session's genesis model, or this peer is not a member.
        """
        if model is not None:
            cid = await self.commit_genesis(self.store, model)
            if bytes(cid) != bytes(self.genesis):
                raise GenesisMismatch(
                    f"this peer's initial model is {cid}, session {self.session!r} starts from "
                    f"{self.genesis}: refusing to join"
                )
        self.model = np.array(
            await fetch_gradient(self.store, self.genesis, timeout=self.config.fetch_timeout),
            dtype=np.float32,
        ).reshape(-1)
        self.peer_id = await self.pubsub.local_peer_id()
        if self.peer_id not in self.config.members and not joining:
            raise GenesisMismatch(f"peer {self.peer_id} is not a member of {self.session!r}")
        board = RoundBoard(
            self.session, self.genesis, self.peer_id, self.config.members, keys=self.pubsub.keys
        )
        if self.config.admission is not None:
            board.requests = self._members
        slicing = await self._open_slicing()
        if slicing is not None and self.config.admission is not None:
            raise ConfigError("member changes (admission) are wired for all-to-all rounds only")
        if slicing is not None:  # only roots are checked before the roster
            self._fetcher = RootFetcher(
                self._fetcher.store, self.config.fetch_timeout, self._poke,
                max_value=self.config.max_value, packing=self.config.packing,
            )  # fmt: skip
        messages = SessionMessages(
            self.session, self.genesis, self.peer_id, self._announcer,
            signer=await self.pubsub.signer(), keys=self.pubsub.keys,
        )  # fmt: skip
        roster = RosterPhase(
            self.store, board, messages, self._fetcher, sliced=slicing is not None,
            members=self._members,
        )  # fmt: skip
        aggregate = AggregateStep(self.store, board, slicing)
        control = await self._open_control(roster, sliced=slicing is not None)
        self._started = _Started(board, messages, roster, aggregate, slicing, control)
        heard = self.pubsub.subscribe(self.topic)
        self._tasks = [
            asyncio.create_task(self._listen(heard)),
            asyncio.create_task(self._announcer.run()),
        ]

    async def _open_control(self, roster: RosterPhase, *, sliced: bool) -> RoundControl:
        """Return the session's control plane (``config.control``; see :mod:`.control`)."""
        if self.validator_rpc is None or self.config.control != "cometbft":
            return PubsubControl(roster)
        signer = await self.pubsub.signer()
        rpc = CometRpc(self.validator_rpc)
        return CometControl(
            rpc, signer, self.session, self.genesis, self._fetcher, self._members,
            board=roster.board, sliced=sliced,
        )  # fmt: skip

    async def _open_slicing(self) -> SliceStep | None:
        """Decide the session's mode (:func:`~.slicing.choose_slicing`, logged); start its step.

        Under retention the step uses the session's own store and holds the keeper's gate for
        each whole run (see :mod:`.slice_retention`), else the fetcher's store.
        """
        rule, self.aggregation_reason = choose_slicing(self.config, self.model.size)
        logger.info("%s: %s", self.peer_id, self.aggregation_reason)
        if rule is None:
            return None
        retention = self.retention
        step = SliceStep(
            self._fetcher.store if retention is None else self.store,
            self.pubsub,
            slices_topic(self.session, self.genesis),
            self.config,
            rule,
            gate=None if retention is None else retention.gate,
            faults=self._faults,
        )
        await step.start(self.peer_id)
        return step

    async def aclose(self) -> None:
        """Store what is pending, stop announcing and listening (store and transport stay open).

        A holder of the last round's model puts it now if ``model_every`` skipped it, so the
        final model's CID can be fetched as it is.
        """
        try:
            await self._storage.settle()
            await self._storage.store_last_model()
        finally:
            watch = [] if self._head_watch is None else [self._head_watch]
            tasks: list[asyncio.Future[Any]] = [*self._tasks, *self._fetcher.clear(), *watch]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=5.0)
            self._tasks = []
            if self._started is not None and self._started.slicing is not None:
                await self._started.slicing.aclose()

    # ------------------------------------------------------------------ hearing

    async def _listen(self, heard: AsyncIterator[PubsubMessage]) -> None:
        async for message in heard:
            accepted = self.board.accept(message)
            if accepted is not None and accepted.kind == "contrib":
                self._prefetch(accepted)
            if self.board.statements or self.board.proofs:
                await self._take_evidence()
            if accepted is not None and accepted.kind == "done":
                record = accepted.record or accepted.cid
                if self._evidence.known_tainted(record):  # e.g. a rewound member's old head
                    self.board.ignore_heads([bytes(record)])
                await self._relay_if_split(accepted.round)
            if self._members.new_joins:
                await self._approve_joins()

    # ------------------------------------------------------------------ evidence

    @property
    def proofs(self) -> dict[str, EquivocationProof]:
        """Proven equivocators (member -> the verified proof this peer holds and published).

        Everything a proven member says is ignored from then on, and it is out of the
        coordinator schedule (see :mod:`~.evidence`).
        """
        return dict(self._evidence.proofs)

    async def _take_evidence(self) -> None:
        """Check the statements and proofs the board held; exclude the authors proven."""
        board, watch = self.board, self._evidence
        while board.statements:
            await watch.witness(*board.statements.popleft())
        while board.proofs:
            _, data = board.proofs.popleft()
            try:
                await watch.offer(data)
            except DecodeError as exc:
                board.dropped["bad-evidence"] += 1
                logger.debug("%s: refused an equivocation proof: %s", self.peer_id, exc)
        while watch.unpublished:
            proof = watch.unpublished.pop(0)
            if self._took_proven(proof):  # the running round builds on its roster
                self._split.set()
            board.exclude(proof.author)
            await self._announcer.post(f"evidence:{proof.author}", proof.block.data)

    async def _rewind(self) -> bool:
        """Rewind to a split round's base if this peer's chain took a proven equivocator's roster.

        The convergence rule (see :mod:`~.evidence`): every peer holding a proof whose chain
        names one of the proof's rosters at the proof's round goes back to the model both
        rosters built on, and re-runs that round without the equivocator (out of the
        schedule, its rosters and votes ignored), waiting for the members the proof's rosters
        listed (:attr:`~.context.RoundContext.awaited`): the same point, the same members and
        the same roster for every such peer, however late the proof reached it. Returns
        whether it rewound; ``False`` when the base model cannot be loaded (it is then tried
        again at the next resync).
        """
        proof = await self._evidence.tainted(self.head)
        if proof is None or self.head is None:
            return False
        p, timeout = proof.round, self.config.fetch_timeout
        try:
            base = None if p == 0 else await walk_back(self.store, p - 1, self.head, timeout)
            built_on = self.genesis if base is None else base[1].result
            if (p > 0 and base is None) or bytes(built_on) != bytes(proof.base):
                return False
            model, state = await self._base_model(proof, None if base is None else base[1])
        except (BlockStoreError, DecodeError, GradientError, RoundVerificationFailed) as exc:
            logger.warning("%s: cannot rewind to round %d yet: %s", self.peer_id, p, exc)
            return False
        self.model = np.array(model, np.float32).reshape(-1)
        self.model_cid, self.round = proof.base, p
        self.head = None if base is None else base[0]
        self.excluded = frozenset(() if base is None else base[1].excluded or ())
        self.rule_state = None if state is None else np.array(state, np.float32).reshape(-1)
        self.history = {k: v for k, v in self.history.items() if v < p}
        self._took = {k: v for k, v in self._took.items() if k < p}
        self._rerun = (p, proof.listed)
        self._storage.unstored_head = None
        self._announcer.withdraw("done")  # its head took the equivocator's roster
        self._members.rewind(self.head)  # round p's members and the rosters before it
        self.board.rewind(p)
        self.board.set_members(self._members.members)
        logger.warning(
            "%s: rewound to round %d (%s equivocated): re-running it", self.peer_id, p, proof.author
        )
        return True

    async def _base_model(
        self, proof: EquivocationProof, base: AgreedRecord | None
    ) -> tuple[FloatArray, FloatArray | None]:
        """Return the model (and rule state) a split round built on: the genesis, or ``base``'s.

        ``base``'s model is fetched if stored, else rebuilt from the last stored one
        (:func:`~.history.load_result`; ``model_every`` stores one every few rounds only).
        """
        timeout = self.config.fetch_timeout
        if base is None:
            return await fetch_gradient(self.store, proof.base, timeout=timeout), None
        model, state = await load_result(
            self.store, base, self.config.rule, timeout=timeout, length=self.model.size
        )
        return model, state

    async def _ignore_tainted(self, heads: list[Head]) -> None:
        """Stop counting the ``heads`` that took a proven equivocator's roster (as votes too).

        They count in no ``heads_from`` (:meth:`~.RoundBoard.ignore_heads`): rewound members'
        old heads, or members still on the split branch, do not make a re-run round over.
        """
        for head in heads:
            if await self._evidence.tainted(head.record) is not None:
                self.board.ignore_heads([bytes(head.record)])

    def _watch_heads(self, r: int) -> None:
        """Check the members' heads of the board's window in the background (see above).

        Not at the round's start: a head naming a record nobody serves costs a fetch timeout.
        """
        if self._head_watch is not None:
            self._head_watch.cancel()
        heads = [h for h in self.board.heads.values() if r - 1 <= h.round <= r + MAX_ROUNDS_AHEAD]
        self._head_watch = asyncio.ensure_future(self._ignore_tainted(heads))

    async def _relay_if_split(self, r: int) -> None:
        """Hand on the roster statement this peer took in round ``r`` if a member's differs.

        Sent once a round, re-announced until the next relay: a coordinator that sent two
        peers two rosters is then proven by both (:mod:`~.evidence`).
        """
        took = self._took.get(r)
        if took is None or r in self._relayed:
            return
        record, coordinator, roster = took
        if self.board.state(r).all_done_name(bytes(record)):
            return
        data = self._evidence.roster_statement(coordinator, r, roster)
        if data is not None:
            self._relayed.add(r)
            await self._announcer.post("witness", data)

    def _prefetch(self, message: AgreedMessage) -> None:
        """Start fetching a contribution as soon as it is heard, the next round's included.

        A peer still finishing round r hears the faster peers' round r+1 contributions; their
        base (its own M_{r+1}) is checked when round r+1 starts, but the blocks are on their
        way meanwhile: the slowest peer of a round otherwise starts every fetch of the next
        one late. At most one per member and round (the board keeps the first claim).
        """
        if message.base is None or message.weight is None or message.peer in self.excluded:
            return
        if message.weight > self.config.max_weight:  # refused when the round looks at it
            return
        current = message.round == self.round and bytes(message.base) == bytes(self.model_cid)
        if current or message.round == self.round + 1:
            self._fetcher.fetch(message.cid, self.model.size)

    # ------------------------------------------------------------------ members

    @property
    def members(self) -> tuple[str, ...]:
        """The members of round :attr:`round` (sorted; the base record's member set)."""
        return self._members.members

    @property
    def member_set_cid(self) -> CID:
        """CID of round :attr:`round`'s member set (a ``gradfed.members`` record)."""
        return self._members.current_cid

    def _round_config(self) -> AgreedConfig:
        """Return the settings of round :attr:`round`: ``config`` with its member set."""
        if not self._members.changed:
            return self.config
        return self.config.for_members(self._members.members)

    async def _request(self, kind: str, body: bytes) -> Statement:
        """Sign a membership request once, hold it, and keep announcing it."""
        statement = await sign_statement(
            await self.pubsub.signer(), kind, body, keys=self.pubsub.keys
        )
        if self.config.admission is not None and kind != JOIN:
            self._members.hold_own(statement)
        await self._announcer.post(f"{kind}:{statement.block.cid}", statement.block.data)
        control = None if self._started is None else self._started.control
        if isinstance(control, CometControl):  # the chain decides: the request is a transaction
            await control.submit(statement.block.data, kind, self.config.round_timeout)
        return statement

    async def _approve_joins(self) -> None:
        """Approve the joins heard whose authors are on this member's own allow-list."""
        joins, self._members.new_joins = self._members.new_joins, []
        for join in joins:
            if self._members.wants_approval(join, self.peer_id):
                body = approve_body(self.session, self.genesis, join.author, join.block.cid)
                approval = await self._request(APPROVE, body)
                self._approved(join.author, approval)

    async def approve(self, peer: str) -> bool:
        """Approve ``peer``'s join (an operator's decision); return whether a vote was signed.

        For the approval policies (``"majority"``, ``"two-thirds"``): beyond the joins this
        member approves by itself (authors on its ``admission.allow``). The join is the one
        heard on pubsub or, on the CometBFT control plane, the one the chain holds. Nothing is
        signed when no join of ``peer`` is known, it is a member already, this peer is not a
        member, or this peer approved it already.
        """
        tracker, admission = self._members, self.config.admission
        cid = await self._join_cid(peer)
        if (
            admission is None
            or admission.policy == "allow-list"
            or cid is None
            or peer in tracker.members
            or self.peer_id not in tracker.members
            or (self.peer_id, peer) in tracker.approvals
        ):
            return False
        body = approve_body(self.session, self.genesis, peer, cid)
        approval = await self._request(APPROVE, body)
        self._approved(peer, approval)
        return True

    def _approved(self, joiner: str, approval: Statement) -> None:
        """Keep announcing ``approval`` of ``joiner``'s join (not one of its older join)."""
        older = self._approving.pop(joiner, None)
        if older is not None:
            self._announcer.withdraw(older)
        self._approving[joiner] = f"{APPROVE}:{approval.block.cid}"

    async def _join_cid(self, peer: str) -> CID | None:
        """Return the CID of ``peer``'s pending join: heard on pubsub, or held by the chain."""
        join = self._members.joins.get(peer)
        if join is not None:
            return join.block.cid
        control = self._parts.control
        if isinstance(control, CometControl):
            pending = dict((await control.members_info()).get("pending") or [])
            return parse_cid(pending[peer]) if peer in pending else None
        return None

    async def join(
        self, model: GradientLike | None = None, *, timeout: float = 60.0
    ) -> ResyncResult:
        """Join the running session: ask, wait for admission, resync to the admitting head.

        Starts as a non-member (:meth:`start`), announces this peer's signed ``agreed/join``
        (re-announced; made at the round it is at, so a member that left rejoins with new
        bytes), and resyncs to each newer head the members announce until one's member set
        admits this peer; the model and history are fetched by CID from any member
        meanwhile. A join that can no longer admit (made before this peer's last change of
        membership, or ``JOIN_ROUNDS`` rounds old: after a resync) is signed anew at the
        current round. A member of the genesis set that restarts (it may have left) resyncs
        before it counts as admitted. This peer contributes from the round after its
        admission.

        Raises
        ------
        NotAdmitted
            If no head admits this peer within ``timeout`` seconds.
        """
        if self.config.admission is None:
            raise ConfigError("joining needs an admission policy (AgreedConfig.admission)")
        if self._started is None:
            await self.start(model, joining=True)
        control = self._parts.control
        if isinstance(control, CometControl):
            # one reading of the chain's open round dates both: the binding (its validator's
            # key first: a join needs it) and the join it goes with
            opened = await self._chain_open_round(control)
            await control.bind(opened, timeout)
            request = await self._join_request(opened)
            return await self._join_chain(control, request, timeout)
        made = self.round
        request = await self._join_request(made)
        deadline = time.monotonic() + timeout
        result = ResyncResult(False, self.round, self.model_cid, self.head)
        # (member, record) of the heads a resync saw already: wait for another head or another
        # member's vote for one, rather than resync back to back on the same heads
        tried: set[tuple[str, bytes]] = set()

        def newer() -> bool:
            heads = self.board.heads.items()
            return any(
                h.round >= self.round and (p, bytes(h.record)) not in tried for p, h in heads
            )

        # admitted: a member at a head past the round the join was made at (a restarted
        # genesis member is in its round-0 set before any resync)
        while self.peer_id not in self._members.members or self.round <= made:
            left = deadline - time.monotonic()
            if left <= 0 or not await self._new_or_retry(newer, left):
                raise NotAdmitted(
                    f"{self.peer_id} was not admitted to {self.session!r}: {self._heard(result)}"
                )
            tried.update((p, bytes(h.record)) for p, h in self.board.heads.items())
            result = await self.resync(timeout=max(left, 0.1))
            moved = self._members.moved.get(self.peer_id)
            stale = join_timing_problem(made, moved, self.round)
            if self.peer_id not in self._members.members and stale:
                self._announcer.withdraw(f"{JOIN}:{request.block.cid}")
                made = self.round
                request = await self._join_request(made)
        self._announcer.withdraw(f"{JOIN}:{request.block.cid}")
        return result

    def _heard(self, result: ResyncResult) -> str:
        """Say which heads this peer heard and why the last resync refused them (one line)."""
        heads = ", ".join(f"{p} round {h.round}" for p, h in sorted(self.board.heads.items()))
        refused = "; ".join(f"{p}: {why}" for p, why in sorted(result.refused.items()))
        return f"heard heads {heads or 'none'}; refused {refused or 'none'}"

    async def _new_or_retry(self, newer: Callable[[], bool], timeout: float) -> bool:
        """Wait up to ``timeout`` s for ``newer`` heads or a retry; return whether either came.

        A retry: a head that a slow fetch or walk refused is due again
        (:meth:`~.heads.HeadChooser.retry_in`).
        """
        retry = self._heads.retry_in()
        if retry is None or retry >= timeout:
            return await self.board.wait_until(newer, timeout)
        await self.board.wait_until(newer, retry)
        return True

    async def _join_request(self, made: int) -> Statement:
        """Sign and announce this peer's join, made at round ``made``."""
        return await self._request(JOIN, join_body(self.session, self.genesis, self.peer_id, made))

    async def _chain_open_round(self, control: CometControl) -> int:
        """Return the first round whose close can still admit a join (the chain's ``/members``)."""
        info = await control.members_info()
        current = info.get("current")
        opened = current if isinstance(current, int) else 0
        return opened + 1 if info.get("next") is not None else opened  # that close is past

    async def _join_chain(
        self, control: CometControl, request: Statement, timeout: float
    ) -> ResyncResult:
        """Wait for the chain to admit this peer; adopt the final record before its first round.

        The record is final on the chain (``2f + 1`` equal results), so its model is fetched
        by CID (or rebuilt from the last stored one) and hashed, not re-verified round by round.
        """
        deadline = time.monotonic() + timeout
        try:
            first = await control.admitted(self.peer_id, timeout)
            view = await control.final(first - 1, max(0.1, deadline - time.monotonic()))
        except QuorumNotReached as exc:
            raise NotAdmitted(f"{self.peer_id} was not admitted to {self.session!r}") from exc
        record_cid = parse_cid(str(view.record))
        wait = self.config.fetch_timeout
        record = AgreedRecord.from_block(await self.store.get(record_cid, timeout=wait))
        model, state = await load_result(
            self.store, record, self.config.rule, timeout=wait, length=self.model.size,
            known={bytes(self.genesis): (self.model, None)},
        )  # fmt: skip
        if record.members is not None:
            member_set = MemberSet.from_block(await self.store.get(record.members, timeout=wait))
            self._members.adopt(member_set, record.members)
            self.board.set_members(self._members.members)
        self.model, self.rule_state = np.array(model, np.float32).reshape(-1), state
        self.model_cid, self.head, self.round = record.result, record_cid, record.round + 1
        self.excluded = frozenset(record.excluded or ())
        self.history[bytes(record_cid)] = record.round
        self.board.advance(self.round)
        self._announcer.withdraw(f"{JOIN}:{request.block.cid}")
        return ResyncResult(True, self.round, self.model_cid, self.head, (record_cid,))

    async def leave(self, after: int | None = None) -> None:
        """Announce this member's signed leave after round ``after`` (default :attr:`round`).

        This peer takes part up to that round; :attr:`left` is set once a round's record
        names a member set without it (the caller then stops and closes the session).
        """
        if self.config.admission is None:
            raise ConfigError("leaving needs an admission policy (AgreedConfig.admission)")
        last = self.round if after is None else after
        await self._request(LEAVE, leave_body(self.session, self.genesis, self.peer_id, last))

    def _poke(self) -> None:
        if self._started is not None:
            self._started.board.poke()

    # ------------------------------------------------------------------ the round

    async def run_round(
        self, gradient: GradientLike, *, weight: int = 1, error_feedback: bool = True
    ) -> AgreedRoundResult:
        """Contribute ``gradient`` (computed on :attr:`model`) to round :attr:`round`.

        Start, contribute, take the roster, aggregate, store, confirm: each a collaborator's
        step on the round's :class:`~.context.RoundContext`. With compression,
        ``error_feedback=False`` sends ``gradient`` alone and leaves the residual as it is (a
        training peer that was not sampled carries its residual to a round that uses it).

        Raises
        ------
        QuorumNotReached
            If no roster with ``min_peers`` contributions was adopted by ``round_timeout``.
        RoundMismatch
            If another roster peer announced a different record (this peer has advanced to its
            own result; call :meth:`resync`), or this peer's chain took a proven equivocator's
            roster (raised at once, also when the proof arrives during the round; the resync
            rewinds).
        """
        parts = self._parts
        values, started = self._start_round(gradient, weight)
        self._unsent = None
        ctx = await self._contribute(values, int(weight), started, error_feedback)
        try:
            adopted = await self._unless_split(ctx, parts.control.take(ctx))
            aggregated = await parts.aggregate.run(ctx, adopted)
            built = None
            if isinstance(parts.control, CometControl) and parts.control.guessed(ctx.number):
                adopted, aggregated, built = await self._confirm_guess(
                    parts.control, ctx, adopted, aggregated
                )
            finished = await self._store(ctx, adopted, aggregated, built)
            await parts.control.settle(ctx, finished)
            result = await self._confirm(ctx, finished, aggregated)
        except BaseException:
            await asyncio.wait([ctx.own.stored])
            if not ctx.own.stored.cancelled():
                ctx.own.stored.exception()  # retrieved: the round's own error is the one raised
            raise
        await ctx.own.stored  # a failed put is this round's error
        self._keep_unsent(result)
        return result

    async def _unless_split(self, ctx: RoundContext, step: Awaitable[T]) -> T:
        """Await ``step``; raise ``RoundMismatch`` if the round is over without this peer.

        Two cases. A proof taints the round's base meanwhile: the round builds on a proven
        equivocator's roster, whatever it adopts is rewound, and the sooner this peer rewinds,
        the sooner the others' re-run of the split round has it (:meth:`_rewind`). Or most
        other members announce heads :data:`BEHIND_BY` rounds past this one (:meth:`_is_behind`):
        it fell behind (restarted without ``resume``, or it missed a roster), and a resync
        catches up now rather than after ``round_timeout``. Pubsub plane only (the CometBFT
        plane orders one history).
        """
        task = asyncio.ensure_future(step)
        if isinstance(self._parts.control, CometControl):
            return await task
        self._split = split = asyncio.Event()
        waiters = [asyncio.ensure_future(split.wait()), asyncio.ensure_future(self._behind(ctx))]
        try:
            await asyncio.wait([task, *waiters], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            if not task.done():
                task.cancel()
                await asyncio.wait([task])
        if self._is_behind(ctx):  # even with a roster: replaying old rounds is slower
            ahead = [
                (p, h) for p, h in self.board.heads.items() if h.round >= ctx.number + BEHIND_BY
            ]
            theirs = {p: f"at round {h.round} (record {h.record})" for p, h in ahead}
            raise RoundMismatch(ctx.number - 1, str(ctx.head), theirs)
        if not split.is_set() or (task.done() and not task.cancelled()):
            return task.result()
        proofs = [p for p in self._evidence.proofs.values() if self._took_proven(p)]
        theirs = {p.author: f"equivocated (proof {p.block.cid})" for p in proofs}
        raise RoundMismatch(ctx.number - 1, str(ctx.head), theirs)

    async def _behind(self, ctx: RoundContext) -> None:
        """Return once :meth:`_is_behind` holds: checked at each board change, not polled."""
        while True:
            changed = self.board.changed  # grabbed before the check, so no change is missed
            if self._is_behind(ctx):
                return
            await changed.wait()

    def _is_behind(self, ctx: RoundContext) -> bool:
        """Whether enough other members' heads are :data:`BEHIND_BY` rounds past ``ctx``'s.

        Enough: ``min_peers`` of them and more than half the members (so a hostile minority's
        heads cannot interrupt an honest peer's round), at most every other member.
        """
        members = len(ctx.config.members)
        needed = max(1, min(members - 1, max(members // 2 + 1, effective_quorum(ctx.config))))
        return self.board.heads_from(ctx.number + BEHIND_BY, but=self.peer_id) >= needed

    def _took_proven(self, proof: EquivocationProof) -> bool:
        """Whether one of this peer's last two rounds took a roster of ``proof``'s author."""
        took = self._took.get(proof.round)
        if took is None or proof.kind != _ROSTER_KIND:
            return False
        _, coordinator, roster = took
        return coordinator == proof.author or bytes(roster) in {bytes(c) for c in proof.claims}

    def _keep_unsent(self, result: AgreedRoundResult) -> None:
        """Error feedback: carry what the round did not apply of this peer's update.

        Only once the round is over (a failed round changes nothing): ``corrected - sent`` when
        the model used the contribution, all of ``corrected`` when the roster (or every slice)
        left it out.
        """
        if self._feedback is None or self._unsent is None:
            return
        corrected, sent = self._unsent
        used = result.included and self.peer_id not in result.missing
        self._feedback.keep(_OWN, corrected, sent if used else np.zeros_like(sent))
        self._unsent = None

    def _start_round(self, gradient: GradientLike, weight: int) -> tuple[FloatArray, float]:
        """Check the gradient and make round :attr:`round` current; return its values and start."""
        if not 1 <= int(weight) <= self.config.max_weight:
            raise InvalidGradient(
                f"weight must be an integer in [1, max_weight {self.config.max_weight}], "
                f"got {weight}"
            )
        started = time.monotonic()
        self.board.advance(self.round)
        self._announcer.withdraw("roster")  # the last round's, re-announced until now
        values = np.array(gradient, dtype=np.float32).reshape(-1)
        if values.size != self.model.size:
            raise InvalidGradient(f"gradient must be {self.model.size} finite values")
        check_values(values, self.config.max_value, "gradient")
        return values, started

    async def _contribute(
        self, values: FloatArray, weight: int, started: float, error_feedback: bool = True
    ) -> RoundContext:
        """Announce this peer's contribution and start its put; return the round's context.

        Announced as soon as the CID is known, and before the put starts: the daemon serves
        the blocks once the put lands (bitswap answers wants for blocks added later), and the
        announcement is not queued behind 4·d bytes of put on this daemon and this event loop
        (measured: it reached the others 60-130 ms after posting when it raced the put).
        """
        r, messages, config = self.round, self._parts.messages, self._round_config()
        if self.peer_id not in config.members:
            raise NotAdmitted(f"{self.peer_id} is not a member of round {r}")
        if self._evidence.proofs:
            await self._storage.settle()  # this peer's own last record is then in the store
        proof = await self._evidence.tainted(self.head)
        if proof is not None:  # resync rewinds past the equivocator's round (:meth:`_rewind`)
            ours, why = str(self.head), f"equivocated (proof {proof.block.cid})"
            raise RoundMismatch(r - 1, ours, {proof.author: why})
        if self._evidence.proofs:  # a rewound member's old head: no vote
            await self._ignore_tainted([*self.board.state(r - 1).done.values()])
            self._watch_heads(r)
        self._check_done(r - 1)
        await self._storage.settle(keep=1)  # the last round's blocks may still be on their way
        encoded, values = await self._encode(values, error_feedback)
        message = messages.make("contrib", r, encoded.cid, base=self.model_cid, weight=weight)
        signed = await messages.post_now("contrib", message)
        proven = self._evidence.proven  # out of the schedule (if any member is left)
        scheduled = tuple(p for p in config.members if p not in proven) or config.members
        stored = asyncio.ensure_future(self._storage.held(encoded.store(self.store)))
        self._fetcher.known(encoded.cid, values)
        logger.debug("round %d: contributed after %.3fs", r, time.monotonic() - started)
        return RoundContext(
            number=r,
            config=config,
            peer=self.peer_id,
            base=self.model_cid,
            base_model=self.model,
            rule_state=self.rule_state,
            head=self.head,
            excluded=self.excluded,
            own=OwnContribution(
                encoded.cid, values, weight, stored, encoded.nbytes, signed.signature
            ),
            ranking=tuple(coordinator_ranking(self.session, self.genesis, r, scheduled)),
            proven=proven,
            started=started,
            awaited=self._awaited(r),
        )

    def _awaited(self, r: int) -> frozenset[str]:
        """Return whom round ``r`` waits for: the proof's listed members if ``r`` is re-run."""
        rerun = self._rerun
        return rerun[1] if rerun is not None and rerun[0] == r else frozenset()

    async def _encode(
        self, values: FloatArray, error_feedback: bool = True
    ) -> tuple[EncodedGradient, FloatArray]:
        """Encode this peer's contribution; return its blocks and the values peers decode.

        Compressed: the update plus the error-feedback residual is packed (the update alone
        without ``error_feedback``), and the decoded values (what every peer aggregates) are
        checked as the others check them.
        """
        config = self.config
        codec, packing = config.compression, config.packing
        if codec is None or packing is None:
            return await encode_gradient(values, chunk_bytes=config.chunk_bytes), values
        feedback = self._feedback if error_feedback else None
        corrected = values if feedback is None else feedback.corrected(_OWN, values)
        encoded = await encode_gradient(
            corrected, chunk_bytes=config.chunk_bytes, compression=codec,
            exact_tail=config.exact_tail,
        )  # fmt: skip
        sent = encoded.decoded(packing, values.size)
        check_values(sent, config.max_value, "compressed gradient")
        if feedback is not None:
            self._unsent = (corrected, sent)
        return encoded, sent

    async def _confirm_guess(
        self,
        control: CometControl,
        ctx: RoundContext,
        adopted: AdoptedRoster,
        aggregated: Aggregated,
    ) -> tuple[AdoptedRoster, Aggregated, _Built | None]:
        """CometBFT plane, a guessed roster: send the result now; on another roster, take it.

        The record is built (not stored) so the result can name it before the chain decides
        the roster; the chain's own roster, when it is not the guess, is aggregated here.
        """
        built = await self._record(ctx, adopted, aggregated)
        chain = await control.confirm(ctx, built[0].cid, built[1][0].cid)
        if chain is None:
            return adopted, aggregated, built
        return chain, await self._parts.aggregate.run(ctx, chain), None

    async def _record(
        self, ctx: RoundContext, adopted: AdoptedRoster, aggregated: Aggregated
    ) -> _Built:
        """Return the round's record block and its encoded model (then rule state): no I/O."""
        config, r, sliced = ctx.config, ctx.number, aggregated.sliced
        encoded = [await encode_gradient(aggregated.model)]
        rule, state = config.rule, None
        if rule is not None and aggregated.state is not None:
            encoded.append(await encode_gradient(aggregated.state))
            state = encoded[-1].cid
        excluded = ctx.excluded | (sliced.liars if sliced is not None else set())
        record = AgreedRecord(
            self.session, self.genesis, r, ctx.head, ctx.base, adopted.cid, encoded[0].cid,
            float(config.learning_rate), None if rule is None else rule.label(r), state,
            None if sliced is None else tuple(sliced.records),
            tuple(sliced.frauds) if sliced is not None and sliced.frauds else None,
            tuple(sorted(excluded)) or None, config.stores_model(r),
            None if config.packing is None else config.packing.label, adopted.roster.members,
            adopted.signature,
        ).to_block()  # fmt: skip
        return record, encoded

    async def _store(
        self,
        ctx: RoundContext,
        adopted: AdoptedRoster,
        aggregated: Aggregated,
        built: _Built | None = None,
    ) -> FinishedRound:
        """Write the round's record, announce ``done``, start storing, advance to the result.

        The roster (pinned here too: the record links it), the record, and on the model's
        holders the model and rule state are stored off the critical path (settled before the
        next round, resync or close; every model_every-th round: a put of 4·d bytes costs the
        daemon ~19 ms of CPU at d = 1M, the largest part of an agreed round's extra cost over
        the runner's on a loaded machine; issue 13's ratio). ``built``: the record
        :meth:`_record` made already.
        """
        config, r, sliced = ctx.config, ctx.number, aggregated.sliced
        self._parts.roster.forget()
        record, encoded = built or await self._record(ctx, adopted, aggregated)
        excluded = ctx.excluded | (sliced.liars if sliced is not None else set())
        stored = config.stores_model(r)
        await self._parts.messages.done(r, encoded[0].cid, record.cid)
        holders = model_holders(
            self.session, self.genesis, r, config.members, adopted.roster.peer_set,
            config.model_replicas,
        )  # fmt: skip
        holder = self.peer_id in holders
        finished = FinishedRound(
            r, adopted.roster, adopted.block, record, encoded[0].cid,
            tuple(encoded) if stored and holder else (), ctx.own, aggregated.kept, config,
        )  # fmt: skip
        self._storage.store_round(finished)
        unstored = holder and not stored  # an unstored last model is put at close
        self._storage.unstored_head = (aggregated.model, aggregated.state) if unstored else None
        self.round, self.model = r + 1, aggregated.model
        self.model_cid, self.head = finished.model, record.cid
        self.excluded = frozenset(excluded)  # the record's: no later roster may list them
        self.rule_state = aggregated.state
        self.history[bytes(record.cid)] = r
        self._rerun = None  # a re-run round is over (or was passed)
        self._took[r] = (record.cid, adopted.roster.coordinator, adopted.cid)
        for old in [k for k in self._took if k < r - 1]:
            del self._took[old]
        self._relayed = {k for k in self._relayed if k >= r - 1}
        self._evidence.forget(r - 1)
        await self._next_members(record.cid, adopted)
        self._fetcher.retain(self._next_fetches())  # the next round's, already on their way
        logger.debug("round %d: done after %.3fs", r, time.monotonic() - ctx.started)
        return finished

    async def _next_members(self, record: CID, adopted: AdoptedRoster) -> None:
        """Take the member set the round's roster names (pinned: ``record`` links it)."""
        self._members.advance(record, adopted.roster, adopted.member_set)
        if adopted.member_set is not None:
            await self.store.put(adopted.member_set[0].to_block())
            self.board.set_members(self._members.members)
            self.left = self.peer_id not in self._members.members
            for joiner in [p for p in self._approving if p in self._members.members]:
                self._announcer.withdraw(self._approving.pop(joiner))

    def _next_fetches(self) -> set[bytes]:
        """CIDs of the current round's contributions heard so far (kept across the round's end)."""
        return {bytes(c.cid) for c in self.board.state(self.round).contributions.values()}

    async def _confirm(
        self, ctx: RoundContext, finished: FinishedRound, aggregated: Aggregated
    ) -> AgreedRoundResult:
        """Wait for (or count) the other roster peers' ``done``; return the round's result."""
        r, roster, record = ctx.number, finished.roster, finished.record.cid
        others = [p for p in roster.peers if p != self.peer_id]
        done = self.board.state(r).done
        if ctx.config.done_timeout > 0:
            await self.board.wait_until(
                lambda: all(p in done for p in others), ctx.config.done_timeout
            )
        await self._relay_if_split(r)  # the others' done may have come before this peer's
        confirmed = {p for p, h in done.items() if bytes(h.record) == bytes(record)}
        theirs = {p: str(h.record) for p, h in done.items() if bytes(h.record) != bytes(record)}
        self._check_done(r, settle_ties=False)
        for p, cid in theirs.items():  # after any earlier reason (e.g. its refused roster)
            earlier = ctx.rejected.get(p)
            ctx.rejected[p] = f"announced record {cid}" + (f"; {earlier}" if earlier else "")
        unconfirmed = tuple(p for p in others if p not in confirmed)
        return AgreedRoundResult(
            round=r,
            base=ctx.base,
            model=finished.model,
            record=record,
            roster_cid=finished.roster_block.cid,
            roster=roster,
            included=self.peer_id in roster.peers,
            absent=tuple(p for p in ctx.config.members if p not in roster.peer_set),
            confirmed=tuple(sorted(confirmed)),
            unconfirmed=unconfirmed,
            matched=not unconfirmed,
            rejected=ctx.rejected,
            seconds=time.monotonic() - ctx.started,
            **slice_report(aggregated.sliced, self.aggregation_reason),
            model_stored=ctx.config.stores_model(r),
            sent_bytes=ctx.own.nbytes,
        )

    def _check_done(self, r: int, *, settle_ties: bool = True) -> None:
        """Raise ``RoundMismatch`` if round ``r``'s ``done`` messages outvote this peer's record.

        Peers that announced another record while this one's wins (most votes, then smallest
        CID, as :meth:`resync` chooses) are the ones that must resync; they are not an error here.
        Without ``settle_ties`` (right after this peer's own ``done``, when the others' may still
        be on their way) only a record with strictly more votes raises; a tie is settled by CID
        at the next check, when the next round starts.
        """
        if self.head is None or r < 0:
            return
        done = {
            p: h
            for p, h in self.board.state(r).done.items()
            if not self._evidence.known_tainted(h.record)
        }
        theirs = {p: h for p, h in done.items() if bytes(h.record) != bytes(self.head)}
        if theirs:
            heads = {**done, self.peer_id: Head(r, self.model_cid, self.head)}
            best = best_head(heads.values())
            votes = Counter(bytes(h.record) for h in heads.values())
            if best is None or bytes(best.record) == bytes(self.head):
                return
            if not settle_ties and votes[bytes(best.record)] <= votes[bytes(self.head)]:
                return
            raise RoundMismatch(r, str(self.head), {p: str(h.record) for p, h in theirs.items()})

    # ------------------------------------------------------------------ catching up

    async def resync(self, *, timeout: float = 10.0, grace: float | None = None) -> ResyncResult:
        """Adopt the best agreed head the other members announce that checks out.

        Waits until every other member's head is heard, or one is heard and ``grace`` seconds
        (default two announce intervals) have passed, or ``timeout``. Heads rank by highest
        round, then most peers behind them, then smallest record CID; the first one ranked
        above this peer's own head is adopted that (:class:`~.heads.HeadChooser`) has a record
        of this session and genesis, ``done`` votes from more than half of its roster, and a
        chain that verifies (:func:`~.history.verify_head`): walked back to a record this peer
        already followed (or the genesis), its proven liars checked (whose ``excluded`` the
        peer then applies to its rosters), and its last rounds re-aggregated (up to
        ``AgreedConfig.model_every`` of them, from this peer's model or the last stored one).
        The head's model is the recomputed one. Refused heads are skipped when announced
        again; :attr:`ResyncResult.refused` says why each was refused. While a head lacks
        votes and none is adopted, new heads are waited for (each change tried) until
        ``timeout``.

        Raises
        ------
        NoVerifiableHead
            If this peer has no head of its own, no head was adopted, and one of those refused
            had the votes of more than half of its roster (the session went on, and this peer
            cannot follow it).
        """
        await self._storage.settle()
        control = self._parts.control
        if isinstance(control, CometControl):
            return await self._resync_from_chain(control, timeout)
        rewound = await self._rewind()
        grace = 2 * self.config.announce_interval if grace is None else grace
        others = [p for p in self._members.members if p != self.peer_id]
        ends = time.monotonic() + timeout
        heads = await self.board.gather_heads(others, grace=grace, timeout=timeout)
        while True:
            choice = await self._choose(heads, timeout)
            left = ends - time.monotonic()
            if choice.head is not None or not choice.outvoted or left <= 0:
                break
            if not await self._new_heads(heads, left):  # a head lacked votes: wait for more
                break
            heads = dict(self.board.heads)
        best, verified = choice.head, choice.verified
        for peer, why in choice.refused.items():
            logger.debug("%s refused %s's %s", self.peer_id, peer, why)
        if best is None or verified is None:
            if choice.endorsed and self.head is None:
                raise NoVerifiableHead(choice.refused)
            return ResyncResult(
                rewound, self.round, self.model_cid, self.head, refused=choice.refused
            )
        await self._adopt(best, verified)
        await self._parts.messages.done(best.round, best.result, best.record)
        logger.info("%s resynced to round %d (%s)", self.peer_id, self.round, best.record)
        return ResyncResult(
            True, self.round, self.model_cid, self.head, tuple(c for c, _ in verified.chain),
            refused=choice.refused, recomputed=verified.recomputed,
        )  # fmt: skip

    async def _resync_from_chain(self, control: CometControl, timeout: float) -> ResyncResult:
        """Resync on the CometBFT plane: the chain's last final record, verified, then adopted.

        The chain decides which record is final (no head votes); its chain of records is still
        verified from IPFS (:func:`~.history.verify_head`: links, signatures, the last rounds
        re-aggregated) before anything changes, so a result that more than 2/3 of the members
        finalized but that does not re-verify raises ``RoundVerificationFailed`` and is not
        adopted.
        """
        head = await control.final_head(timeout)
        if (
            head is None
            or head.round < self.round
            or (self.head is not None and bytes(head.record) == bytes(self.head))
        ):
            return ResyncResult(False, self.round, self.model_cid, self.head)
        verified = await verify_head(
            self.store, head.record, session=self.session, genesis=self.genesis,
            history=self.history, deadline=timeout, keys=self.pubsub.keys,
            result=ResultLoad(
                self.model.size, self.config.fetch_timeout, self.config.rule,
                known={bytes(self.model_cid): (self.model, self.rule_state)},
                max_rebuild=self.config.model_every,
            ),
        )  # fmt: skip
        await self._adopt(head, verified)
        logger.info(
            "%s resynced from the chain to round %d (%s)", self.peer_id, self.round, head.record
        )
        return ResyncResult(
            True, self.round, self.model_cid, self.head, tuple(c for c, _ in verified.chain),
            recomputed=verified.recomputed,
        )  # fmt: skip

    async def _new_heads(self, chosen_from: dict[str, Head], timeout: float) -> bool:
        """Wait up to ``timeout`` s for the heads to differ from ``chosen_from``; return whether.

        Compared with the heads the last choice was made from, not with those heard when the
        wait starts: a head heard while that choice fetched and verified is one it never saw.
        """
        return await self.board.wait_until(lambda: self.board.heads != chosen_from, timeout)

    async def _choose(self, heads: dict[str, Head], timeout: float) -> HeadChoice:
        """Choose among the others' ``heads`` and this peer's own (see :meth:`resync`)."""
        tainted = {}
        for peer, head in list(heads.items()):
            proof = await self._evidence.tainted(head.record)
            if proof is not None:  # built on a proven equivocator's roster: never adopted
                tainted[peer] = f"head {head.record} took a roster {proof.author} equivocated"
        self.board.ignore_heads(bytes(heads[p].record) for p in tainted)
        heads = {p: h for p, h in heads.items() if p != self.peer_id and p not in tainted}
        if self.head is not None:
            heads[self.peer_id] = Head(self.round - 1, self.model_cid, self.head)
        choice = await self._heads.choose(
            heads, self.head, history=self.history, deadline=timeout, result=ResultLoad(
                self.model.size, self.config.fetch_timeout, self.config.rule,
                known={bytes(self.model_cid): (self.model, self.rule_state)},
                max_rebuild=self.config.model_every,  # an honest chain stores one that often
            ), check=None if self.config.admission is None else self._member_sets_check,
        )  # fmt: skip
        choice.refused.update(tainted)
        return choice

    async def _member_sets_check(self, verified: VerifiedHead) -> None:
        """Raise ``RoundVerificationFailed`` if a head's chain has a member set it may not."""
        await self._members.followable(self.store, verified.chain, self.config.fetch_timeout)

    async def _adopt(self, best: Head, verified: VerifiedHead) -> None:
        """Make a verified head current: its recomputed model, rule state and proven liars.

        With an admission policy the chain's member sets were checked when it was chosen (a
        head whose sets fail is refused and the next one tried) and the head's is taken.
        """
        if self.config.admission is not None:  # the head's member set and its last rosters
            await self._members.follow(self.store, verified.chain, self.config.fetch_timeout)
            self.board.set_members(self._members.members)
        self.rule_state = verified.state  # the custom rule resumes from the head's state
        self.model = np.array(verified.model, np.float32).reshape(-1)
        self.model_cid, self.head, self.round = best.result, best.record, best.round + 1
        self._storage.unstored_head = None
        self._rerun = None
        self.excluded = verified.excluded
        for cid, record in verified.chain:
            self.history[bytes(cid)] = record.round
        self.board.advance(self.round)

    async def linger(self, *, timeout: float, grace: float | None = None) -> set[str]:
        """Announce the head until every member has announced the same round's, then ``grace`` s.

        The others may not have heard this peer's head yet: it is re-announced from the first
        interval again and for ``grace`` seconds more (default ``max_announce_interval`` +
        ``announce_interval``). Returns the members heard within ``timeout`` (this one included).
        """
        await self._storage.settle()
        members, last = set(self._members.members), self.round - 1
        if self.head is not None:
            await self._parts.messages.done(last, self.model_cid, self.head)

        def finished() -> set[str]:
            heads = self.board.heads
            return {p for p, h in heads.items() if h.round >= last} | {self.peer_id}

        if await self.board.wait_until(lambda: finished() >= members, timeout):
            extra = self.config.max_announce_interval + self.config.announce_interval
            await asyncio.sleep(extra if grace is None else grace)  # keep announcing our head
        return finished()
