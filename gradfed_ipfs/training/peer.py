"""``Peer``: Flower's ClientApp and ServerApp in one object, with no central server.

Every peer runs the same loop over an
:class:`~gradfed_ipfs.federated.agreed.session.AgreedSession`: for agreed round ``r`` it
evaluates the global model (if it has ``evaluate``), trains it if the round's deterministic
sample names it, contributes ``[update | metrics]`` and adopts the agreed result, whose CID
every peer shares. The strategy, sampling and metric summary run inside the agreed update rule
(:class:`~gradfed_ipfs.training.rule.TrainingRule`), so the model, its optimizer state and the
round's aggregated metrics are all content-addressed. After the last training round one more
round evaluates the final model (nobody trains).

With ``FederationConfig(overlap=True)`` a peer trains round ``r + 1``'s update in a worker
thread while round ``r``'s exchange runs, from its estimate of round ``r``'s model (or that
round's base): the update it sends in round ``r + 1`` is relative to the model it trained
from, so the strategy applies it one round late (a one-step-delayed outer update, as streaming
DiLoCo's overlap). The rule and the records are unchanged: every peer still ends each round on
the same model CID.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Literal, Protocol, TypeVar

import numpy as np

from .._types import FloatArray
from ..adapters.layout import Layout
from ..adapters.numpy import flatten, unflatten_list
from ..cometbft.abci import RoundsGenesis
from ..errors import ConfigError, GradfedError, InvalidGradient, QuorumNotReached, RoundMismatch
from ..federated.agreed.control import rounds_genesis
from ..federated.agreed.history import model_cid
from ..federated.agreed.members import HeldRequest
from ..federated.agreed.session import AgreedConfig, AgreedSession
from ..federated.exchange.fetcher import check_values
from ..federated.privacy.mechanisms import DifferentialPrivacy
from ..kubo.pubsub import PubsubTransport
from ..storage.base import BlockStore
from .history import History, RoundEntry, report_line
from .metrics import MAX_SAMPLES, VectorLayout
from .rule import TrainingRule
from .sampling import sample_size
from .secure import SecAgg, SecureFit, SecureTrainingRule, secure_contribution, secure_fit
from .strategy import ConfigValue, FedAvg, FitResult, QFedAvg, Strategy

__all__ = [
    "ArraysAdapter",
    "Client",
    "EvaluateFn",
    "FederationConfig",
    "LocalDP",
    "ModelAdapter",
    "NodeLike",
    "Peer",
    "TrainFn",
    "VectorAdapter",
    "training_rule",
]

logger = logging.getLogger("gradfed_ipfs.training")

M = TypeVar("M")

Config = dict[str, ConfigValue]
TrainFn = Callable[[M, Config], tuple[Any, int, Mapping[str, float]]]
"""``train(model, config) -> (new model or update, num_samples, metrics)``."""
EvaluateFn = Callable[[M, Config], tuple[float, int, Mapping[str, float]]]
"""``evaluate(model, config) -> (loss, num_samples, metrics)``."""


class NodeLike(Protocol):
    """What :class:`Peer` needs of a node: a block store and a pubsub transport.

    :class:`gradfed_ipfs.Node` is one (``node`` sits beside ``training`` in the layers, so it
    is named only here).
    """

    @property
    def store(self) -> BlockStore:
        """The node's block store."""
        ...

    @property
    def pubsub(self) -> PubsubTransport:
        """The node's pubsub transport."""
        ...


class ModelAdapter(Protocol[M]):
    """Converts a model to one flat float32 vector and back (same layout every time)."""

    def to_vector(self, model: M) -> FloatArray:
        """Return the model's parameters as a flat float32 vector ``(d,)``."""
        ...

    def from_vector(self, vector: FloatArray) -> M:
        """Return a model holding ``vector``'s parameters (the vector is the caller's copy)."""
        ...


class VectorAdapter:
    """The model *is* a flat float32 vector."""

    def to_vector(self, model: FloatArray) -> FloatArray:
        """Return ``model`` as a flat float32 vector."""
        return np.asarray(model, np.float32).reshape(-1)

    def from_vector(self, vector: FloatArray) -> FloatArray:
        """Return ``vector``."""
        return vector


