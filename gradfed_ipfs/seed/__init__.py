"""The seed crate's API: ``ipfrs-tensorlogic`` 0.2.0's ``gradient`` module, with its names.

Every name the crate's ``gradient`` module (and its crate root) exports is importable from here,
aliases included (``LegacyBackwardPassCoordinator``, ``GradientPrivacyBudget``, ...), with the
crate's semantics and the fixes DESIGN.md §5 requires. Where the crate's type is also our native
one (``DistributedGradientAccumulator``, ``GossipModelSync``, ``DifferentialPrivacy``, the tensor
types) this package re-exports the native class. The legacy-only pieces (step and pass
coordinators, the GARW block, ``FederatedRound``, ``ModelSyncProtocol``, convergence detection)
live in this package. It imports native code; nothing native imports it.
"""

from __future__ import annotations

from ..errors import (
    ArrowBlockError,
    ComputationGraphError,
    CoordinationError,
    FederatedError,
    GradientError,
)
from ..federated.accumulate import DistributedGradientAccumulator
from ..federated.besteffort import GossipModelSync
from ..federated.exchange import ModelUpdate, RoundStats
from ..federated.privacy import DifferentialPrivacy, DPMechanism, PrivacyBudget
from ..federated.secagg import SecureAggregation
from ..formats.arrow import load_gradient_from_arrow, store_gradient_as_arrow
from ..provenance import ComputationGraphStore, ComputationNode, GradientCheckpoint
from ..storage import Block, BlockStore, MemoryBlockStore
from ..tensor import (
    GradientAggregator,
    GradientCompressor,
    GradientDelta,
    GradientVerifier,
    LayerGradient,
    QuantizedGradient,
    SparseGradient,
    TensorDtype,
    TensorMetadata,
    federated_average_by_region,
    federated_average_in_regions,
    hierarchical_federated_average,
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
from .clients import ClientInfo, ClientState
from .convergence import ConvergenceConfig, ConvergenceDetector
from .coordination import (
    BackwardPassCoordinator,
    BackwardPassId,
    CoordinationStatus,
    GradientContribution,
    PassCoordinator,
)
from .garw import GradientArrowBlock
from .rounds import FederatedRound
from .sync import ModelSyncProtocol

GradientPrivacyBudget = PrivacyBudget
"""The crate root's name for :class:`PrivacyBudget`."""

__all__ = [
    "AggregationMethod",
    "ArrowBlockError",
    "BackwardPassConfig",
    "BackwardPassCoordinator",
    "BackwardPassId",
    "BackwardPassStats",
    "BackwardPassStep",
    "BackwardStepStatus",
    "Block",
    "BlockStore",
    "ClientInfo",
    "ClientState",
    "ComputationGraphError",
    "ComputationGraphStore",
    "ComputationNode",
    "ConvergenceConfig",
    "ConvergenceDetector",
    "CoordinationError",
    "CoordinationStatus",
    "DPMechanism",
    "DifferentialPrivacy",
    "DistributedGradientAccumulator",
    "FederatedError",
    "FederatedRound",
    "GossipModelSync",
    "GradientAggregator",
    "GradientArrowBlock",
    "GradientCheckpoint",
    "GradientCompressor",
    "GradientContribution",
    "GradientDelta",
    "GradientError",
    "GradientPrivacyBudget",
    "GradientVerifier",
    "LayerGradient",
    "LegacyBackwardPassCoordinator",
    "MemoryBlockStore",
    "ModelSyncProtocol",
    "ModelUpdate",
    "PassCoordinator",
    "PrivacyBudget",
    "QuantizedGradient",
    "RoundStats",
    "SecureAggregation",
    "SparseGradient",
    "StepCoordinator",
    "TensorDtype",
    "TensorMetadata",
    "clip_gradient_norm",
    "federated_average",
    "federated_average_by_region",
    "federated_average_in_regions",
    "hierarchical_federated_average",
    "load_gradient_from_arrow",
    "store_gradient_as_arrow",
]
