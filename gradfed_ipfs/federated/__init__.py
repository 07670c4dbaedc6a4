"""Federated learning over IPFS: rounds, convergence, differential privacy, secure aggregation."""

from __future__ import annotations

from .accountant import PrivacyBudget, RdpPrivacyAccountant
from .clients import ClientInfo, ClientState
from .convergence import ConvergenceConfig, ConvergenceDetector
from .privacy import AccountingMode, Calibration, DifferentialPrivacy, DPMechanism
from .rounds import FederatedRound, ModelUpdate, RoundStats
from .secure_aggregation import SecAggClient, SecAggServer, SecureAggregation
from .sync import ModelSyncProtocol

__all__ = [
    "AccountingMode",
    "Calibration",
    "ClientInfo",
    "ClientState",
    "ConvergenceConfig",
    "ConvergenceDetector",
    "DPMechanism",
    "DifferentialPrivacy",
    "FederatedRound",
    "ModelSyncProtocol",
    "ModelUpdate",
    "PrivacyBudget",
    "RdpPrivacyAccountant",
    "RoundStats",
    "SecAggClient",
    "SecAggServer",
    "SecureAggregation",
]
