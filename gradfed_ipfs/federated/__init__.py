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
    AgreedConfig,
    AgreedRoundResult,
    AgreedSession,
    DistributedGradientAccumulator,
    GossipModelSync,
    GradientAccumulator,
    ModelUpdate,
    ResyncResult,
    RobustRule,
    RoundConfig,
    RoundResult,
    RoundRunner,
    RoundStats,
    SecureOptions,
    StreamingAccumulator,
    verify_agreed_history,
)
from .secagg import SecAggClient, SecAggServer, SecureAggregation

__all__ = [
    "AgreedConfig",
    "AgreedRoundResult",
    "AgreedSession",
    "ResyncResult",
    "RobustRule",
    "verify_agreed_history",
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
