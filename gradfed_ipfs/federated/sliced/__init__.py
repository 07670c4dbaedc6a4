"""The sliced data plane: reduce-scatter of contributions, one slice per reducer.

:func:`~gradfed_ipfs.federated.sliced.plan.plan_slices` cuts a vector into slices,
:class:`ReduceScatterPeer` reduces its slices (one-level or chained) and checks the others',
and a reducer that lies is proven so by a fraud record.
"""

from __future__ import annotations

from .config import ReduceScatterConfig, ReduceScatterResult
from .peer import ReduceScatterPeer
from .transport import MemorySliceBoard, PubsubSliceBoard

__all__ = [
    "MemorySliceBoard",
    "PubsubSliceBoard",
    "ReduceScatterConfig",
    "ReduceScatterPeer",
    "ReduceScatterResult",
]
