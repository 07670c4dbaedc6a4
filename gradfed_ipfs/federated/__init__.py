"""Federated learning over IPFS: rounds, differential privacy and secure aggregation."""

from __future__ import annotations

from .privacy import (
    AccountingMode,
    Calibration,
    DifferentialPrivacy,
    DPMechanism,
    PrivacyBudget,
    RdpPrivacyAccountant,
)
from .round import (
    AccumulatorConfig,
    DistributedGradientAccumulator,
    GossipModelSync,
    GradientAccumulator,
    ModelUpdate,
    RoundConfig,
    RoundResult,
    RoundRunner,
    RoundStats,
    SecureOptions,
    StreamingAccumulator,
)
from .secagg import SecAggClient, SecAggServer, SecureAggregation

__all__ = [
    "AccountingMode",
    "AccumulatorConfig",
    "Calibration",
    "DPMechanism",
    "DifferentialPrivacy",
    "DistributedGradientAccumulator",
    "GossipModelSync",
    "GradientAccumulator",
    "ModelUpdate",
    "PrivacyBudget",
    "RdpPrivacyAccountant",
    "RoundConfig",
    "RoundResult",
    "RoundRunner",
    "RoundStats",
    "SecAggClient",
    "SecAggServer",
    "SecureAggregation",
    "SecureOptions",
    "StreamingAccumulator",
]
