"""A SecAgg round over IPFS: every protocol message is a block, announced by CID on pubsub.

:mod:`gradfed_ipfs.federated.secagg.protocol` implements the protocol's parties;
this module runs them across peers. A round has a fixed, known set of client peers and one
designated aggregator peer (which may also be a client). Each message a party sends is committed
as a block to the sender's own store and announced on the session's SecAgg sub-topic
``gradfed/v1/<session>/secagg`` as a small JSON object::

    {"v": 1, "session": "...", "round": 0, "kind": "masked", "from": "<peer>", "cid": "bafk..."}

The receiver fetches the block by CID through its own store (for Kubo, bitswap from the sender's
daemon); :mod:`gradfed_ipfs.federated.secagg.wire` holds that encoding and the channel.
Message kinds (:data:`KINDS`), in protocol order:

``keys``             a client's two X25519 public keys (JSON block)
``shares``           a client's AES-GCM encrypted Shamir share bundle, one ciphertext per other
                     client (JSON block); the recipients pick theirs, nobody else can read them
``masked``           a client's masked ring vector (Arrow ``secagg-u32/u64`` block,
                     :mod:`gradfed_ipfs.federated.secagg.blocks`); never its unmasked vector
``unmask-request``   the aggregator's survivors / dropped lists (JSON block)
``unmask-response``  a survivor's shares of the survivors' self-mask seeds and the dropped
                     clients' mask keys (JSON block)
``done``             the aggregator's closing notice (JSON block), so clients stop re-publishing

Announcements are re-published every ``republish_interval`` until the peer closes (gossipsub may
drop a message, and a subscriber may join late); receivers keep the first CID per
(kind, sender). An announcement is accepted only when its ``from`` is the authenticated pubsub
sender and that sender may send that kind (clients or the aggregator); everything else is
dropped and counted in :attr:`SecureRoundPeer.drops`.

Dropouts: key advertisement and share distribution need *every* client of the round (the roster
is fixed). A client that shared its keys but has no masked vector at the aggregator within
``mask_timeout`` (or whose masked block cannot be fetched) is dropped; its dangling pairwise
masks are removed with the survivors' shares, as long as at least ``threshold`` clients survive
and answer. Otherwise :class:`~gradfed_ipfs.errors.SecureAggregationError` is raised and no sum
is produced.

Not covered: a sender that announces different CIDs for one message to different peers
(equivocation) is not detected; the protocol is the honest-but-curious one of Bonawitz et al.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from multiformats import CID

from ..._types import FloatArray, GradientLike
from ...errors import BlockStoreError, DecodeError, SecureAggregationError
from ...kubo.pubsub import TOPIC_PREFIX, PubsubTransport
from ...storage.base import BlockStore
from ...tensor.aggregation import as_float32_vector
from ..secagg.blocks import decode_masked_block, encode_masked_block
from ..secagg.protocol import (
    AdvertisedKeys,
    EncryptedShare,
    SecAggClient,
    SecAggServer,
    UnmaskingShares,
)
from ..secagg.wire import (
    KINDS,
    SecAggChannel,
    from_hex,
    json_block,
    load_json,
    shares_from_json,
    shares_to_json,
    str_list,
    to_hex,
)
from .stats import RoundStats

__all__ = [
    "KINDS",
    "SecureRoundConfig",
    "SecureRoundPeer",
    "SecureRoundResult",
    "run_secure_round",
    "secagg_topic",
]

logger = logging.getLogger("gradfed_ipfs.federated")

RandBytes = Callable[[int], bytes]
_T = TypeVar("_T")


def secagg_topic(session_id: str) -> str:
    """Return the SecAgg sub-topic of a session: ``gradfed/v1/<session_id>/secagg``."""
    return f"{TOPIC_PREFIX}{session_id}/secagg"


@dataclass(frozen=True)
class SecureRoundConfig:
    """What every party of one SecAgg round must agree on.

    Attributes
    ----------
    session_id, round_id
        The round; they bind the masks (the SecAgg context) and scope the announcements.
    clients
        Peer IDs of the round's clients (the fixed roster).
    aggregator
        Peer ID of the aggregator (it may also be a client).
    threshold
        Shamir threshold t: the fewest survivors (and unmasking answers) that yield a sum.
    length
        Vector length d.
    clip_range, ring_bits
        The fixed-point encoding (see :class:`~gradfed_ipfs.federated.secagg.FixedPoint`).
    phase_timeout
        Seconds each party waits for the keys, the share bundles or the unmasking request.
    mask_timeout
        Seconds the aggregator waits for masked vectors once every share bundle is in;
        clients without one by then are dropped.
    response_timeout
        Seconds the aggregator waits for every survivor's unmasking answer (then it uses the
        answers it has, if at least ``threshold``); also how long a client waits for ``done``.
    fetch_timeout
        Seconds one message block may take to arrive.
    republish_interval
        Seconds between re-publications of a party's announcements.
    subscriber_timeout
        Seconds :meth:`SecureRoundPeer.start` waits for the other parties to subscribe.
    """

    session_id: str
    round_id: int
    clients: tuple[str, ...]
    aggregator: str
    threshold: int
    length: int
    clip_range: float = 8.0
    ring_bits: int = 32
    phase_timeout: float = 30.0
    mask_timeout: float = 10.0
    response_timeout: float = 10.0
    fetch_timeout: float = 30.0
    republish_interval: float = 0.5
    subscriber_timeout: float = 10.0

    def __post_init__(self) -> None:
        if len(set(self.clients)) != len(self.clients) or not self.clients:
            raise SecureAggregationError("clients must be a non-empty list of distinct peer IDs")
        if not 1 <= self.threshold <= len(self.clients):
            raise SecureAggregationError(
                f"need 1 <= threshold <= clients, got t={self.threshold}, n={len(self.clients)}"
            )
        if self.length < 1 or self.round_id < 0 or self.ring_bits not in (32, 64):
            raise SecureAggregationError("need length >= 1, round_id >= 0, ring_bits 32 or 64")
        for name in (
            "phase_timeout",
            "mask_timeout",
            "response_timeout",
            "fetch_timeout",
            "republish_interval",
        ):
            if not getattr(self, name) > 0:
                raise SecureAggregationError(f"{name} must be > 0 seconds")

    @property
    def context(self) -> bytes:
        """The SecAgg context binding keys and masks to this session and round."""
        return f"{self.session_id}/{self.round_id}".encode()

    @property
    def topic(self) -> str:
        """The SecAgg sub-topic of the session."""
        return secagg_topic(self.session_id)


@dataclass
class SecureRoundResult:
    """The aggregator's outcome of a SecAgg round.

    Attributes
    ----------
    total
        Sum of the survivors' (clipped) vectors, float32, exact to the fixed-point resolution.
    mean
        ``total / len(survivors)``, float32.
    survivors, dropped
        Clients whose masked vector was summed, and clients that shared keys but did not.
    stats
        ``participants`` = survivors; ``missing_clients`` and ``dropped_clients`` = dropped.
    masked_cids
        Survivor → CID of the masked block the aggregator fetched.
    """

    total: FloatArray
    mean: FloatArray
    survivors: list[str]
    dropped: list[str]
    stats: RoundStats
    masked_cids: dict[str, CID] = field(default_factory=dict)


async def _gather_all(jobs: Mapping[str, Awaitable[_T]]) -> dict[str, _T | BaseException]:
    results = await asyncio.gather(*jobs.values(), return_exceptions=True)
    return dict(zip(jobs, results, strict=True))


class SecureRoundPeer:
    """One peer of a SecAgg round: its client role, its aggregator role, or both.

    Parameters
    ----------
    store
        This peer's block store (for Kubo, its own daemon).
    transport
        This peer's pubsub transport; its peer ID is this peer's identity in the round.
    config
        The round, identical for every party.
    randbytes
        Cryptographic randomness for the client role (``os.urandom``; tests inject a seeded one).

    Attributes
    ----------
    drops
        Announcements dropped, by reason.
    """

    def __init__(
        self,
        store: BlockStore,
        transport: PubsubTransport,
        config: SecureRoundConfig,
        *,
        randbytes: RandBytes = os.urandom,
    ) -> None:
        self.store = store
        self.transport = transport
        self.config = config
        self._rand = randbytes
        self._channel: SecAggChannel | None = None
        self._client: SecAggClient | None = None

    @property
    def drops(self) -> Counter[str]:
        """Announcements dropped, by reason."""
        return self._channel.drops if self._channel is not None else Counter()

    @property
    def peer_id(self) -> str:
        """Return this peer's ID (after :meth:`start`)."""
        return self._ch.peer_id

    @property
    def _ch(self) -> SecAggChannel:
        if self._channel is None:
            raise SecureAggregationError("start() must run first")
        return self._channel

    async def start(self) -> None:
        """Subscribe to the SecAgg topic and wait (bounded) until the other parties have too."""
        if self._channel is not None:
            return
        peer_id = await self.transport.local_peer_id()
        if peer_id not in self.config.clients and peer_id != self.config.aggregator:
            raise SecureAggregationError(f"{peer_id} is neither a client nor the aggregator")
        self._channel = SecAggChannel(self.store, self.transport, peer_id, self.config)
        await self._channel.start()

    async def aclose(self) -> None:
        """Stop listening and re-publishing."""
        if self._channel is not None:
            await self._channel.aclose()

    async def __aenter__(self) -> SecureRoundPeer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ shared steps

    async def _require_all(self, kind: str) -> dict[str, bytes]:
        """Wait for ``kind`` from every client and fetch each block."""
        ch, clients = self._ch, set(self.config.clients)
        if not await ch.wait(lambda: clients <= ch.senders(kind), self.config.phase_timeout):
            missing = sorted(clients - ch.senders(kind))
            raise SecureAggregationError(f"no {kind!r} message from {missing} in time")
        fetched = await _gather_all({c: ch.fetch(kind, c) for c in sorted(clients)})
        out = {}
        for c, data in fetched.items():
            if isinstance(data, BaseException):
                raise SecureAggregationError(f"{kind!r} block of {c} unavailable: {data}")
            out[c] = data
        return out

    async def _roster(self) -> dict[str, AdvertisedKeys]:
        roster = {}
        for c, data in (await self._require_all("keys")).items():
            try:
                body = load_json(data, "keys")
                keys = AdvertisedKeys(
                    c, from_hex(body.get("cipher"), "cipher"), from_hex(body.get("mask"), "mask")
                )
            except DecodeError as exc:
                raise SecureAggregationError(f"keys of {c} malformed: {exc}") from exc
            if body.get("client_id") != c or len(keys.cipher_public_key) != 32:
                raise SecureAggregationError(f"keys of {c} malformed")
            if len(keys.mask_public_key) != 32:
                raise SecureAggregationError(f"keys of {c} malformed")
            roster[c] = keys
        return roster

    async def _bundles(self) -> list[EncryptedShare]:
        out = []
        for c, data in (await self._require_all("shares")).items():
            try:
                body = load_json(data, "shares")
                cts = body.get("shares")
                if body.get("sender") != c or not isinstance(cts, dict):
                    raise DecodeError("wrong sender or no shares")
                out += [EncryptedShare(c, str(r), from_hex(ct, "share")) for r, ct in cts.items()]
            except DecodeError as exc:
                raise SecureAggregationError(f"share bundle of {c} malformed: {exc}") from exc
        return out

    # ------------------------------------------------------------------ client role

    async def share_keys(self) -> None:
        """Client rounds 0-1: advertise keys, then distribute the encrypted share bundle.

        Ends once this client holds every other client's shares (ready to mask).
        """
        cfg, ch = self.config, self._ch
        if ch.peer_id not in cfg.clients:
            raise SecureAggregationError(f"{ch.peer_id} is not a client of this round")
        client = SecAggClient(
            ch.peer_id,
            cfg.threshold,
            clip_range=cfg.clip_range,
            ring_bits=cfg.ring_bits,
            context=cfg.context,
            randbytes=self._rand,
        )
        mine = client.advertise_keys()
        await ch.post(
            "keys",
            json_block(
                {
                    "client_id": ch.peer_id,
                    "cipher": to_hex(mine.cipher_public_key),
                    "mask": to_hex(mine.mask_public_key),
                }
            ),
        )
        shares = client.share_keys(await self._roster())
        bundle = {
            "sender": ch.peer_id,
            "shares": {m.recipient: to_hex(m.ciphertext) for m in shares},
        }
        await ch.post("shares", json_block(bundle))
        client.receive_shares(m for m in await self._bundles() if m.recipient == ch.peer_id)
        self._client = client

    async def send_masked(self, gradient: GradientLike) -> CID:
        """Client round 2: commit and announce the masked vector; return its CID."""
        if self._client is None:
            raise SecureAggregationError("share_keys must run before send_masked")
        values = as_float32_vector(gradient)
        if values.size != self.config.length:
            raise SecureAggregationError(
                f"gradient has {values.size} values, the round expects {self.config.length}"
            )
        return await self._ch.post("masked", encode_masked_block(self._client.masked_input(values)))

    async def answer_unmask(self) -> bool:
        """Client round 3: answer the aggregator's unmasking request, then wait for ``done``.

        Returns
        -------
        bool
            Whether this client was among the survivors (and answered).
        """
        cfg, ch, client = self.config, self._ch, self._client
        if client is None:
            raise SecureAggregationError("share_keys must run before answer_unmask")
        agg = cfg.aggregator
        wait = cfg.phase_timeout + cfg.mask_timeout
        if not await ch.wait(lambda: ("unmask-request", agg) in ch.inbox, wait):
            raise SecureAggregationError("no unmasking request from the aggregator in time")
        try:
            body = load_json(await ch.fetch("unmask-request", agg), "unmask request")
            survivors = str_list(body.get("survivors"), "survivors")
            dropped = str_list(body.get("dropped"), "dropped")
        except (DecodeError, BlockStoreError) as exc:
            raise SecureAggregationError(f"unmasking request unusable: {exc}") from exc
        if ch.peer_id not in survivors:
            return False
        answer = client.unmask(survivors, dropped)
        await ch.post(
            "unmask-response",
            json_block(
                {
                    "client_id": ch.peer_id,
                    "self_mask_shares": shares_to_json(answer.self_mask_shares),
                    "key_shares": shares_to_json(answer.key_shares),
                }
            ),
        )
        await ch.wait(lambda: ("done", agg) in ch.inbox, cfg.response_timeout)
        return True

    async def run_client(self, gradient: GradientLike) -> bool:
        """Every client round in order; return whether this client's vector was summed."""
        await self.share_keys()
        await self.send_masked(gradient)
        return await self.answer_unmask()

    # ------------------------------------------------------------------ aggregator role

    async def aggregate(self) -> SecureRoundResult:
        """Aggregate: check the sharers, collect the masked blocks, unmask only their sum.

        Returns
        -------
        SecureRoundResult
            The survivors' sum and mean and the round's stats.

        Raises
        ------
        SecureAggregationError
            If a client is missing from key or share distribution, fewer than ``threshold``
            clients survive masking, or fewer than ``threshold`` survivors answer.
        """
        cfg, ch = self.config, self._ch
        if ch.peer_id != cfg.aggregator:
            raise SecureAggregationError(f"{ch.peer_id} is not this round's aggregator")
        started = time.monotonic()
        server = SecAggServer(
            cfg.threshold, clip_range=cfg.clip_range, ring_bits=cfg.ring_bits, context=cfg.context
        )
        server.register((await self._roster()).values())
        server.route_shares(await self._bundles())  # ciphertexts stay unread: only the sharers

        clients = set(cfg.clients)
        await ch.wait(lambda: clients <= ch.senders("masked"), cfg.mask_timeout)
        announced = sorted(ch.senders("masked") & clients)
        fetched = await _gather_all({c: ch.fetch("masked", c) for c in announced})
        cids = {}
        for c, data in fetched.items():
            if isinstance(data, BaseException):
                logger.info("secagg: masked block of %s unavailable: %s", c, data)
                continue
            try:
                vector = decode_masked_block(
                    data, ring_bits=cfg.ring_bits, expected_length=cfg.length
                )
            except DecodeError as exc:
                logger.info("secagg: masked block of %s rejected: %s", c, exc)
                continue
            server.receive_masked(c, vector)
            cids[c] = ch.inbox[("masked", c)]
        survivors, dropped = server.unmask_request()
        await ch.post("unmask-request", json_block({"survivors": survivors, "dropped": dropped}))

        alive = set(survivors)
        await ch.wait(lambda: alive <= ch.senders("unmask-response"), cfg.response_timeout)
        responders = sorted(ch.senders("unmask-response") & alive)
        answers = []
        for c, data in (
            await _gather_all({c: ch.fetch("unmask-response", c) for c in responders})
        ).items():
            if isinstance(data, BaseException):
                continue
            try:
                body = load_json(data, "unmask response")
                if body.get("client_id") != c:
                    raise DecodeError("wrong client_id")
                answers.append(
                    UnmaskingShares(
                        c,
                        shares_from_json(body.get("self_mask_shares"), "self_mask_shares"),
                        shares_from_json(body.get("key_shares"), "key_shares"),
                    )
                )
            except DecodeError as exc:
                logger.info("secagg: unmasking answer of %s rejected: %s", c, exc)
        total = server.finalize(answers)
        await ch.post("done", json_block({"survivors": survivors, "dropped": dropped}))
        mean = (total / np.float32(len(survivors))).astype(np.float32)
        stats = RoundStats(
            round_id=cfg.round_id,
            participants=len(survivors),
            missing_clients=list(dropped),
            duration_ms=int((time.monotonic() - started) * 1000),
            dropped_clients=list(dropped),
        )
        return SecureRoundResult(total, mean, survivors, dropped, stats, cids)

    # ------------------------------------------------------------------ both

    async def run(self, gradient: GradientLike | None = None) -> SecureRoundResult | None:
        """Run this peer's roles; return the aggregator's result (``None`` for a pure client).

        Parameters
        ----------
        gradient
            This peer's vector, required when it is a client.
        """
        await self.start()
        jobs: list[Awaitable[Any]] = []
        if self.peer_id in self.config.clients:
            if gradient is None:
                raise SecureAggregationError("a client needs a gradient")
            jobs.append(self.run_client(gradient))
        is_aggregator = self.peer_id == self.config.aggregator
        if is_aggregator:
            jobs.append(self.aggregate())
        tasks = [asyncio.ensure_future(job) for job in jobs]
        try:
            done = await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        result = done[-1] if is_aggregator else None
        return result if isinstance(result, SecureRoundResult) else None


async def run_secure_round(
    store: BlockStore,
    transport: PubsubTransport,
    config: SecureRoundConfig,
    gradient: GradientLike | None = None,
    *,
    randbytes: RandBytes = os.urandom,
) -> SecureRoundResult | None:
    """Run one SecAgg round for this peer (client, aggregator or both) and close its channel.

    Returns
    -------
    SecureRoundResult or None
        The aggregate on the aggregator; ``None`` on a peer that is only a client.
    """
    peer = SecureRoundPeer(store, transport, config, randbytes=randbytes)
    try:
        return await peer.run(gradient)
    finally:
        await peer.aclose()
