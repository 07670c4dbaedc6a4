"""The agreed vector of a training session: model parameters, then a tail of round metrics.

Every contribution and every global model of a training session is one float32 vector::

    [ params (d) | fit, fit_samples, eval_samples, eval_loss, fit:<name>..., eval:<name>...,
      secure:<member>... ]

In a *contribution*, ``params`` is the peer's update ``local - global`` (zeros when it did not
train), ``fit`` is 1 when it trained, the samples and metrics are its own, and the evaluation
is of the round's base model on its data. In a *global model* the tail is the round's agreed
summary: ``fit`` counts the results, samples are totals and metrics are combined by
:func:`robust_mean` (fit metrics over the trainers, evaluation over every contributor). The
summary is therefore part of the model CID every peer agrees on. A session under secure aggregation
(:mod:`gradfed_ipfs.training.secure`) adds one flag per member: in the aggregator's
contribution and in the global model, 1 marks the members whose masked vectors were summed.
Peer tails are hostile: a tail with a non-finite or negative value, or a count above the
session's cap (:attr:`VectorLayout.max_samples`, the agreed ``max_weight``, default 2**20),
counts as a peer that neither trained nor evaluated, on every peer alike. One peer can
therefore add at most ``max_samples`` to a round's sample totals, and, as long as the liars are
a minority of the values combined, cannot move a metric outside the range of the honest ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from .._types import FloatArray
from ..errors import ConfigError, InvalidGradient, ShapeMismatch
from ..federated.accumulate.config import DEFAULT_MAX_WEIGHT

__all__ = ["FIXED_SLOTS", "MAX_SAMPLES", "PeerTail", "RoundSummary", "VectorLayout", "robust_mean"]

FIXED_SLOTS: Final = ("fit", "fit_samples", "eval_samples", "eval_loss")
"""The tail slots every session has, before the declared metrics."""

MAX_SAMPLES: Final = 1 << 24
"""Largest sample count a tail may ever carry (float32 holds integers exactly up to 2**24)."""


def robust_mean(items: Sequence[tuple[int, float]]) -> float:
    """Combine ``(samples, value)`` pairs: the sample-weighted mean of the middle values.

    The values are sorted and the ``⌊(n - 1) / 2⌋`` lowest and highest are dropped (for odd
    ``n`` the median is left, for even ``n`` the two middle values, weighted by their samples);
    ``0.0`` for no items. Why: a peer reports its own metrics and sample count, so a weighted
    mean lets one peer set it (a loss of −3e38, or an accuracy of 3e38 with the largest
    allowed count). With at most ``⌊(n - 1) / 2⌋`` liars (any minority) every value left lies
    between two honest values, so any weighting of them stays within the honest range; the
    weights (each capped at ``max_samples`` by :meth:`VectorLayout.read_tail`) only choose a
    point inside it. Two values (and one) are the Flower-style sample-weighted mean. Ties are
    broken by the samples, so every peer computes the same float64 from the same roster.
    """
    ordered = sorted(items, key=lambda item: (item[1], item[0]))
    cut = (len(ordered) - 1) // 2
    middle = ordered[cut : len(ordered) - cut] if ordered else []
    total = sum(w for w, _ in middle)
    if not total:
        return 0.0
    return sum(w * v for w, v in middle) / total


@dataclass(frozen=True)
class PeerTail:
    """One contribution's tail, checked (an unusable tail reads as nothing)."""

    fit: bool
    fit_samples: int
    eval_samples: int
    eval_loss: float
    fit_metrics: dict[str, float]
    eval_metrics: dict[str, float]


@dataclass(frozen=True)
class RoundSummary:
    """A global model's tail: the agreed summary of the round that produced it."""

    results: int
    fit_samples: int
    eval_samples: int
    eval_loss: float | None
    fit_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    secure: tuple[str, ...] = ()
    """The members flagged in the secure tail (the secure sum's survivors), sorted."""


