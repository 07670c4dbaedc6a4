"""Backward-pass helpers and the per-layer step coordinator of the seed (seed-api §5).

:class:`StepCoordinator` (the seed's ``LegacyBackwardPassCoordinator``, kept as an alias) tracks,
per layer (node) of a backward pass, which peers have sent a gradient, aggregates them and
applies the result with plain SGD. Fixes over the seed:

- ``BackwardPassConfig.timeout`` is enforced: peers of a step that have not reported
  ``timeout`` seconds after the step was scheduled are marked ``Failed`` (on an injectable
  monotonic clock, so tests need no sleeps). A gradient that arrives later does not revive them.
- ``max_peers`` is enforced when scheduling a step and when aggregating.
- ``aggregated_gradient_cid`` is set by :meth:`StepCoordinator.commit_aggregate`, which stores
  the aggregate as an Arrow gradient block (raw CID) in a block store.
- Aggregation goes through the strategy objects of :mod:`gradfed_ipfs.tensor.aggregation`, with
  contributions keyed by peer ID and processed in **sorted peer-ID order**. A positional
  ``WeightedMean(weights=[...])`` therefore maps its weights to the peers sorted by ID, not to
  the order of the list given to :meth:`StepCoordinator.aggregate_gradients` (the seed used list
  order); pass a mapping ``{peer_id: weight}`` to be explicit. A peer may appear only once.

The step coordinator is a plain single-threaded data structure, as in the seed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias

import numpy as np
from multiformats import CID

from .._types import FloatArray, GradientLike
from ..errors import (
    DimensionMismatch,
    EmptyGradients,
    EmptyGradientSet,
    InvalidGradient,
    NodeNotFound,
    PeerNotFound,
    ShapeMismatch,
)
from ..federated.accumulate.config import AccumulatorConfig
from ..formats.arrow import store_gradient_as_arrow
from ..storage.base import Block, BlockStore
from ..tensor.aggregation import (
    AggregationMethod,
    Contribution,
    GradientAggregator,
    as_float32_vector,
)
from ..tensor.robust import clip_gradient_norm

BackwardPassConfig = AccumulatorConfig
"""The seed's name for :class:`~gradfed_ipfs.federated.round.AccumulatorConfig`."""

__all__ = [
    "AggregationMethod",
    "BackwardPassConfig",
    "BackwardPassStats",
    "BackwardPassStep",
    "BackwardStepStatus",
    "Clock",
    "LegacyBackwardPassCoordinator",
    "StepCoordinator",
    "clip_gradient_norm",
    "federated_average",
]

logger = logging.getLogger("gradfed_ipfs")

Clock: TypeAlias = Callable[[], float]
"""A monotonic clock in seconds, such as :func:`time.monotonic` (the default)."""


def federated_average(gradients: Sequence[GradientLike]) -> FloatArray:
    """Unweighted element-wise mean of the gradients (the seed's ``federated_average``).

    Computed as the seed does, ``Σ g/n`` in float32 in list order (bit for bit the crate's).

    Raises
    ------
    EmptyGradients
        If ``gradients`` is empty.
    DimensionMismatch
        If lengths differ.
    """
    if len(gradients) == 0:
        raise EmptyGradients()
    try:
        return GradientAggregator.average(gradients)
    except ShapeMismatch as exc:
        raise DimensionMismatch(exc.expected, exc.actual) from None


# --------------------------------------------------------------------------- step status


@dataclass(frozen=True)
class BackwardStepStatus:
    """One peer's state within a step: the seed's ``BackwardStepStatus`` enum.

    Variants: ``BackwardStepStatus.Pending()``, ``GradientRequested(peer_id)``,
    ``GradientReceived(cid)``, ``Aggregated()`` and ``Failed(reason)``.
    """

    Pending: ClassVar[type[Pending]]
    GradientRequested: ClassVar[type[GradientRequested]]
    GradientReceived: ClassVar[type[GradientReceived]]
    Aggregated: ClassVar[type[Aggregated]]
    Failed: ClassVar[type[Failed]]

    @property
    def name(self) -> str:
        """The variant's name, e.g. ``"GradientReceived"``."""
        return type(self).__name__

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Pending(BackwardStepStatus):
    """Waiting for the peer's gradient."""


@dataclass(frozen=True)
class GradientRequested(BackwardStepStatus):
    """The gradient was requested from the peer (set by :meth:`BackwardPassStep.request`).

    Attributes
    ----------
    peer_id
        The peer asked.
    """

    peer_id: str


@dataclass(frozen=True)
class GradientReceived(BackwardStepStatus):
    """The peer's gradient arrived.

    Attributes
    ----------
    cid
        Where it is stored.
    """

    cid: str


