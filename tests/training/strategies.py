"""Strategies by name, for test peer processes (each process builds its own instance)."""

from __future__ import annotations

from gradfed_ipfs.tensor import Median
from gradfed_ipfs.training import (
    DiLoCo,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedProx,
    FedYogi,
    QFedAvg,
    Robust,
    SparseLoCo,
    Strategy,
)


def make_strategy(name: str) -> Strategy:
    """Return a fresh strategy: ``fedavg``, ``fedprox``, ``fedavgm``, ``fedadam``, ..."""
    factories = {
        "fedavg": FedAvg,
        "fedprox": lambda: FedProx(proximal_mu=0.1),
        "fedavgm": lambda: FedAvgM(server_momentum=0.5),
        "fedadagrad": FedAdagrad,
        "fedadam": lambda: FedAdam(eta=0.05),
        "fedyogi": FedYogi,
        "qfedavg": lambda: QFedAvg(q=0.2, client_learning_rate=0.5),
        "median": lambda: Robust(Median()),
        "diloco": DiLoCo,
        "sparseloco": SparseLoCo,
    }
    return factories[name]()  # type: ignore[no-any-return]