@dataclass(frozen=True)
class VectorLayout:
    """Where parameters and metrics sit in a session's vectors.

    Attributes
    ----------
    params
        Number of model parameters d.
    fit_metrics, eval_metrics
        Names of the client metrics carried (others returned by clients are dropped).
    secure
        The members, one flag slot each, of a session under secure aggregation (else empty).
    max_samples
        Largest sample count (fit or evaluation) a peer's tail may report: the session's
        agreed ``max_weight`` (default :data:`DEFAULT_MAX_WEIGHT`, 2**20; at most
        :data:`MAX_SAMPLES`). A tail above it reads as a peer that did nothing.
    """

    params: int
    fit_metrics: tuple[str, ...] = ()
    eval_metrics: tuple[str, ...] = ()
    secure: tuple[str, ...] = ()
    max_samples: int = DEFAULT_MAX_WEIGHT

    def __post_init__(self) -> None:
        if self.params < 1:
            raise ConfigError(f"a model needs at least one parameter, got {self.params}")
        if not 1 <= self.max_samples <= MAX_SAMPLES:
            raise ConfigError(f"max_samples must be in [1, {MAX_SAMPLES}], got {self.max_samples}")
        for names in (self.fit_metrics, self.eval_metrics, self.secure):
            if len(set(names)) != len(names):
                raise ConfigError(f"metric names must be distinct: {names}")

    @property
    def tail(self) -> int:
        """Number of tail slots."""
        return len(FIXED_SLOTS) + len(self.fit_metrics) + len(self.eval_metrics) + len(self.secure)

    @property
    def size(self) -> int:
        """Length of every vector of the session: ``params + tail``."""
        return self.params + self.tail

    def split(self, vector: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Return ``(params, tail)`` views of a session vector.

        Raises
        ------
        ShapeMismatch
            If the vector is not :attr:`size` long.
        """
        flat = np.asarray(vector, dtype=np.float32).reshape(-1)
        if flat.size != self.size:
            raise ShapeMismatch([self.size], [flat.size])
        return flat[: self.params], flat[self.params :]

    def genesis(self, params: FloatArray) -> FloatArray:
        """Return the session's first vector: ``params`` and a zero tail."""
        p = np.asarray(params, dtype=np.float32).reshape(-1)
        if p.size != self.params:
            raise ShapeMismatch([self.params], [p.size])
        return np.concatenate([p, np.zeros(self.tail, np.float32)])

    def contribution(
        self,
        update: FloatArray | None,
        *,
        fit_samples: int = 0,
        fit_metrics: Mapping[str, float] | None = None,
        eval_samples: int = 0,
        eval_loss: float = 0.0,
        eval_metrics: Mapping[str, float] | None = None,
    ) -> FloatArray:
        """Pack one peer's contribution; ``update=None`` means it did not train (zeros)."""
        out = np.zeros(self.size, np.float32)
        if update is not None:
            u = np.asarray(update, dtype=np.float32).reshape(-1)
            if u.size != self.params:
                raise ShapeMismatch([self.params], [u.size])
            out[: self.params] = u
        fit_values = [float((fit_metrics or {}).get(n, 0.0)) for n in self.fit_metrics]
        eval_values = [float((eval_metrics or {}).get(n, 0.0)) for n in self.eval_metrics]
        fixed = [float(update is not None), fit_samples, eval_samples, eval_loss]
        flags = [0.0] * len(self.secure)
        out[self.params :] = np.array([*fixed, *fit_values, *eval_values, *flags], np.float64)
        if not np.isfinite(out[self.params :]).all():
            raise InvalidGradient("client losses and metrics must be finite")
        return out

    def read_tail(self, tail: FloatArray) -> PeerTail:
        """Decode a peer's tail; an unusable one reads as a peer that did nothing."""
        t = np.asarray(tail, dtype=np.float64)
        k, n, e = len(FIXED_SLOTS), len(self.fit_metrics), len(self.eval_metrics)
        fit_n, eval_n = t[1], t[2]
        usable = (
            t.size == self.tail
            and bool(np.isfinite(t).all())
            and t[0] in (0.0, 1.0)
            and all(0 <= c <= self.max_samples and c == int(c) for c in (fit_n, eval_n))
        )
        if not usable:
            return PeerTail(False, 0, 0, 0.0, {}, {})
        return PeerTail(
            fit=bool(t[0] == 1.0) and fit_n > 0,
            fit_samples=int(fit_n),
            eval_samples=int(eval_n),
            eval_loss=float(t[3]),
            fit_metrics=dict(zip(self.fit_metrics, t[k : k + n].tolist(), strict=True)),
            eval_metrics=dict(zip(self.eval_metrics, t[k + n : k + n + e].tolist(), strict=True)),
        )

    def summarize(self, fits: Sequence[PeerTail], evaluations: Sequence[PeerTail]) -> FloatArray:
        """Return the global tail: sample totals and :func:`robust_mean` of each metric.

        ``fits`` and ``evaluations`` are checked tails (:meth:`read_tail`); the result does not
        depend on their order.
        """
        fit_total = sum(p.fit_samples for p in fits)
        eval_total = sum(p.eval_samples for p in evaluations)
        fit_values = [
            robust_mean([(p.fit_samples, p.fit_metrics[n]) for p in fits]) for n in self.fit_metrics
        ]
        eval_values = [
            robust_mean([(p.eval_samples, p.eval_metrics[n]) for p in evaluations])
            for n in self.eval_metrics
        ]
        loss = robust_mean([(p.eval_samples, p.eval_loss) for p in evaluations])
        fixed = [len(fits), fit_total, eval_total, loss]
        flags = [0.0] * len(self.secure)
        values = [*fixed, *fit_values, *eval_values, *flags]
        return np.array(values, np.float64).astype(np.float32)

    def summary(self, model: FloatArray) -> RoundSummary:
        """Decode a global model's tail (this session's own: trusted after agreement)."""
        _, tail = self.split(model)
        t = tail.astype(np.float64).tolist()
        k, n, e = len(FIXED_SLOTS), len(self.fit_metrics), len(self.eval_metrics)
        flags = t[k + n + e :]
        return RoundSummary(
            results=int(t[0]),
            fit_samples=int(t[1]),
            eval_samples=int(t[2]),
            eval_loss=t[3] if t[2] > 0 else None,
            fit_metrics=dict(zip(self.fit_metrics, t[k : k + n], strict=True)) if t[0] else {},
            eval_metrics=dict(zip(self.eval_metrics, t[k + n : k + n + e], strict=True))
            if t[2]
            else {},
            secure=tuple(sorted(p for p, f in zip(self.secure, flags, strict=True) if f == 1.0)),
        )
