"""Federated learning over IPFS: rounds, convergence, differential privacy, secure aggregation."""

from __future__ import annotations

from .convergence import ConvergenceConfig, ConvergenceDetector

__all__ = [
    "ConvergenceConfig",
    "ConvergenceDetector",
]
