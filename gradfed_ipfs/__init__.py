"""gradfed-ipfs: exchange and aggregate federated-learning gradients through IPFS (Kubo).

The public API mirrors the seed crate's ``gradient`` module re-exports (see
``shared/design/seed-api.md``), plus block stores, CIDs, daemon management, robust aggregation,
compression codecs and verifiable round records. Every name is listed once in ``__all__``.
"""

from __future__ import annotations

import contextlib as _contextlib

from .announcement import (
    Announcement,
    AnnouncementFilter,
)
from .arrow_ipc import (
    load_gradient_from_arrow,
    load_layer_from_arrow,
    store_gradient_as_arrow,
    store_layer_as_arrow,
)
from .backward_pass import (
    AggregationMethod,
    BackwardPassConfig,
    BackwardPassStats,
    BackwardPassStep,
    BackwardStepStatus,
    LegacyBackwardPassCoordinator,
    StepCoordinator,
    clip_gradient_norm,
    federated_average,
)
from .blockstore import (
    Block,
    BlockStore,
    KuboBlockStore,
    MemoryBlockStore,
)
from .checkpoint import (
    GradientCheckpoint,
)
from .cid import (
    make_cid,
    parse_cid,
    verify_cid,
)
from .computation_graph import (
    ComputationGraphStore,
    ComputationNode,
)
from .coordination import (
    BackwardPassCoordinator,
    BackwardPassId,
    CoordinationStatus,
    GradientContribution,
    PassCoordinator,
)
from .dag import (
    ChunkManifest,
    fetch_gradient,
    put_gradient,
)
from .errors import (
    ArrowBlockError,
    ArrowBlockShapeMismatch,
    BlockCorrupt,
    BlockNotFound,
    BlockStoreError,
    BlockTooLarge,
    ChecksumFailed,
    CircularDependency,
    ClientNotFound,
    ComputationGraphError,
    CoordinationError,
    DecodeError,
    DimensionMismatch,
    EmptyGradients,
    EmptyGradientSet,
    EmptyInput,
    FederatedDimensionMismatch,
    FederatedError,
    GradfedError,
    GradientError,
    GraphIoError,
    GraphNodeNotFound,
    GraphSerializationError,
    IncompatibleDtype,
    InvalidCompressionRatio,
    InvalidGradient,
    InvalidMagic,
    KuboError,
    KuboNotInstalled,
    KuboStartError,
    MalformedAnnouncement,
    MalformedArrow,
    MalformedManifest,
    NoContributions,
    NodeNotFound,
    NotStarted,
    OutlierDetected,
    PassAlreadyTerminal,
    PassNotFound,
    PeerNotFound,
    PrivacyBudgetExhausted,
    PubsubError,
    PubsubRequestError,
    PubsubUnavailable,
    SecureAggregationError,
    ShapeMismatch,
    StoreRequestError,
    StoreUnavailable,
    TruncatedData,
)
from .federated.accountant import (
    PrivacyBudget,
    RdpPrivacyAccountant,
)
from .federated.accumulator import (
    DistributedGradientAccumulator,
)
from .federated.clients import (
    ClientInfo,
    ClientState,
)
from .federated.convergence import (
    ConvergenceConfig,
    ConvergenceDetector,
)
from .federated.gossip import (
    GossipModelSync,
)
from .federated.privacy import (
    AccountingMode,
    Calibration,
    DifferentialPrivacy,
    DPMechanism,
)
from .federated.rounds import (
    FederatedRound,
    ModelUpdate,
    RoundStats,
)
from .federated.runner import (
    RoundConfig,
    RoundResult,
    RoundRunner,
)
from .federated.secure_aggregation import (
    SecAggClient,
    SecAggServer,
    SecureAggregation,
)
from .federated.streaming import (
    StreamingAccumulator,
)
from .federated.sync import (
    ModelSyncProtocol,
)
from .garw import (
    GradientArrowBlock,
)
from .kubo import (
    KuboDaemon,
    KuboSwarm,
)
from .pubsub import (
    KuboPubsub,
    MemoryPubsub,
    MemoryPubsubBus,
    session_topic,
)
from .round_record import (
    RoundRecord,
    RoundVerification,
    commit_round,
    verify_history,
    verify_round,
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
    GradientAggregator,
    GradientCompressor,
    GradientDelta,
    GradientVerifier,
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

GradientPrivacyBudget = PrivacyBudget
"""The seed's crate-root name for :class:`PrivacyBudget`."""

__version__ = "0.1.0"

__all__ = [
    "AccountingMode",
    "AggregationMethod",
    "AggregationStrategy",
    "Announcement",
    "AnnouncementFilter",
    "ArrowBlockError",
    "ArrowBlockShapeMismatch",
    "BackwardPassConfig",
    "BackwardPassCoordinator",
    "BackwardPassId",
    "BackwardPassStats",
    "BackwardPassStep",
    "BackwardStepStatus",
    "Block",
    "BlockCorrupt",
    "BlockNotFound",
    "BlockStore",
    "BlockStoreError",
    "BlockTooLarge",
    "BySize",
    "Calibration",
    "ChecksumFailed",
    "ChunkManifest",
    "CircularDependency",
    "ClientInfo",
    "ClientNotFound",
    "ClientState",
    "clip_gradient_norm",
    "Codec",
    "CODECS",
    "commit_round",
    "ComputationGraphError",
    "ComputationGraphStore",
    "ComputationNode",
    "Contribution",
    "ConvergenceConfig",
    "ConvergenceDetector",
    "CoordinationError",
    "CoordinationStatus",
    "DecodeError",
    "DenseGradient",
    "DifferentialPrivacy",
    "DimensionMismatch",
    "DistributedGradientAccumulator",
    "DPMechanism",
    "EmptyGradients",
    "EmptyGradientSet",
    "EmptyInput",
    "ErrorFeedback",
    "FedAvg",
    "federated_average",
    "FederatedDimensionMismatch",
    "FederatedError",
    "FederatedRound",
    "fetch_gradient",
    "GossipModelSync",
    "GradfedError",
    "GradientAggregator",
    "GradientArrowBlock",
    "GradientCheckpoint",
    "GradientCompressor",
    "GradientContribution",
    "GradientDelta",
    "GradientError",
    "GradientPrivacyBudget",
    "GradientVerifier",
    "GraphIoError",
    "GraphNodeNotFound",
    "GraphSerializationError",
    "IncompatibleDtype",
    "Int4",
    "Int8",
    "InvalidCompressionRatio",
    "InvalidGradient",
    "InvalidMagic",
    "Krum",
    "KuboBlockStore",
    "KuboDaemon",
    "KuboError",
    "KuboNotInstalled",
    "KuboPubsub",
    "KuboStartError",
    "KuboSwarm",
    "LayerGradient",
    "LegacyBackwardPassCoordinator",
    "load_gradient_from_arrow",
    "load_layer_from_arrow",
    "make_cid",
    "MalformedAnnouncement",
    "MalformedArrow",
    "MalformedManifest",
    "Mean",
    "Median",
    "MemoryBlockStore",
    "MemoryPubsub",
    "MemoryPubsubBus",
    "ModelSyncProtocol",
    "ModelUpdate",
    "MultiKrum",
    "NoContributions",
    "NodeNotFound",
    "NormBounded",
    "NotStarted",
    "OutlierDetected",
    "parse_cid",
    "PassAlreadyTerminal",
    "PassCoordinator",
    "PassNotFound",
    "PeerNotFound",
    "PrivacyBudget",
    "PrivacyBudgetExhausted",
    "PubsubError",
    "PubsubRequestError",
    "PubsubUnavailable",
    "put_gradient",
    "QuantizedGradient",
    "RandomK",
    "RdpPrivacyAccountant",
    "RoundConfig",
    "RoundRecord",
    "RoundResult",
    "RoundRunner",
    "RoundStats",
    "RoundVerification",
    "SecAggClient",
    "SecAggServer",
    "SecureAggregation",
    "SecureAggregationError",
    "session_topic",
    "ShapeMismatch",
    "SparseGradient",
    "StepCoordinator",
    "store_gradient_as_arrow",
    "store_layer_as_arrow",
    "StoreRequestError",
    "StoreUnavailable",
    "StreamingAccumulator",
    "Sum",
    "TensorDtype",
    "TensorMetadata",
    "Threshold",
    "TopK",
    "TopKInt8",
    "TrimmedMean",
    "TruncatedData",
    "verify_cid",
    "verify_history",
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
