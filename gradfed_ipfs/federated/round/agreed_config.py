"""Settings and outcomes of agreed rounds (:mod:`gradfed_ipfs.federated.round.agreed`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from multiformats import CID

from ..._types import CIDLike
from ...cid import parse_cid
from ...errors import InvalidGradient
from ...formats.pubsub import session_topic
from ...formats.roster import Roster

__all__ = ["AgreedConfig", "AgreedRoundResult", "ResyncResult", "agreed_topic"]


def agreed_topic(session: str, genesis: CIDLike) -> str:
    """Return the pubsub topic of an agreed session: ``gradfed/v1/<session>/agreed/<genesis>``."""
    return session_topic(f"{session}/agreed/{parse_cid(genesis)}")


@dataclass(frozen=True)
class AgreedConfig:
    """Settings of an agreed session (times in seconds).

    Attributes
    ----------
    members
        Peer IDs of the session's peers, this one included: the roster's ``expected``.
    min_peers
        Least number of contributions (this peer's included) a roster must list; default all.
    learning_rate
        Factor of the update rule ``M_{r+1} = M_r + learning_rate · weighted mean``.
    collect_timeout
        After the round starts, the coordinator closes the roster with what it has.
    takeover_timeout
        Delay per coordinator rank before the next one publishes a roster itself.
    round_timeout
        No adopted roster by then raises ``QuorumNotReached``.
    done_timeout
        How long ``run_round`` waits for the other roster peers' ``done`` before returning.
        With ``0`` (the default) it does not wait: the next round starts at once, and the
        ``done`` messages of the last round are checked when the next round starts (a
        disagreement raises ``RoundMismatch`` there) and by :meth:`AgreedSession.linger`.
    announce_interval
        Delay before a message is first re-announced; it doubles after each re-announcement.
    max_announce_interval
        Longest delay between re-announcements of one message.
    fetch_timeout
        Bound on fetching one contribution or record.
    """

    members: tuple[str, ...]
    min_peers: int | None = None
    learning_rate: float = 1.0
    collect_timeout: float = 10.0
    takeover_timeout: float = 5.0
    round_timeout: float = 60.0
    done_timeout: float = 0.0
    announce_interval: float = 0.25
    max_announce_interval: float = 1.0
    fetch_timeout: float = 30.0

    def __post_init__(self) -> None:
        if not self.members or len(set(self.members)) != len(self.members):
            raise InvalidGradient("members must be a non-empty list of distinct peer IDs")
        if self.min_peers is not None and not 1 <= self.min_peers <= len(self.members):
            raise InvalidGradient(f"min_peers must be in [1, {len(self.members)}]")
        if not np.isfinite(self.learning_rate):
            raise InvalidGradient("learning_rate must be finite")
        for name in ("collect_timeout", "takeover_timeout", "round_timeout",
                     "announce_interval", "max_announce_interval", "fetch_timeout"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise InvalidGradient(f"{name} must be > 0 seconds")
        if not self.done_timeout >= 0:
            raise InvalidGradient("done_timeout must be >= 0 seconds")

    @property
    def quorum(self) -> int:
        """The effective ``min_peers``."""
        return len(self.members) if self.min_peers is None else self.min_peers


@dataclass(frozen=True)
class AgreedRoundResult:
    """The outcome of one agreed round on this peer.

    Attributes
    ----------
    round
        Round number.
    base, model
        Model CIDs before and after the round.
    record, roster_cid
        The round record's and the roster's CIDs.
    roster
        The agreed roster (its ``entries`` are the participants, in aggregation order).
    included
        Whether this peer's contribution is in the roster.
    absent
        Members that are not in the roster (typed "expected and absent").
    confirmed
        Peers whose ``done`` named the same record.
    unconfirmed
        Roster peers whose ``done`` had not arrived when ``run_round`` returned.
    matched
        Whether every other roster peer had confirmed the same record by then.
    rejected
        Peer → reason, for contributions or rosters refused this round.
    seconds
        Wall time of the round.
    """

    round: int
    base: CID
    model: CID
    record: CID
    roster_cid: CID
    roster: Roster
    included: bool
    absent: tuple[str, ...]
    confirmed: tuple[str, ...]
    unconfirmed: tuple[str, ...]
    matched: bool
    rejected: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(frozen=True)
class ResyncResult:
    """What :meth:`AgreedSession.resync` did: the adopted head and the records it followed."""

    changed: bool
    round: int
    model: CID
    head: CID | None
    records: tuple[CID, ...] = ()
