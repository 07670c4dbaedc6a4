"""Provenance: the CID-linked computation graph, checkpoints, and verifiable round records."""

from __future__ import annotations

from .checkpoint import GradientCheckpoint
from .graph import (
    ComputationGraphStore,
    ComputationNode,
    load_graph,
    provenance_chain_from_store,
    save_graph,
)
from .round_record import (
    ContributionRef,
    RoundRecord,
    RoundVerification,
    commit_round,
    verify_history,
    verify_round,
)

__all__ = [
    "ComputationGraphStore",
    "ComputationNode",
    "ContributionRef",
    "GradientCheckpoint",
    "RoundRecord",
    "RoundVerification",
    "commit_round",
    "load_graph",
    "provenance_chain_from_store",
    "save_graph",
    "verify_history",
    "verify_round",
]
