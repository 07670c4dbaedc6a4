"""Rounds over IPFS: accumulators, announcements, and the runner with DP and SecAgg options."""

from __future__ import annotations

from .accumulator import DistributedGradientAccumulator
from .config import AccumulatorConfig
from .gossip import GossipModelSync
from .runner import RoundConfig, RoundResult, RoundRunner
from .secagg import SecureRoundConfig, run_secure_round
from .stats import ModelUpdate, RoundStats
from .streaming import StreamingAccumulator

__all__ = [
    "AccumulatorConfig",
    "DistributedGradientAccumulator",
    "GossipModelSync",
    "ModelUpdate",
    "RoundConfig",
    "RoundResult",
    "RoundRunner",
    "RoundStats",
    "SecureRoundConfig",
    "StreamingAccumulator",
    "run_secure_round",
]
