"""Gradient announcements (DESIGN §3): the wire record and the receiver's checks.

Announcements go on topic ``gradfed/v1/<session_id>`` (see
:func:`~gradfed_ipfs.kubo.pubsub.session_topic`) as small JSON objects::

    {"version": 1, "session": "...", "round": 3, "peer_id": "12D3Koo...", "cid": "bafy...",
     "num_samples": 128, "length": 10000000, "timestamp_ms": 1764400000000}

:class:`AnnouncementFilter` is the receiver's pure validation logic: it drops, and counts by
reason, every message that is oversized, malformed, from another session, carries a CID that
does not parse, claims a peer ID other than its authenticated ``from``, repeats a (peer, round)
already seen, or is the receiver's own. The transport that carries them
(:class:`~gradfed_ipfs.kubo.pubsub.PubsubMessage`, Kubo and in-memory pubsub) is
:mod:`gradfed_ipfs.kubo.pubsub`.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from multiformats import CID

from ..cid import parse_cid
from ..errors import DecodeError, MalformedAnnouncement
from .limits import load_json
from .pubsub import PubsubMessage

__all__ = [
    "ANNOUNCEMENT_VERSION",
    "MAX_MESSAGE_BYTES",
    "Announcement",
    "AnnouncementFilter",
]

logger = logging.getLogger("gradfed_ipfs.formats.announcement")

ANNOUNCEMENT_VERSION: Final = 1
"""The announcement layout written and accepted here."""
MAX_MESSAGE_BYTES: Final = 64 * 1024
"""Receivers drop announcements larger than this (64 KiB)."""


@dataclass(frozen=True, slots=True)
class Announcement:
    """A peer's claim that it holds a gradient for a round (DESIGN §3).

    Attributes
    ----------
    session
        Session ID; the topic is ``gradfed/v1/<session>``.
    round
        Round number (≥ 0).
    peer_id
        The announcing peer; receivers require it to equal the pubsub ``from``.
    cid
        The gradient's CID (raw block or dag-cbor manifest).
    num_samples
        Training samples behind the gradient (FedAvg weight), or ``None``.
    length
        Number of float32 values (d).
    timestamp_ms
        Unix time of the announcement, in milliseconds.
    version
        Layout version (:data:`ANNOUNCEMENT_VERSION`).
    """

    session: str
    round: int
    peer_id: str
    cid: CID
    num_samples: int | None
    length: int
    timestamp_ms: int
    version: int = ANNOUNCEMENT_VERSION

    @classmethod
    def new(
        cls,
        session: str,
        round_id: int,
        peer_id: str,
        cid: CID | str,
        *,
        num_samples: int | None = None,
        length: int = 0,
    ) -> Announcement:
        """Create an announcement stamped now (the CID is parsed)."""
        return cls(
            session, round_id, peer_id, parse_cid(cid), num_samples, length, int(time.time() * 1e3)
        )

    def encode(self) -> bytes:
        """Return the compact JSON bytes of the announcement."""
        record = {
            "version": self.version,
            "session": self.session,
            "round": self.round,
            "peer_id": self.peer_id,
            "cid": str(self.cid),
            "num_samples": self.num_samples,
            "length": self.length,
            "timestamp_ms": self.timestamp_ms,
        }
        return json.dumps(record, separators=(",", ":")).encode("utf-8")

    @classmethod
    def decode(cls, data: bytes) -> Announcement:
        """Parse and validate untrusted announcement bytes.

        Raises
        ------
        MalformedAnnouncement
            With ``reason`` ``"oversized"``, ``"malformed"`` or ``"bad_cid"``.
        """
        if len(data) > MAX_MESSAGE_BYTES:
            raise _bad("oversized", f"announcement of {len(data)} bytes > {MAX_MESSAGE_BYTES}")
        try:
            # Depth-limited: deeply nested JSON fits under the size cap (found by fuzzing).
            record = load_json(data, "announcement", error=MalformedAnnouncement)
        except MalformedAnnouncement as exc:
            raise _bad("malformed", str(exc)) from None
        if not isinstance(record, dict):
            raise _bad("malformed", "announcement is not a JSON object")
        version = record.get("version")
        # `true == 1` and `1.0 == 1` in Python: require the integer itself.
        if type(version) is not int or version != ANNOUNCEMENT_VERSION:
            raise _bad("malformed", f"unsupported version {record.get('version')!r:.20}")
        session, peer_id, cid_text = record.get("session"), record.get("peer_id"), record.get("cid")
        if not isinstance(session, str) or not isinstance(peer_id, str) or not peer_id:
            raise _bad("malformed", "session and peer_id must be strings")
        samples = record.get("num_samples")
        if samples is not None and not _is_count(samples):
            raise _bad("malformed", f"num_samples must be a non-negative int, got {samples!r:.20}")
        for key in ("round", "length", "timestamp_ms"):
            if not _is_count(record.get(key)):
                raise _bad("malformed", f"{key} must be a non-negative int")
        if not isinstance(cid_text, str):
            raise _bad("bad_cid", "cid must be a string")
        try:
            cid = parse_cid(cid_text)
        except DecodeError as exc:
            raise _bad("bad_cid", str(exc)) from None
        return cls(
            session,
            record["round"],
            peer_id,
            cid,
            samples,
            record["length"],
            record["timestamp_ms"],
        )


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _bad(reason: str, message: str) -> MalformedAnnouncement:
    error = MalformedAnnouncement(message)
    error.reason = reason  # type: ignore[attr-defined]
    return error


class AnnouncementFilter:
    """The receiver's checks: accept each valid announcement once, count every drop by reason.

    Parameters
    ----------
    session
        Only announcements of this session are accepted.
    local_peer_id
        This node's peer ID; its own messages are dropped.
    max_seen
        Most (peer, round) pairs remembered for de-duplication (oldest forgotten first).

    Attributes
    ----------
    drops
        Reason → count: ``oversized``, ``malformed``, ``wrong_session``, ``bad_cid``,
        ``forged_sender``, ``duplicate``, ``own``, ``error``.
    accepted
        Number of announcements accepted.
    """

    def __init__(self, session: str, local_peer_id: str, *, max_seen: int = 4096) -> None:
        self.session = session
        self.local_peer_id = local_peer_id
        self.max_seen = max_seen
        self.drops: Counter[str] = Counter()
        self.accepted = 0
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()

    def accept(self, message: PubsubMessage) -> Announcement | None:
        """Return the announcement if it passes every check, else count the drop and return None.

        Never raises.
        """
        try:
            return self._accept(message)
        except Exception:  # defensive: no exception may escape a subscriber loop
            logger.exception("announcement check failed")
            self.drops["error"] += 1
            return None

    def _accept(self, message: PubsubMessage) -> Announcement | None:
        if message.from_peer == self.local_peer_id:
            self._drop("own")
            return None
        try:
            announcement = Announcement.decode(message.data)
        except MalformedAnnouncement as exc:
            self._drop(getattr(exc, "reason", "malformed"))
            return None
        if announcement.session != self.session:
            self._drop("wrong_session")
            return None
        if announcement.peer_id != message.from_peer:
            self._drop("forged_sender")
            return None
        key = (announcement.peer_id, announcement.round)
        if key in self._seen:
            self._seen.move_to_end(key)
            self._drop("duplicate")
            return None
        self._seen[key] = None
        while len(self._seen) > self.max_seen:
            self._seen.popitem(last=False)
        self.accepted += 1
        return announcement

    def _drop(self, reason: str) -> None:
        self.drops[reason] += 1
        logger.debug("dropped announcement: %s", reason)

    def counts(self) -> Iterator[tuple[str, int]]:
        """Yield ``(reason, count)`` for every drop reason seen, sorted by reason."""
        yield from sorted(self.drops.items())
