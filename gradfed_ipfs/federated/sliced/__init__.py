"""The sliced data plane: reduce-scatter of contributions, one slice per reducer.

:func:`~gradfed_ipfs.federated.sliced.plan.plan_slices` cuts a vector into slices,
:class:`ReduceScatterPeer` reduces its slices (one-level or chained) and checks the others',
and a reducer that lies is proven so by a fraud record. Tests and benchmarks make a reducer
misbehave through the :class:`SliceFaults` hooks they pass in (:class:`Lying`, :class:`Silent`).
"""

from __future__ import annotations

from .config import ReduceScatterConfig, ReduceScatterResult
from .faults import Lying, Silent, SliceFaults
from .peer import ReduceScatterPeer
from .transport import MemorySliceBoard, PubsubSliceBoard

__all__ = [
    "Lying",
    "MemorySliceBoard",
    "PubsubSliceBoard",
    "ReduceScatterConfig",
    "ReduceScatterPeer",
    "ReduceScatterResult",
    "Silent",
    "SliceFaults",
]
