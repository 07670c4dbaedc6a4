"""What a DP round's record carries, and how a verifier bounds its claim (issue 15).

Noise cannot be recomputed, so a round record claiming DP noise (``privacy["noise"]`` true)
never verifies: at best it is *unverifiable*, with the residual between the recorded aggregate
and the recomputed pre-noise aggregate consistent with the claimed noise. The ``privacy`` map of
such a record carries (:func:`dp_privacy_claim` builds it)::

    noise             true
    clip              C, the L2 norm every contribution was clipped to before aggregation
    noise_multiplier  z
    noise_std         per-coordinate std of the noise in the recorded aggregate
                      (zC/n for DP-FedAvg over n contributions, zC for the secure sum)
    epsilon_spent     ε spent after this round (the accountant's cumulative figure)
    delta             δ
    accountant_event  the event charged, e.g. {"type": "gaussian", "noise_multiplier": z}
    pre_noise         SecAgg rounds only: a link to the pre-noise aggregate, which the masked
                      contributions hide (a commitment the verifier checks the residual against)

Without these fields the claim cannot be bounded and the record is unverifiable; with them a
verifier re-clips the contributions (or takes ``pre_noise``), and a residual that the claimed
noise cannot explain (:func:`residual_z` beyond :data:`RESIDUAL_Z_MAX`) is a mismatch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from .._types import FloatArray
from ..cid import parse_cid
from ..errors import GradfedError
from ..tensor.aggregation import AggregationStrategy, Contribution, method_name
from ..tensor.robust import clip_to_norm

__all__ = [
    "DP_CLAIM_FIELDS",
    "RESIDUAL_Z_MAX",
    "check_dp_claim",
    "dp_claim_problems",
    "dp_privacy_claim",
    "residual_z",
]

DP_CLAIM_FIELDS: Final = (
    "clip",
    "noise_multiplier",
    "noise_std",
    "epsilon_spent",
    "delta",
    "accountant_event",
)
"""Fields a record claiming DP noise must carry (besides ``noise``)."""
RESIDUAL_Z_MAX: Final = 6.0
"""Largest |z| of the residual's chi-square statistic accepted as the claimed noise."""


def dp_privacy_claim(
    *,
    clip: float,
    noise_multiplier: float,
    noise_std: float,
    epsilon_spent: float,
    delta: float,
    accountant_event: Mapping[str, Any],
    pre_noise_cid: str | None = None,
) -> dict[str, Any]:
    """Return the ``privacy`` map of a DP round's record (see the module docstring).

    Parameters
    ----------
    clip
        L2 clip norm C.
    noise_multiplier
        Gaussian noise multiplier z.
    noise_std
        Per-coordinate noise std in the released aggregate.
    epsilon_spent, delta
        The accountant's cumulative spend after the round.
    accountant_event
        The event charged to the accountant (dag-cbor encodable).
    pre_noise_cid
        SecAgg rounds: the CID of the stored pre-noise aggregate.
    """
    claim: dict[str, Any] = {
        "noise": True,
        "clip": float(clip),
        "noise_multiplier": float(noise_multiplier),
        "noise_std": float(noise_std),
        "epsilon_spent": float(epsilon_spent),
        "delta": float(delta),
        "accountant_event": dict(accountant_event),
    }
    if pre_noise_cid is not None:
        claim["pre_noise"] = parse_cid(pre_noise_cid)
    return claim


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def dp_claim_problems(privacy: Mapping[str, Any]) -> list[str]:
    """Return what keeps a DP claim from being bounded: missing or invalid fields."""
    problems = [key for key in DP_CLAIM_FIELDS if key not in privacy]
    for key in ("clip", "noise_std"):
        if key in privacy and not _positive(privacy[key]):
            problems.append(f"{key} is not a positive number")
    if "accountant_event" in privacy and not isinstance(privacy["accountant_event"], dict):
        problems.append("accountant_event is not a map")
    return problems


def residual_z(recorded: FloatArray, pre_noise: FloatArray, noise_std: float) -> float:
    """Return the z-score of ``sum(r²)/s²`` against chi-square(d), ``r = recorded - pre_noise``.

    Under the claim each of the d residual coordinates is N(0, s²), so ``sum(r²)/s²`` has mean
    d and variance 2d; a z far from 0 (too much or too little noise) refutes the claim.
    """
    residual = recorded.astype(np.float64).reshape(-1) - pre_noise.astype(np.float64).reshape(-1)
    d = residual.size
    if d == 0:
        return 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        statistic = float(np.dot(residual, residual)) / (noise_std * noise_std)
    if not math.isfinite(statistic):
        return math.inf
    return (statistic - d) / math.sqrt(2 * d)


def check_dp_claim(
    privacy: Mapping[str, Any],
    aggregation: AggregationStrategy,
    inputs: Mapping[str, Contribution],
    recorded: FloatArray,
    pre_noise: FloatArray | None,
) -> tuple[bool, str]:
    """Bound a record's DP noise claim against the recomputable part of its aggregate.

    Parameters
    ----------
    privacy
        The record's ``privacy`` map (claims ``noise``).
    aggregation
        The record's strategy, applied to the contributions clipped to ``clip``.
    inputs
        The fetched contributions by peer (unused when ``pre_noise`` is given).
    recorded
        The recorded (noised) aggregate, flat.
    pre_noise
        The committed pre-noise aggregate (SecAgg rounds), or ``None`` to recompute it.

    Returns
    -------
    tuple[bool, str]
        ``(True, why)`` when the claim is refuted (a mismatch), else ``(False, why)``: why the
        round is unverifiable (fields missing, or the residual is consistent with the noise).
    """
    problems = dp_claim_problems(privacy)
    if problems:
        return False, (
            f"the record claims DP noise but {', '.join(problems)} missing or invalid, "
            "so the noise cannot be bounded"
        )
    clip, noise_std = float(privacy["clip"]), float(privacy["noise_std"])
    if pre_noise is not None:
        source = "the committed pre-noise aggregate"
    else:
        try:
            clipped = {
                peer: Contribution.of(clip_to_norm(c.values, clip), c.num_samples)
                for peer, c in inputs.items()
            }
            pre_noise = np.asarray(aggregation.aggregate(clipped), dtype=np.float32)
        except (GradfedError, ValueError, TypeError, ArithmeticError) as exc:
            return True, f"clipped contributions cannot be aggregated: {exc}"
        name = method_name(aggregation) or type(aggregation).__name__
        source = f"the {name} of the contributions clipped to {clip:g}"
    if pre_noise.size != recorded.size:
        return True, f"{source} has {pre_noise.size} values, the aggregate {recorded.size}"
    z = residual_z(recorded, pre_noise, noise_std)
    if not abs(z) <= RESIDUAL_Z_MAX:
        return True, (
            f"the aggregate differs from {source} by more than the claimed "
            f"N(0, {noise_std:.3g}²) noise explains (z = {z:.3g}, limit {RESIDUAL_Z_MAX:g})"
        )
    return False, (
        f"DP noise cannot be recomputed; the residual against {source} is consistent with the "
        f"claimed N(0, {noise_std:.3g}²) (z = {z:.2f}); ε = {privacy['epsilon_spent']}, "
        f"δ = {privacy['delta']}"
    )