@dataclass(frozen=True)
class Aggregated(BackwardStepStatus):
    """The peer's gradient went into the step's aggregate."""


@dataclass(frozen=True)
class Failed(BackwardStepStatus):
    """The peer failed or timed out.

    Attributes
    ----------
    reason
        Why.
    """

    reason: str


BackwardStepStatus.Pending = Pending
BackwardStepStatus.GradientRequested = GradientRequested
BackwardStepStatus.GradientReceived = GradientReceived
BackwardStepStatus.Aggregated = Aggregated
BackwardStepStatus.Failed = Failed

_WAITING = (Pending, GradientRequested)


@dataclass
class BackwardPassStep:
    """One node (layer) of the backward pass and each peer's status for it.

    Attributes
    ----------
    node_id
        The computation-graph node.
    op
        Its operation, e.g. ``"matmul"``.
    peer_contributions
        Peer ID → status.
    aggregated_gradient_cid
        CID of the committed aggregate (set by :meth:`StepCoordinator.commit_aggregate`).
    started_at
        Creation time on the coordinator's monotonic clock (seconds).
    """

    node_id: str
    op: str
    peer_contributions: dict[str, BackwardStepStatus] = field(default_factory=dict)
    aggregated_gradient_cid: str | None = None
    started_at: float = field(default_factory=time.monotonic)

    @classmethod
    def new(cls, node_id: str, op: str, *, started_at: float | None = None) -> BackwardPassStep:
        """Build a step with no peers, started now (or at ``started_at``)."""
        return cls(node_id, op, started_at=time.monotonic() if started_at is None else started_at)

    def add_peer(self, peer_id: str) -> None:
        """Register a peer as ``Pending`` unless it is already registered."""
        self.peer_contributions.setdefault(peer_id, Pending())

    def request(self, peer_id: str) -> None:
        """Mark a waiting peer's gradient as requested (``GradientRequested``)."""
        if isinstance(self.peer_contributions.get(peer_id, Pending()), Pending):
            self.peer_contributions[peer_id] = GradientRequested(peer_id)

    def record_gradient_received(self, peer_id: str, cid: str) -> None:
        """Set ``GradientReceived(cid)`` (also for a peer that was never added, as the seed)."""
        self.peer_contributions[peer_id] = GradientReceived(str(cid))

    def record_gradient_failed(self, peer_id: str, reason: str) -> None:
        """Set ``Failed(reason)``."""
        self.peer_contributions[peer_id] = Failed(reason)

    def expire(self, now: float, timeout: float) -> list[str]:
        """Fail every waiting peer if ``now`` is past ``started_at + timeout``.

        Returns
        -------
        list[str]
            The peers that were just marked ``Failed`` (sorted).
        """
        if now - self.started_at < timeout:
            return []
        late = sorted(p for p, s in self.peer_contributions.items() if isinstance(s, _WAITING))
        for peer in late:
            self.peer_contributions[peer] = Failed(f"timed out after {timeout:g} s")
        return late

    def is_complete(self) -> bool:
        """Whether no peer is still waiting (vacuously true with no peers)."""
        return not any(isinstance(s, _WAITING) for s in self.peer_contributions.values())

    def ready_to_aggregate(self) -> bool:
        """Whether there is at least one peer and every peer is received or aggregated."""
        return bool(self.peer_contributions) and all(
            isinstance(s, GradientReceived | Aggregated) for s in self.peer_contributions.values()
        )

    def received_count(self) -> int:
        """Return the number of peers whose gradient was received or aggregated."""
        return sum(
            isinstance(s, GradientReceived | Aggregated) for s in self.peer_contributions.values()
        )

    def failed_count(self) -> int:
        """Return the number of failed peers."""
        return sum(isinstance(s, Failed) for s in self.peer_contributions.values())

    def is_aggregated(self) -> bool:
        """Whether there is at least one peer and every peer is ``Aggregated``."""
        return bool(self.peer_contributions) and all(
            isinstance(s, Aggregated) for s in self.peer_contributions.values()
        )


@dataclass
class BackwardPassStats:
    """Counters over a coordinator's steps (the seed's ``BackwardPassStats``).

    Attributes
    ----------
    total_steps
        Scheduled steps.
    completed_steps
        Steps whose peers are all ``Aggregated``.
    pending_steps
        Steps neither completed nor failed.
    failed_steps
        Steps with at least one failed peer.
    total_gradient_bytes
        ``4 *`` the float count of all buffered aggregates.
    participating_peers
        Distinct peers over all steps.
    """

    total_steps: int = 0
    completed_steps: int = 0
    pending_steps: int = 0
    failed_steps: int = 0
    total_gradient_bytes: int = 0
    participating_peers: int = 0


