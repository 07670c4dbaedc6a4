"""Secure aggregation as a strategy wrapper: ``Peer(..., strategy=SecAgg(FedAvg()))``.

Flower runs SecAgg+ as a workflow around its strategy (``SecAggPlusWorkflow``); here the
wrapper plays that part in a serverless agreed round. In agreed round ``r`` the sampled peers
are the clients of one SecAgg round (:mod:`gradfed_ipfs.federated.secagg_round.peer`, unchanged:
every message a block, announced on its own sub-topic), and the first of them in the round's
coordinator order (:func:`~gradfed_ipfs.federated.agreed.round.coordinator.coordinator_ranking` over
the sample) is its aggregator. Each client trains, then masks (Flower's weighting)::

    x_i = [ w_i·Δ_i (d) | w_i | trained_i | w_i·fit metrics ]      w_i = n_i / max_weight

(zeros when its training failed: it still takes part, or the round would lack its keys). The
aggregator unmasks only the survivors' sum ``S``, and contributes to the agreed round the
weighted mean ``S_Δ / W`` (``W = N / max_weight``, ``N = round(S_w · max_weight)`` samples) with
a tail naming the survivors. Without ``central_dp`` the SecAgg round is verifiable
(:class:`~gradfed_ipfs.federated.secagg_round.SecureRoundConfig` ``verifiable``): the
aggregator reveals its round key, every other survivor recomputes ``S`` from the blocks the
clients announced and contributes the same fit, and :class:`SecureTrainingRule` takes the fit
that more than half of the sample contributed with identical bytes, so a made-up mean is
ignored. With ``central_dp`` the clients clip ``Δ_i`` to L2 norm ``C`` first, the aggregator
noises ``S_Δ`` (Flower's server-side fixed clipping), the other clients contribute no update
(only their evaluation, in the clear) and the aggregator's fit is taken: it is trusted for its
sum and its noise. Either way the one fit, of weight ``N``, goes to the inner strategy, so
every peer computes the same model, record and
:class:`~gradfed_ipfs.training.history.History` (``secure`` lists the survivors).

Only strategies that need nothing but the weighted mean are accepted: FedAvg, FedProx, FedAvgM,
FedAdagrad, FedAdam, FedYogi. QFedAvg and the robust rules need each client's update or loss,
which the aggregator must never see; :class:`SecAgg` refuses them with ``ConfigError``.

Costs and limits: the fixed-point ring clips each coordinate of ``x_i`` to ``±clip_range``
(updates and fit metrics alike) and rounds it to ``1 / scale``; every sampled peer must share
keys (a sampled peer that is down fails the round's fit: no results, the model only moves on
the next round); a client that drops after the keys is unmasked away (the result is the
survivors' mean) while ``threshold`` survive; ``phase_timeout`` must cover the spread of the
clients' training times. Evaluation results stay in the clear.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from multiformats import CID

from .._types import FloatArray
from ..errors import ConfigError, PrivacyBudgetExhausted, SecureAggregationError
from ..federated.agreed.round.coordinator import coordinator_ranking
from ..federated.agreed.session import AgreedSession
from ..federated.privacy.mechanisms import (
    AccountingMode,
    DifferentialPrivacy,
    DPMechanism,
    clip_l2_norm,
)
from ..federated.secagg.protocol import RandBytes, check_threshold
from ..federated.secagg_round import (
    SecAggSettings,
    SecureRoundConfig,
    SecureRoundPeer,
    SecureRoundResult,
)
from ..formats.agreed.roster import Roster
from ..kubo.pubsub import PubsubTransport
from ..storage.base import BlockStore
from .metrics import FIXED_SLOTS, MAX_SAMPLES, PeerTail, VectorLayout
from .rule import TrainingRule
from .strategy import ConfigValue, FedAvg, FitResult, ServerOptStrategy, SparseLoCo, Strategy

__all__ = [
    "SecAgg",
    "SecureFit",
    "SecureTrainingRule",
    "masked_input",
    "run_secure_fit",
    "secure_aggregator",
    "secure_contribution",
    "secure_fit",
    "unmasked_fit",
]

logger = logging.getLogger("gradfed_ipfs.training")

_LINEAR = "FedAvg, FedProx, FedAvgM, FedAdagrad, FedAdam, FedYogi, DiLoCo or SparseLoCo"


class SecAgg(Strategy):
    """Secure aggregation around a strategy that needs only the weighted mean.

    Parameters
    ----------
    strategy
        The inner strategy: :class:`FedAvg` (or :class:`FedProx`), :class:`SparseLoCo`'s
        outer step or a :class:`ServerOptStrategy` (FedAvgM, FedAdagrad, FedAdam, FedYogi,
        DiLoCo).
    threshold
        Shamir threshold t for the round's k sampled clients (``k/2 < t <= k``); default
        ``k // 2 + 1``, and at least 2.
    settings
        The encoding and the phase timeouts (default ``SecAggSettings()``, see
        :class:`~gradfed_ipfs.federated.secagg_round.SecAggSettings`).
        Here ``clip_range`` must be >= 1, so a weight fits in the masked vector.
    max_weight
        Sample count of weight 1 (Flower's ``max_weight``); a client with more samples fails
        the round (its update would leave the clip range).
    fetch_timeout, republish_interval, subscriber_timeout
        How the protocol's messages travel (see
        :class:`~gradfed_ipfs.federated.secagg_round.SecureRoundConfig`).
    randbytes
        Cryptographic randomness (``os.urandom``; tests may inject a seeded one).
    central_dp
        Central DP on the secure sum (Gaussian, RDP accounting; each peer its own instance):
        clients clip ``Δ`` to L2 norm ``C = central_dp.sensitivity`` before weighting; the
        aggregator adds N(0, (z·C)²) to the sum's update part (it charges its accountant, and
        refuses the round's fit when the budget cannot afford it); every other peer charges one
        release for each round with a secure fit, so each ``History`` reports the session's ε.

    Raises
    ------
    ConfigError
        If the inner strategy needs per-client values, or a setting is out of range.
    """

    def __init__(  # noqa: PLR0913 - public constructor: keyword-only SecAgg settings
        self,
        strategy: Strategy,
        *,
        threshold: int | None = None,
        settings: SecAggSettings | None = None,
        max_weight: int = 1000,
        fetch_timeout: float = 30.0,
        republish_interval: float = 0.5,
        subscriber_timeout: float = 10.0,
        randbytes: RandBytes = os.urandom,
        central_dp: DifferentialPrivacy | None = None,
    ) -> None:
        if not isinstance(strategy, FedAvg | ServerOptStrategy | SparseLoCo):
            raise ConfigError(
                f"SecAgg cannot wrap {strategy.name}: the aggregator learns only the weighted "
                f"sum of the updates, and {strategy.name} needs each client's update or loss "
                f"(use {_LINEAR})"
            )
        settings = SecAggSettings() if settings is None else settings
        if not settings.clip_range >= 1.0:  # finite: checked by SecAggSettings
            raise ConfigError(f"clip_range must be finite and >= 1, got {settings.clip_range}")
        if not 1 <= max_weight <= 1 << 20:
            raise ConfigError(f"max_weight must be in [1, 2**20], got {max_weight}")
        self.strategy, self.threshold = strategy, threshold
        self.settings, self.max_weight = settings, max_weight
        self.message_timeouts = {
            "fetch_timeout": fetch_timeout,
            "republish_interval": republish_interval,
            "subscriber_timeout": subscriber_timeout,
        }
        self.randbytes = randbytes
        if central_dp is not None and (
            central_dp.accounting is not AccountingMode.RDP
            or central_dp.mechanism is not DPMechanism.GAUSSIAN
        ):
            raise ConfigError("SecAgg's central_dp needs the Gaussian mechanism and RDP accounting")
        self.central_dp = central_dp
        self.name = f"secagg-{strategy.name}"  # type: ignore[misc]  # names its inner strategy

    def __repr__(self) -> str:
        return f"SecAgg({self.strategy!r}, threshold={self.threshold})"

    def fit_config(self, server_round: int) -> dict[str, ConfigValue]:
        """Return the inner strategy's client config."""
        return self.strategy.fit_config(server_round)

    def aggregate(
        self,
        params: FloatArray,
        fits: Sequence[FitResult],
        learning_rate: float,
        state: FloatArray | None,
    ) -> tuple[FloatArray, FloatArray | None]:
        """Apply the inner strategy (``fits`` is the one secure mean, of weight ``N``)."""
        return self.strategy.aggregate(params, fits, learning_rate, state)

    def clip(self, update: FloatArray) -> FloatArray:
        """Return ``update`` clipped to L2 norm ``central_dp.sensitivity`` (as is without DP)."""
        if self.central_dp is None:
            return update
        clipped = clip_l2_norm(np.asarray(update, np.float64), self.central_dp.sensitivity)
        return clipped.astype(np.float32)

    def release(self, total: FloatArray, params: int) -> FloatArray | None:
        """Return the unmasked sum, its first ``params`` values noised with ``central_dp``.

        ``None`` if the budget cannot afford the release (nothing is charged then).
        """
        dp = self.central_dp
        if dp is None:
            return total
        update = np.array(total[:params], np.float64)
        try:
            dp.add_gaussian_noise(update)  # checks, noises, charges; unchanged if refused
        except PrivacyBudgetExhausted as exc:
            logger.warning("secure sum not released: %s", exc)
            return None
        return np.concatenate([update.astype(np.float32), total[params:]])

    def charge(self) -> None:
        """Charge one release of the sum released by another peer (no-op without DP)."""
        if self.central_dp is not None:
            self.central_dp.budget.charge(self.central_dp.release_event(DPMechanism.GAUSSIAN))

    def summary(self) -> str:
        """Return the settings that shape the secure mean, for the round record's label."""
        dp = self.central_dp
        noise = "" if dp is None else f" dp_z={dp.noise_multiplier():g} dp_clip={dp.sensitivity:g}"
        return (
            f"clip_range={self.settings.clip_range:g} ring_bits={self.settings.ring_bits} "
            f"max_weight={self.max_weight}{noise}"
        )

    def threshold_for(self, clients: int) -> int:
        """Return the Shamir threshold for ``clients`` sampled clients.

        Raises
        ------
        ConfigError
            If fewer than 2 clients, or the threshold does not fit ``k/2 < t <= k``.
        """
        t = self.threshold if self.threshold is not None else max(2, clients // 2 + 1)
        try:
            check_threshold(t, clients)
        except SecureAggregationError as exc:
            raise ConfigError(f"SecAgg over {clients} sampled clients: {exc}") from exc
        return t

    def protocol_config(
        self, session: str, genesis: CID, base: CID, round_id: int, clients: Sequence[str],
        length: int,
    ) -> SecureRoundConfig:  # fmt: skip
        """Return the parameters of agreed round ``round_id``'s SecAgg round (from ``base``)."""
        return SecureRoundConfig(
            session_id=f"{session}/agreed/{genesis}/{base}",
            round_id=round_id,
            clients=tuple(sorted(clients)),
            aggregator=secure_aggregator(session, genesis, round_id, clients),
            threshold=self.threshold_for(len(clients)),
            length=length,
            settings=self.settings,
            verifiable=self.central_dp is None,  # with central DP only the noised sum is public
            **self.message_timeouts,
        )


def secure_aggregator(session: str, genesis: CID, round_id: int, clients: Sequence[str]) -> str:
    """Return the aggregator of an agreed round: the round's first coordinator among ``clients``."""
    return coordinator_ranking(session, genesis, round_id, tuple(clients))[0]


def masked_input(
    layout: VectorLayout,
    update: FloatArray | None,
    samples: int,
    fit_metrics: Mapping[str, float],
    max_weight: int,
) -> FloatArray:
    """Return ``[w·Δ | w | 1 | w·metrics]`` (``w = samples / max_weight``); zeros if untrained."""
    out = np.zeros(layout.params + 2 + len(layout.fit_metrics), np.float64)
    if update is None:
        return out.astype(np.float32)
    w = samples / max_weight
    d = layout.params
    out[:d] = w * np.asarray(update, np.float64)
    out[d], out[d + 1] = w, 1.0
    out[d + 2 :] = [w * float(fit_metrics.get(n, 0.0)) for n in layout.fit_metrics]
    return out.astype(np.float32)


@dataclass(frozen=True)
class SecureFit:
    """What the aggregator recovered from the survivors' sum.

    Attributes
    ----------
    mean
        The sample-weighted mean update, float32 ``(d,)``.
    samples, results
        Training samples ``N`` and clients that trained, over the survivors.
    fit_metrics
        Sample-weighted mean of each fit metric.
    survivors
        Clients whose masked vectors were summed.
    """

    mean: FloatArray
    samples: int
    results: int
    fit_metrics: dict[str, float]
    survivors: tuple[str, ...]


def unmasked_fit(
    layout: VectorLayout, summed: FloatArray, survivors: Sequence[str], max_weight: int
) -> SecureFit:
    """Decode the survivors' sum ``(d + 2 + m,)``; ``samples == 0`` when none of them trained."""
    total = np.asarray(summed, np.float64)
    d = layout.params
    samples = min(MAX_SAMPLES, max(0, round(float(total[d]) * max_weight)))
    results = max(0, round(float(total[d + 1])))
    if samples == 0 or results == 0:
        return SecureFit(np.zeros(d, np.float32), 0, 0, {}, tuple(sorted(survivors)))
    weight = samples / max_weight
    metrics = {n: float(total[d + 2 + i] / weight) for i, n in enumerate(layout.fit_metrics)}
    return SecureFit(
        (total[:d] / weight).astype(np.float32), samples, results, metrics,
        tuple(sorted(survivors)),
    )  # fmt: skip


def secure_contribution(
    layout: VectorLayout,
    fit: SecureFit,
    *,
    eval_samples: int = 0,
    eval_loss: float = 0.0,
    eval_metrics: Mapping[str, float] | None = None,
) -> FloatArray:
    """Return the aggregator's contribution: the mean, ``results`` in the ``fit`` slot, flags."""
    vector = layout.contribution(
        fit.mean, fit_samples=fit.samples, fit_metrics=fit.fit_metrics,
        eval_samples=eval_samples, eval_loss=eval_loss, eval_metrics=eval_metrics,
    )  # fmt: skip
    vector[layout.params] = fit.results
    flags = vector[layout.size - len(layout.secure) :]
    flags[:] = [1.0 if p in fit.survivors else 0.0 for p in layout.secure]
    return vector


async def run_secure_fit(
    secagg: SecAgg,
    store: BlockStore,
    pubsub: PubsubTransport,
    config: SecureRoundConfig,
    vector: FloatArray,
) -> tuple[FloatArray, list[str], bool] | None:
    """Run this peer's client role (and aggregator role); return ``(sum, survivors, ours)``.

    ``ours`` is true on the aggregator (its own result); in a verifiable round another survivor
    returns the sum it recomputed from the aggregator's release. A failure of either role is
    logged, never raised: a client that fails is dropped by the protocol; an aggregator that
    fails, or a client without a checked release, returns ``None``.
    """
    peer = SecureRoundPeer(store, pubsub, config, randbytes=secagg.randbytes)
    try:
        try:
            await peer.start()
        except Exception as exc:  # e.g. the daemon's pubsub failed: this peer's failure
            logger.warning("round %d: secure round not started: %s", config.round_id, exc)
            return None
        jobs: list[Awaitable[object]] = [peer.run_client(vector)]
        if peer.peer_id == config.aggregator:
            jobs.append(peer.aggregate())
        outcomes = await asyncio.gather(*jobs, return_exceptions=True)
    finally:
        await peer.aclose()
    for role, outcome in zip(("client", "aggregator"), outcomes, strict=False):
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, Exception):
                raise outcome  # cancellation
            logger.warning("round %d: secure %s role failed: %s", config.round_id, role, outcome)
    last = outcomes[-1]
    if isinstance(last, SecureRoundResult):
        return last.total, last.survivors, True
    if peer.released is not None and peer.view is not None:
        return peer.released, peer.view[0], False
    return None


