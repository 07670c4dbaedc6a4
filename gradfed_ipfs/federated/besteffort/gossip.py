"""``GossipModelSync``: the seed's gossip API (seed-api §6.12) over real IPFS pubsub.

The seed's version is an in-process broadcast channel that counts messages rather than peers and
whose ``verify_update`` accepts almost any string. Here an endpoint runs over a
:class:`~gradfed_ipfs.kubo.PubsubTransport`: :class:`~gradfed_ipfs.kubo.KuboPubsub` on a
real daemon, or :class:`~gradfed_ipfs.kubo.pubsub.MemoryPubsub` (a shared in-process bus) in unit
tests. Messages are DESIGN §3 announcements on ``gradfed/v1/<session_id>``; every received one
passes an :class:`~gradfed_ipfs.formats.AnnouncementFilter` (authenticated sender, session,
CID, size, de-duplication per (peer, round), own messages), and ``collect_updates`` counts
distinct peers. Announcers re-publish until the round closes (bounded count and interval), so a
late subscriber still learns the CID.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator

from multiformats import CID

from ...cid import parse_cid
from ...errors import DecodeError, InvalidGradient, PubsubError
from ...formats.announcement import Announcement, AnnouncementFilter
from ...kubo.pubsub import (
    KuboPubsub,
    MemoryPubsub,
    MemoryPubsubBus,
    PubsubMessage,
    PubsubTransport,
    session_topic,
)
from ..exchange.stats import ModelUpdate

__all__ = ["GossipModelSync", "ModelUpdate"]

logger = logging.getLogger("gradfed_ipfs.federated")


class GossipModelSync:
    """One peer's endpoint for announcing and collecting model/gradient CIDs over pubsub.

    Parameters
    ----------
    local_peer_id
        This peer's ID; must be the transport's authenticated sender ID (for Kubo, the daemon's
        peer ID), since receivers check it against the pubsub ``from``.
    transport
        The pubsub transport (Kubo or in-memory).
    session_id
        Session whose topic (``gradfed/v1/<session_id>``) this endpoint uses.
    max_seen
        Bound of the de-duplication memory, in (peer, round) pairs.
    max_pending
        Most accepted announcements buffered before they are collected; beyond, they are
        dropped and counted as ``overflow``.

    Notes
    -----
    The subscription opens when the endpoint is created (in-memory) or on :meth:`start`
    (Kubo), and sees only messages published after that.
    """

    def __init__(
        self,
        local_peer_id: str,
        transport: PubsubTransport,
        *,
        session_id: str = "default",
        max_seen: int = 4096,
        max_pending: int = 1024,
    ) -> None:
        self.local_peer_id = local_peer_id
        self.transport = transport
        self.session_id = session_id
        self.topic = session_topic(session_id)
        self.filter = AnnouncementFilter(session_id, local_peer_id, max_seen=max_seen)
        self.max_pending = max_pending
        self.publish_failures = 0
        self._pending: list[Announcement] = []
        self._arrived = asyncio.Event()
        self._stream: AsyncIterator[PubsubMessage] | None = None
        self._reader: asyncio.Task[None] | None = None
        if isinstance(transport, MemoryPubsub):
            self._stream = transport.subscribe(self.topic)  # registers synchronously

    @classmethod
    def new(
        cls,
        local_peer_id: str,
        *,
        session_id: str = "default",
        transport: PubsubTransport | None = None,
    ) -> GossipModelSync:
        """Create an endpoint; without ``transport``, on a fresh in-memory bus (seed behaviour).

        Parameters
        ----------
        local_peer_id
            This peer's ID.
        session_id
            The session.
        transport
            The pubsub transport; a new :class:`MemoryPubsubBus` endpoint when ``None``.

        Returns
        -------
        GossipModelSync
            The endpoint.
        """
        if transport is None:
            transport = MemoryPubsubBus().endpoint(local_peer_id)
        return cls(local_peer_id, transport, session_id=session_id)

    def subscribe(self, peer_id: str, transport: PubsubTransport | None = None) -> GossipModelSync:
        """Return another peer's endpoint on the same session (and bus, for in-memory ones).

        Parameters
        ----------
        peer_id
            The other endpoint's peer ID.
        transport
            Its transport; required unless this endpoint is in-memory.

        Returns
        -------
        GossipModelSync
            The new endpoint; it sees only messages published after this call.

        Raises
        ------
        InvalidGradient
            If ``transport`` is missing for a non-memory endpoint.
        """
        if transport is None:
            if not isinstance(self.transport, MemoryPubsub):
                raise InvalidGradient("subscribe() on a Kubo endpoint needs that peer's transport")
            transport = self.transport.bus.endpoint(peer_id)
        return GossipModelSync(
            peer_id, transport, session_id=self.session_id, max_seen=self.filter.max_seen
        )

    @property
    def drops(self) -> Counter[str]:
        """Dropped messages by reason (see :class:`AnnouncementFilter`, plus ``overflow``)."""
        return self.filter.drops

    async def start(self, *, timeout: float = 10.0) -> None:
        """Open the subscription (if needed) and start reading it in the background.

        For a Kubo transport, waits (at most ``timeout`` seconds) until ``pubsub/ls`` lists the
        topic, so that messages published afterwards reach this endpoint.
        """
        if self._reader is not None:
            return
        if self._stream is None:
            self._stream = self.transport.subscribe(self.topic)
        self._reader = asyncio.create_task(self._read(self._stream), name=f"gossip-{self.topic}")
        if isinstance(self.transport, KuboPubsub):
            deadline = time.monotonic() + timeout
            delay = 0.01
            while self.topic not in await self.transport.topics():
                if time.monotonic() > deadline or self._reader.done():
                    raise PubsubError(
                        f"subscription to {self.topic} did not open", topic=self.topic
                    )
                await asyncio.sleep(delay)  # polling against a deadline
                delay = min(2 * delay, 0.2)

    async def _read(self, stream: AsyncIterator[PubsubMessage]) -> None:
        """Accept messages into the pending buffer; nothing escapes this loop but cancellation."""
        try:
            async for message in stream:
                announcement = self.filter.accept(message)
                if announcement is None:
                    continue
                if len(self._pending) >= self.max_pending:
                    self.filter.drops["overflow"] += 1
                    continue
                self._pending.append(announcement)
                self._arrived.set()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("gossip reader for %s stopped", self.topic)
            self.filter.drops["error"] += 1

    async def wait_for_peers(self, count: int, *, timeout: float) -> list[str]:
        """Wait until at least ``count`` other peers subscribe to the topic, or ``timeout``.

        Gossipsub can lose messages published right after peers connect, so announcers call
        this before their first publication.

        Returns
        -------
        list of str
            The subscribed peers last seen (possibly fewer than ``count`` at the deadline).
        """
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                peers = await self.transport.peers(self.topic)
            except PubsubError as exc:
                logger.debug("pubsub/peers failed: %s", exc)
                peers = []
            if len(peers) >= count or time.monotonic() > deadline:
                return peers
            await asyncio.sleep(delay)  # polling against a deadline
            delay = min(2 * delay, 0.2)

    def make_announcement(
        self,
        model_cid: CID | str,
        round_id: int,
        *,
        num_samples: int | None = None,
        length: int = 0,
    ) -> Announcement:
        """Return this peer's announcement of ``model_cid`` for ``round_id`` (CID parsed).

        Raises
        ------
        DecodeError
            If ``model_cid`` is not a CID.
        InvalidGradient
            If ``round_id`` is negative.
        """
        if round_id < 0:
            raise InvalidGradient(f"round_id must be >= 0, got {round_id}")
        return Announcement.new(
            self.session_id,
            round_id,
            self.local_peer_id,
            parse_cid(model_cid),
            num_samples=num_samples,
            length=length,
        )

    async def broadcast_update(
        self,
        model_cid: CID | str,
        round_id: int,
        *,
        num_samples: int | None = None,
        length: int = 0,
    ) -> Announcement:
        """Publish one announcement of ``model_cid`` for ``round_id``.

        Returns
        -------
        Announcement
            What was published.

        Raises
        ------
        DecodeError
            If ``model_cid`` is not a CID.
        PubsubError
            If the transport fails.
        """
        await self.start()
        announcement = self.make_announcement(
            model_cid, round_id, num_samples=num_samples, length=length
        )
        await self.transport.publish(self.topic, announcement.encode())
        return announcement

    async def announce_until(
        self,
        announcement: Announcement,
        closed: asyncio.Event,
        *,
        interval: float = 1.0,
        max_count: int = 60,
    ) -> int:
        """Re-publish ``announcement`` every ``interval`` seconds until ``closed`` is set.

        At most ``max_count`` publications. Publication failures are logged and counted in
        :attr:`publish_failures`, never raised.

        Returns
        -------
        int
            How many publications succeeded.
        """
        data = announcement.encode()
        sent = 0
        for _ in range(max_count):
            try:
                await self.transport.publish(self.topic, data)
                sent += 1
            except PubsubError as exc:
                self.publish_failures += 1
                logger.debug("re-publish failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closed.wait(), interval)
            if closed.is_set():
                break
        return sent

    async def next_announcement(self, timeout: float | None) -> Announcement | None:
        """Return the next accepted announcement, or ``None`` after ``timeout`` seconds."""
        await self.start()
        if not self._pending:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout)
        return self._pending.pop(0) if self._pending else None

    async def collect_announcements(
        self, expected_peers: int, timeout_ms: int, *, round_id: int | None = None
    ) -> list[Announcement]:
        """Collect announcements from distinct peers until ``expected_peers`` or the deadline.

        Parameters
        ----------
        expected_peers
            Distinct other peers to wait for.
        timeout_ms
            Deadline in milliseconds.
        round_id
            Only this round's announcements count; others are discarded.

        Returns
        -------
        list of Announcement
            One per peer, in arrival order (possibly fewer than expected at the deadline).
        """
        deadline = time.monotonic() + timeout_ms / 1000
        found: dict[str, Announcement] = {}
        while len(found) < expected_peers:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            announcement = await self.next_announcement(remaining)
            if announcement is None:
                break
            if round_id is not None and announcement.round != round_id:
                self.filter.drops["other_round"] += 1
                continue
            found.setdefault(announcement.peer_id, announcement)
        return list(found.values())

    async def collect_updates(self, expected_peers: int, timeout_ms: int) -> list[ModelUpdate]:
        """Seed API: collect updates from ``expected_peers`` distinct peers or until the deadline.

        Returns
        -------
        list of ModelUpdate
            One per distinct peer (a chatty peer counts once); own messages are excluded.
        """
        announcements = await self.collect_announcements(expected_peers, timeout_ms)
        return [ModelUpdate(a.peer_id, str(a.cid), a.round, a.timestamp_ms) for a in announcements]

    def verify_update(self, update: ModelUpdate) -> bool:
        """Return whether an update is well formed: a peer ID, a CID that parses, a round ≥ 0.

        Stricter than the seed, which also accepted any string of 4+ characters as a CID.
        """
        if not update.peer_id.strip() or update.round_id < 0:
            return False
        try:
            parse_cid(update.model_cid)
        except DecodeError:
            return False
        return True

    async def aclose(self) -> None:
        """Stop reading and close the subscription (the transport stays open)."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._stream is not None:
            closer = getattr(self._stream, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()
