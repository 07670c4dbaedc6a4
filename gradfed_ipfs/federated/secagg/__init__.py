"""Secure aggregation (Bonawitz et al. 2017): Shamir shares, fixed point, masking, wire."""

from __future__ import annotations

from .fixed_point import FixedPoint, RingArray
from .protocol import SecAggClient, SecAggServer
from .shamir import Share, combine_shares, split_secret
from .simulation import SecAggResult, SecureAggregation

__all__ = [
    "FixedPoint",
    "RingArray",
    "SecAggClient",
    "SecAggResult",
    "SecAggServer",
    "SecureAggregation",
    "Share",
    "combine_shares",
    "split_secret",
]
