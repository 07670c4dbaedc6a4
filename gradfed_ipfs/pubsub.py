"""IPFS pubsub: a Kubo client, an in-memory transport, and gradient announcements.

Kubo's pubsub RPC (since v0.11) puts a topic on the wire as ``u`` + base64url without padding,
takes message data as a multipart file, and streams received messages from ``pubsub/sub`` as
NDJSON objects ``{"from", "data", "seqno", "topicIDs"}`` whose byte fields are multibase
``u``-prefixed base64url. ``from`` is the sender's peer ID, authenticated because Kubo signs
pubsub messages. This module and ``blockstore/kubo.py`` are the only places that catch ``httpx``
errors; they leave here as :class:`~gradfed_ipfs.errors.PubsubError`.

Announcements (DESIGN §3) go on topic ``gradfed/v1/<session_id>`` as small JSON objects::

    {"version": 1, "session": "...", "round": 3, "peer_id": "12D3Koo...", "cid": "bafy...",
     "num_samples": 128, "length": 10000000, "timestamp_ms": 1764400000000}

:class:`AnnouncementFilter` is the receiver's pure validation logic: it drops, and counts by
reason, every message that is oversized, malformed, from another session, carries a CID that
does not parse, claims a peer ID other than its authenticated ``from``, repeats a (peer, round)
already seen, or is the receiver's own.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import re
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import httpx
from multiformats import CID

from .cid import parse_cid
from .errors import (
    DecodeError,
    MalformedAnnouncement,
    PubsubError,
    PubsubRequestError,
    PubsubUnavailable,
)

__all__ = [
    "ANNOUNCEMENT_VERSION",
    "MAX_MESSAGE_BYTES",
    "TOPIC_PREFIX",
    "Announcement",
    "AnnouncementFilter",
    "KuboPubsub",
    "MemoryPubsub",
    "MemoryPubsubBus",
    "PubsubMessage",
    "PubsubTransport",
    "decode_multibase",
    "decode_topic",
    "encode_multibase",
    "encode_topic",
    "parse_sub_line",
    "session_topic",
]

logger = logging.getLogger("gradfed_ipfs.pubsub")

TOPIC_PREFIX: Final = "gradfed/v1/"
"""Announcement topics are ``TOPIC_PREFIX + session_id``."""
ANNOUNCEMENT_VERSION: Final = 1
"""The announcement layout written and accepted here."""
MAX_MESSAGE_BYTES: Final = 64 * 1024
"""Receivers drop announcements larger than this (64 KiB)."""
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


class PubsubTransport(Protocol):
    """What announcements need from pubsub: publish, subscribe, and who else listens."""

    async def local_peer_id(self) -> str:
        """Return this node's peer ID (the ``from`` of what it publishes)."""
        ...

    async def publish(self, topic: str, data: bytes) -> None:
        """Publish ``data`` on ``topic``."""
        ...

    def subscribe(self, topic: str) -> AsyncIterator[PubsubMessage]:
        """Return an async iterator over messages on ``topic`` published from now on."""
        ...

    async def peers(self, topic: str) -> list[str]:
        """Return the peers known to subscribe to ``topic``."""
        ...

    async def aclose(self) -> None:
        """Release the transport's resources."""
        ...


# --------------------------------------------------------------------------- Kubo


