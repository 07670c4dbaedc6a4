"""gradfed-ipfs: exchange and aggregate federated-learning gradients through IPFS (Kubo).

The public API mirrors the seed crate's ``gradient`` module re-exports (see
``shared/design/seed-api.md``), plus the block stores, CIDs and daemon management it needs.
"""

from __future__ import annotations

import contextlib as _contextlib

from .arrow_ipc import load_gradient_from_arrow, store_gradient_as_arrow
from .backward_pass import (
    AggregationMethod,
    BackwardPassConfig,
    clip_gradient_norm,
    federated_average,
)
from .blockstore import Block, BlockStore, KuboBlockStore, MemoryBlockStore
from .cid import make_cid, parse_cid, verify_cid
from .errors import (
    BlockCorrupt,
    BlockNotFound,
    BlockStoreError,
    BlockTooLarge,
    ChecksumFailed,
    DecodeError,
    DimensionMismatch,
    EmptyGradients,
    EmptyGradientSet,
    GradfedError,
    GradientError,
    IncompatibleDtype,
    InvalidCompressionRatio,
    InvalidGradient,
    MalformedArrow,
    NodeNotFound,
    OutlierDetected,
    PeerNotFound,
    ShapeMismatch,
    StoreUnavailable,
)
from .federated.accumulator import DistributedGradientAccumulator
from .kubo import KuboDaemon, KuboSwarm

__version__ = "0.1.0"

__all__ = [
    "AggregationMethod",
    "BackwardPassConfig",
    "Block",
    "BlockCorrupt",
    "BlockNotFound",
    "BlockStore",
    "BlockStoreError",
    "BlockTooLarge",
    "ChecksumFailed",
    "clip_gradient_norm",
    "DecodeError",
    "DimensionMismatch",
    "DistributedGradientAccumulator",
    "EmptyGradients",
    "EmptyGradientSet",
    "federated_average",
    "GradfedError",
    "GradientError",
    "IncompatibleDtype",
    "InvalidCompressionRatio",
    "InvalidGradient",
    "KuboBlockStore",
    "KuboDaemon",
    "KuboSwarm",
    "load_gradient_from_arrow",
    "make_cid",
    "MalformedArrow",
    "MemoryBlockStore",
    "NodeNotFound",
    "OutlierDetected",
    "parse_cid",
    "PeerNotFound",
    "ShapeMismatch",
    "store_gradient_as_arrow",
    "StoreUnavailable",
    "verify_cid",
]

# Present every export as living in the top-level package (as httpx does), so reprs,
# tracebacks and docs show ``gradfed_ipfs.X`` rather than the private module layout.
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("gradfed_ipfs."):
        with _contextlib.suppress(AttributeError, TypeError):
            _obj.__module__ = "gradfed_ipfs"
del _name, _obj, _contextlib
