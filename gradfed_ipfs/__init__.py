"""gradfed-ipfs: exchange and aggregate federated-learning gradients through IPFS (Kubo).

This is the native API. The layers, from the bottom up (imports only point down):

- :mod:`gradfed_ipfs.errors`, :mod:`gradfed_ipfs.cid`, :mod:`gradfed_ipfs.block`: the one
  exception tree, CIDs, blocks;
- :mod:`gradfed_ipfs.tensor`: pure NumPy gradient types, codecs, aggregation rules,
  verification;
- :mod:`gradfed_ipfs.formats`: bytes to objects and back (Arrow blocks, dag-cbor records,
  announcements), no I/O;
- :mod:`gradfed_ipfs.kubo` (daemons, pubsub) and :mod:`gradfed_ipfs.storage` (block stores,
  chunked gradient DAGs);
- :mod:`gradfed_ipfs.federated` (rounds, privacy, secure aggregation) and
  :mod:`gradfed_ipfs.provenance` (computation graph, checkpoints, round records);
- :mod:`gradfed_ipfs.cli`.

The seed crate's API (``ipfrs-tensorlogic``'s ``gradient`` module, its names and aliases) is in
:mod:`gradfed_ipfs.seed`; nothing here imports it. Every name is listed once in ``__all__``.
"""

from __future__ import annotations

import contextlib as _contextlib

from .block import Block
from .cid import make_cid, parse_cid, verify_cid
from .errors import (
    BlockCorrupt,
    BlockNotFound,
    BlockStoreError,
    BlockTimeout,
    ConfigError,
    DecodeError,
    EmptyError,
    FederatedError,
    GradfedError,
    GradientError,
    InvalidGradient,
    KuboError,
    PrivacyBudgetExhausted,
    PubsubError,
    SecureAggregationError,
    ShapeMismatch,
    StoreUnavailable,
)
from .federated import (
    AccountingMode,
    AccumulatorConfig,
    AgreedConfig,
    AgreedRoundResult,
    AgreedSession,
    DifferentialPrivacy,
    DistributedGradientAccumulator,
    DPMechanism,
    GossipModelSync,
    PrivacyBudget,
    RdpPrivacyAccountant,
    RegionalConfig,
    RegionalRoundResult,
    RegionalSession,
    RobustRule,
    RoundConfig,
    RoundResult,
    RoundRunner,
    RoundStats,
    SecureOptions,
    StreamingAccumulator,
    verify_agreed_history,
    verify_regional_round,
)
from .formats import Announcement, AnnouncementFilter, session_topic
from .kubo import KuboDaemon, KuboPubsub, KuboSwarm, MemoryPubsub, MemoryPubsubBus
from .node import Node
from .provenance import (
    ComputationGraphStore,
    ComputationNode,
    ContributionRef,
    GradientCheckpoint,
    RoundRecord,
    RoundVerification,
    commit_round,
    verify_history,
    verify_round,
)
from .storage import (
    BlockStore,
    ChunkManifest,
    KuboBlockStore,
    MemoryBlockStore,
    Retention,
    RetentionKeeper,
    fetch_gradient,
    put_gradient,
)
from .tensor import (
    CODECS,
    AggregationStrategy,
    BySize,
    Codec,
    Contribution,
    DenseGradient,
    ErrorFeedback,
    FedAvg,
    GradientDelta,
    Int4,
    Int8,
    Krum,
    LayerGradient,
    Mean,
    Median,
    MultiKrum,
    NormBounded,
    QuantizedGradient,
    RandomK,
    SparseGradient,
    Sum,
    TensorDtype,
    TensorMetadata,
    Threshold,
    TopK,
    TopKInt8,
    TrimmedMean,
    WeightedMean,
)
from .training import Client, FederationConfig, History, Peer, run_simulation

__version__ = "0.1.0"

__all__ = [
    "AccountingMode",
    "AccumulatorConfig",
    "AggregationStrategy",
    "AgreedConfig",
    "AgreedRoundResult",
    "AgreedSession",
    "Announcement",
    "AnnouncementFilter",
    "Block",
    "BlockCorrupt",
    "BlockNotFound",
    "BlockStore",
    "BlockStoreError",
    "BlockTimeout",
    "BySize",
    "ChunkManifest",
    "Client",
    "Codec",
    "CODECS",
    "commit_round",
    "ComputationGraphStore",
    "ComputationNode",
    "ConfigError",
    "Contribution",
    "ContributionRef",
    "DecodeError",
    "DenseGradient",
    "DifferentialPrivacy",
    "DistributedGradientAccumulator",
    "DPMechanism",
    "EmptyError",
    "ErrorFeedback",
    "FedAvg",
    "FederatedError",
    "FederationConfig",
    "fetch_gradient",
    "GossipModelSync",
    "GradfedError",
    "GradientCheckpoint",
    "GradientDelta",
    "GradientError",
    "History",
    "Int4",
    "Int8",
    "InvalidGradient",
    "Krum",
    "KuboBlockStore",
    "KuboDaemon",
    "KuboError",
    "KuboPubsub",
    "KuboSwarm",
    "LayerGradient",
    "make_cid",
    "Mean",
    "Median",
    "MemoryBlockStore",
    "MemoryPubsub",
    "MemoryPubsubBus",
    "MultiKrum",
    "Node",
    "NormBounded",
    "parse_cid",
    "Peer",
    "PrivacyBudget",
    "PrivacyBudgetExhausted",
    "PubsubError",
    "put_gradient",
    "QuantizedGradient",
    "RandomK",
    "RdpPrivacyAccountant",
    "RegionalConfig",
    "RegionalRoundResult",
    "RegionalSession",
    "Retention",
    "RetentionKeeper",
    "RobustRule",
    "RoundConfig",
    "RoundRecord",
    "RoundResult",
    "RoundRunner",
    "RoundStats",
    "RoundVerification",
    "run_simulation",
    "SecureAggregationError",
    "SecureOptions",
    "session_topic",
    "ShapeMismatch",
    "SparseGradient",
    "StoreUnavailable",
    "StreamingAccumulator",
    "Sum",
    "TensorDtype",
    "TensorMetadata",
    "Threshold",
    "TopK",
    "TopKInt8",
    "TrimmedMean",
    "verify_agreed_history",
    "verify_cid",
    "verify_history",
    "verify_regional_round",
    "verify_round",
    "WeightedMean",
]

# Present every export as living in the top-level package (as httpx does), so reprs,
# tracebacks and docs show ``gradfed_ipfs.X`` rather than the internal module layout.
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("gradfed_ipfs."):
        with _contextlib.suppress(AttributeError, TypeError):
            _obj.__module__ = "gradfed_ipfs"
del _name, _obj, _contextlib
