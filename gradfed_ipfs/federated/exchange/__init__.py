"""What every round protocol shares: announcing, fetching and encoding contributions, and stats.

:class:`Reannouncer` repeats pubsub messages until they are no longer needed,
:class:`ContributionFetcher` fetches announced contributions by CID, :class:`EncodedGradient`
is a gradient's Arrow bytes and CID, :func:`carried_or_fetched` loads a record a message
names (its inline bytes, else by CID), and :class:`RoundStats` / :class:`ModelUpdate` are the
JSON records a round reports.
"""

from __future__ import annotations

from .announcer import Reannouncer
from .encoded import EncodedGradient, encode_gradient
from .fetcher import ContributionFetcher
from .records import carried_or_fetched
from .stats import ModelUpdate, RoundStats

__all__ = [
    "ContributionFetcher",
    "EncodedGradient",
    "ModelUpdate",
    "Reannouncer",
    "RoundStats",
    "carried_or_fetched",
    "encode_gradient",
]
