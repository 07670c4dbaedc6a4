"""High-level federated training over agreed rounds (Flower's apps and strategies, serverless).

A :class:`Peer` is given a :class:`Client` (local ``train`` and optional ``evaluate``), a
:class:`ModelAdapter`, the session's initial model, a :class:`Strategy` and a
:class:`FederationConfig`; :meth:`Peer.run` trains every round over the consistent-rounds
protocol and returns a :class:`History`. :func:`run_simulation` runs N peers in one process.
:class:`SecAgg` wraps a strategy so that updates are only ever summed under secure aggregation
(its encoding and phase timeouts: :class:`SecAggSettings`).
See ``docs/flower.md`` for the mapping from Flower's concepts.
"""

from __future__ import annotations

from ..federated.secagg_round import SecAggSettings
from .history import History, RoundEntry
from .metrics import RoundSummary, VectorLayout, robust_mean
from .peer import (
    ArraysAdapter,
    Client,
    EvaluateFn,
    FederationConfig,
    LocalDP,
    ModelAdapter,
    NodeLike,
    Peer,
    TrainFn,
    VectorAdapter,
    training_rule,
)
from .rule import TrainingRule
from .sampling import round_seed, sample_peers
from .secure import SecAgg
from .simulation import run_simulation
from .strategy import (
    ConfigValue,
    DiLoCo,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedProx,
    FedYogi,
    FitResult,
    QFedAvg,
    Robust,
    ServerOptStrategy,
    SparseLoCo,
    Strategy,
)

__all__ = [
    "ArraysAdapter",
    "Client",
    "ConfigValue",
    "DiLoCo",
    "EvaluateFn",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedProx",
    "FedYogi",
    "FederationConfig",
    "FitResult",
    "History",
    "LocalDP",
    "ModelAdapter",
    "NodeLike",
    "Peer",
    "QFedAvg",
    "Robust",
    "RoundEntry",
    "RoundSummary",
    "SecAgg",
    "SecAggSettings",
    "ServerOptStrategy",
    "SparseLoCo",
    "Strategy",
    "TrainFn",
    "TrainingRule",
    "VectorAdapter",
    "VectorLayout",
    "robust_mean",
    "round_seed",
    "run_simulation",
    "sample_peers",
    "training_rule",
]
