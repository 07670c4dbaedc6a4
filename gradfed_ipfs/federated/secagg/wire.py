"""How SecAgg protocol messages are encoded as blocks and exchanged by CID.

:mod:`gradfed_ipfs.federated.secagg_round.peer` runs the protocol; this module is its wire: the
encoding of the message blocks (:data:`KINDS`) and the :class:`SecAggChannel` that commits each
message block to the sender's own store and announces its CID on the session's SecAgg sub-topic
as a small JSON object (at most 2048 bytes)::

    {"v": 1, "session": "...", "round": 0, "kind": "masked", "from": "<peer>", "cid": "bafk..."}

Receivers fetch the block by CID through their own store (for Kubo, bitswap from the sender's
daemon). The message blocks themselves are encoded by :mod:`.codec`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection
from typing import Final, Protocol

from multiformats import CID

from ...cid import parse_cid
from ...errors import DecodeError, PubsubError
from ...kubo.pubsub import PubsubMessage, PubsubTransport
from ...storage.base import Block, BlockStore
from .codec import json_block, load_json

__all__ = ["KINDS", "ChannelConfig", "SecAggChannel"]

logger = logging.getLogger("gradfed_ipfs.federated")

KINDS: Final = (
    "server-key",
    "keys",
    "shares",
    "masked",
    "unmask-request",
    "view",
    "unmask-response",
    "done",
)
"""Every message kind, in protocol order."""
_CLIENT_KINDS: Final = frozenset({"keys", "shares", "masked", "view", "unmask-response"})
_AGGREGATOR_KINDS: Final = frozenset({"server-key", "unmask-request", "done"})
_MAX_ANNOUNCEMENT: Final = 2048
_VERSION: Final = 1


class ChannelConfig(Protocol):
    """What a :class:`SecAggChannel` needs of the round's configuration.

    :class:`~gradfed_ipfs.federated.secagg_round.peer.SecureRoundConfig` provides it; the timeouts
    and intervals are seconds.
    """

    @property
    def session_id(self) -> str:
        """The session the announcements are scoped to."""
        ...

    @property
    def round_id(self) -> int:
        """The round the announcements are scoped to."""
        ...

    @property
    def clients(self) -> Collection[str]:
        """Peer IDs of the round's clients (they may send client kinds)."""
        ...

    @property
    def aggregator(self) -> str:
        """Peer ID of the aggregator (it may send aggregator kinds)."""
        ...

    @property
    def topic(self) -> str:
        """The pubsub topic the announcements travel on."""
        ...

    @property
    def fetch_timeout(self) -> float:
        """Seconds one message block may take to arrive."""
        ...

    @property
    def republish_interval(self) -> float:
        """Seconds between re-publications of this peer's announcements."""
        ...

    @property
    def subscriber_timeout(self) -> float:
        """Seconds :meth:`SecAggChannel.start` waits for the other parties."""
        ...


