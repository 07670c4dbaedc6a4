"""Round bookkeeping for a whole training run (seed-api §6.10).

:class:`ModelSyncProtocol` numbers the rounds, enforces the client minimum and the round limit,
and feeds each round's loss to a legacy :class:`~gradfed_ipfs.seed.convergence.
ConvergenceDetector`. Like the seed it moves no model; the global model CID is what the caller
passes. Fixed defect: completing a round twice is refused instead of adding its loss twice.
"""

from __future__ import annotations

import math

from .._types import CIDLike, GradientLike
from ..errors import InvalidGradient
from .convergence import ConvergenceDetector
from .rounds import FederatedRound, RoundStats

__all__ = ["ModelSyncProtocol"]


class ModelSyncProtocol:
    """Round bookkeeping for a training run, with a legacy convergence detector (seed §6.10).

    Parameters
    ----------
    max_rounds
        Maximum number of rounds.
    min_clients_per_round
        Smallest client count a round may start with.
    convergence_window, convergence_threshold
        Window size and coefficient-of-variation threshold of the legacy detector.
    """

    def __init__(
        self,
        max_rounds: int,
        min_clients_per_round: int,
        convergence_window: int,
        convergence_threshold: float,
    ) -> None:
        self._current_round = 0
        self._max_rounds = max_rounds
        self._min_clients = min_clients_per_round
        self._rounds: list[FederatedRound] = []
        self._losses: dict[int, float] = {}
        self.convergence = ConvergenceDetector(convergence_window, convergence_threshold)

    def start_round(self, global_model: CIDLike, client_count: int) -> int:
        """Open the next round; the client minimum is checked before the round limit.

        Parameters
        ----------
        global_model
            CID of the model the round trains from.
        client_count
            Number of participating clients.

        Returns
        -------
        int
            The new round's index.
        """
        if client_count < self._min_clients:
            raise InvalidGradient(
                f"Not enough clients: need {self._min_clients}, got {client_count}"
            )
        if self._current_round >= self._max_rounds:
            raise InvalidGradient(f"Maximum rounds reached: {self._max_rounds}")
        self._rounds.append(FederatedRound(self._current_round, global_model, client_count))
        index = self._current_round
        self._current_round += 1
        return index

    def complete_round(
        self, round_num: int, aggregated_gradient: GradientLike, loss: float
    ) -> None:
        """Complete round ``round_num`` with its aggregate and feed ``loss`` to the detector.

        Parameters
        ----------
        round_num
            Index returned by :meth:`start_round`.
        aggregated_gradient
            The round's aggregate.
        loss
            The round's loss (finite).
        """
        if not 0 <= round_num < len(self._rounds):
            raise InvalidGradient(f"Invalid round number: {round_num}")
        if round_num in self._losses:
            raise InvalidGradient(f"Round {round_num} is already completed")
        if not math.isfinite(loss):
            raise InvalidGradient(f"loss must be finite, got {loss}")
        self._rounds[round_num].complete(aggregated_gradient)
        self.convergence.add_loss(loss)
        self._losses[round_num] = loss

    def should_continue(self) -> bool:
        """Return whether another round should run (rounds left and not converged)."""
        return self._current_round < self._max_rounds and not self.has_converged()

    def has_converged(self) -> bool:
        """Return the legacy detector's verdict."""
        return self.convergence.has_converged()

    def current_round(self) -> int:
        """Return the index the next round will get."""
        return self._current_round

    def total_rounds(self) -> int:
        """Return the number of rounds started."""
        return len(self._rounds)

    def get_round(self, round_num: int) -> FederatedRound | None:
        """Return round ``round_num``, or ``None`` if it does not exist.

        Parameters
        ----------
        round_num
            Round index.

        Returns
        -------
        FederatedRound or None
            The round.
        """
        return self._rounds[round_num] if 0 <= round_num < len(self._rounds) else None

    def latest_loss(self) -> float | None:
        """Return the most recent loss fed to the detector."""
        return self.convergence.latest_loss()

    def max_rounds(self) -> int:
        """Return the round limit."""
        return self._max_rounds

    def stats(self, round_num: int) -> RoundStats:
        """Return :meth:`FederatedRound.stats` of a round, with this protocol's detector.

        Parameters
        ----------
        round_num
            Round index.

        Returns
        -------
        RoundStats
            The round's stats; ``converged`` is the detector's current verdict.
        """
        rnd = self.get_round(round_num)
        if rnd is None:
            raise InvalidGradient(f"Invalid round number: {round_num}")
        return rnd.stats(self.convergence)
