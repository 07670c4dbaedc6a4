"""Client-level DP-FedAvg for :class:`~gradfed_ipfs.federated.besteffort.runner.RoundRunner` rounds.

McMahan et al. 2018 (https://arxiv.org/abs/1710.06963), on one node's view of a round:

1. clip every contribution (the local gradient and each peer's) to L2 norm C;
2. sum them with *equal* weights and add N(0, (zC)²) per coordinate (z: noise multiplier);
3. divide by the number n of contributions, so the mean carries N(0, (zC/n)²) noise.

The arithmetic is :meth:`~gradfed_ipfs.DifferentialPrivacy.dp_fedavg` (clipping
by :func:`~gradfed_ipfs.federated.privacy.mechanisms.clip_l2_norm`, noise by
:func:`~gradfed_ipfs.federated.privacy.mechanisms.dp_noised_sum`), and the accounting is its
``dp_accounting`` RDP accountant: the Gaussian event is checked against the budget before any
noise is drawn and composed before the aggregate is returned; a release that does not fit raises
:class:`~gradfed_ipfs.errors.PrivacyBudgetExhausted` and returns nothing. This module only adapts
an accumulator's contributions to it and checks that a runner can use it.

Why equal weights: the sum's sensitivity is C only if every client's term is bounded by C.
FedAvg's sample-count weights n_k / Σn make one client's term as large as its (self-announced,
unbounded) sample count allows, which voids the bound; announced sample counts are ignored here.

What the reported ε covers: this node's released aggregate, at the budget's δ. Peers see each
other's raw gradients on IPFS (this is central DP with every node as a trusted aggregator; hide
individual updates with secure aggregation). Each node draws its own noise, so if several nodes
publish their aggregates of the same round, those releases compose: the total is not this ε.
The number of contributions n is public (announcements are on pubsub), so dividing by it is
post-processing.
"""

from __future__ import annotations

from ..._types import FloatArray
from ...errors import InvalidGradient, PrivacyBudgetExhausted
from ..accumulate.accumulator import GradientAccumulator
from ..privacy.mechanisms import AccountingMode, DifferentialPrivacy, DPMechanism

__all__ = ["check_dp_round", "dp_round_aggregate"]


def check_dp_round(dp: DifferentialPrivacy, accumulator: GradientAccumulator) -> None:
    """Refuse a DP round before anything is committed or announced.

    Parameters
    ----------
    dp
        The mechanism; it must use RDP accounting.
    accumulator
        The round's accumulator; it must hold contributions (``holds_contributions``; a
        streaming accumulator folds them into one sum and cannot clip each one).

    Raises
    ------
    InvalidGradient
        If ``dp`` uses legacy (flat ε/100) accounting or the accumulator holds no
        contributions.
    PrivacyBudgetExhausted
        If one more Gaussian release would exceed the budget.
    """
    if dp.accounting is not AccountingMode.RDP:
        raise InvalidGradient("DP rounds need RDP accounting (legacy ε/100 is no guarantee)")
    if not accumulator.holds_contributions:
        raise InvalidGradient(
            f"DP rounds need an accumulator holding each contribution, not "
            f"{type(accumulator).__name__}"
        )
    if not dp.budget.can_afford(dp.release_event(DPMechanism.GAUSSIAN)):
        raise PrivacyBudgetExhausted(
            f"Privacy budget exhausted: one more DP round would exceed "
            f"epsilon={dp.budget.epsilon:g} at delta={dp.budget.delta:g}"
        )


def dp_round_aggregate(
    dp: DifferentialPrivacy, accumulator: GradientAccumulator
) -> tuple[FloatArray, float, float]:
    """Return the DP-FedAvg aggregate of the held contributions and the (ε, δ) spent so far.

    Parameters
    ----------
    dp
        The mechanism: its ``sensitivity`` is the clip norm C, its Gaussian noise multiplier z,
        its budget and accountant are charged one Gaussian event (Poisson-subsampled at its
        ``sampling_rate`` when < 1).
    accumulator
        Holds the local and peer gradients; sample counts are ignored (equal weights).

    Returns
    -------
    tuple
        ``(aggregate, epsilon_spent, delta_spent)``: the float32 mean of the clipped
        contributions plus N(0, (zC/n)²) noise, and the cumulative spend after this release.

    Raises
    ------
    PrivacyBudgetExhausted
        If the release does not fit; nothing is charged or returned.
    """
    vectors = {peer: c.values for peer, c in accumulator.contributions().items()}
    aggregate = dp.dp_fedavg(vectors, clip_norm=dp.sensitivity)
    epsilon, delta = dp.spent()
    return aggregate, epsilon, delta