GradientData: TypeAlias = (
    Sequence[tuple[str, GradientLike]] | Mapping[str, GradientLike | Contribution]
)


class StepCoordinator:
    """Per-layer backward-pass coordinator (the seed's ``LegacyBackwardPassCoordinator``).

    Parameters
    ----------
    config
        Settings; default :class:`BackwardPassConfig()`.
    clock
        Monotonic clock in seconds for step deadlines (default :func:`time.monotonic`).
    """

    def __init__(
        self, config: BackwardPassConfig | None = None, *, clock: Clock = time.monotonic
    ) -> None:
        self.config = config if config is not None else BackwardPassConfig()
        self.learning_rate = 0.01
        self.steps: list[BackwardPassStep] = []
        self.participating_peers: set[str] = set()
        self.accumulation_buffer: dict[str, FloatArray] = {}
        self._clock = clock

    def with_learning_rate(self, lr: float) -> StepCoordinator:
        """Set the SGD learning rate and return ``self`` (builder)."""
        self.learning_rate = float(lr)
        return self

    # ---------------------------------------------------------------- lookups and timeouts

    def _step(self, node_id: str) -> BackwardPassStep | None:
        return next((s for s in self.steps if s.node_id == node_id), None)

    def check_timeouts(self) -> dict[str, list[str]]:
        """Fail the waiting peers of every step past its deadline.

        Every other method calls this first, so callers only need it to learn who timed out.

        Returns
        -------
        dict[str, list[str]]
            Node id → peers that were just marked ``Failed``.
        """
        now = self._clock()
        expired: dict[str, list[str]] = {}
        for step in self.steps:
            late = step.expire(now, self.config.timeout)
            if late:
                expired.setdefault(step.node_id, []).extend(late)
                logger.debug("step %s: peers %s timed out", step.node_id, late)
        return expired

    # ---------------------------------------------------------------- seed API

    def schedule_step(self, node_id: str, op: str, peers: Iterable[str]) -> BackwardPassStep:
        """Append a step with every peer ``Pending``; its deadline starts now.

        Duplicate node ids are allowed; lookups find the first.

        Raises
        ------
        InvalidGradient
            If more than ``config.max_peers`` distinct peers are given.
        """
        unique = list(dict.fromkeys(peers))
        if len(unique) > self.config.max_peers:
            raise InvalidGradient(
                f"step {node_id!r} has {len(unique)} peers, max_peers is {self.config.max_peers}"
            )
        step = BackwardPassStep(node_id, op, started_at=self._clock())
        for peer in unique:
            step.add_peer(peer)
        self.steps.append(step)
        self.participating_peers.update(unique)
        return step

    def receive_gradient(self, node_id: str, peer_id: str, gradient_cid: str) -> BackwardStepStatus:
        """Record that ``peer_id`` sent its gradient for ``node_id``.

        Returns
        -------
        BackwardStepStatus
            The peer's status afterwards: ``GradientReceived``, or ``Failed`` when the gradient
            arrived after the step's deadline (it is then ignored).

        Raises
        ------
        NodeNotFound
            If no step has that node id.
        PeerNotFound
            If the peer is not registered in the step.
        """
        self.check_timeouts()
        step = self._step(node_id)
        if step is None:
            raise NodeNotFound(node_id)
        status = step.peer_contributions.get(peer_id)
        if status is None:
            raise PeerNotFound(peer_id)
        if isinstance(status, Failed):
            logger.debug("step %s: late gradient from %s ignored", node_id, peer_id)
            return status
        step.record_gradient_received(peer_id, gradient_cid)
        return step.peer_contributions[peer_id]

    def _check_contributions(self, contributions: dict[str, Contribution]) -> None:
        """Refuse no contributions, contributions of different lengths, or too many of them."""
        if not contributions:
            raise EmptyGradients()
        lengths = [c.values.size for c in contributions.values()]  # given order, as the seed
        for length in lengths:
            if length != lengths[0]:
                raise DimensionMismatch([lengths[0]], [length])
        if len(contributions) > self.config.max_peers:
            raise InvalidGradient(
                f"{len(contributions)} contributions exceed max_peers {self.config.max_peers}"
            )

    def aggregate_gradients(self, node_id: str, gradient_data: GradientData) -> FloatArray:
        """Aggregate peers' gradients with the configured method, clip, and buffer the result.

        Parameters
        ----------
        node_id
            The step; when it exists, its received peers become ``Aggregated`` and only its
            registered peers may contribute. It need not exist (as in the seed).
        gradient_data
            ``[(peer_id, gradient), …]`` or ``{peer_id: gradient or Contribution}``; a
            :class:`~gradfed_ipfs.tensor.aggregation.Contribution` carries a sample count for
            FedAvg. Processed in sorted peer-ID order.

        Raises
        ------
        EmptyGradients
            If there are no gradients.
        DimensionMismatch
            If lengths differ.
        InvalidGradient
            If a peer appears twice, or more than ``max_peers`` peers contribute.
        PeerNotFound
            If the step exists and a contributor is not registered in it.
        """
        self.check_timeouts()
        contributions = _contributions(gradient_data)
        self._check_contributions(contributions)
        step = self._step(node_id)
        if step is not None:
            for peer in sorted(contributions):
                if peer not in step.peer_contributions:
                    raise PeerNotFound(peer)
        try:
            result = self.config.aggregation.aggregate(contributions)
        except ShapeMismatch as exc:
            raise DimensionMismatch(exc.expected, exc.actual) from None
        except EmptyGradientSet:
            raise EmptyGradients() from None
        result = np.array(result, dtype=np.float32, copy=True)
        self.clip_gradients(result)
        if step is not None:
            for peer, status in step.peer_contributions.items():
                if isinstance(status, GradientReceived):
                    step.peer_contributions[peer] = Aggregated()
        self.accumulation_buffer[node_id] = result
        return result

    def clip_gradients(self, grads: FloatArray) -> FloatArray:
        """Clip ``grads`` in place to ``config.gradient_clipping`` (if set); return it."""
        if self.config.gradient_clipping is not None:
            clip_gradient_norm(grads, self.config.gradient_clipping)
        return grads

    def apply_gradient(self, params: FloatArray, gradient: GradientLike) -> FloatArray:
        """Plain SGD in place: ``params -= learning_rate * gradient``; return ``params``.

        Raises
        ------
        DimensionMismatch
            If the lengths differ.
        """
        grad = as_float32_vector(gradient)
        if params.size != grad.size:
            raise DimensionMismatch([params.size], [grad.size])
        params -= (np.float32(self.learning_rate) * grad).reshape(params.shape)
        return params

    def next_ready_step(self) -> BackwardPassStep | None:
        """Return the first step ready to aggregate (an aggregated step still counts)."""
        self.check_timeouts()
        return next((s for s in self.steps if s.ready_to_aggregate()), None)

    def stats(self) -> BackwardPassStats:
        """Return counters over all steps (after applying timeouts)."""
        self.check_timeouts()
        completed = sum(s.is_aggregated() for s in self.steps)
        failed = sum(s.failed_count() > 0 for s in self.steps)
        return BackwardPassStats(
            total_steps=len(self.steps),
            completed_steps=completed,
            pending_steps=len(self.steps) - completed - failed,
            failed_steps=failed,
            total_gradient_bytes=sum(4 * g.size for g in self.accumulation_buffer.values()),
            participating_peers=len(self.participating_peers),
        )

    # ---------------------------------------------------------------- storage

    async def commit_aggregate(self, node_id: str, store: BlockStore, *, pin: bool = True) -> CID:
        """Store the buffered aggregate of ``node_id`` as an Arrow gradient block.

        The block is a raw-codec CID over :func:`~gradfed_ipfs.formats.store_gradient_as_arrow`
        bytes (layer name ``node_id``); the step's ``aggregated_gradient_cid`` is set to it.

        Raises
        ------
        NodeNotFound
            If nothing was aggregated for ``node_id``.
        BlockTooLarge
            If the encoded aggregate exceeds the 2 MiB block limit.
        """
        values = self.accumulation_buffer.get(node_id)
        if values is None:
            raise NodeNotFound(node_id)
        block = Block.new(store_gradient_as_arrow(values, layer=node_id), "raw")
        cid = await store.put(block, pin=pin)
        step = self._step(node_id)
        if step is not None:
            step.aggregated_gradient_cid = str(cid)
        return cid


LegacyBackwardPassCoordinator = StepCoordinator
"""The seed's export name for :class:`StepCoordinator`."""


def _contributions(gradient_data: GradientData) -> dict[str, Contribution]:
    result: dict[str, Contribution] = {}
    items: Iterable[tuple[str, GradientLike | Contribution]]
    items = gradient_data.items() if isinstance(gradient_data, Mapping) else gradient_data
    for peer, value in items:
        if peer in result:
            raise InvalidGradient(f"peer {peer!r} contributed twice; one peer counts once")
        result[peer] = value if isinstance(value, Contribution) else Contribution.of(value)
    return result
