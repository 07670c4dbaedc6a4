"""IPFS pubsub: a Kubo client and an in-memory transport.

Kubo's pubsub RPC (since v0.11) puts a topic on the wire as ``u`` + base64url without padding,
takes message data as a multipart file, and streams received messages from ``pubsub/sub`` as
NDJSON objects ``{"from", "data", "seqno", "topicIDs"}`` whose byte fields are multibase
``u``-prefixed base64url. ``from`` is the sender's peer ID, authenticated because Kubo signs
pubsub messages. Calls go through the one RPC client (:mod:`gradfed_ipfs.kubo.rpc`) with the
pubsub error family: failures leave as :class:`~gradfed_ipfs.errors.PubsubError`, each call has
a total deadline, and a ``pubsub/sub`` line longer than
:data:`~gradfed_ipfs.kubo.rpc.MAX_PUBSUB_LINE_BYTES` is skipped as it streams in, never held.

The gradient announcements carried on topic ``gradfed/v1/<session_id>`` (DESIGN §3), and the
receiver's checks on them, live in :mod:`gradfed_ipfs.formats.announcement`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final, Protocol

from ..errors import (
    BadSignature,
    ConfigError,
    DecodeError,
    PubsubError,
    PubsubRequestError,
    PubsubResponseTooLarge,
    PubsubTimeout,
    PubsubUnavailable,
)
from ..formats.pubsub import (
    TOPIC_PREFIX,
    PubsubMessage,
    decode_multibase,
    decode_topic,
    encode_multibase,
    encode_topic,
    parse_sub_line,
    session_topic,
)
from ..formats.statement import (
    PEER_ID_KEYS,
    DelegatedSigner,
    KeyBook,
    KeyDirectory,
    LocalSigner,
    Signer,
)
from ..formats.statement import ed25519_key_of as _ed25519_key_of
from .rpc import MAX_PUBSUB_LINE_BYTES, KuboRpc, Transport
from .rpc_errors import ErrorFamily
from .signing import KuboSigner

__all__ = [
    "PUBSUB_ERRORS",
    "PUBLISH_ATTEMPTS",
    "TOPIC_PREFIX",
    "KuboPubsub",
    "MemoryPubsub",
    "MemoryPubsubBus",
    "PubsubMessage",
    "PubsubTransport",
    "PubsubWrapper",
    "decode_multibase",
    "decode_topic",
    "encode_multibase",
    "encode_topic",
    "parse_sub_line",
    "session_topic",
]

logger = logging.getLogger("gradfed_ipfs.kubo.pubsub")

PUBLISH_ATTEMPTS: Final = 5
"""Tries of one ``pubsub/pub`` that Kubo answers with "validation ignored" (a seqno race)."""
_SEQNO_IGNORED: Final = "validation ignored"

PUBSUB_ERRORS: Final = ErrorFamily(
    unavailable=PubsubUnavailable,
    timeout=PubsubTimeout,
    too_large=PubsubResponseTooLarge,
    refused=PubsubRequestError,
)
"""Pubsub's error family for :class:`~gradfed_ipfs.kubo.rpc.KuboRpc` calls."""


class PubsubTransport(Protocol):
    """What announcements need from pubsub: publish, subscribe, who else listens, and identity.

    The transport is the peer's identity on the network: it authenticates the ``from`` of what
    it publishes, signs this peer's statements (:meth:`signer`) and knows where the others'
    keys are (:attr:`keys`).
    """

    async def local_peer_id(self) -> str:
        """Return this node's peer ID (the ``from`` of what it publishes)."""
        ...

    async def signer(self) -> Signer:
        """Return what signs this node's statements (its identity key)."""
        ...

    @property
    def keys(self) -> KeyBook:
        """Where the statements' authors' keys are found."""
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


class PubsubWrapper:
    """A transport that hands every call to ``inner``: subclass it to change one part.

    Loss, delay or counting wrappers (tests, benchmarks, simulations) override ``publish`` or
    ``subscribe`` and keep the inner transport's identity, peers and lifetime.
    """

    def __init__(self, inner: PubsubTransport) -> None:
        self.inner = inner

    async def local_peer_id(self) -> str:
        """Return the inner transport's peer ID."""
        return await self.inner.local_peer_id()

    async def signer(self) -> Signer:
        """Return the inner transport's signer."""
        return await self.inner.signer()

    @property
    def keys(self) -> KeyBook:
        """The inner transport's key book."""
        return self.inner.keys

    async def publish(self, topic: str, data: bytes) -> None:
        """Publish through the inner transport."""
        await self.inner.publish(topic, data)

    def subscribe(self, topic: str) -> AsyncIterator[PubsubMessage]:
        """Subscribe through the inner transport."""
        return self.inner.subscribe(topic)

    async def peers(self, topic: str) -> list[str]:
        """Return the inner transport's peers on ``topic``."""
        return await self.inner.peers(topic)

    async def aclose(self) -> None:
        """Close the inner transport."""
        await self.inner.aclose()


