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
    ModelUpdate,
    RoundConfig,
    RoundResult,
    RoundRunner,
    RoundStats,
    SecureRoundConfig,
    StreamingAccumulator,
    run_secure_round,
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
    "SecureRoundConfig",
    "StreamingAccumulator",
    "run_secure_round",
]
