"""Gradient tensors: types, compression, aggregation and verification (pure NumPy, no I/O).

Modules: ``types`` (layer gradients), ``metadata`` (dtype, tensor metadata), ``delta``
(``GradientDelta``), ``compression`` (the seed's ``GradientCompressor``), ``codecs`` (``Codec``
registry, error feedback), ``packing`` (agreed rounds' compressed contributions),
``aggregation``, ``robust`` (rules; the one clip and norm), ``bulyan``, ``fedopt`` (server
optimizers), ``regional``, ``kernels``, ``verification``, ``adaptive``. Storing a delta is
:mod:`gradfed_ipfs.storage.delta_store`.
"""

from __future__ import annotations

from .adaptive import BySize
from .aggregation import (
    AggregationMethod,
    AggregationStrategy,
    Contribution,
    GradientAggregator,
    Krum,
    Mean,
    Median,
    MultiKrum,
    NormBounded,
    SampleWeightedMean,
    Sum,
    TrimmedMean,
    WeightedMean,
    fedavg,
    gradient_sum,
    mean,
    weighted_mean,
)
from .bulyan import Bulyan, bulyan
from .codecs import (
    CODECS,
    Codec,
    Dense,
    ErrorFeedback,
    Int2,
    Int4,
    Int8,
    QuantizedCodec,
    RandomK,
    Threshold,
    TopK,
    TopKInt2,
    TopKInt8,
)
from .compression import GradientCompressor
from .delta import GradientDelta
from .fedopt import (
    OptimizerState,
    ServerAdagrad,
    ServerAdam,
    ServerMomentum,
    ServerNesterov,
    ServerOptimizer,
    ServerYogi,
    fedprox_gradient,
    qfedavg_update,
)
from .packing import DEFAULT_PACK_BLOCK, PACKED_CODECS, PackedChunk, PackSpec
from .regional import (
    combine_region_means,
    federated_average_by_region,
    federated_average_in_regions,
    hierarchical_federated_average,
    region_mean,
)
from .robust import (
    clip_to_norm,
    coordinate_median,
    krum_scores,
    multikrum_select,
    pairwise_sq_distances,
    trimmed_mean,
)
from .types import (
    DenseGradient,
    LayerGradient,
    QuantizedGradient,
    SparseGradient,
    SparseQuantizedGradient,
    TensorDtype,
    TensorMetadata,
)
from .verification import GradientVerifier, PeerAnomaly, cross_peer_check

__all__ = [
    "combine_region_means",
    "federated_average_by_region",
    "federated_average_in_regions",
    "hierarchical_federated_average",
    "region_mean",
    "Bulyan",
    "ServerAdagrad",
    "ServerAdam",
    "ServerMomentum",
    "ServerNesterov",
    "ServerYogi",
    "OptimizerState",
    "ServerOptimizer",
    "bulyan",
    "fedprox_gradient",
    "qfedavg_update",
    "CODECS",
    "AggregationMethod",
    "AggregationStrategy",
    "BySize",
    "Codec",
    "Contribution",
    "Dense",
    "DenseGradient",
    "ErrorFeedback",
    "SampleWeightedMean",
    "GradientAggregator",
    "GradientCompressor",
    "GradientDelta",
    "GradientVerifier",
    "DEFAULT_PACK_BLOCK",
    "Int2",
    "Int4",
    "Int8",
    "PACKED_CODECS",
    "PackSpec",
    "PackedChunk",
    "Krum",
    "LayerGradient",
    "Mean",
    "Median",
    "MultiKrum",
    "NormBounded",
    "PeerAnomaly",
    "QuantizedCodec",
    "QuantizedGradient",
    "RandomK",
    "SparseGradient",
    "SparseQuantizedGradient",
    "Sum",
    "TensorDtype",
    "TensorMetadata",
    "Threshold",
    "TopK",
    "TopKInt2",
    "TopKInt8",
    "TrimmedMean",
    "WeightedMean",
    "clip_to_norm",
    "coordinate_median",
    "cross_peer_check",
    "fedavg",
    "gradient_sum",
    "krum_scores",
    "mean",
    "multikrum_select",
    "pairwise_sq_distances",
    "trimmed_mean",
    "weighted_mean",
]
