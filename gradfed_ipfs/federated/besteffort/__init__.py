"""The best-effort round: :class:`RoundRunner`, the building block under agreed rounds.

Each peer commits its gradient, collects the others' by CID until a deadline and aggregates
what it got. Peers may end on different models when pubsub loses messages; agreed rounds
(:mod:`gradfed_ipfs.federated.agreed`) are the protocol that makes them agree.
Differential privacy and secure aggregation are options of the one :class:`RoundConfig`.
"""

from __future__ import annotations

from .config import RoundConfig, SecureOptions
from .gossip import GossipModelSync
from .result import RoundResult
from .runner import RoundRunner
from .throughput import ThroughputMeter

__all__ = [
    "GossipModelSync",
    "RoundConfig",
    "RoundResult",
    "RoundRunner",
    "SecureOptions",
    "ThroughputMeter",
]