# --------------------------------------------------------------------------- Kubo


class KuboPubsub:
    """Kubo's pubsub RPC, over one :class:`~gradfed_ipfs.kubo.rpc.KuboRpc`.

    Parameters
    ----------
    api_url
        The daemon's RPC base URL, e.g. ``http://127.0.0.1:5001``.
    timeout
        Total deadline of each non-streaming call, in seconds.
    reconnect_delay
        First delay in seconds before re-opening a broken ``pubsub/sub`` stream; doubles up to
        ``max_reconnect_delay``.
    max_reconnect_delay
        Largest delay between reconnect attempts, in seconds.
    transport
        An ``httpx`` transport to use instead of the network (tests).
    rpc
        A shared RPC client (e.g. a :class:`~gradfed_ipfs.Node`'s), not closed by
        :meth:`aclose`; by default the transport makes and owns one.
    max_line
        Longest ``pubsub/sub`` line kept, in bytes; longer ones count in :attr:`bad_lines`.
    delegated
        Sign statements in process with a key the daemon's identity bound once
        (:class:`~gradfed_ipfs.formats.statement.DelegatedSigner`; default), else with the
        identity key itself (one ``key/sign`` call per statement).

    Attributes
    ----------
    reconnects
        How many times a subscription stream was re-opened.
    bad_lines
        Stream lines that were not valid pubsub messages, or too long (skipped).
    """

    def __init__(
        self,
        api_url: str,
        *,
        timeout: float = 10.0,
        reconnect_delay: float = 0.1,
        max_reconnect_delay: float = 2.0,
        transport: Transport | None = None,
        rpc: KuboRpc | None = None,
        max_line: int = MAX_PUBSUB_LINE_BYTES,
        delegated: bool = True,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.delegated = delegated
        self.timeout = timeout
        self.reconnect_delay = reconnect_delay
        self.max_reconnect_delay = max_reconnect_delay
        self.max_line = max_line
        self.reconnects = 0
        self.bad_lines = 0
        self._peer_id: str | None = None
        self._signer: Signer | None = None
        self._closed = False
        self._publishing = asyncio.Lock()
        self._owns_rpc = rpc is None
        self.rpc = rpc or KuboRpc(
            self.api_url, timeout=timeout, errors=PUBSUB_ERRORS, transport=transport
        )

    async def _post(self, endpoint: str, params: Mapping[str, str], **kwargs: Any) -> Any:
        return await self.rpc.post_json(
            endpoint, params, deadline=self.timeout, errors=PUBSUB_ERRORS, **kwargs
        )

    async def local_peer_id(self) -> str:
        """Return the daemon's peer ID (``id``), cached after the first call."""
        if self._peer_id is None:
            answer = await self._post("id", {})
            self._peer_id = str(answer["ID"])
        return self._peer_id

    async def signer(self) -> Signer:
        """Return what signs this daemon's statements (cached).

        With :attr:`delegated`, a delegate key its identity bound (two ``key/sign`` calls
        here, none per statement; the same key after a restart); else the identity key
        (:class:`~gradfed_ipfs.kubo.KuboSigner`, one ``key/sign`` per statement).
        """
        if self._signer is None:
            identity = await KuboSigner.open(self.rpc)
            self._signer = await DelegatedSigner.open(identity) if self.delegated else identity
        return self._signer

    @property
    def keys(self) -> KeyBook:
        """Peer IDs are keys on a real network (:data:`~gradfed_ipfs.formats.PEER_ID_KEYS`)."""
        return PEER_ID_KEYS

    async def publish(self, topic: str, data: bytes) -> None:
        """``pubsub/pub``: the topic in multibase, the data as a multipart file.

        Publications through one transport go one at a time: Kubo's seqno validator ignores a
        local message that a later one of the same daemon overtook (see below), so this
        transport's own publications (a re-publisher beside a new post, say) never race.

        Raises
        ------
        PubsubUnavailable, PubsubRequestError
            If the daemon cannot be reached or refuses (a "validation ignored" answer only
            after :data:`PUBLISH_ATTEMPTS` tries).
        """
        files = {"file": ("data", data, "application/octet-stream")}
        params = {"arg": encode_topic(topic)}
        async with self._publishing:
            for attempt in range(1, PUBLISH_ATTEMPTS + 1):
                try:
                    await self._post("pubsub/pub", params, files=files)
                    return
                except PubsubRequestError as exc:
                    # Kubo's seqno validator ignores a local message whose seqno is not above
                    # the last one it validated; publishes racing on one daemon (from other
                    # clients) can hit that. The ignored message went nowhere, and a new
                    # publish gets a new seqno.
                    if _SEQNO_IGNORED not in str(exc) or attempt == PUBLISH_ATTEMPTS:
                        raise
                    logger.debug("pubsub/pub %s: %s, publishing again", topic, _SEQNO_IGNORED)

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
        lines = self.rpc.stream_lines(
            "pubsub/sub",
            {"arg": encode_topic(topic)},
            max_line=self.max_line,
            errors=PUBSUB_ERRORS,
            on_oversized=self._count_bad_line,
        )
        async with contextlib.aclosing(lines):
            async for line in lines:
                message = self._parse(line.decode("utf-8", errors="replace"))
                if message is not None:
                    yield message

    def _count_bad_line(self) -> None:
        self.bad_lines += 1
        logger.debug("skipping a pubsub line over %d bytes", self.max_line)

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
        """Close the RPC client (if this transport made it); open subscriptions end."""
        self._closed = True
        if self._owns_rpc:
            await self.rpc.aclose()


# --------------------------------------------------------------------------- in memory


_MEMORY_KEY_DOMAIN: Final = b"gradfed-ipfs memory bus identity\0"


class MemoryPubsubBus:
    """An in-process pubsub network for unit tests: every endpoint sees every publication.

    Subscriptions register synchronously when :meth:`MemoryPubsub.subscribe` is called, so a
    subscriber sees exactly the messages published after that call.

    Endpoints sign their statements too. A named endpoint (``"peer-a"``) gets a key derived from
    its name, bound in :attr:`keys`: deterministic, so sessions give the same CIDs on every run,
    and public, so the bus is a simulation of a network, not a place for secrets. An endpoint
    whose name is an Ed25519 peer ID needs its own signer (:meth:`endpoint`).
    """

    def __init__(self) -> None:
        self._queues: dict[str, list[tuple[str, asyncio.Queue[PubsubMessage]]]] = {}
        self._seqno = 0
        self.keys = KeyDirectory()
        self._signers: dict[str, LocalSigner] = {}

    def endpoint(self, peer_id: str, *, signer: LocalSigner | None = None) -> MemoryPubsub:
        """Return a transport for ``peer_id`` on this bus, signing with ``signer``.

        Raises
        ------
        ConfigError
            If ``signer`` signs as another author, or ``peer_id`` is an Ed25519 peer ID and no
            signer is given (its key cannot be derived from its name).
        """
        if signer is not None:
            if signer.peer_id != peer_id:
                raise ConfigError(f"endpoint {peer_id} cannot sign as {signer.peer_id}")
            self._signers.setdefault(peer_id, signer)
            if peer_id not in self.keys and not _is_peer_id(peer_id):
                self.keys.add(peer_id, signer.public_key)
        return MemoryPubsub(self, peer_id)

    def signer(self, peer_id: str) -> LocalSigner:
        """Return the signer of ``peer_id`` on this bus (derived from its name if none given).

        Raises
        ------
        ConfigError
            If ``peer_id`` is an Ed25519 peer ID whose signer was never given.
        """
        known = self._signers.get(peer_id)
        if known is not None:
            return known
        if _is_peer_id(peer_id):
            raise ConfigError(f"{peer_id} is a peer ID: give its signer (bus.endpoint(signer=))")
        seed = hashlib.sha256(_MEMORY_KEY_DOMAIN + peer_id.encode("utf-8")).digest()
        signer = self._signers[peer_id] = LocalSigner.from_seed(seed, name=peer_id)
        self.keys.add(peer_id, signer.public_key)
        return signer

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

    async def signer(self) -> LocalSigner:
        """Return this endpoint's signer (:meth:`MemoryPubsubBus.signer`)."""
        return self.bus.signer(self.peer_id)

    @property
    def keys(self) -> KeyBook:
        """The bus's key directory."""
        return self.bus.keys

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


def _is_peer_id(name: str) -> bool:
    try:
        _ed25519_key_of(name)
    except BadSignature:
        return False
    return True
