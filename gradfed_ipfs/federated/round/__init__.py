"""Rounds over IPFS: one config, one runner (DP and SecAgg as options), one result.

``RoundRunner(store, gossip, RoundConfig(..., dp=..., secure=SecureOptions(...)))`` runs a
round and returns a ``RoundResult``; the accumulators implement one ``GradientAccumulator``
protocol (holding: ``DistributedGradientAccumulator``; streaming: ``StreamingAccumulator``).
"""

from __future__ import annotations

from .accumulator import DistributedGradientAccumulator, GradientAccumulator
from .agreed import AgreedConfig, AgreedRoundResult, AgreedSession, ResyncResult
from .agreed_history import verify_agreed_history
from .agreed_slicing import RobustRule
from .config import DEFAULT_MAX_WEIGHT, AccumulatorConfig, RoundConfig, SecureOptions
from .gossip import GossipModelSync
from .regional import (
    RegionalConfig,
    RegionalRoundResult,
    RegionalSession,
    verify_regional_round,
)
from .result import RoundResult
from .runner import RoundRunner
from .stats import ModelUpdate, RoundStats
from .streaming import StreamingAccumulator
from .throughput import ThroughputMeter

__all__ = [
    "AgreedConfig",
    "AgreedRoundResult",
    "AgreedSession",
    "ResyncResult",
    "RobustRule",
    "verify_agreed_history",
    "RegionalConfig",
    "RegionalRoundResult",
    "RegionalSession",
    "verify_regional_round",
    "DEFAULT_MAX_WEIGHT",
    "AccumulatorConfig",
    "DistributedGradientAccumulator",
    "GossipModelSync",
    "GradientAccumulator",
    "ModelUpdate",
    "RoundConfig",
    "RoundResult",
    "RoundRunner",
    "RoundStats",
    "SecureOptions",
    "StreamingAccumulator",
    "ThroughputMeter",
]
