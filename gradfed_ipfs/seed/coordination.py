"""Pass-level coordination of a distributed backward pass (seed-api §8).

:class:`PassCoordinator` (the seed's root-exported ``BackwardPassCoordinator``, kept as an alias)
tracks, per backward pass, which peers have contributed a gradient. It is thread safe: one
:class:`threading.Lock` guards all state.

Fixes over the seed:

- **One peer counts once per pass.** A second contribution from the same peer *replaces* the
  first (same position, counts once); the replaced contribution is no longer returned by
  :meth:`PassCoordinator.contributions`.
- **``timeout_ms`` is enforced.** A pass that is not terminal ``timeout_ms`` after it started
  becomes ``Failed`` (reason says how many contributions arrived). Time comes from an injectable
  monotonic clock, so tests need no sleeps. Expiry is applied lazily by every method, and
  eagerly by :meth:`PassCoordinator.expire_timed_out`.
- **Terminal is final.** ``mark_complete`` and ``mark_failed`` on a pass that is already
  Complete or Failed change nothing and return ``False`` (the seed let ``mark_complete``
  overwrite a Failed pass, which would undo a timeout).

The caller aggregates (for example with :meth:`GradientArrowBlock.fedavg`) and then calls
:meth:`PassCoordinator.mark_complete`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import (
    ArrowBlockError,
    ConfigError,
    CoordinationError,
    MalformedManifest,
    PassAlreadyTerminal,
    PassNotFound,
)
from .garw import GradientArrowBlock

__all__ = [
    "ArrowBlockError",
    "BackwardPassCoordinator",
    "BackwardPassId",
    "Clock",
    "CoordinationError",
    "CoordinationStatus",
    "GradientArrowBlock",
    "GradientContribution",
    "PassCoordinator",
]

Clock = Callable[[], float]
"""A monotonic clock in seconds, such as :func:`time.monotonic` (the default)."""


@dataclass(frozen=True, order=True)
class BackwardPassId:
    """Identifies one backward pass: a training round and the peer that started it.

    Attributes
    ----------
    round
        The training round.
    initiator_peer
        The peer ID of the initiator.
    """

    round: int
    initiator_peer: str

    @classmethod
    def new(cls, round: int, initiator_peer: str) -> BackwardPassId:
        """Build a pass id (the seed's constructor)."""
        return cls(round, initiator_peer)

    def as_key(self) -> str:
        """Return ``"{round}-{initiator_peer}"``."""
        return f"{self.round}-{self.initiator_peer}"

    def __str__(self) -> str:
        return self.as_key()

    def to_dict(self) -> dict[str, Any]:
        """Return the serde form ``{"round": …, "initiator_peer": …}``."""
        return {"round": self.round, "initiator_peer": self.initiator_peer}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BackwardPassId:
        """Parse :meth:`to_dict` output; ``MalformedManifest`` if it is not one."""
        try:
            round_, peer = data["round"], data["initiator_peer"]
        except (KeyError, TypeError) as exc:
            raise MalformedManifest(f"not a BackwardPassId: {data!r:.80}") from exc
        if not isinstance(round_, int) or isinstance(round_, bool) or not isinstance(peer, str):
            raise MalformedManifest(f"not a BackwardPassId: {data!r:.80}")
        return cls(round_, peer)


# --------------------------------------------------------------------------- status


@dataclass(frozen=True)
class CoordinationStatus:
    """The state of a backward pass: the seed's ``CoordinationStatus`` enum.

    Build variants as ``CoordinationStatus.Pending()``,
    ``CoordinationStatus.CollectingGradients(received, expected)``,
    ``CoordinationStatus.Aggregating()``, ``CoordinationStatus.Complete(aggregated_cid)`` and
    ``CoordinationStatus.Failed(reason)``; test with ``isinstance`` or ``==``.
    """

    Pending: ClassVar[type[Pending]]
    CollectingGradients: ClassVar[type[CollectingGradients]]
    Aggregating: ClassVar[type[Aggregating]]
    Complete: ClassVar[type[Complete]]
    Failed: ClassVar[type[Failed]]

    @property
    def name(self) -> str:
        """The variant's name, e.g. ``"Complete"``."""
        return type(self).__name__

    @property
    def is_terminal(self) -> bool:
        """Whether the pass is Complete or Failed."""
        return False

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Pending(CoordinationStatus):
    """Started; no contribution yet."""


@dataclass(frozen=True)
class CollectingGradients(CoordinationStatus):
    """Some contributions arrived.

    Attributes
    ----------
    received
        Distinct peers that contributed.
    expected
        Peers the coordinator waits for.
    """

    received: int
    expected: int


@dataclass(frozen=True)
class Aggregating(CoordinationStatus):
    """The caller is aggregating (set by :meth:`PassCoordinator.mark_aggregating`)."""


@dataclass(frozen=True)
class Complete(CoordinationStatus):
    """The aggregate is done.

    Attributes
    ----------
    aggregated_cid
        The aggregate's CID (string form).
    """

    aggregated_cid: str

    @property
    def is_terminal(self) -> bool:
        """Always true."""
        return True


@dataclass(frozen=True)
class Failed(CoordinationStatus):
    """The pass failed (explicitly, or by timing out).

    Attributes
    ----------
    reason
        Why.
    """

    reason: str

    @property
    def is_terminal(self) -> bool:
        """Always true."""
        return True


CoordinationStatus.Pending = Pending
CoordinationStatus.CollectingGradients = CollectingGradients
CoordinationStatus.Aggregating = Aggregating
CoordinationStatus.Complete = Complete
CoordinationStatus.Failed = Failed


# --------------------------------------------------------------------------- contributions


@dataclass(frozen=True)
class GradientContribution:
    """One peer's gradient for one pass.

    Attributes
    ----------
    pass_id
        The pass it belongs to.
    peer_id
        The contributing peer.
    gradient_cid
        Where the gradient is (a CID string, or the seed's ``grad-…`` id).
    layer_name
        The layer.
    num_samples
        Samples behind the gradient (FedAvg weight).
    submitted_at_ms
        Submission time in Unix milliseconds, as given by the submitter.
    """

    pass_id: BackwardPassId
    peer_id: str
    gradient_cid: str
    layer_name: str
    num_samples: int
    submitted_at_ms: int

    def to_dict(self) -> dict[str, Any]:
        """Return the serde form (``pass_id`` as a nested dict)."""
        return {
            "pass_id": self.pass_id.to_dict(),
            "peer_id": self.peer_id,
            "gradient_cid": self.gradient_cid,
            "layer_name": self.layer_name,
            "num_samples": self.num_samples,
            "submitted_at_ms": self.submitted_at_ms,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GradientContribution:
        """Parse :meth:`to_dict` output; ``MalformedManifest`` if it is not one."""
        try:
            result = cls(
                BackwardPassId.from_dict(data["pass_id"]),
                data["peer_id"],
                data["gradient_cid"],
                data["layer_name"],
                data["num_samples"],
                data["submitted_at_ms"],
            )
        except (KeyError, TypeError) as exc:
            raise MalformedManifest(f"not a GradientContribution: {data!r:.80}") from exc
        for name in ("peer_id", "gradient_cid", "layer_name"):
            if not isinstance(getattr(result, name), str):
                raise MalformedManifest(f"GradientContribution.{name} must be a string")
        for name in ("num_samples", "submitted_at_ms"):
            value = getattr(result, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise MalformedManifest(f"GradientContribution.{name} must be an int >= 0")
        return result


# --------------------------------------------------------------------------- coordinator


@dataclass
class _PassState:
    status: CoordinationStatus
    contributions: dict[str, GradientContribution]  # peer → latest, in first-arrival order
    started_at: float


class PassCoordinator:
    """Thread-safe tracker of backward passes (the seed's root ``BackwardPassCoordinator``).

    Parameters
    ----------
    expected_peers
        Distinct peers needed before a pass is ready to aggregate (>= 1).
    timeout_ms
        Milliseconds after :meth:`start_pass` at which a non-terminal pass becomes Failed (> 0).
    clock
        Monotonic clock in seconds (default :func:`time.monotonic`); inject a fake in tests.
    """

    def __init__(
        self, expected_peers: int, timeout_ms: int, *, clock: Clock = time.monotonic
    ) -> None:
        if expected_peers < 1:
            raise ConfigError(f"expected_peers must be >= 1, got {expected_peers}")
        if timeout_ms <= 0:
            raise ConfigError(f"timeout_ms must be > 0, got {timeout_ms}")
        self._expected_peers = expected_peers
        self._timeout_ms = timeout_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._passes: dict[str, tuple[BackwardPassId, _PassState]] = {}

    @property
    def expected_peers(self) -> int:
        """Distinct peers needed before a pass is ready."""
        return self._expected_peers

    @property
    def timeout_ms(self) -> int:
        """Pass timeout in milliseconds (enforced)."""
        return self._timeout_ms

    # ---------------------------------------------------------------- internals (lock held)

    def _expire_locked(self, state: _PassState, now: float) -> bool:
        if state.status.is_terminal:
            return False
        elapsed_ms = (now - state.started_at) * 1000.0
        if elapsed_ms < self._timeout_ms:
            return False
        state.status = CoordinationStatus.Failed(
            f"timed out after {self._timeout_ms} ms with {len(state.contributions)} of "
            f"{self._expected_peers} contributions"
        )
        return True

    def _get_locked(self, pass_id: BackwardPassId) -> _PassState | None:
        entry = self._passes.get(pass_id.as_key())
        if entry is None:
            return None
        self._expire_locked(entry[1], self._clock())
        return entry[1]

    # ---------------------------------------------------------------- seed API

    def start_pass(self, pass_id: BackwardPassId) -> bool:
        """Start a pass in ``Pending``; ``False`` if a pass with that key already exists."""
        with self._lock:
            key = pass_id.as_key()
            if key in self._passes:
                return False
            state = _PassState(CoordinationStatus.Pending(), {}, self._clock())
            self._passes[key] = (pass_id, state)
            return True

    def submit_contribution(self, contribution: GradientContribution) -> CoordinationStatus:
        """Record a contribution and return ``CollectingGradients(received, expected)``.

        ``received`` counts distinct peers: a peer's resubmission replaces its earlier
        contribution.

        Raises
        ------
        PassNotFound
            If the pass was never started (or was garbage-collected).
        PassAlreadyTerminal
            If the pass is Complete or Failed, including by timing out.
        """
        with self._lock:
            state = self._get_locked(contribution.pass_id)
            if state is None:
                raise _not_found(contribution.pass_id)
            if state.status.is_terminal:
                error = PassAlreadyTerminal(contribution.pass_id.as_key())
                error.args = (f"Backward pass is already terminal (status: {state.status})",)
                raise error
            state.contributions[contribution.peer_id] = contribution
            status = CoordinationStatus.CollectingGradients(
                len(state.contributions), self._expected_peers
            )
            state.status = status
            return status

    def is_ready_to_aggregate(self, pass_id: BackwardPassId) -> bool:
        """Whether the pass has contributions from ``expected_peers`` distinct peers.

        ``False`` for unknown passes and for passes that have failed or completed.
        """
        with self._lock:
            state = self._get_locked(pass_id)
            return (
                state is not None
                and not state.status.is_terminal
                and len(state.contributions) >= self._expected_peers
            )

    def mark_aggregating(self, pass_id: BackwardPassId) -> bool:
        """Set a non-terminal pass to ``Aggregating``; ``False`` if unknown or terminal."""
        return self._set(pass_id, CoordinationStatus.Aggregating())

    def mark_complete(self, pass_id: BackwardPassId, aggregated_cid: str) -> bool:
        """Set ``Complete(aggregated_cid)``; ``False`` if unknown or already terminal."""
        return self._set(pass_id, CoordinationStatus.Complete(str(aggregated_cid)))

    def mark_failed(self, pass_id: BackwardPassId, reason: str) -> bool:
        """Set ``Failed(reason)``; ``False`` if unknown or already terminal."""
        return self._set(pass_id, CoordinationStatus.Failed(reason))

    def _set(self, pass_id: BackwardPassId, status: CoordinationStatus) -> bool:
        with self._lock:
            state = self._get_locked(pass_id)
            if state is None or state.status.is_terminal:
                return False
            state.status = status
            return True

    def status(self, pass_id: BackwardPassId) -> CoordinationStatus | None:
        """Return the pass's status (after applying its timeout), or ``None`` if unknown."""
        with self._lock:
            state = self._get_locked(pass_id)
            return None if state is None else state.status

    def contributions(self, pass_id: BackwardPassId) -> list[GradientContribution]:
        """Return the pass's contributions, one per peer in first-arrival order (copy)."""
        with self._lock:
            state = self._get_locked(pass_id)
            return [] if state is None else list(state.contributions.values())

    def active_count(self) -> int:
        """Return the number of passes that are neither Complete nor Failed."""
        with self._lock:
            now = self._clock()
            count = 0
            for _, state in self._passes.values():
                self._expire_locked(state, now)
                count += not state.status.is_terminal
            return count

    def gc_before_round(self, round: int) -> int:
        """Remove terminal passes of rounds before ``round``; return how many were removed.

        Active passes are kept whatever their round (timed-out passes are terminal).
        """
        with self._lock:
            now = self._clock()
            doomed = []
            for key, (pass_id, state) in self._passes.items():
                self._expire_locked(state, now)
                if state.status.is_terminal and pass_id.round < round:
                    doomed.append(key)
            for key in doomed:
                del self._passes[key]
            return len(doomed)

    # ---------------------------------------------------------------- additions

    def expire_timed_out(self) -> list[BackwardPassId]:
        """Fail every pass past its deadline now; return the ids that just timed out."""
        with self._lock:
            now = self._clock()
            return [pid for pid, state in self._passes.values() if self._expire_locked(state, now)]

    def deadline(self, pass_id: BackwardPassId) -> float | None:
        """Return the pass's deadline on the coordinator's clock, or ``None`` if unknown."""
        with self._lock:
            entry = self._passes.get(pass_id.as_key())
            return None if entry is None else entry[1].started_at + self._timeout_ms / 1000.0

    def garw_fedavg(
        self, pass_id: BackwardPassId, blocks: Mapping[str, GradientArrowBlock]
    ) -> GradientArrowBlock:
        """Sample-weighted FedAvg of a ready pass's GARW blocks, as a new GARW block.

        Parameters
        ----------
        pass_id
            A pass that :meth:`is_ready_to_aggregate`.
        blocks
            Peer ID → that peer's decoded block; exactly the contributing peers. Blocks are
            averaged in sorted peer-ID order, weighted by each block's ``num_samples``.

        Raises
        ------
        PassNotFound
            If the pass is unknown.
        CoordinationError
            If the pass is not ready, or ``blocks`` names other peers than the contributors.
        """
        with self._lock:
            state = self._get_locked(pass_id)
            if state is None:
                raise _not_found(pass_id)
            ready = (
                not state.status.is_terminal and len(state.contributions) >= self._expected_peers
            )
            peers = set(state.contributions)
        if not ready:
            raise CoordinationError(f"pass {pass_id} is not ready to aggregate")
        if set(blocks) != peers:
            raise CoordinationError(
                f"blocks are from {sorted(blocks)}, contributors are {sorted(peers)}"
            )
        ordered = [blocks[p] for p in sorted(blocks)]
        values = GradientArrowBlock.fedavg(ordered)
        first = ordered[0]
        return GradientArrowBlock.new(
            first.layer_name, values, sum(b.num_samples for b in ordered), first.shape
        )


def _not_found(pass_id: BackwardPassId) -> PassNotFound:
    error = PassNotFound(pass_id.as_key())
    error.args = (f"Backward pass not found: {pass_id.as_key()}",)  # the seed's message
    return error


BackwardPassCoordinator = PassCoordinator
"""The seed's name for :class:`PassCoordinator` (the root-exported coordinator)."""
