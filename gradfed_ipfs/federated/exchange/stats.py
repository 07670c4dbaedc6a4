"""Round statistics and model-update announcements, as JSON records."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Self

from ...errors import FederatedError, InvalidGradient

__all__ = ["JsonRecord", "ModelUpdate", "RoundStats"]


class JsonRecord:
    """JSON (de)serialization shared by the round records, over ``to_dict``/``from_dict``."""

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-compatible dict."""
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Build from :meth:`to_dict` output."""
        raise NotImplementedError

    def to_json(self) -> str:
        """Serialize to a JSON string (sorted keys; CIDs as strings)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        """Parse :meth:`to_json` output; malformed input raises ``FederatedError``.

        Parameters
        ----------
        text
            JSON text.

        Returns
        -------
        Self
            The record.
        """
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise FederatedError(f"Malformed {cls.__name__} JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise FederatedError(f"Malformed {cls.__name__} JSON: expected an object")
        return cls.from_dict(data)


@dataclass
class RoundStats(JsonRecord):
    """What happened in one round.

    Parameters
    ----------
    round_id
        The round's id.
    participants
        Number of clients whose contribution was received.
    missing_clients
        Expected clients without a contribution, sorted.
    duration_ms
        Time since the round started (or its total duration once ended), in milliseconds.
    converged
        Whether the convergence detector reports convergence.
    epsilon_spent, delta_spent
        Total (ε, δ) spent by the DP mechanism used in the round, or ``None`` without DP.
    dropped_clients
        Clients that dropped out after committing to the round, sorted: out of secure
        aggregation after masking, or (``RoundRunner``) announced a gradient that never arrived.
    rejected_contributions
        Contributions refused: from a client not in the round, or (``RoundRunner``) corrupt,
        undecodable or of the wrong length.
    """

    round_id: int
    participants: int
    missing_clients: list[str]
    duration_ms: int
    converged: bool = False
    epsilon_spent: float | None = None
    delta_spent: float | None = None
    dropped_clients: list[str] = field(default_factory=list)
    rejected_contributions: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-compatible dict of every field."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoundStats:
        """Build from :meth:`to_dict` output; fields after ``converged`` are optional.

        Parameters
        ----------
        data
            The decoded JSON object.

        Returns
        -------
        RoundStats
            The stats.
        """
        try:
            return cls(
                round_id=int(data["round_id"]),
                participants=int(data["participants"]),
                missing_clients=[str(c) for c in data["missing_clients"]],
                duration_ms=int(data["duration_ms"]),
                converged=bool(data.get("converged", False)),
                epsilon_spent=_opt_float(data.get("epsilon_spent")),
                delta_spent=_opt_float(data.get("delta_spent")),
                dropped_clients=[str(c) for c in data.get("dropped_clients", [])],
                rejected_contributions=int(data.get("rejected_contributions", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FederatedError(f"Malformed RoundStats: {exc}") from exc


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class ModelUpdate(JsonRecord):
    """An announcement that ``peer_id`` holds model ``model_cid`` for ``round_id``.

    Parameters
    ----------
    peer_id
        The announcing peer.
    model_cid
        CID string of the model.
    round_id
        The round (>= 0).
    timestamp_ms
        Unix time of the announcement, in milliseconds.
    """

    peer_id: str
    model_cid: str
    round_id: int
    timestamp_ms: int

    @classmethod
    def new(cls, peer_id: str, model_cid: str, round_id: int) -> ModelUpdate:
        """Create an update stamped with the current time.

        Parameters
        ----------
        peer_id
            The announcing peer.
        model_cid
            CID string of the model.
        round_id
            The round (>= 0).

        Returns
        -------
        ModelUpdate
            The update.
        """
        if round_id < 0:
            raise InvalidGradient(f"round_id must be >= 0, got {round_id}")
        return cls(peer_id, model_cid, round_id, int(time.time() * 1000))

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-compatible dict of every field."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelUpdate:
        """Build from :meth:`to_dict` output.

        Parameters
        ----------
        data
            The decoded JSON object.

        Returns
        -------
        ModelUpdate
            The update.
        """
        try:
            return cls(
                str(data["peer_id"]),
                str(data["model_cid"]),
                int(data["round_id"]),
                int(data["timestamp_ms"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FederatedError(f"Malformed ModelUpdate: {exc}") from exc