async def secure_fit(
    secagg: SecAgg,
    layout: VectorLayout,
    session: AgreedSession,
    sampled: Sequence[str],
    update: FloatArray | None,
    samples: int,
    metrics: Mapping[str, float],
) -> SecureFit | None:
    """Take part in the SecAgg round of ``session``'s current round (a sampled peer).

    ``update`` is ``None`` when this peer's training failed (it masks zeros). Returns the
    unmasked (and, with ``central_dp``, noised) fit on the aggregator; without ``central_dp``
    also on every survivor that recomputed the sum from the aggregator's release; else ``None``.
    """
    if update is not None and samples > secagg.max_weight:
        logger.warning("%d samples exceed SecAgg's max_weight: not summed", samples)
        update = None
    if update is not None:
        update = secagg.clip(update)
    masked = masked_input(layout, update, samples, metrics, secagg.max_weight)
    config = secagg.protocol_config(
        session.session, session.genesis, session.model_cid, session.round, sampled, masked.size
    )
    result = await run_secure_fit(secagg, session.store, session.pubsub, config, masked)
    if result is None:
        return None
    summed, survivors, ours = result
    fit = unmasked_fit(layout, summed, survivors, secagg.max_weight)
    if fit.samples == 0 or not ours:  # nothing to release, or a sum that is public anyway
        return fit
    total = secagg.release(summed, layout.params)
    if total is None:
        return None
    return unmasked_fit(layout, total, survivors, secagg.max_weight)


