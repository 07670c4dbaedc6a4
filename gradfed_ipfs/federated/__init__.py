"""Federated learning over IPFS: rounds, differential privacy and secure aggregation."""

from __future__ import annotations

from .accumulate import (
    AccumulatorConfig,
    DistributedGradientAccumulator,
    GradientAccumulator,
    StreamingAccumulator,
)
from .agreed import (
    AgreedConfig,
    AgreedRoundResult,
    AgreedSession,
    ResyncResult,
    RobustRule,
    verify_agreed_history,
)
from .besteffort import GossipModelSync, RoundConfig, RoundResult, RoundRunner, SecureOptions
from .exchange import ModelUpdate, RoundStats
from .privacy import (
    AccountingMode,
    Calibration,
    DifferentialPrivacy,
    DPMechanism,
    PrivacyBudget,
    RdpPrivacyAccountant,
)
from .regional import RegionalConfig, RegionalRoundResult, RegionalSession, verify_regional_round
from .secagg import SecAggClient, SecAggServer, SecureAggregation
from .secagg_round import SecAggSettings

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
    "SecAggSettings",
    "SecureAggregation",
    "SecureOptions",
    "StreamingAccumulator",
]