class ArraysAdapter:
    """The model is a list of NumPy arrays (Flower's ``NDArrays``).

    Flattened by :mod:`gradfed_ipfs.adapters.numpy`; integer arrays ride in the layout, never
    averaged.

    Parameters
    ----------
    example
        A model of the right shapes and dtypes (e.g. the initial one): it fixes the layout.
    """

    def __init__(self, example: list[Any]) -> None:
        self.layout: Layout = flatten(example)[1]

    def to_vector(self, model: list[Any]) -> FloatArray:
        """Return the float arrays as one float32 vector (layout checked)."""
        vector, layout = flatten(model)
        if layout != self.layout:
            raise ConfigError("the model's arrays do not match the adapter's layout")
        return vector

    def from_vector(self, vector: FloatArray) -> list[Any]:
        """Return the arrays (float32 ones are views of ``vector``)."""
        return unflatten_list(vector, self.layout)


@dataclass(frozen=True)
class Client(Generic[M]):
    """A peer's local work (Flower's ClientApp).

    Attributes
    ----------
    train
        Trains a copy of the global model on local data; see :data:`TrainFn`.
    evaluate
        Optional; evaluates the global model on local data (federated evaluation).
    returns
        Whether ``train`` returns the new ``"model"`` or the ``"update"`` (new - global).
    """

    train: TrainFn[M]
    evaluate: EvaluateFn[M] | None = None
    returns: Literal["model", "update"] = "model"


@dataclass(frozen=True)
class LocalDP:
    """Differential privacy of this peer's updates, applied before they leave it.

    Each update is clipped to L2 norm ``clip_norm`` and noised by ``mechanism`` (std
    ``z · clip_norm``), which charges its own (ε, δ) budget: this protects the peer's whole
    contribution (user-level local DP) without trusting any aggregator, at the price of N
    peers' independent noise in the mean. A peer whose budget is spent stops training (its
    rounds count as failures) and only evaluates and follows.
    """

    mechanism: DifferentialPrivacy
    clip_norm: float = 1.0


@dataclass(frozen=True)
class FederationConfig(Generic[M]):
    """What every peer of a training session must agree on (and local evaluation).

    Attributes
    ----------
    rounds
        Server rounds to train (Flower's ``num_rounds``).
    fraction
        Fraction of members sampled to train per round (Flower's ``fraction_fit``).
    min_fit
        Least members sampled per round (``min_fit_clients``).
    min_available
        Least contributions a round needs (``min_available_clients``); default all members.
    learning_rate
        Server learning rate applied to the strategy's update (1.0: FedAvg as is).
    fit_metrics, eval_metrics
        Names of the client metrics aggregated (sample-weighted) into each round's summary.
    on_fit_config
        ``server_round -> dict`` sent to clients (``on_fit_config_fn``); same function on
        every peer. The strategy's entries (e.g. ``proximal_mu``) are added.
    evaluate_fn
        ``(model, server_round) -> (loss, metrics)`` run by this peer on each new global model
        (Flower's centralized ``evaluate_fn``; here each peer can run its own).
    final_evaluation
        Run one more round after the last that only evaluates the final model.
    overlap
        Train round ``r + 1``'s update (in a worker thread) while round ``r``'s agreed exchange
        runs, so compute does not wait for the network. Round ``r``'s model is not known yet,
        so that training starts from an estimate of it (``overlap_start``) and the update sent
        in round ``r + 1`` is relative to the model it trained from: the strategy applies it
        one round late (a one-step-delayed outer update). Round 0 and the first round after a
        resync train as usual. Round ``r + 1``'s sample is not known yet either: with
        ``fraction`` below 1 a peer trains ahead every round and drops what an unsampled
        round does not use (:class:`LocalDP` charges it all the same). ``train`` runs at the
        same time as ``evaluate_fn`` (another thread). Not with :class:`SecAgg`. What it costs
        in convergence: ``docs/benchmarks.md``.
    overlap_start
        Where overlapped training starts. ``"estimate"`` (default): round ``r``'s base moved
        by the strategy's step on this peer's own round-``r`` update alone (from the current
        optimizer state), as if every peer had sent it (the local update as a proxy for the
        pending average, as in the "eager updates" of Kale et al. 2025,
        https://arxiv.org/abs/2502.12996); ``"base"``: round ``r``'s base as it is (a plain
        one-round-stale update, which costs more the further local training moves the model).
    """

    rounds: int
    fraction: float = 1.0
    min_fit: int = 1
    min_available: int | None = None
    learning_rate: float = 1.0
    fit_metrics: tuple[str, ...] = ()
    eval_metrics: tuple[str, ...] = ()
    on_fit_config: Callable[[int], Mapping[str, ConfigValue]] | None = None
    evaluate_fn: Callable[[M, int], tuple[float, Mapping[str, float]]] | None = None
    final_evaluation: bool = True
    overlap: bool = False
    overlap_start: Literal["estimate", "base"] = "estimate"

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ConfigError(f"rounds must be >= 1, got {self.rounds}")
        if not math.isfinite(self.learning_rate):
            raise ConfigError("learning_rate must be finite")
        if self.overlap_start not in ("estimate", "base"):
            raise ConfigError(
                f"overlap_start must be 'estimate' or 'base', not {self.overlap_start!r}"
            )