class SecureTrainingRule(TrainingRule):
    """:class:`TrainingRule` under :class:`SecAgg`: one secure mean is the round's one fit.

    A sampled peer's contribution claims the secure fit when its tail is sane (``results`` an
    integer in ``[1, survivors]``, flags 0/1 naming only sampled peers, weight = samples).
    Without central DP every survivor that recomputed the sum contributes the same fit as the
    aggregator, and the fit taken is the one that more than half of the round's sample claim
    with identical bytes (update, fit slots and flags): a lying aggregator, or any minority of
    the sample, cannot set it, and if no fit has a majority the round has none (the model only
    moves on the next round). With central DP only the aggregator can know the noised sum, so
    its claim is taken as is (the aggregator is trusted for its sum and its noise). Every
    other slot of a contribution counts for evaluation only.
    """

    def label(self, round_number: int) -> str:
        """Return the training label followed by the SecAgg settings."""
        secagg = self.strategy
        extra = f" {secagg.summary()}" if isinstance(secagg, SecAgg) else ""
        return super().label(round_number) + extra

    @property
    def verified(self) -> bool:
        """Whether a fit needs a majority of the sample (no central DP), not the aggregator's."""
        return not (isinstance(self.strategy, SecAgg) and self.strategy.central_dp is not None)

    def apply(
        self,
        model: FloatArray,
        roster: Roster,
        gradients: Sequence[FloatArray],
        learning_rate: float,
        state: FloatArray | None,
    ) -> tuple[FloatArray, FloatArray | None]:
        """Return the next global vector (params moved by the secure mean, the summary)."""
        params, _ = self.layout.split(model)
        sample = self.sampled(roster.session, roster.genesis, roster.round, roster.base)
        claims, evaluations = self._claims(roster, gradients, sample)
        fit = self._chosen(claims, sample, roster)
        new_params, new_state = params, state
        fit_tails = [] if fit is None else [fit[1]]
        if fit is not None:
            new_params, new_state = self.strategy.aggregate(params, [fit[0]], learning_rate, state)
        summary = self.layout.summarize(fit_tails, evaluations)
        if fit is not None:
            raw, flags = fit[2], len(self.layout.secure)
            summary[0] = raw[0]
            summary[len(summary) - flags :] = raw[len(raw) - flags :]
        return np.concatenate([np.asarray(new_params, np.float32), summary]), new_state

    def _claims(
        self, roster: Roster, gradients: Sequence[FloatArray], sample: Sequence[str]
    ) -> tuple[dict[bytes, list[tuple[FitResult, PeerTail, np.ndarray]]], list[PeerTail]]:
        """Return the sane fit claims grouped by their bytes, and every usable evaluation."""
        claims: dict[bytes, list[tuple[FitResult, PeerTail, np.ndarray]]] = {}
        evaluations: list[PeerTail] = []
        sampled = set(sample)
        for entry, vector in zip(roster.entries, gradients, strict=True):
            update, raw = self.layout.split(vector)
            tail = raw.copy()
            sane = entry.peer in sampled and self._sane(update, tail, sampled)
            if entry.peer in sampled:
                tail[0] = 1.0 if sane else 0.0  # a secure tail's fit slot counts results
            peer_tail = self.layout.read_tail(tail)
            if peer_tail.eval_samples > 0:
                evaluations.append(peer_tail)
            if sane and peer_tail.fit and entry.weight == peer_tail.fit_samples:
                fit = FitResult(entry.peer, update, entry.weight)
                claims.setdefault(self._fit_bytes(update, raw), []).append((fit, peer_tail, raw))
        return claims, evaluations

    def _chosen(
        self,
        claims: dict[bytes, list[tuple[FitResult, PeerTail, np.ndarray]]],
        sample: Sequence[str],
        roster: Roster,
    ) -> tuple[FitResult, PeerTail, np.ndarray] | None:
        """Return the claim the rule takes: a majority of the sample's, or the aggregator's."""
        if not sample:
            return None
        if self.verified:
            for group in claims.values():
                if 2 * len(group) > len(sample):  # at most one group can have a majority
                    return group[0]
            return None
        aggregator = secure_aggregator(roster.session, roster.genesis, roster.round, sample)
        mine = [c for group in claims.values() for c in group if c[0].peer == aggregator]
        return mine[0] if mine else None

    def _fit_bytes(self, update: FloatArray, raw: np.ndarray) -> bytes:
        """Return what two claims of one fit share: update, results, samples, metrics, flags."""
        n, flags = len(self.layout.fit_metrics), len(self.layout.secure)
        k = len(FIXED_SLOTS)
        slots = np.concatenate([raw[:2], raw[k : k + n], raw[len(raw) - flags :]])
        return np.asarray(update, np.float32).tobytes() + slots.astype(np.float32).tobytes()

    def _sane(self, update: FloatArray, tail: np.ndarray, sample: set[str]) -> bool:
        """Whether a tail names a plausible secure sum."""
        flags = tail[len(tail) - len(self.layout.secure) :]
        if not (np.isfinite(tail).all() and np.isfinite(update).all()):
            return False
        if not np.isin(flags, (0.0, 1.0)).all():
            return False
        survivors = {p for p, f in zip(self.layout.secure, flags, strict=True) if f == 1.0}
        results = tail[0]
        return survivors <= sample and results == int(results) and 1 <= results <= len(survivors)
