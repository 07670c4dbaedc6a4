"""Deterministic participant sampling: every peer computes the same sample for a round.

The round's seed is ``sha256(session, genesis, round, base model CID)``; members are ranked
by ``sha256(seed, peer)`` and the first ``max(min_fit, ceil(fraction · N))`` are sampled.
Nobody can steer it without changing the agreed base model, and no message is needed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from multiformats import CID

from ..errors import ConfigError

__all__ = ["round_seed", "sample_peers", "sample_size"]


def round_seed(session: str, genesis: CID, round_number: int, base: CID) -> bytes:
    """Return the 32-byte seed of a round (a hash of what every peer agrees on)."""
    h = hashlib.sha256(b"gradfed/v1/sample\0")
    for part in (session.encode(), bytes(genesis), str(round_number).encode(), bytes(base)):
        h.update(len(part).to_bytes(4, "big") + part)
    return h.digest()


def sample_size(members: int, fraction: float, min_fit: int) -> int:
    """Return ``min(members, max(min_fit, ceil(fraction · members)))``.

    Raises
    ------
    ConfigError
        If ``fraction`` is not in (0, 1] or ``min_fit < 1``.
    """
    if not (0.0 < fraction <= 1.0):
        raise ConfigError(f"fraction must be in (0, 1], got {fraction}")
    if min_fit < 1:
        raise ConfigError(f"min_fit must be >= 1, got {min_fit}")
    return min(members, max(min_fit, math.ceil(fraction * members - 1e-9)))


def sample_peers(
    seed: bytes, members: Sequence[str], fraction: float, min_fit: int = 1
) -> tuple[str, ...]:
    """Return the sampled members for ``seed``, sorted."""
    k = sample_size(len(members), fraction, min_fit)
    ranked = sorted(members, key=lambda p: hashlib.sha256(seed + p.encode()).digest())
    return tuple(sorted(ranked[:k]))
