"""Strategies: how the agreed round turns the trainers' updates into the next global model.

A strategy is a small object every peer holds the same copy of: it is applied by every peer
to the agreed roster (bit-identically: each rule here is element-wise float64 math or the
deterministic weighted mean), and its state (a server optimizer's moments) is a vector whose
CID the round record names. The math lives in :mod:`gradfed_ipfs.tensor`; this module only
wires it:

- :class:`FedAvg`: ``x ← x + lr · Σ (n_i/N) Δ_i`` (the agreed session's default rule);
- :class:`FedProx`: FedAvg, plus ``proximal_mu`` in every client's config (clients add
  :func:`~gradfed_ipfs.tensor.fedopt.fedprox_gradient` to their gradients);
- :class:`FedAvgM`, :class:`FedAdagrad`, :class:`FedAdam`, :class:`FedYogi`: the weighted mean
  is a pseudo-gradient for a :class:`~gradfed_ipfs.tensor.fedopt.ServerOptimizer`;
- :class:`DiLoCo`: DiLoCo's outer step, Nesterov momentum on the pseudo-gradient
  (:class:`~gradfed_ipfs.tensor.fedopt.ServerNesterov`); :class:`SparseLoCo`: SparseLoCo's
  outer step ``x ← x + outer_lr · mean``, no outer momentum (its error feedback is the
  compression's);
- :class:`QFedAvg`: q-FFL's update, weighting by each trainer's loss on the global model;
- :class:`Robust`: any robust rule of :mod:`gradfed_ipfs.tensor` (``Median``,
  ``TrimmedMean``, ``Krum``, ``MultiKrum``, ``Bulyan``); sample counts are not used.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

import numpy as np

from .._types import FloatArray
from ..errors import ConfigError
from ..tensor import fedopt
from ..tensor.aggregation import AggregationStrategy, Contribution, method_name
from ..tensor.deterministic import deterministic_update
from ..tensor.fedopt import decode_optimizer_state, encode_optimizer_state

__all__ = [
    "ConfigValue",
    "DiLoCo",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedProx",
    "FedYogi",
    "FitResult",
    "QFedAvg",
    "Robust",
    "ServerOptStrategy",
    "SparseLoCo",
    "Strategy",
    "decode_optimizer_state",
    "encode_optimizer_state",
]

ConfigValue: TypeAlias = bool | int | float | str | bytes
"""A value of a round's client config (dag-cbor scalars)."""


@dataclass(frozen=True)
class FitResult:
    """One trainer's result in a round, in roster order.

    Attributes
    ----------
    peer
        Its peer ID.
    update
        ``local - global``, float32 ``(d,)``.
    weight
        Its roster weight (training samples).
    loss
        Its evaluation loss of the round's base model (``None`` without ``evaluate``).
    """

    peer: str
    update: FloatArray
    weight: int
    loss: float | None = None


class Strategy(ABC):
    """How a round's fit results move the global model (see the module docstring)."""

    name: ClassVar[str] = "strategy"

    def fit_config(self, server_round: int) -> dict[str, ConfigValue]:
        """Return what this strategy adds to the clients' config of ``server_round``."""
        return {}

    @abstractmethod
    def aggregate(
        self,
        params: FloatArray,
        fits: Sequence[FitResult],
        learning_rate: float,
        state: FloatArray | None,
    ) -> tuple[FloatArray, FloatArray | None]:
        """Return the new float32 params ``(d,)`` and state (``None``: stateless).

        ``fits`` is non-empty and in roster order; ``state`` is the previous round's.
        """


class FedAvg(Strategy):
    """Sample-weighted mean of the updates (McMahan et al. 2017)."""

    name: ClassVar[str] = "fedavg"

    def aggregate(
        self,
        params: FloatArray,
        fits: Sequence[FitResult],
        learning_rate: float,
        state: FloatArray | None,
    ) -> tuple[FloatArray, FloatArray | None]:
        """Return ``float32(x + lr · Σ (n_i/N) Δ_i)`` (deterministic order and precision)."""
        updates = [f.update for f in fits]
        return deterministic_update(params, updates, [f.weight for f in fits], learning_rate), None