@dataclass
class _LocalWork:
    """What this peer computes in one round before the agreed step (its inputs to it)."""

    round: int
    timings: dict[str, float] = field(default_factory=dict)
    eval_samples: int = 0
    eval_loss: float = 0.0
    eval_metrics: dict[str, float] = field(default_factory=dict)
    update: FloatArray | None = None
    fit_samples: int = 0
    fit_metrics: dict[str, float] = field(default_factory=dict)
    secured: SecureFit | None = None
    trained: bool = False


class Peer(Generic[M]):
    """One member of a training session (see the module docstring).

    Parameters
    ----------
    node
        This peer's :class:`~gradfed_ipfs.Node` (entered), or anything with its ``store`` and
        ``pubsub``; give either ``node`` or both ``store`` and ``pubsub``.
    store, pubsub
        This peer's block store and pubsub transport (its Kubo daemon, or the memory bus).
    client
        Local training and evaluation.
    adapter
        Model ⇄ flat float32 vector.
    initial_model
        The session's initial model: identical on every peer (its CID names the session).
    strategy
        Aggregation strategy (default :class:`FedAvg`); wrapped in
        :class:`~gradfed_ipfs.training.secure.SecAgg`, the sampled peers' updates are only
        ever summed under secure aggregation.
    config
        Rounds, sampling, metrics, configs, evaluation.
    agreed
        The agreed session's members and timing (its ``rule``, ``min_peers`` and
        ``learning_rate`` are set from ``config``). With ``compression`` the parameter part of
        each contribution is compressed and its metrics tail sent exact (``exact_tail`` is set
        to the tail's length); not with SecAgg.
    session
        Session name.
    log
        Called with each round's report line (e.g. ``print``); default: logging at INFO.
    privacy
        Optional :class:`LocalDP` of this peer's updates (ε spent goes in the History).
    approvals
        With ``agreed.admission`` under an approval policy: called before each round, the
        peer IDs this member approves when their join is heard (beyond its ``admission.allow``;
        e.g. the allow-list of its federation file, read again).
    on_request
        With ``agreed.admission``: called once with each join, approval or leave this peer
        newly holds (:class:`~gradfed_ipfs.federated.agreed.members.HeldRequest`, agreed
        round numbers); the next roster it makes can carry it.
    validator_rpc
        With ``agreed.control == "cometbft"``: ``http://127.0.0.1:PORT`` of this member's own
        validator (the chain's genesis: :meth:`chain_genesis`).

    With ``agreed.admission`` the member set changes from round to round (joins, leaves,
    evictions; :mod:`gradfed_ipfs.federated.agreed.membership`): each round samples from its
    own members, ``run(join=True)`` joins a running session and :meth:`leave` leaves it.
    """

    def __init__(  # noqa: PLR0913 - public constructor: keyword-only settings
        self,
        *,
        node: NodeLike | None = None,
        store: BlockStore | None = None,
        pubsub: PubsubTransport | None = None,
        client: Client[M],
        adapter: ModelAdapter[M],
        initial_model: M,
        config: FederationConfig[M],
        agreed: AgreedConfig,
        strategy: Strategy | None = None,
        session: str = "train",
        log: Callable[[str], None] | None = None,
        privacy: LocalDP | None = None,
        approvals: Callable[[], Collection[str]] | None = None,
        on_request: Callable[[HeldRequest], None] | None = None,
        validator_rpc: str | None = None,
    ) -> None:
        if node is not None and store is None and pubsub is None:
            store, pubsub = node.store, node.pubsub
        elif node is not None or store is None or pubsub is None:
            raise ConfigError("give Peer either node= or both store= and pubsub=")
        self.privacy = privacy
        self.strategy = strategy if strategy is not None else FedAvg()
        if isinstance(self.strategy, QFedAvg) and client.evaluate is None:
            raise ConfigError("QFedAvg needs clients with evaluate (their loss)")
        if config.overlap and isinstance(self.strategy, SecAgg):
            raise ConfigError("overlap does not work with SecAgg (its round needs the sample)")
        if agreed.admission is not None and isinstance(self.strategy, SecAgg):
            raise ConfigError("SecAgg needs a fixed member set (AgreedConfig.admission=None)")
        self.approvals, self.on_request = approvals, on_request
        self.validator_rpc = validator_rpc
        self.client, self.adapter, self.config = client, adapter, config
        self.store, self.pubsub, self.session_name = store, pubsub, session
        initial = np.array(adapter.to_vector(initial_model), np.float32).reshape(-1)
        secure = isinstance(self.strategy, SecAgg)
        if isinstance(self.strategy, SecAgg):  # the sample size is fixed: check it now
            self.strategy.threshold_for(
                sample_size(len(agreed.members), config.fraction, config.min_fit)
            )
        self.layout = VectorLayout(
            initial.size, config.fit_metrics, config.eval_metrics,
            secure=agreed.members if secure else (),
            max_samples=min(agreed.max_weight, MAX_SAMPLES),
        )  # fmt: skip
        self._genesis_vector = self.layout.genesis(initial)
        self.rule = training_rule(self.strategy, self.layout, agreed.members, config)
        min_peers = config.min_available if config.min_available is not None else agreed.min_peers
        if secure and agreed.compression is not None:
            raise ConfigError("SecAgg sums masked vectors: they cannot be compressed")
        self.agreed = replace(
            agreed, rule=self.rule, min_peers=min_peers, learning_rate=config.learning_rate,
            exact_tail=self.layout.tail if agreed.compression is not None else agreed.exact_tail,
        )  # fmt: skip
        self.log = log
        self.session: AgreedSession | None = None
        self._ahead: tuple[int, asyncio.Task[_LocalWork]] | None = None
        self._leaving: asyncio.Task[None] | None = None

    async def chain_genesis(self) -> RoundsGenesis:
        """Return the genesis of this session's round chain (``agreed.control="cometbft"``).

        The same on every member (it names the genesis model, metrics tail included, and the
        agreed settings); bind each member's validator to it before :meth:`run`.
        """
        genesis = await model_cid(self._genesis_vector)
        return rounds_genesis(self.session_name, genesis, self.agreed)

    @property
    def model_vector(self) -> FloatArray:
        """The current global parameters (after :meth:`run`), float32 ``(d,)``."""
        if self.session is None:
            return self.layout.split(self._genesis_vector)[0].copy()
        return self.layout.split(self.session.model)[0].copy()

    @property
    def model(self) -> M:
        """The current global model."""
        return self.adapter.from_vector(self.model_vector)

    async def run(
        self,
        *,
        resume: bool = False,
        resync_timeout: float = 10.0,
        linger: float = 0.0,
        join: bool = False,
        join_timeout: float = 120.0,
    ) -> History:
        """Run every round (and the final evaluation); return this peer's :class:`History`.

        With ``resume`` the peer first adopts the latest head its members announce (a restarted peer
        catches up, optimizer state included); a peer that head has out (it left or was evicted
        before: a restarted member) then asks to join again, as with ``join``. So does a peer whose
        resync after a failed round finds it out. With ``join`` (needs ``agreed.admission``) it asks
        to join the running session, fetches the model and history of the head that admits it by
        CID, and contributes from the next round (``NotAdmitted`` if no head admits it within
        ``join_timeout`` seconds). A round that fails with
        :class:`~gradfed_ipfs.errors.RoundMismatch` or ``QuorumNotReached`` is resynced and retried,
        up to 3 times in a row. The run ends early when this peer is no longer a member
        (:meth:`leave`, or evicted: ``History.ended``). With ``linger`` (seconds) the peer keeps
        announcing its last head until every member has finished, or for at most that long, before
        it closes its session (a process that exits right away may leave a slower member without
        it).
        """
        started = time.monotonic()
        genesis = await AgreedSession.commit_genesis(self.store, self._genesis_vector)
        session = self.session = AgreedSession(
            self.store, self.pubsub, self.session_name, genesis, self.agreed,
            on_request=self.on_request, validator_rpc=self.validator_rpc,
        )  # fmt: skip
        await session.start(self._genesis_vector, joining=join)
        history = History(
            self.session_name, str(genesis), session.peer_id, self.rule.label(0), self.config.rounds
        )
        try:
            if join:
                await session.join(timeout=join_timeout)
            elif resume:
                await session.resync(timeout=resync_timeout)
                await self._rejoin(session, join_timeout)
            if self.config.evaluate_fn is not None and session.round == 0:
                loss, metrics = self.config.evaluate_fn(self.model, 0)
                history.initial_local_loss, history.initial_local_metrics = loss, dict(metrics)
            await self._rounds(session, history, resync_timeout, join_timeout)
            if session.left:
                history.ended = "left" if self._leaving is not None else "evicted"
            if linger > 0:
                await session.linger(timeout=linger)
        finally:
            await self._drop_ahead()
            await self._drop_leave()
            await session.aclose()
        history.seconds = time.monotonic() - started
        return history

    async def _rounds(
        self, session: AgreedSession, history: History, resync: float, join: float
    ) -> None:
        """Run the rounds left while this peer is a member (see :meth:`run`)."""
        total = self.config.rounds + (1 if self.config.final_evaluation else 0)
        failures = 0
        while session.round < total and not session.left:
            await self._approve(session)
            try:
                entry = await self._round(session)
            except (RoundMismatch, QuorumNotReached) as exc:
                failures += 1
                if failures > 3:
                    raise
                logger.warning("%s: %s; resyncing", session.peer_id, exc)
                await session.resync(timeout=resync)
                await self._rejoin(session, join)
                # a rewind past an equivocator's round: its rounds are run again
                history.entries = [e for e in history.entries if e.round < session.round]
                continue
            failures = 0
            history.entries.append(entry)
            line = report_line(entry, self.config.rounds)
            (self.log or logger.info)(line)

    async def _rejoin(self, session: AgreedSession, timeout: float) -> None:
        """Ask to join again if the head resynced to has this peer out (``timeout``: seconds).

        It left or was evicted before this run: a restarted member.
        """
        if session.config.admission is None or session.left or session.peer_id in session.members:
            return
        (self.log or logger.info)(
            f"not a member at round {session.round} (left or evicted before): asking to join"
        )
        await session.join(timeout=timeout)

    def leave(self) -> bool:
        """Leave the running session cleanly: a signed leave after the current round.

        Returns at once (safe from a signal handler on the running loop); :meth:`run` ends once
        a round's record names a member set without this peer (``History.ended == "left"``).
        ``False`` when there is nothing to leave: not running, not a member (yet), no admission
        policy, or already leaving.
        """
        session = self.session
        if (
            session is None
            or session.config.admission is None
            or self._leaving is not None
            or session.peer_id not in session.members
        ):
            return False
        self._leaving = asyncio.ensure_future(session.leave(after=session.round))
        return True

    async def _drop_leave(self) -> None:
        """Stop signing a leave still on its way (the run ended first)."""
        if self._leaving is not None and not self._leaving.done():
            self._leaving.cancel()
        if self._leaving is not None:
            with contextlib.suppress(asyncio.CancelledError, GradfedError):
                await self._leaving

    async def _approve(self, session: AgreedSession) -> None:
        """Approve the joins this member's ``approvals`` name (before each round)."""
        if self.approvals is None or session.config.admission is None:
            return
        members = set(session.members)
        if session.peer_id not in members:
            return
        for peer in self.approvals():
            if peer not in members:
                await session.approve(peer)

    async def _round(self, session: AgreedSession) -> RoundEntry:
        """One agreed round: evaluate, train if sampled (under SecAgg if set), contribute."""
        r, base = session.round, session.model_cid
        params = self.layout.split(session.model)[0]
        config = self.rule.config(r)
        config_block = self.rule.config_block(r)
        await self.store.put(config_block)
        sampled = self.rule.sampled(session.session, session.genesis, r, base, session.members)
        local = await self._local_work(session, params, config, sampled)
        vector, weight = self._contribution(local)
        # No update (not sampled, failed, refused): the error-feedback residual waits for one.
        carry = local.update is not None or local.secured is not None
        result = await session.run_round(vector, weight=weight, error_feedback=carry)
        local.timings["round"] = result.seconds
        summary = self.layout.summary(session.model)
        released = local.secured is not None and local.secured.samples > 0
        if isinstance(self.strategy, SecAgg) and summary.results and not released:
            self.strategy.charge()  # the sum another peer released
        entry = RoundEntry(
            round=r, record=str(result.record), model=str(result.model),
            config=str(config_block.cid), roster=list(result.roster.peers),
            sampled=list(sampled), results=summary.results,
            failures=max(0, len(sampled) - summary.results),
            fit_samples=summary.fit_samples, fit_metrics=summary.fit_metrics,
            eval_samples=summary.eval_samples, eval_loss=summary.eval_loss,
            eval_metrics=summary.eval_metrics, timings=local.timings,
            epsilon=self._epsilon(),
            secure=list(summary.secure) if isinstance(self.strategy, SecAgg) else None,
            sent_bytes=result.sent_bytes, members=len(result.roster.expected),
        )  # fmt: skip
        if self.config.evaluate_fn is not None and r < self.config.rounds:
            t = time.monotonic()
            loss, metrics = self.config.evaluate_fn(self.model, r + 1)
            entry.local_loss, entry.local_metrics = float(loss), dict(metrics)
            local.timings["local_evaluate"] = time.monotonic() - t
        return entry

    async def _local_work(
        self, session: AgreedSession, params: FloatArray, config: Config, sampled: Sequence[str]
    ) -> _LocalWork:
        """Evaluate, then train if sampled (or take what was trained ahead), under SecAgg if set.

        With ``overlap``, next round's training starts here, before this round's exchange.
        """
        r = session.round
        local = await self._trained_ahead(r) or _LocalWork(round=r)
        await self._evaluate(local, params, config)
        if session.peer_id not in sampled:  # what was trained ahead is not used
            local.update, local.fit_samples, local.fit_metrics = None, 0, {}
            self._train_ahead(r + 1, params)
            return local
        if not local.trained:
            await self._fit(local, params, config)
        self._train_ahead(r + 1, self._ahead_start(session, params, local))
        if isinstance(self.strategy, SecAgg):
            await self._secure_fit(local, self.strategy, session, sampled)
        return local

    def _ahead_start(
        self, session: AgreedSession, params: FloatArray, local: _LocalWork
    ) -> FloatArray:
        """Where next round's training starts (``overlap``): this round's model as guessed.

        ``"estimate"``: the strategy's step on this peer's own update alone (from the current
        rule state), as if every peer had sent it; ``"base"`` (or no update): ``params``.
        """
        if self.config.overlap_start == "base" or local.update is None:
            return params
        fit = FitResult(session.peer_id, local.update, max(1, local.fit_samples))
        lr, state = self.agreed.learning_rate, session.rule_state
        try:
            guess, _ = self.strategy.aggregate(params, [fit], lr, state)
        except GradfedError as exc:  # e.g. Krum needs more than one update: the plain base
            logger.debug("round %d: no estimate of the round's model: %s", local.round, exc)
            return params
        return np.asarray(guess, np.float32).reshape(-1)

    def _train_ahead(self, round_number: int, params: FloatArray) -> None:
        """With ``overlap``, start training round ``round_number``'s update from ``params``."""
        if not self.config.overlap or round_number >= self.config.rounds:
            return
        work = _LocalWork(round=round_number)
        base, config = params.copy(), self.rule.config(round_number)

        async def train() -> _LocalWork:
            await self._fit(work, base, config)
            return work

        self._ahead = (round_number, asyncio.create_task(train()))

    async def _trained_ahead(self, round_number: int) -> _LocalWork | None:
        """Return the work trained ahead for ``round_number`` (waiting for it), if any.

        Work trained for another round (a resync moved the session) is dropped.
        """
        if self._ahead is None:
            return None
        target, task = self._ahead
        self._ahead = None
        t = time.monotonic()
        work = await task  # _fit turns a failing train into this round's failure: no raise
        if target != round_number:
            logger.warning(
                "round %d: dropping the update trained for round %d", round_number, target
            )
            return None
        work.timings["train_wait"] = time.monotonic() - t
        return work

    async def _drop_ahead(self) -> None:
        """Stop waiting for work trained ahead (its thread finishes on its own)."""
        if self._ahead is not None:
            task = self._ahead[1]
            self._ahead = None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _evaluate(self, local: _LocalWork, params: FloatArray, config: Config) -> None:
        """Evaluate the global model on local data, if the client can (federated evaluation)."""
        if self.client.evaluate is None:
            return
        t = time.monotonic()
        try:
            loss, n, metrics = await asyncio.to_thread(
                self.client.evaluate, self.adapter.from_vector(params.copy()), dict(config)
            )
            local.eval_samples, local.eval_loss = _checked(n), float(loss)
            local.eval_metrics = dict(metrics)
        except Exception as exc:  # a failing client is this peer's failure, not the round's
            logger.warning("round %d: evaluate failed: %s", local.round, exc)
        local.timings["evaluate"] = time.monotonic() - t

    async def _fit(self, local: _LocalWork, params: FloatArray, config: Config) -> None:
        """Train a copy of the global model (this peer is sampled)."""
        t = time.monotonic()
        try:
            local.update, local.fit_samples, local.fit_metrics = await asyncio.to_thread(
                self._train, params, config
            )
        except Exception as exc:  # reported as this round's failure
            logger.warning("round %d: train failed: %s", local.round, exc)
        local.trained = True
        local.timings["train"] = time.monotonic() - t

    async def _secure_fit(
        self, local: _LocalWork, secagg: SecAgg, session: AgreedSession, sampled: Sequence[str]
    ) -> None:
        """Send this peer's fit through the SecAgg round; it is never contributed in the clear."""
        t = time.monotonic()
        local.secured = await secure_fit(
            secagg, self.layout, session, sampled,
            local.update, local.fit_samples, local.fit_metrics,
        )  # fmt: skip
        local.update, local.fit_samples, local.fit_metrics = None, 0, {}
        local.timings["secagg"] = time.monotonic() - t

    def _contribution(self, local: _LocalWork) -> tuple[FloatArray, int]:
        """Return this peer's contribution vector and its weight."""
        secured, cap = local.secured, self.layout.max_samples
        if local.eval_samples > cap:  # every peer would read the tail as unusable
            logger.warning(
                "round %d: %d evaluation samples exceed the session's max_weight %d: "
                "evaluation not reported", local.round, local.eval_samples, cap,
            )  # fmt: skip
            local.eval_samples, local.eval_loss, local.eval_metrics = 0, 0.0, {}
        if secured is not None and secured.samples > cap:  # no roster may list it
            logger.warning(
                "round %d: the secure sum's %d samples exceed max_weight %d: not contributed",
                local.round, secured.samples, cap,
            )  # fmt: skip
        elif secured is not None and secured.samples > 0:  # this peer aggregated the secure sum
            vector = secure_contribution(
                self.layout, secured, eval_samples=local.eval_samples,
                eval_loss=local.eval_loss, eval_metrics=local.eval_metrics,
            )  # fmt: skip
            return vector, secured.samples
        if local.update is not None and local.fit_samples > cap:  # no roster may list it
            logger.warning(
                "round %d: %d samples exceed the session's max_weight %d: update not contributed",
                local.round, local.fit_samples, cap,
            )  # fmt: skip
            local.update, local.fit_samples, local.fit_metrics = None, 0, {}
        try:
            vector = self.layout.contribution(
                local.update, fit_samples=local.fit_samples, fit_metrics=local.fit_metrics,
                eval_samples=local.eval_samples, eval_loss=local.eval_loss,
                eval_metrics=local.eval_metrics,
            )  # fmt: skip
            check_values(vector, self.agreed.max_value, "the contribution")  # run_round's check
        except InvalidGradient as exc:
            logger.warning("round %d: unusable client output: %s", local.round, exc)
            vector = self.layout.contribution(None)
        if local.update is not None:
            return vector, local.fit_samples
        return vector, min(cap, max(1, local.eval_samples))  # the rule weighs evaluations by tail

    def _epsilon(self) -> float | None:
        """ε spent so far: SecAgg's central DP if set, else this peer's local DP."""
        if isinstance(self.strategy, SecAgg) and self.strategy.central_dp is not None:
            return self.strategy.central_dp.spent()[0]
        return None if self.privacy is None else self.privacy.mechanism.spent()[0]

    def _train(
        self, params: FloatArray, config: Config
    ) -> tuple[FloatArray, int, dict[str, float]]:
        """Run the client's ``train`` on a copy of ``params``; return the update."""
        out, n, metrics = self.client.train(self.adapter.from_vector(params.copy()), dict(config))
        vector = np.asarray(self.adapter.to_vector(out), np.float32).reshape(-1)
        if vector.size != params.size:
            raise InvalidGradient(f"train returned {vector.size} parameters, not {params.size}")
        update = vector if self.client.returns == "update" else vector - params
        samples = _checked(n)
        if samples < 1:
            raise InvalidGradient("train reported no samples")
        update = update.astype(np.float32)
        if self.privacy is not None:  # PrivacyBudgetExhausted: this round is a failure
            self.privacy.mechanism.apply_dp_sgd(update, self.privacy.clip_norm)
        return update, samples, dict(metrics)


