"""Differential privacy: Gaussian and Laplace mechanisms and an RDP accountant."""

from __future__ import annotations

from .accountant import PrivacyBudget, RdpPrivacyAccountant
from .mechanisms import AccountingMode, Calibration, DifferentialPrivacy, DPMechanism

__all__ = [
    "AccountingMode",
    "Calibration",
    "DPMechanism",
    "DifferentialPrivacy",
    "PrivacyBudget",
    "RdpPrivacyAccountant",
]