@dataclass(frozen=True)
class FedProx(FedAvg):
    """FedAvg whose clients add ``μ/2 ‖w - w_global‖²`` to their loss (Li et al. 2020).

    Every client's config carries ``proximal_mu``; a client applies it with
    :func:`~gradfed_ipfs.tensor.fedopt.fedprox_gradient`.
    """

    name: ClassVar[str] = "fedprox"
    proximal_mu: float = 0.01

    def __post_init__(self) -> None:
        if not (math.isfinite(self.proximal_mu) and self.proximal_mu >= 0):
            raise ConfigError(f"proximal_mu must be finite and >= 0, got {self.proximal_mu}")

    def fit_config(self, server_round: int) -> dict[str, ConfigValue]:
        """Return ``{"proximal_mu": μ}``."""
        return {"proximal_mu": float(self.proximal_mu)}


class ServerOptStrategy(Strategy):
    """The weighted mean ``Δ = lr · Σ (n_i/N) Δ_i`` fed to a server optimizer as a gradient.

    Parameters
    ----------
    optimizer
        Any :class:`~gradfed_ipfs.tensor.fedopt.ServerOptimizer`.
    """

    def __init__(self, optimizer: fedopt.ServerOptimizer) -> None:
        self.optimizer = optimizer
        self.name = optimizer.name  # type: ignore[misc]  # the instance names its optimizer

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optimizer!r})"

    def aggregate(
        self,
        params: FloatArray,
        fits: Sequence[FitResult],
        learning_rate: float,
        state: FloatArray | None,
    ) -> tuple[FloatArray, FloatArray | None]:
        """Return the optimizer's step from the previous state (decoded from ``state``)."""
        updates, weights = [f.update for f in fits], [f.weight for f in fits]
        return fedopt.optimizer_round(
            self.optimizer, params, updates, weights, learning_rate, state
        )


class FedAvgM(ServerOptStrategy):
    """FedAvg with server momentum: ``v ← β v + Δ``; ``x ← x + η v`` (Flower's defaults)."""

    def __init__(self, *, server_learning_rate: float = 1.0, server_momentum: float = 0.0) -> None:
        super().__init__(fedopt.ServerMomentum(server_learning_rate, server_momentum))


class FedAdagrad(ServerOptStrategy):
    """FedAdagrad (Reddi et al. 2021); defaults as Flower's (η=0.1, β₁=0, τ=1e-9)."""

    def __init__(
        self, *, eta: float = 0.1, beta_1: float = 0.0, beta_2: float = 0.99, tau: float = 1e-9
    ) -> None:
        super().__init__(fedopt.ServerAdagrad(eta, beta_1, beta_2, tau))


class FedAdam(ServerOptStrategy):
    """FedAdam (Reddi et al. 2021); defaults as Flower's (η=0.1, β₁=0.9, β₂=0.99, τ=1e-9)."""

    def __init__(
        self, *, eta: float = 0.1, beta_1: float = 0.9, beta_2: float = 0.99, tau: float = 1e-9
    ) -> None:
        super().__init__(fedopt.ServerAdam(eta, beta_1, beta_2, tau))


class FedYogi(ServerOptStrategy):
    """FedYogi (Reddi et al. 2021); defaults as Flower's (η=0.01, τ=1e-3)."""

    def __init__(
        self, *, eta: float = 0.01, beta_1: float = 0.9, beta_2: float = 0.99, tau: float = 1e-3
    ) -> None:
        super().__init__(fedopt.ServerYogi(eta, beta_1, beta_2, tau))


class DiLoCo(ServerOptStrategy):
    """DiLoCo's outer optimizer: SGD with Nesterov momentum.

    Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language Models",
    https://arxiv.org/abs/2311.08105.

    Each round's ``Δ = lr · Σ (n_i/N) Δ_i`` is the negative pseudo-gradient; the step is
    ``torch.optim.SGD(lr=outer_lr, momentum=momentum, nesterov=True)`` on ``g = −Δ``
    (:class:`~gradfed_ipfs.tensor.fedopt.ServerNesterov`). The inner loop (H local steps) is
    the client's ``train``. Defaults are OpenDiLoCo's (``outer_lr`` 0.7, ``momentum`` 0.9).
    """

    def __init__(self, outer_lr: float = 0.7, momentum: float = 0.9) -> None:
        super().__init__(fedopt.ServerNesterov(outer_lr, momentum))
        self.name = "diloco"  # type: ignore[misc]  # the strategy, not its optimizer