def training_rule(
    strategy: Strategy, layout: VectorLayout, members: Sequence[str], config: FederationConfig[Any]
) -> TrainingRule:
    """Return the agreed update rule of a training session (every peer's, and a verifier's).

    ``members`` are round 0's; the strategy's fit config and ``config.on_fit_config`` make each
    round's client config. Under :class:`~gradfed_ipfs.training.secure.SecAgg` the rule is a
    :class:`~gradfed_ipfs.training.secure.SecureTrainingRule`.
    """
    user_config = config.on_fit_config

    def round_config(server_round: int) -> dict[str, ConfigValue]:
        extra = {} if user_config is None else dict(user_config(server_round))
        return {**strategy.fit_config(server_round), **extra}

    kind = SecureTrainingRule if isinstance(strategy, SecAgg) else TrainingRule
    return kind(
        strategy, layout, members, fraction=config.fraction, min_fit=config.min_fit,
        fit_rounds=config.rounds, config=round_config,
    )  # fmt: skip


def _checked(n: object) -> int:
    """Return a sample count as an int in ``[0, MAX_SAMPLES]``."""
    if not isinstance(n, int | np.integer) or not 0 <= int(n) <= MAX_SAMPLES:
        raise InvalidGradient(f"num_samples must be an integer in [0, {MAX_SAMPLES}], got {n!r}")
    return int(n)
