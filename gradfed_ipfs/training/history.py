"""``History``: what one peer saw of a training session, round by round (JSON, plots).

Agreed round ``r`` trains server round ``r + 1`` and evaluates (federated) the model it
started from; the last agreed round only evaluates. So the federated evaluation of server
round ``k``'s model is in agreed round ``k``'s entry; :meth:`History.losses_distributed` and
:meth:`History.metrics_distributed` line them up as Flower's ``History`` does.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DecodeError

__all__ = ["History", "RoundEntry"]


@dataclass
class RoundEntry:
    """One agreed round as this peer saw it (times in seconds).

    Attributes
    ----------
    round
        Agreed round number r (it trains server round r + 1, evaluates model r).
    record, model, config
        CIDs of the round record, the new global model and the round's client config.
    roster
        Peers whose contributions the round aggregated, in order.
    sampled
        Peers sampled to train.
    results, failures
        Fit results aggregated; sampled peers without one.
    fit_samples, fit_metrics
        Total training samples and their sample-weighted client fit metrics.
    eval_samples, eval_loss, eval_metrics
        Federated evaluation of the round's *base* model over every contributor.
    local_loss, local_metrics
        This peer's ``evaluate_fn`` on the round's *new* model (``None`` without it).
    epsilon
        ε this peer has spent so far (``None`` without differential privacy).
    timings
        ``train``, ``evaluate``, ``secagg``, ``round`` (agreed round) and ``local_evaluate``.
    secure
        Under :class:`~gradfed_ipfs.training.secure.SecAgg`, the sampled peers whose masked
        updates were in the secure sum (``None`` without SecAgg).
    sent_bytes
        Bytes of this peer's contribution blocks this round (``AgreedRoundResult.sent_bytes``:
        about ``4·d`` dense, less with ``AgreedConfig.compression``).
    members
        How many members the round had (its roster's ``expected``; ``0``: not recorded).
    """

    round: int
    record: str
    model: str
    config: str
    roster: list[str]
    sampled: list[str]
    results: int
    failures: int
    fit_samples: int
    fit_metrics: dict[str, float]
    eval_samples: int
    eval_loss: float | None
    eval_metrics: dict[str, float]
    local_loss: float | None = None
    local_metrics: dict[str, float] = field(default_factory=dict)
    epsilon: float | None = None
    timings: dict[str, float] = field(default_factory=dict)
    secure: list[str] | None = None
    sent_bytes: int = 0
    members: int = 0


@dataclass
class History:
    """A training session's rounds as one peer saw them.

    Attributes
    ----------
    session, genesis, peer, strategy
        Session name, genesis model CID, this peer's ID, strategy label.
    rounds
        Server rounds trained.
    initial_local_loss, initial_local_metrics
        ``evaluate_fn`` on the initial model (``None`` without it).
    entries
        One :class:`RoundEntry` per agreed round, in order.
    seconds
        Wall time of the whole run.
    ended
        ``"done"`` (every round run), ``"left"`` (this peer left: ``Peer.leave``) or
        ``"evicted"`` (a round's member set dropped it).
    """

    session: str
    genesis: str
    peer: str
    strategy: str
    rounds: int
    initial_local_loss: float | None = None
    initial_local_metrics: dict[str, float] = field(default_factory=dict)
    entries: list[RoundEntry] = field(default_factory=list)
    seconds: float = 0.0
    ended: str = "done"

    # ------------------------------------------------------------------ Flower-style views

    def losses_distributed(self) -> list[tuple[int, float]]:
        """``(server_round, loss)`` of the federated evaluation of each round's model."""
        return [
            (e.round, e.eval_loss) for e in self.entries if e.round >= 1 and e.eval_loss is not None
        ]

    def metrics_distributed(self) -> dict[str, list[tuple[int, float]]]:
        """Federated evaluation metrics of each server round's model."""
        return _series((e.round, e.eval_metrics) for e in self.entries if e.round >= 1)

    def metrics_distributed_fit(self) -> dict[str, list[tuple[int, float]]]:
        """Sample-weighted client fit metrics of each server round."""
        return _series((e.round + 1, e.fit_metrics) for e in self.entries if e.results)

    def losses_centralized(self) -> list[tuple[int, float]]:
        """``(server_round, loss)`` of this peer's ``evaluate_fn`` (round 0: initial model)."""
        first = [] if self.initial_local_loss is None else [(0, self.initial_local_loss)]
        later = [(e.round + 1, e.local_loss) for e in self.entries if e.local_loss is not None]
        return first + [(r, loss) for r, loss in later if r <= self.rounds]

    def metrics_centralized(self) -> dict[str, list[tuple[int, float]]]:
        """Return this peer's ``evaluate_fn`` metrics per server round (0: the initial model)."""
        items = [(0, self.initial_local_metrics)]
        items += [(e.round + 1, e.local_metrics) for e in self.entries if e.round < self.rounds]
        return _series(items)

    def report(self) -> str:
        """Return the per-round report lines, as printed during the run."""
        return "\n".join(report_line(e, self.rounds) for e in self.entries)

    # ------------------------------------------------------------------ persistence

    def to_json(self) -> str:
        """Return the history as JSON (CIDs as strings; no NaN)."""
        return json.dumps(asdict(self), indent=1, sort_keys=True, allow_nan=False)

    def save(self, path: str | Path) -> Path:
        """Write :meth:`to_json` to ``path``; return it."""
        target = Path(path)
        target.write_text(self.to_json() + "\n")
        return target

    @classmethod
    def from_json(cls, text: str) -> History:
        """Rebuild a history from :meth:`to_json` output.

        Raises
        ------
        DecodeError
            If the text is not a saved history.
        """
        try:
            data = json.loads(text)
            entries = [RoundEntry(**e) for e in data.pop("entries")]
            return cls(**data, entries=entries)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise DecodeError(f"not a saved History: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path) -> History:
        """Read a history written by :meth:`save`."""
        return cls.from_json(Path(path).read_text())

    def plot(self, path: str | Path, metric: str = "accuracy") -> Path:
        """Plot ``metric`` (centralized and distributed) and the losses to ``path`` (PNG).

        Needs matplotlib (``ImportError`` without it).
        """
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for label, points in (
            ("local evaluate_fn", self.metrics_centralized().get(metric, [])),
            ("federated", self.metrics_distributed().get(metric, [])),
            ("clients' fit", self.metrics_distributed_fit().get(metric, [])),
        ):
            if points:
                left.plot(*zip(*points, strict=True), marker="o", label=label)
        left.set(xlabel="server round", ylabel=metric, title=f"{self.session}: {metric}")
        for label, points in (
            ("local evaluate_fn", self.losses_centralized()),
            ("federated", self.losses_distributed()),
        ):
            if points:
                right.plot(*zip(*points, strict=True), marker="o", label=label)
        right.set(xlabel="server round", ylabel="loss", title=self.strategy)
        for axis in (left, right):
            axis.grid(alpha=0.3)
            if axis.get_legend_handles_labels()[0]:
                axis.legend()
        fig.tight_layout()
        target = Path(path)
        fig.savefig(target, dpi=100)
        plt.close(fig)
        return target


def report_line(entry: RoundEntry, rounds: int) -> str:
    """Return Flower's round report for one entry (``round 3: received 3 results and …``)."""
    if entry.round >= rounds:
        head = f"final evaluation of round {entry.round}"
    else:
        secure = "" if entry.secure is None else f" (secure sum of {len(entry.secure)} peers)"
        head = (
            f"round {entry.round + 1}: received {entry.results} results{secure} and "
            f"{entry.failures} failures"
        )
        if entry.members:
            head += f" ({entry.members} members)"
    parts = [head]
    if entry.eval_loss is not None:
        parts.append(f"federated loss of round {entry.round}'s model {entry.eval_loss:.4f}")
    if entry.local_loss is not None:
        parts.append(f"local loss {entry.local_loss:.4f}")
    parts.append(f"({entry.timings.get('round', 0.0):.2f} s, record {entry.record})")
    return "; ".join(parts)


def _series(items: Any) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for server_round, metrics in items:
        for name, value in metrics.items():
            if isinstance(value, float | int) and math.isfinite(value):
                out.setdefault(name, []).append((server_round, float(value)))
    return out