@dataclass(frozen=True)
class SparseLoCo(Strategy):
    """SparseLoCo's outer step: ``x ← x + lr · outer_lr · Σ (n_i/N) Δ_i``.

    Sarfi et al. 2025, "Communication Efficient LLM Pre-training with SparseLoCo",
    https://arxiv.org/abs/2508.15706.

    No outer momentum: SparseLoCo replaces it with error feedback on the compressed updates,
    which lives where the compression does, on each peer before its update is sent (an agreed
    session's compression settings). Paired with a top-k, 2-bit compression with error feedback,
    this is SparseLoCo; with dense updates it is FedAvg scaled by ``outer_lr``. With
    ``outer_lr`` 1.0 it gives FedAvg's bits. Stateless.

    Attributes
    ----------
    outer_lr
        Factor of the mean of the updates (finite, > 0; default 1.0).
    """

    name: ClassVar[str] = "sparseloco"
    outer_lr: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.outer_lr) and self.outer_lr > 0):
            raise ConfigError(f"outer_lr must be finite and > 0, got {self.outer_lr}")

    def aggregate(
        self,
        params: FloatArray,
        fits: Sequence[FitResult],
        learning_rate: float,
        state: FloatArray | None,
    ) -> tuple[FloatArray, FloatArray | None]:
        """Return ``float32(x + lr · outer_lr · Σ (n_i/N) Δ_i)`` (deterministic)."""
        updates, weights = [f.update for f in fits], [f.weight for f in fits]
        factor = float(learning_rate) * float(self.outer_lr)
        return deterministic_update(params, updates, weights, factor), None


@dataclass(frozen=True)
class QFedAvg(Strategy):
    """q-FedAvg (Li et al. 2020): trainers with a higher loss on the global model weigh more.

    Needs clients with ``evaluate`` (the loss ``F_k`` of the base model on their data).

    Attributes
    ----------
    q
        Fairness exponent ``q >= 0`` (0: the plain mean of the updates).
    client_learning_rate
        The clients' step size; ``L = 1 / client_learning_rate``.
    """

    name: ClassVar[str] = "qfedavg"
    q: float = 0.2
    client_learning_rate: float = 0.1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.client_learning_rate) and self.client_learning_rate > 0):
            raise ConfigError("client_learning_rate must be finite and > 0")
        if not (math.isfinite(self.q) and self.q >= 0):
            raise ConfigError(f"q must be finite and >= 0, got {self.q}")

    def aggregate(
        self,
        params: FloatArray,
        fits: Sequence[FitResult],
        learning_rate: float,
        state: FloatArray | None,
    ) -> tuple[FloatArray, FloatArray | None]:
        """Return ``x + lr · qfedavg_update(...)``; all losses zero leaves ``x`` as it is."""
        losses = [max(0.0, f.loss or 0.0) for f in fits]
        if not any(losses):
            return np.asarray(params, np.float32).copy(), None
        lipschitz = 1.0 / self.client_learning_rate
        update = fedopt.qfedavg_update([f.update for f in fits], losses, self.q, lipschitz)
        return deterministic_update(params, [update], [1], learning_rate), None


class Robust(Strategy):
    """A robust rule of :mod:`gradfed_ipfs.tensor` applied to the updates, peers in ID order.

    Parameters
    ----------
    rule
        E.g. ``Median()``, ``TrimmedMean(0.2)``, ``Krum(f=1)``, ``MultiKrum(f=1, m=2)``,
        ``Bulyan(f=1)`` (each has its own minimum number of trainers).
    """

    def __init__(self, rule: AggregationStrategy) -> None:
        self.rule = rule
        self.name = f"robust-{(method_name(rule) or type(rule).__name__).lower()}"  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"Robust({self.rule!r})"

    def aggregate(
        self,
        params: FloatArray,
        fits: Sequence[FitResult],
        learning_rate: float,
        state: FloatArray | None,
    ) -> tuple[FloatArray, FloatArray | None]:
        """Return ``float32(x + lr · rule(updates))``."""
        contributions = {f.peer: Contribution.of(f.update, f.weight) for f in fits}
        aggregate = self.rule.aggregate(contributions)
        return deterministic_update(params, [aggregate], [1], learning_rate), None
