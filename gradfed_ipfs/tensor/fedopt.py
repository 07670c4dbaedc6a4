"""Server-side optimizers: how an aggregate moves the global model (pure NumPy, no I/O).

A federated round produces an aggregate *update* ``Δ`` (the weighted mean of the peers'
``local_model - global_model``, shape ``(d,)``, float32). FedAvg applies it as it is:
``x ← x + Δ``. The optimizers here treat ``Δ`` as a pseudo-gradient and keep state between
rounds (Reddi et al. 2021, "Adaptive Federated Optimization", https://arxiv.org/abs/2003.00295;
Hsu et al. 2019, "Measuring the Effects of Non-Identical Data Distribution",
https://arxiv.org/abs/1909.06335):

- :class:`ServerMomentum` (FedAvgM's): ``v ← β v + Δ``; ``x ← x + η v``.
- :class:`ServerAdagrad` (FedAdagrad's): ``m ← β₁ m + (1-β₁) Δ``; ``v ← v + Δ²``;
  ``x ← x + η m / (√v + τ)``.
- :class:`ServerAdam` (FedAdam's): ``v ← β₂ v + (1-β₂) Δ²``, with Adam's bias correction of
  the step size ``η √(1-β₂ᵗ) / (1-β₁ᵗ)`` (as Flower's ``FedAdam`` does).
- :class:`ServerYogi` (FedYogi's): ``v ← v - (1-β₂) Δ² sign(v - Δ²)``.
- :class:`ServerNesterov` (DiLoCo's outer optimizer; Douillard et al. 2023,
  https://arxiv.org/abs/2311.08105): SGD with Nesterov momentum on the pseudo-gradient
  ``g = −Δ``, as ``torch.optim.SGD(lr, momentum, nesterov=True)``:
  ``v ← μ v + Δ`` (``v = Δ`` at the first step); ``x ← x + η (Δ + μ v)``.

The training strategies :class:`gradfed_ipfs.training.FedAvgM`, ``FedAdagrad``, ``FedAdam``,
``FedYogi`` and ``DiLoCo`` wrap them; :class:`gradfed_ipfs.federated.agreed.OptimizerRule`
makes any of them an agreed round's update rule.

Defaults are Flower's. The state is an :class:`OptimizerState` of named float32 arrays and a
step count: plain data, so a round record can store it by CID and every peer applies the same
update from the same state. Arithmetic is float64 internally and rounds to float32 once per
step, element-wise, so results are identical on every machine. :func:`encode_optimizer_state`
packs a state into one float32 vector (what a round record stores by CID) and
:func:`decode_optimizer_state` unpacks it; :func:`optimizer_round` is one round's step from
the contributions.

:func:`fedprox_gradient` is FedProx's client-side proximal term (Li et al. 2020,
https://arxiv.org/abs/1812.06127); :func:`qfedavg_update` is q-FFL's server step (Li et al.
2020, https://arxiv.org/abs/1905.10497).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from .._types import FloatArray, GradientLike
from ..errors import ConfigError, InvalidGradient, ShapeMismatch
from .deterministic import deterministic_update

__all__ = [
    "ServerAdagrad",
    "ServerAdam",
    "ServerMomentum",
    "ServerNesterov",
    "ServerYogi",
    "OptimizerState",
    "ServerOptimizer",
    "decode_optimizer_state",
    "encode_optimizer_state",
    "fedprox_gradient",
    "optimizer_round",
    "qfedavg_update",
]


Wide = NDArray[np.float64]
"""float64 working arrays of the optimizers."""


@dataclass(frozen=True)
class OptimizerState:
    """A server optimizer's state after ``step`` updates.

    Attributes
    ----------
    step
        Number of updates applied so far (0 for a fresh optimizer).
    arrays
        Named float32 arrays of shape ``(d,)`` (e.g. ``"m"``, ``"v"``); empty before the first
        step.
    """

    step: int = 0
    arrays: Mapping[str, FloatArray] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """Return ``{"step": int, "arrays": {name: bytes}}`` (little-endian float32)."""
        return {
            "step": self.step,
            "arrays": {
                name: np.ascontiguousarray(a, dtype="<f4").tobytes()
                for name, a in sorted(self.arrays.items())
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object], length: int) -> OptimizerState:
        """Rebuild from :meth:`to_dict` output, checking every array holds ``length`` floats.

        Raises
        ------
        InvalidGradient
            If the step is not a non-negative integer, or an array is not ``length`` float32s.
        """
        step, arrays = data.get("step"), data.get("arrays")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise InvalidGradient(f"optimizer state step must be an integer >= 0, got {step!r}")
        if not isinstance(arrays, Mapping):
            raise InvalidGradient("optimizer state arrays must be a mapping")
        out: dict[str, FloatArray] = {}
        for name, raw in arrays.items():
            if not isinstance(name, str) or not isinstance(raw, bytes | bytearray):
                raise InvalidGradient("optimizer state arrays map names to bytes")
            if len(raw) != 4 * length:
                raise InvalidGradient(
                    f"optimizer state array {name!r} has {len(raw)} bytes, expected {4 * length}"
                )
            out[name] = np.frombuffer(bytes(raw), dtype="<f4").astype(np.float32)
        return cls(step, out)


class ServerOptimizer(ABC):
    """Applies an aggregate update to the global model, with state kept between rounds."""

    name: ClassVar[str]
    """Short name recorded in round records."""

    state_names: ClassVar[tuple[str, ...]] = ("m", "v")
    """Names of the state arrays, in the order :func:`encode_state` packs them."""

    def step(
        self, model: GradientLike, update: GradientLike, state: OptimizerState | None = None
    ) -> tuple[FloatArray, OptimizerState]:
        """Return the new model and state after applying ``update`` to ``model``.

        Parameters
        ----------
        model
            Current global model, float32 ``(d,)``.
        update
            The round's aggregate update ``Δ`` (mean of ``local - global``), ``(d,)``.
        state
            The state returned by the previous call, or ``None`` for the first round.

        Returns
        -------
        tuple of numpy.ndarray and OptimizerState
            The new float32 model ``(d,)`` and the new state. Inputs are not modified.

        Raises
        ------
        ShapeMismatch
            If lengths differ (model, update, state arrays).
        InvalidGradient
            If ``update`` has NaN or Inf values.
        """
        x = np.asarray(model, dtype=np.float32).reshape(-1)
        delta = np.asarray(update, dtype=np.float32).reshape(-1)
        if delta.shape != x.shape:
            raise ShapeMismatch([x.size], [delta.size])
        if not np.isfinite(delta).all():
            raise InvalidGradient("the aggregate update has NaN or Inf values")
        state = state if state is not None else OptimizerState()
        for array in state.arrays.values():
            if array.shape != x.shape:
                raise ShapeMismatch([x.size], [array.size])
        wide = {name: a.astype(np.float64) for name, a in state.arrays.items()}
        step = state.step + 1
        moved, new_wide = self._apply(x.astype(np.float64), delta.astype(np.float64), wide, step)
        new_state = OptimizerState(step, {k: v.astype(np.float32) for k, v in new_wide.items()})
        return moved.astype(np.float32), new_state

    @abstractmethod
    def _apply(
        self,
        x: Wide,
        delta: Wide,
        state: dict[str, Wide],
        step: int,
    ) -> tuple[Wide, dict[str, Wide]]:
        """float64 math of one step; ``step`` counts from 1."""


def _check_positive(**values: float) -> None:
    for key, value in values.items():
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{key} must be finite and > 0, got {value}")


def _check_unit(**values: float) -> None:
    for key, value in values.items():
        if not (0.0 <= value < 1.0):
            raise ConfigError(f"{key} must be in [0, 1), got {value}")


@dataclass(frozen=True)
class ServerMomentum(ServerOptimizer):
    """FedAvg with server momentum (Hsu et al. 2019): ``v ← β v + Δ``; ``x ← x + η v``.

    Attributes
    ----------
    server_learning_rate
        η (default 1.0: with momentum 0, plain FedAvg).
    server_momentum
        β in [0, 1) (default 0.0).
    """

    name: ClassVar[str] = "fedavgm"
    state_names: ClassVar[tuple[str, ...]] = ("v",)
    server_learning_rate: float = 1.0
    server_momentum: float = 0.0

    def __post_init__(self) -> None:
        _check_positive(server_learning_rate=self.server_learning_rate)
        _check_unit(server_momentum=self.server_momentum)

    def _apply(
        self, x: Wide, delta: Wide, state: dict[str, Wide], step: int
    ) -> tuple[Wide, dict[str, Wide]]:
        velocity = delta if "v" not in state else self.server_momentum * state["v"] + delta
        return x + self.server_learning_rate * velocity, {"v": velocity}


@dataclass(frozen=True)
class ServerNesterov(ServerOptimizer):
    """DiLoCo's outer optimizer: SGD with Nesterov momentum on the pseudo-gradient ``g = −Δ``.

    The same step as ``torch.optim.SGD(params, lr=η, momentum=μ, nesterov=True)`` given
    ``param.grad = g`` (torch: ``b ← μ b + g``, ``b = g`` at the first step;
    ``x ← x − η (g + μ b)``), written in terms of ``Δ`` and ``v = −b``:
    ``v ← μ v + Δ``; ``x ← x + η (Δ + μ v)``. The state ``"v"`` is torch's momentum buffer
    negated. Here the step is float64 and rounds once; torch rounds each of its float32
    operations, so the two agree to within a few float32 ulps of the step's largest magnitude
    (at most 4 for the buffer and 8 for the model: ``tests/tensor/test_nesterov.py``), not bit
    for bit; where every operation is exact they agree bit for bit.

    Attributes
    ----------
    learning_rate
        η, the outer learning rate (default 0.7, OpenDiLoCo's).
    momentum
        μ in [0, 1) (default 0.9, OpenDiLoCo's).
    """

    name: ClassVar[str] = "nesterov"
    state_names: ClassVar[tuple[str, ...]] = ("v",)
    learning_rate: float = 0.7
    momentum: float = 0.9

    def __post_init__(self) -> None:
        _check_positive(learning_rate=self.learning_rate)
        _check_unit(momentum=self.momentum)

    def _apply(
        self, x: Wide, delta: Wide, state: dict[str, Wide], step: int
    ) -> tuple[Wide, dict[str, Wide]]:
        velocity = delta if "v" not in state else self.momentum * state["v"] + delta
        return x + self.learning_rate * (delta + self.momentum * velocity), {"v": velocity}


@dataclass(frozen=True)
class _AdaptiveOptimizer(ServerOptimizer):
    """Shared settings and first moment of the FedAdagrad, FedAdam and FedYogi optimizers."""

    eta: float = 0.1
    beta_1: float = 0.9
    beta_2: float = 0.99
    tau: float = 1e-9

    def __post_init__(self) -> None:
        _check_positive(eta=self.eta, tau=self.tau)
        _check_unit(beta_1=self.beta_1, beta_2=self.beta_2)

    def _apply(
        self, x: Wide, delta: Wide, state: dict[str, Wide], step: int
    ) -> tuple[Wide, dict[str, Wide]]:
        m = self.beta_1 * state.get("m", np.zeros_like(delta)) + (1.0 - self.beta_1) * delta
        v = self._second_moment(state.get("v", np.zeros_like(delta)), delta * delta)
        return x + self._step_size(step) * m / (np.sqrt(v) + self.tau), {"m": m, "v": v}

    def _step_size(self, step: int) -> float:
        return self.eta

    @abstractmethod
    def _second_moment(self, v: Wide, squared: Wide) -> Wide:
        """Return the new second moment from the old one and ``Δ²``."""


@dataclass(frozen=True)
class ServerAdagrad(_AdaptiveOptimizer):
    """FedAdagrad's optimizer (Reddi et al. 2021): ``v ← v + Δ²``; Flower's η=0.1, β₁=0."""

    name: ClassVar[str] = "fedadagrad"
    beta_1: float = 0.0

    def _second_moment(self, v: Wide, squared: Wide) -> Wide:
        return v + squared


@dataclass(frozen=True)
class ServerAdam(_AdaptiveOptimizer):
    """FedAdam's optimizer (Reddi et al. 2021): ``v ← β₂ v + (1-β₂) Δ²``, bias-corrected."""

    name: ClassVar[str] = "fedadam"

    def _second_moment(self, v: Wide, squared: Wide) -> Wide:
        return self.beta_2 * v + (1.0 - self.beta_2) * squared

    def _step_size(self, step: int) -> float:
        return self.eta * math.sqrt(1.0 - self.beta_2**step) / (1.0 - self.beta_1**step)


@dataclass(frozen=True)
class ServerYogi(_AdaptiveOptimizer):
    """FedYogi's optimizer (Reddi et al. 2021): ``v ← v - (1-β₂) Δ² sign(v - Δ²)``."""

    name: ClassVar[str] = "fedyogi"
    eta: float = 0.01
    tau: float = 1e-3

    def _second_moment(self, v: Wide, squared: Wide) -> Wide:
        return v - (1.0 - self.beta_2) * squared * np.sign(v - squared)


def encode_optimizer_state(optimizer: ServerOptimizer, state: OptimizerState) -> FloatArray:
    """Return ``[step, arrays...]`` as one float32 vector (arrays in ``optimizer.state_names``).

    This is the rule state a round record names by CID.

    Raises
    ------
    InvalidGradient
        If the step is too large for float32 (2**24) or an array is missing.
    """
    if state.step >= 1 << 24:
        raise InvalidGradient(f"optimizer step {state.step} does not fit a float32")
    missing = [n for n in optimizer.state_names if n not in state.arrays]
    if missing:
        raise InvalidGradient(f"optimizer state lacks arrays {missing}")
    arrays = [np.asarray(state.arrays[n], np.float32).reshape(-1) for n in optimizer.state_names]
    return np.concatenate([np.array([state.step], np.float32), *arrays])


def decode_optimizer_state(
    optimizer: ServerOptimizer, vector: FloatArray | None, length: int
) -> OptimizerState | None:
    """Invert :func:`encode_optimizer_state` for ``length`` params (``None`` stays ``None``).

    Raises
    ------
    InvalidGradient
        If the vector's length or step does not fit (a state from another session).
    """
    if vector is None:
        return None
    names = optimizer.state_names
    v = np.asarray(vector, np.float32).reshape(-1)
    step = float(v[0]) if v.size else -1.0
    if v.size != 1 + len(names) * length or not (step >= 0 and step == int(step)):
        raise InvalidGradient(f"optimizer state of {v.size} values does not fit {length} params")
    arrays = {n: v[1 + i * length : 1 + (i + 1) * length] for i, n in enumerate(names)}
    return OptimizerState(int(step), arrays)


def optimizer_round(
    optimizer: ServerOptimizer,
    params: FloatArray,
    updates: Sequence[FloatArray],
    weights: Sequence[int],
    learning_rate: float,
    state: FloatArray | None,
) -> tuple[FloatArray, FloatArray]:
    """One round of a server optimizer: ``Δ = lr · Σ (w_i/W) Δ_i`` fed to ``optimizer``.

    ``params`` float32 ``(d,)``; ``updates`` N ≥ 1 float32 ``(d,)`` in roster order with
    their positive integer ``weights``; ``state`` the previous round's
    :func:`encode_optimizer_state` vector (``None`` at the first round). Returns the new
    float32 params ``(d,)`` and encoded state; bit-identical on every machine (the mean is
    :func:`~gradfed_ipfs.tensor.deterministic.deterministic_update`'s).
    """
    zero = np.zeros_like(params, dtype=np.float32)
    delta = deterministic_update(zero, updates, weights, 1.0)
    if learning_rate != 1.0:
        delta = deterministic_update(zero, [delta], [1], learning_rate)
    previous = decode_optimizer_state(optimizer, state, params.size)
    moved, new_state = optimizer.step(params, delta, previous)
    return moved, encode_optimizer_state(optimizer, new_state)


def fedprox_gradient(
    gradient: GradientLike, local_model: GradientLike, global_model: GradientLike, mu: float
) -> FloatArray:
    """Return ``gradient + μ (w - w_global)``: the gradient of FedProx's proximal loss term.

    FedProx adds ``μ/2 ‖w - w_global‖²`` to each client's loss; a client that computes its own
    gradients adds this to them before its optimizer step. Shapes ``(d,)``, float32.

    Raises
    ------
    ShapeMismatch
        If lengths differ.
    InvalidGradient
        If ``mu`` is negative or not finite.
    """
    if not (math.isfinite(mu) and mu >= 0):
        raise InvalidGradient(f"mu must be finite and >= 0, got {mu}")
    g = np.asarray(gradient, dtype=np.float32).reshape(-1)
    w = np.asarray(local_model, dtype=np.float32).reshape(-1)
    w0 = np.asarray(global_model, dtype=np.float32).reshape(-1)
    if not g.shape == w.shape == w0.shape:
        raise ShapeMismatch([g.size], [w.size if w.shape != g.shape else w0.size])
    return (g + np.float32(mu) * (w - w0)).astype(np.float32)


def qfedavg_update(
    updates: Sequence[GradientLike], losses: Sequence[float], q: float, lipschitz: float
) -> FloatArray:
    """q-FedAvg's aggregate update (Li et al. 2020, q-FFL), shape ``(d,)``.

    Each client k sent ``Δ_k = local_k - global`` and its loss ``F_k`` on the global model.
    With ``L`` = 1/(client learning rate): ``Δw_k = L (−Δ_k)``,
    ``h_k = q F_k^{q-1} ‖Δw_k‖² + L F_k^q``; the update is ``−Σ F_k^q Δw_k / Σ h_k``. With
    ``q = 0`` it is the plain mean of the ``Δ_k``.

    Raises
    ------
    InvalidGradient
        If there are no updates, counts differ, a loss is negative or not finite, ``q < 0`` or
        ``lipschitz <= 0``.
    ShapeMismatch
        If update lengths differ.
    """
    if not updates or len(updates) != len(losses):
        raise InvalidGradient("q-FedAvg needs one loss per update and at least one update")
    if not (math.isfinite(q) and q >= 0):
        raise InvalidGradient(f"q must be finite and >= 0, got {q}")
    _check_positive(lipschitz=lipschitz)
    vectors = [np.asarray(u, dtype=np.float64).reshape(-1) for u in updates]
    for vector in vectors[1:]:
        if vector.shape != vectors[0].shape:
            raise ShapeMismatch([vectors[0].size], [vector.size])
    numerator = np.zeros_like(vectors[0])
    denominator = 0.0
    for vector, loss in zip(vectors, losses, strict=True):
        if not (math.isfinite(loss) and loss >= 0):
            raise InvalidGradient(f"losses must be finite and >= 0, got {loss}")
        delta_w = -lipschitz * vector
        loss_q = loss**q
        numerator += loss_q * delta_w
        if q > 0 and loss > 0:
            denominator += q * loss ** (q - 1) * float(delta_w @ delta_w)
        denominator += lipschitz * loss_q
    if denominator <= 0:
        raise InvalidGradient("q-FedAvg denominator is zero (all losses zero?)")
    return (-numerator / denominator).astype(np.float32)
