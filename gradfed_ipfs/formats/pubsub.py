"""Pubsub wire forms, without I/O: multibase fields, topic encoding, received messages.

Kubo's pubsub RPC (since v0.11) puts a topic on the wire as ``u`` + base64url without padding
and streams received messages from ``pubsub/sub`` as NDJSON objects ``{"from", "data", "seqno",
"topicIDs"}`` whose byte fields are multibase ``u``-prefixed base64url.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..errors import DecodeError

__all__ = [
    "TOPIC_PREFIX",
    "PubsubMessage",
    "decode_multibase",
    "decode_topic",
    "encode_multibase",
    "encode_topic",
    "parse_sub_line",
    "session_topic",
]

TOPIC_PREFIX: Final = "gradfed/v1/"
"""Announcement topics are ``TOPIC_PREFIX + session_id``."""
_BASE64URL: Final = re.compile(r"[A-Za-z0-9_-]*")


def encode_multibase(data: bytes) -> str:
    """Return ``u`` + base64url without padding (multibase ``base64url``)."""
    return "u" + base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def decode_multibase(text: str) -> bytes:
    """Decode a multibase ``u`` (base64url, unpadded) string.

    Raises
    ------
    DecodeError
        If it is not ``u``-prefixed base64url.
    """
    if not isinstance(text, str) or not text.startswith("u"):
        raise DecodeError(f"not multibase base64url: {text!r:.60}")
    body = text[1:]
    if not _BASE64URL.fullmatch(body):
        raise DecodeError(f"not multibase base64url: {text!r:.60}")
    try:
        return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError) as exc:
        raise DecodeError(f"not multibase base64url: {text!r:.60}") from exc


def encode_topic(topic: str) -> str:
    """Return the wire form of a topic (``u`` + base64url of its UTF-8 bytes)."""
    return encode_multibase(topic.encode("utf-8"))


def decode_topic(wire: str) -> str:
    """Return the topic from its wire form; see :func:`encode_topic`."""
    try:
        return decode_multibase(wire).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"topic is not UTF-8: {wire!r:.60}") from exc


def session_topic(session_id: str) -> str:
    """Return the announcement topic of a session: ``gradfed/v1/<session_id>``."""
    return f"{TOPIC_PREFIX}{session_id}"


@dataclass(frozen=True, slots=True)
class PubsubMessage:
    """One received pubsub message.

    Attributes
    ----------
    from_peer
        The sender's peer ID (authenticated by the transport).
    data
        The message payload.
    seqno
        The sender's sequence number bytes.
    topics
        The topics it was published on.
    """

    from_peer: str
    data: bytes
    seqno: bytes = b""
    topics: tuple[str, ...] = ()


def parse_sub_line(item: Mapping[str, Any]) -> PubsubMessage:
    """Parse one decoded NDJSON object of ``pubsub/sub``.

    Raises
    ------
    DecodeError
        If a field is missing or not multibase.
    """
    sender = item.get("from")
    if not isinstance(sender, str) or not sender:
        raise DecodeError("pubsub message without a 'from' peer ID")
    topic_ids = item.get("topicIDs") or []
    if not isinstance(topic_ids, list):
        raise DecodeError("pubsub message 'topicIDs' is not a list")
    seqno = item.get("seqno")
    return PubsubMessage(
        from_peer=sender,
        data=decode_multibase(item.get("data", "u")),
        seqno=decode_multibase(seqno) if isinstance(seqno, str) else b"",
        topics=tuple(decode_topic(t) for t in topic_ids),
    )
