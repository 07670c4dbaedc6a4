"""Federated rounds, round statistics and model updates (seed-api §6.7, §6.8, §6.11).

Everything here is pure bookkeeping and NumPy math; nothing talks to IPFS. Defects of the
seed that are fixed (seed-api §12, item 14):

* ``FederatedRound.record_contribution`` from a client that is not in the round raises
  :class:`~gradfed_ipfs.errors.ClientNotFound` and the contribution is *not* kept (the seed
  silently included strangers in the average). ``rejected_contributions`` counts such refusals.
* Recording, aggregating or asking for missing clients on a round that was never
  :meth:`~FederatedRound.start`-ed raises :class:`~gradfed_ipfs.errors.NotStarted`.
* ``RoundStats.converged`` reflects the convergence detector passed to ``stats``.
* ``ClientInfo.sample_count`` (or a per-contribution count) weights FedAvg through
  :func:`gradfed_ipfs.tensor.aggregation.fedavg` (sorted client ids; all-zero counts give the
  plain mean; a client without a count weighs as the mean known count).
* Client state transitions are validated (see :data:`ALLOWED_TRANSITIONS`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .._types import CIDLike, FloatArray, GradientLike
from ..cid import cid_to_str, make_cid
from ..errors import (
    ClientNotFound,
    ConfigError,
    FederatedDimensionMismatch,
    FederatedError,
    InvalidGradient,
    NoContributions,
    NotStarted,
)
from ..federated.exchange.stats import JsonRecord, ModelUpdate, RoundStats
from ..tensor.aggregation import Contribution, fedavg
from .clients import ALLOWED_TRANSITIONS, ClientInfo, ClientState
from .convergence import ConvergenceDetector

if TYPE_CHECKING:
    from ..federated.privacy.mechanisms import DifferentialPrivacy
    from ..federated.secagg.simulation import SecAggResult

__all__ = [
    "ALLOWED_TRANSITIONS",
    "PLACEHOLDER_MODEL_CID",
    "ClientInfo",
    "ClientState",
    "FederatedRound",
    "ModelUpdate",
    "RoundStats",
]

PLACEHOLDER_MODEL_CID: str = cid_to_str(make_cid(b""))
"""The global-model CID of a session round before a model is known: raw CIDv1 of zero bytes."""


def _now_s() -> int:
    return int(time.time())


def _as_vector(gradient: GradientLike) -> FloatArray:
    vector = np.asarray(gradient, dtype=np.float32).reshape(-1)
    if not np.all(np.isfinite(vector)):
        raise InvalidGradient("gradient contains NaN or Inf")
    return vector


def _check_lengths(vectors: Mapping[str, FloatArray]) -> None:
    # Federated callers expect the seed's FederatedError family, not the tensor layer's.
    if not vectors:
        raise NoContributions()
    ids = sorted(vectors)
    length = int(vectors[ids[0]].shape[0])
    for cid in ids[1:]:
        if vectors[cid].shape[0] != length:
            raise FederatedDimensionMismatch(length, int(vectors[cid].shape[0]))


class FederatedRound(JsonRecord):
    """One federated round, in the seed's legacy mode or session mode.

    Legacy mode (this constructor) counts completions; session mode (:meth:`start`) knows the
    expected clients and collects their contributions.

    Parameters
    ----------
    round_num
        Index of the round in its run.
    global_model
        CID of the global model the round trains from.
    client_count
        Number of clients the round waits for.
    """

    def __init__(self, round_num: int, global_model: CIDLike, client_count: int) -> None:
        if round_num < 0 or client_count < 0:
            raise ConfigError("round_num and client_count must be >= 0")
        self.round_num = round_num
        self.client_count = client_count
        self.global_model: str = cid_to_str(global_model)
        self.aggregated_gradient: FloatArray | None = None
        self.start_time: int = _now_s()
        self.end_time: int | None = None
        self.completed_count = 0
        self.round_id = round_num
        self.expected_clients: list[str] = []
        self.sample_counts: dict[str, int] = {}
        self.contributions: dict[str, FloatArray] = {}
        self.rejected_contributions = 0
        self.epsilon_spent: float | None = None
        self.delta_spent: float | None = None
        self.dropped_clients: list[str] = []
        self._session_start: float | None = None
        self._clock: Callable[[], float] = time.monotonic

    # ------------------------------------------------------------------ session mode

    @classmethod
    def start(
        cls,
        round_id: int,
        clients: Iterable[str | ClientInfo],
        *,
        global_model: CIDLike = PLACEHOLDER_MODEL_CID,
        clock: Callable[[], float] = time.monotonic,
    ) -> FederatedRound:
        """Start a session-mode round expecting ``clients``.

        Parameters
        ----------
        round_id
            The round's id (>= 0).
        clients
            Client ids, or :class:`ClientInfo` objects whose ``sample_count`` becomes the
            client's FedAvg weight.
        global_model
            CID of the model the round trains from (the placeholder CID if unknown).
        clock
            Monotonic clock in seconds, used for ``RoundStats.duration_ms``.

        Returns
        -------
        FederatedRound
            The started round.
        """
        ids: list[str] = []
        counts: dict[str, int] = {}
        for client in clients:
            if isinstance(client, ClientInfo):
                ids.append(client.client_id)
                counts[client.client_id] = client.sample_count
            else:
                ids.append(str(client))
        if not ids:
            raise InvalidGradient("a round needs at least one expected client")
        if len(set(ids)) != len(ids):
            raise InvalidGradient("expected client ids must be unique")
        rnd = cls(round_id, global_model, len(ids))
        rnd.expected_clients = ids
        rnd.sample_counts = counts
        rnd._clock = clock
        rnd._session_start = clock()
        return rnd

    @property
    def is_started(self) -> bool:
        """Whether the round is in session mode (started, or deserialized from one)."""
        return self._session_start is not None or bool(self.expected_clients)

    def _require_started(self) -> None:
        if not self.is_started:
            raise NotStarted()

    def record_contribution(
        self, client_id: str, gradient: GradientLike, sample_count: int | None = None
    ) -> None:
        """Store ``client_id``'s gradient, replacing an earlier one (one client counts once).

        Parameters
        ----------
        client_id
            An expected client.
        gradient
            The client's update, any shape; stored flattened as float32.
        sample_count
            Overrides the client's FedAvg weight when given (>= 0).
        """
        self._require_started()
        if client_id not in self.expected_clients:
            self.rejected_contributions += 1
            raise ClientNotFound(client_id)
        if sample_count is not None and sample_count < 0:
            raise InvalidGradient(f"sample_count must be >= 0, got {sample_count}")
        vector = _as_vector(gradient)
        self.contributions[client_id] = vector
        if sample_count is not None:
            self.sample_counts[client_id] = sample_count

    def aggregate(self, dp: DifferentialPrivacy | None = None) -> FloatArray:
        """Aggregate the contributions: sample-weighted FedAvg, or DP-FedAvg with ``dp``.

        Parameters
        ----------
        dp
            If given, client-level DP-FedAvg (McMahan et al. 2018) via
            :meth:`DifferentialPrivacy.dp_fedavg`: each contribution is clipped to the
            mechanism's sensitivity, Gaussian noise is added to the sum and the budget is
            charged. The mean is then unweighted: sample counts are private and unbounded
            weights would void the sensitivity bound. The spent (ε, δ) is recorded.

        Returns
        -------
        FloatArray
            The aggregate, shape ``(d,)``, float32. It is not stored; see :meth:`complete`.
        """
        self._require_started()
        if not self.contributions:
            raise NoContributions()
        _check_lengths(self.contributions)
        if dp is None:
            return fedavg(
                {
                    cid: Contribution(vec, self.sample_counts.get(cid))
                    for cid, vec in self.contributions.items()
                }
            )
        result = dp.dp_fedavg(self.contributions, expected_clients=len(self.expected_clients))
        self.epsilon_spent, self.delta_spent = dp.spent()
        return result

    def record_secure_result(self, result: SecAggResult) -> FloatArray:
        """Take a secure-aggregation outcome as this round's aggregate and note the dropouts.

        Parameters
        ----------
        result
            The outcome of :func:`~gradfed_ipfs.federated.secagg.protocol.
            run_secure_aggregation` or of a networked :class:`SecAggServer` run.

        Returns
        -------
        FloatArray
            The survivors' unweighted mean, shape ``(d,)``, float32 (SecAgg only reveals the
            sum; clients wanting FedAvg weights pre-scale their own vectors).
        """
        self._require_started()
        unknown = [c for c in result.survivors + result.dropped if c not in self.expected_clients]
        if unknown:
            raise ClientNotFound(unknown[0])
        if not result.survivors:
            raise NoContributions()
        self.dropped_clients = sorted(result.dropped)
        return (result.total / np.float32(len(result.survivors))).astype(np.float32)

    def missing_clients(self) -> list[str]:
        """Return the expected clients that have not contributed, sorted (the seed: in order)."""
        self._require_started()
        return sorted(set(self.expected_clients) - set(self.contributions))

    def stats(self, detector: ConvergenceDetector | None = None) -> RoundStats:
        """Summarize the round.

        Parameters
        ----------
        detector
            The run's convergence detector; ``converged`` is its :meth:`~ConvergenceDetector.
            converged` answer (``False`` without one).

        Returns
        -------
        RoundStats
            Session mode: participants are contributors. Legacy mode: participants are
            completions and no client is known to be missing.
        """
        if self._session_start is not None:
            elapsed_ms = round((self._clock() - self._session_start) * 1000)
        elif self.end_time is not None:
            elapsed_ms = (self.end_time - self.start_time) * 1000
        else:
            elapsed_ms = 0
        started = self.is_started
        return RoundStats(
            round_id=self.round_id,
            participants=len(self.contributions) if started else self.completed_count,
            missing_clients=self.missing_clients() if started else [],
            duration_ms=max(elapsed_ms, 0),
            converged=detector.converged() if detector is not None else False,
            epsilon_spent=self.epsilon_spent,
            delta_spent=self.delta_spent,
            dropped_clients=sorted(self.dropped_clients),
            rejected_contributions=self.rejected_contributions,
        )

    # ------------------------------------------------------------------ legacy mode and shared

    def mark_client_completed(self) -> None:
        """Count one more completed client (legacy mode)."""
        self.completed_count += 1

    def is_complete(self) -> bool:
        """Session mode: every expected client contributed; legacy: completions >= client count."""
        if self.expected_clients:
            return all(c in self.contributions for c in self.expected_clients)
        return self.completed_count >= self.client_count

    def complete(self, aggregated_gradient: GradientLike) -> None:
        """Store the round's aggregate and stamp ``end_time``.

        Parameters
        ----------
        aggregated_gradient
            The aggregate, any shape; stored flattened as float32.
        """
        self.aggregated_gradient = _as_vector(aggregated_gradient)
        self.end_time = _now_s()

    def duration(self) -> int | None:
        """Return ``end_time - start_time`` in seconds once the round has ended."""
        return None if self.end_time is None else self.end_time - self.start_time

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        """Return the seed's serde fields (contributions and the clock are not serialized)."""
        agg = self.aggregated_gradient
        return {
            "round_num": self.round_num,
            "client_count": self.client_count,
            "global_model": self.global_model,
            "aggregated_gradient": None if agg is None else [float(v) for v in agg],
            "start_time": self.start_time,
            "end_time": self.end_time,
            "completed_count": self.completed_count,
            "round_id": self.round_id,
            "expected_clients": list(self.expected_clients),
            "sample_counts": dict(self.sample_counts),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FederatedRound:
        """Build from :meth:`to_dict` output; ``round_id`` defaults to 0 and lists to empty.

        Parameters
        ----------
        data
            The decoded JSON object.

        Returns
        -------
        FederatedRound
            The round, without contributions or session clock.
        """
        try:
            rnd = cls(int(data["round_num"]), str(data["global_model"]), int(data["client_count"]))
            agg = data.get("aggregated_gradient")
            rnd.aggregated_gradient = None if agg is None else _as_vector(agg)
            rnd.start_time = int(data["start_time"])
            end = data.get("end_time")
            rnd.end_time = None if end is None else int(end)
            rnd.completed_count = int(data.get("completed_count", 0))
            rnd.round_id = int(data.get("round_id", 0))
            rnd.expected_clients = [str(c) for c in data.get("expected_clients", [])]
            rnd.sample_counts = {str(k): int(v) for k, v in data.get("sample_counts", {}).items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise FederatedError(f"Malformed FederatedRound: {exc}") from exc
        return rnd