class SecAggChannel:
    """One peer's message channel: commit + announce, collect announcements, fetch by CID.

    Parameters
    ----------
    store
        This peer's block store; :meth:`post` commits to it and :meth:`fetch` reads through it.
    transport
        This peer's pubsub transport.
    peer_id
        This peer's ID (the ``from`` of its announcements).
    cfg
        The round (session, round, roster, topic, timeouts).

    Attributes
    ----------
    inbox
        (kind, sender) → the first CID accepted for it (this peer's own posts included).
    drops
        Announcements dropped, by reason (``oversized``, ``malformed``, ``other_round``,
        ``spoofed_sender``, ``not_a_party``).
    """

    def __init__(
        self, store: BlockStore, transport: PubsubTransport, peer_id: str, cfg: ChannelConfig
    ) -> None:
        self.store = store
        self.transport = transport
        self.peer_id = peer_id
        self.cfg = cfg
        self.inbox: dict[tuple[str, str], CID] = {}
        self.drops: Counter[str] = Counter()
        self._changed = asyncio.Event()
        self._posted: list[bytes] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._subscription: AsyncIterator[PubsubMessage] | None = None
        self._clients = frozenset(cfg.clients)

    async def start(self) -> None:
        """Subscribe, start re-publishing, and wait for the other parties to subscribe.

        The wait is bounded by ``subscriber_timeout`` seconds and best effort: re-publication
        covers late joiners.
        """
        self._subscription = self.transport.subscribe(self.cfg.topic)
        self._tasks.append(asyncio.create_task(self._read(), name=f"secagg-read-{self.peer_id}"))
        self._tasks.append(
            asyncio.create_task(self._republish(), name=f"secagg-republish-{self.peer_id}")
        )
        others = (self._clients | {self.cfg.aggregator}) - {self.peer_id}
        deadline = time.monotonic() + self.cfg.subscriber_timeout
        delay = 0.01
        while time.monotonic() < deadline:  # best effort: re-publication covers late joiners
            try:
                if others <= set(await self.transport.peers(self.cfg.topic)):
                    break
            except PubsubError as exc:
                logger.debug("secagg: pubsub peers failed: %s", exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def aclose(self) -> None:
        """Stop reading and re-publishing and close the subscription."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        closer = getattr(self._subscription, "aclose", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer()

    async def _read(self) -> None:
        if self._subscription is None:
            return
        async for message in self._subscription:
            self.accept(message)

    def accept(self, message: PubsubMessage) -> None:
        """Validate one announcement and record its CID (first per kind and sender)."""
        if len(message.data) > _MAX_ANNOUNCEMENT:
            self.drops["oversized"] += 1
            return
        try:
            item = load_json(message.data, "announcement")
            kind, sender = item.get("kind"), item.get("from")
            if item.get("v") != _VERSION or kind not in KINDS or not isinstance(sender, str):
                raise DecodeError("bad version, kind or sender")
            cid = parse_cid(str(item.get("cid")))
        except (DecodeError, ValueError, TypeError):
            self.drops["malformed"] += 1
            return
        if item.get("session") != self.cfg.session_id or item.get("round") != self.cfg.round_id:
            self.drops["other_round"] += 1
            return
        if sender != message.from_peer:
            self.drops["spoofed_sender"] += 1
            return
        allowed = (kind in _CLIENT_KINDS and sender in self._clients) or (
            kind in _AGGREGATOR_KINDS and sender == self.cfg.aggregator
        )
        if not allowed:
            self.drops["not_a_party"] += 1
            return
        if (kind, sender) not in self.inbox:
            self.inbox[(kind, sender)] = cid
            self._changed.set()

    async def post(self, kind: str, data: bytes) -> CID:
        """Commit ``data`` to this peer's store and announce its CID (re-published)."""
        cid = await self.store.put(Block.new(data, "raw"))
        wire = json_block(
            {
                "v": _VERSION,
                "session": self.cfg.session_id,
                "round": self.cfg.round_id,
                "kind": kind,
                "from": self.peer_id,
                "cid": str(cid),
            }
        )
        self.inbox.setdefault((kind, self.peer_id), cid)  # this peer's other role sees it
        self._changed.set()
        self._posted.append(wire)
        await self.transport.publish(self.cfg.topic, wire)
        return cid

    async def _republish(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.republish_interval)  # re-publication timer
            for wire in list(self._posted):
                try:
                    await self.transport.publish(self.cfg.topic, wire)
                except PubsubError as exc:
                    logger.debug("secagg: re-publish failed: %s", exc)

    def senders(self, kind: str) -> set[str]:
        """Return the peers whose ``kind`` announcement has been accepted."""
        return {s for k, s in self.inbox if k == kind}

    async def wait(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``ready()`` (re-checked on each new announcement) or the timeout."""
        deadline = time.monotonic() + timeout
        while not ready():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return True

    async def fetch(self, kind: str, sender: str) -> bytes:
        """Fetch the block ``sender`` announced for ``kind`` through this peer's store."""
        block = await self.store.get(self.inbox[(kind, sender)], timeout=self.cfg.fetch_timeout)
        return block.data
