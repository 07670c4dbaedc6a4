"""Accumulators: one protocol, holding, streaming and regional accumulators, and their config.

An accumulator takes peers' contributions by CID, checks them and aggregates them in NumPy.
:class:`GradientAccumulator` is the protocol; :class:`DistributedGradientAccumulator` holds every
contribution until the round's aggregate, :class:`StreamingAccumulator` folds each one in as it
arrives; either can keep per-region sums for regional rounds
(:mod:`~gradfed_ipfs.federated.accumulate.regional`).
"""

from __future__ import annotations

from .accumulator import DistributedGradientAccumulator, GradientAccumulator
from .config import DEFAULT_MAX_WEIGHT, AccumulatorConfig
from .streaming import StreamingAccumulator

__all__ = [
    "DEFAULT_MAX_WEIGHT",
    "AccumulatorConfig",
    "DistributedGradientAccumulator",
    "GradientAccumulator",
    "StreamingAccumulator",
]
