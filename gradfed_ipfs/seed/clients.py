"""Federated clients and their validated state machine (seed-api §6.6).

The seed let a client move from any state to any other. Here a move not in
:data:`ALLOWED_TRANSITIONS` raises :class:`~gradfed_ipfs.errors.FederatedError` and leaves the
client unchanged. ``sample_count`` is the client's FedAvg weight in
:meth:`gradfed_ipfs.seed.rounds.FederatedRound.start`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from ..errors import FederatedError, InvalidGradient

__all__ = ["ALLOWED_TRANSITIONS", "ClientInfo", "ClientState"]


def _now_s() -> int:
    return int(time.time())


class ClientState(Enum):
    """Where a client is in its round (seed ``Idle | Training | Completed | Failed``)."""

    IDLE = "idle"
    TRAINING = "training"
    COMPLETED = "completed"
    FAILED = "failed"
    # The seed's spellings, as aliases of the same members.
    Idle = "idle"
    Training = "training"
    Completed = "completed"
    Failed = "failed"


ALLOWED_TRANSITIONS: Mapping[ClientState, frozenset[ClientState]] = {
    ClientState.IDLE: frozenset({ClientState.TRAINING, ClientState.FAILED}),
    ClientState.TRAINING: frozenset({ClientState.COMPLETED, ClientState.FAILED}),
    # A completed client can still fail (its upload or verification failed) or train again.
    ClientState.COMPLETED: frozenset({ClientState.IDLE, ClientState.TRAINING, ClientState.FAILED}),
    # A failed client may be retried.
    ClientState.FAILED: frozenset({ClientState.IDLE, ClientState.TRAINING}),
}
"""Legal client state transitions; anything else raises :class:`FederatedError`."""


@dataclass
class ClientInfo:
    """A participant: its id, state, number of local samples and last update time.

    Parameters
    ----------
    client_id
        The client's (peer) id.
    sample_count
        Number of local training samples; the client's FedAvg weight (>= 0).
    state
        Current state (``IDLE`` for a new client).
    last_update
        Unix time of the last state change, in seconds.
    """

    client_id: str
    sample_count: int = 0
    state: ClientState = ClientState.IDLE
    last_update: int = field(default_factory=_now_s)

    def __post_init__(self) -> None:
        if self.sample_count < 0:
            raise InvalidGradient(f"sample_count must be >= 0, got {self.sample_count}")

    def _move(self, target: ClientState) -> None:
        if target not in ALLOWED_TRANSITIONS[self.state]:
            raise FederatedError(
                f"Invalid client state transition for {self.client_id}: "
                f"{self.state.name} -> {target.name}"
            )
        self.state = target
        self.last_update = _now_s()

    def start_training(self) -> None:
        """Move to ``TRAINING`` (from ``IDLE``, ``COMPLETED`` or ``FAILED``)."""
        self._move(ClientState.TRAINING)

    def complete_training(self) -> None:
        """Move to ``COMPLETED`` (only from ``TRAINING``)."""
        self._move(ClientState.COMPLETED)

    def mark_failed(self) -> None:
        """Move to ``FAILED`` (from ``IDLE``, ``TRAINING`` or ``COMPLETED``)."""
        self._move(ClientState.FAILED)

    def reset(self) -> None:
        """Move back to ``IDLE`` for the next round (from ``COMPLETED`` or ``FAILED``)."""
        self._move(ClientState.IDLE)
