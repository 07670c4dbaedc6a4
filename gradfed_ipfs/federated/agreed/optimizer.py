"""A server optimizer as an agreed round's update rule (no training API needed).

:class:`OptimizerRule` turns any :class:`~gradfed_ipfs.tensor.fedopt.ServerOptimizer`
(``ServerNesterov`` for DiLoCo's outer step, ``ServerAdam``, ``ServerMomentum``, …) into an
:class:`~.config.UpdateRule`: the roster's weighted mean ``Δ = lr · Σ (w_i/W) g_i`` is the
optimizer's pseudo-gradient, and its state (moments and step count, one float32 vector from
:func:`~gradfed_ipfs.tensor.fedopt.encode_optimizer_state`) is stored as a block whose CID the
round record names. The math is :func:`~gradfed_ipfs.tensor.fedopt.optimizer_round`, the same
as the training strategies' (:class:`gradfed_ipfs.training.ServerOptStrategy`), so a verifier
given the same rule re-computes every round bit for bit (:func:`~.history.verify_agreed_history`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..._types import FloatArray
from ...formats.agreed.roster import Roster
from ...tensor.fedopt import ServerOptimizer, optimizer_round

__all__ = ["OptimizerRule"]


@dataclass(frozen=True)
class OptimizerRule:
    """An agreed round's update rule: a server optimizer stepped by the roster's weighted mean.

    Every member (and a verifier) must use an equal optimizer: its ``repr`` (name and
    hyperparameters) is the round record's ``rule``. The rule forces all-to-all rounds (its
    label is no slice rule).

    Attributes
    ----------
    optimizer
        E.g. ``ServerNesterov()`` (DiLoCo's outer step) or ``ServerAdam()``.
    """

    optimizer: ServerOptimizer

    def label(self, round_number: int) -> str:
        """Return the optimizer's ``repr``, e.g. ``ServerNesterov(learning_rate=0.7, ...)``."""
        return repr(self.optimizer)[:256]

    def apply(
        self,
        model: FloatArray,
        roster: Roster,
        gradients: Sequence[FloatArray],
        learning_rate: float,
        state: FloatArray | None,
    ) -> tuple[FloatArray, FloatArray | None]:
        """Return the optimizer's step on ``model`` (float32 ``(d,)``) and its encoded state.

        Raises
        ------
        InvalidGradient
            If ``state`` does not fit ``d`` params (a state from another session), or the
            aggregate is not finite: the round fails on every peer alike.
        """
        weights = [entry.weight for entry in roster.entries]
        return optimizer_round(self.optimizer, model, gradients, weights, learning_rate, state)