class KuboPubsub:
    """Kubo's pubsub RPC on one shared ``httpx.AsyncClient``.

    Parameters
    ----------
    api_url
        The daemon's RPC base URL, e.g. ``http://127.0.0.1:5001``.
    timeout
        Seconds bounding each non-streaming call.
    reconnect_delay
        First delay in seconds before re-opening a broken ``pubsub/sub`` stream; doubles up to
        ``max_reconnect_delay``.
    max_reconnect_delay
        Largest delay between reconnect attempts, in seconds.
    transport
        An ``httpx`` transport to use instead of the network (tests).

    Attributes
    ----------
    reconnects
        How many times a subscription stream was re-opened.
    bad_lines
        Stream lines that were not valid pubsub messages (skipped).
    """

    def __init__(
        self,
        api_url: str,
        *,
        timeout: float = 10.0,
        reconnect_delay: float = 0.1,
        max_reconnect_delay: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.timeout = timeout
        self.reconnect_delay = reconnect_delay
        self.max_reconnect_delay = max_reconnect_delay
        self.reconnects = 0
        self.bad_lines = 0
        self._peer_id: str | None = None
        self._closed = False
        self._client = httpx.AsyncClient(
            base_url=f"{self.api_url}/api/v0",
            transport=transport,
            timeout=httpx.Timeout(timeout, connect=5.0),
        )

    async def _post(self, endpoint: str, params: Mapping[str, str], **kwargs: Any) -> Any:
        try:
            response = await self._client.post(f"/{endpoint}", params=dict(params), **kwargs)
        except httpx.HTTPError as exc:
            raise PubsubUnavailable(
                f"{endpoint} failed: {exc!r}", api_url=self.api_url, topic=params.get("arg")
            ) from exc
        if response.status_code != 200:
            raise PubsubRequestError(
                f"Kubo refused {endpoint}: HTTP {response.status_code} {response.text[:300]}",
                api_url=self.api_url,
                topic=params.get("arg"),
            )
        text = response.text.strip()
        try:
            return json.loads(text) if text else None
        except ValueError as exc:
            raise PubsubRequestError(f"{endpoint} answered non-JSON: {text[:100]!r}") from exc

    async def local_peer_id(self) -> str:
        """Return the daemon's peer ID (``id``), cached after the first call."""
        if self._peer_id is None:
            answer = await self._post("id", {})
            self._peer_id = str(answer["ID"])
        return self._peer_id

    async def publish(self, topic: str, data: bytes) -> None:
        """``pubsub/pub``: the topic in multibase, the data as a multipart file.

        Raises
        ------
        PubsubUnavailable, PubsubRequestError
            If the daemon cannot be reached or refuses.
        """
        files = {"file": ("data", data, "application/octet-stream")}
        await self._post("pubsub/pub", {"arg": encode_topic(topic)}, files=files)

    async def topics(self) -> list[str]:
        """``pubsub/ls``: the topics this daemon subscribes to (decoded)."""
        answer = await self._post("pubsub/ls", {}) or {}
        return [decode_topic(t) for t in answer.get("Strings") or []]

    async def peers(self, topic: str | None = None) -> list[str]:
        """``pubsub/peers``: peers we know subscribe to ``topic`` (any topic when ``None``)."""
        params = {"arg": encode_topic(topic)} if topic is not None else {}
        answer = await self._post("pubsub/peers", params) or {}
        return [str(p) for p in answer.get("Strings") or []]

    async def subscribe(self, topic: str) -> AsyncIterator[PubsubMessage]:
        """``pubsub/sub`` as an async iterator, re-opening the stream whenever it breaks.

        Lines that are not valid messages are counted in :attr:`bad_lines` and skipped. The
        iterator ends only when the consumer stops or :meth:`aclose` is called.
        """
        delay = self.reconnect_delay
        first = True
        while not self._closed:
            if not first:
                self.reconnects += 1
                logger.debug("pubsub/sub %s: reconnecting in %.2fs", topic, delay)
                await asyncio.sleep(delay)  # reconnect backoff, not a synchronisation
                delay = min(delay * 2, self.max_reconnect_delay)
            first = False
            try:
                async for message in self._stream(topic):
                    delay = self.reconnect_delay
                    yield message
            except PubsubError as exc:
                logger.debug("pubsub/sub %s broke: %s", topic, exc)

    async def _stream(self, topic: str) -> AsyncIterator[PubsubMessage]:
        request = self._client.build_request(
            "POST",
            "/pubsub/sub",
            params={"arg": encode_topic(topic)},
            timeout=httpx.Timeout(None, connect=5.0),
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise PubsubUnavailable(f"pubsub/sub failed: {exc!r}", topic=topic) from exc
        try:
            if response.status_code != 200:
                body = (await response.aread())[:300]
                raise PubsubRequestError(f"pubsub/sub: HTTP {response.status_code} {body!r}")
            async for line in response.aiter_lines():
                message = self._parse(line)
                if message is not None:
                    yield message
        except httpx.HTTPError as exc:
            raise PubsubUnavailable(f"pubsub/sub stream broke: {exc!r}", topic=topic) from exc
        finally:
            with contextlib.suppress(httpx.HTTPError):
                await response.aclose()

    def _parse(self, line: str) -> PubsubMessage | None:
        if not line.strip():
            return None
        try:
            item = json.loads(line)
            if not isinstance(item, dict):
                raise DecodeError("not an object")
            return parse_sub_line(item)
        except (ValueError, DecodeError, RecursionError) as exc:  # never end the stream
            self.bad_lines += 1
            logger.debug("skipping bad pubsub line %r: %s", line[:80], exc)
            return None

    async def aclose(self) -> None:
        """Close the HTTP client; open subscriptions end."""
        self._closed = True
        await self._client.aclose()


# --------------------------------------------------------------------------- in memory


class MemoryPubsubBus:
    """An in-process pubsub network for unit tests: every endpoint sees every publication.

    Subscriptions register synchronously when :meth:`MemoryPubsub.subscribe` is called, so a
    subscriber sees exactly the messages published after that call.
    """

    def __init__(self) -> None:
        self._queues: dict[str, list[tuple[str, asyncio.Queue[PubsubMessage]]]] = {}
        self._seqno = 0

    def endpoint(self, peer_id: str) -> MemoryPubsub:
        """Return a transport for ``peer_id`` on this bus."""
        return MemoryPubsub(self, peer_id)

    def deliver(self, sender: str, topic: str, data: bytes) -> None:
        """Hand a message from ``sender`` to every subscriber of ``topic`` (the sender too)."""
        self._seqno += 1
        message = PubsubMessage(sender, bytes(data), self._seqno.to_bytes(8, "big"), (topic,))
        for _, queue in self._queues.get(topic, []):
            queue.put_nowait(message)

    def register(self, topic: str, peer_id: str) -> asyncio.Queue[PubsubMessage]:
        """Add a subscriber queue for ``peer_id`` on ``topic``."""
        queue: asyncio.Queue[PubsubMessage] = asyncio.Queue()
        self._queues.setdefault(topic, []).append((peer_id, queue))
        return queue

    def unregister(self, topic: str, queue: asyncio.Queue[PubsubMessage]) -> None:
        """Remove a subscriber queue."""
        self._queues[topic] = [(p, q) for p, q in self._queues.get(topic, []) if q is not queue]

    def subscribers(self, topic: str) -> list[str]:
        """Return the peer IDs subscribed to ``topic``."""
        return sorted({peer for peer, _ in self._queues.get(topic, [])})


class MemoryPubsub:
    """One peer's endpoint on a :class:`MemoryPubsubBus` (a :class:`PubsubTransport`).

    Parameters
    ----------
    bus
        The shared bus.
    peer_id
        This endpoint's peer ID: the authenticated ``from`` of what it publishes.
    """

    def __init__(self, bus: MemoryPubsubBus, peer_id: str) -> None:
        self.bus = bus
        self.peer_id = peer_id

    async def local_peer_id(self) -> str:
        """Return this endpoint's peer ID."""
        return self.peer_id

    async def publish(self, topic: str, data: bytes) -> None:
        """Deliver ``data`` to every current subscriber of ``topic``."""
        self.bus.deliver(self.peer_id, topic, data)
        await asyncio.sleep(0)

    def subscribe(self, topic: str) -> AsyncIterator[PubsubMessage]:
        """Subscribe now and return an iterator over later messages."""
        queue = self.bus.register(topic, self.peer_id)
        return self._iterate(topic, queue)

    async def _iterate(
        self, topic: str, queue: asyncio.Queue[PubsubMessage]
    ) -> AsyncIterator[PubsubMessage]:
        try:
            while True:
                yield await queue.get()
        finally:
            self.bus.unregister(topic, queue)

    async def peers(self, topic: str) -> list[str]:
        """Return the other peers subscribed to ``topic``."""
        return [p for p in self.bus.subscribers(topic) if p != self.peer_id]

    async def aclose(self) -> None:
        """Nothing to release."""


# --------------------------------------------------------------------------- announcements


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
            record = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            # RecursionError: deeply nested JSON fits under the size cap (found by fuzzing).
            raise _bad("malformed", f"announcement is not JSON: {type(exc).__name__}") from None
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
