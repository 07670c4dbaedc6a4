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

``server-key``       the aggregator's X25519 public key for this round (JSON block)
``keys``             a client's two X25519 and one Ed25519 public keys (JSON block)
``shares``           a client's AES-GCM encrypted Shamir share bundle, one ciphertext per other
                     client (JSON block); the recipients pick theirs, nobody else can read them
``masked``           a client's masked ring vector (Arrow ``secagg-u32/u64`` block,
                     :mod:`gradfed_ipfs.federated.secagg.blocks`) and the senders whose shares
                     it rejected, **sealed to the server key** (AES-GCM): ciphertext to anyone
                     else, including the other clients
``unmask-request``   the aggregator's survivors / dropped lists (JSON block)
``view``             a survivor's Ed25519 signature over the lists it was shown (JSON block);
                     a client unmasks only if >= ``threshold`` survivors signed its lists and
                     nobody signed other lists (Bonawitz et al.'s consistency check)
``unmask-response``  a survivor's shares of the survivors' self-mask seeds and the dropped
                     clients' mask keys, **sealed to the server key**
``done``             the aggregator's closing notice (JSON block), so clients stop re-publishing;
                     in a ``verifiable`` round it also reveals the round's server private key and
                     the survivors whose answers were used, and every survivor recomputes the
                     sum (:meth:`SecureRoundPeer.check_release`)

A subscriber that is not a party (any daemon on the topic) can fetch every block, but reads only
public keys, share ciphertexts for the clients, the lists and signatures: never a masked vector
or an unmasking share, so never the sum. Except in a ``verifiable`` round: once the sum is made,
its revealed key opens the sealed blocks to anyone who fetches them (what the aggregator saw:
the sum, never a survivor's vector while fewer than ``threshold`` clients collude).

Announcements are re-published every ``republish_interval`` until the peer closes (gossipsub may
drop a message, and a subscriber may join late); receivers keep the first CID per
(kind, sender). An announcement is accepted only when its ``from`` is the authenticated pubsub
sender and that sender may send that kind (clients or the aggregator); everything else is
dropped and counted in :attr:`SecureRoundPeer.drops`.

Dropouts: key advertisement and share distribution need *every* client of the round (the roster
is fixed). A client whose share bundle is malformed for everyone (it does not decode, or lacks
a share for some other client) is left out by every party; one whose share for some client
does not decrypt or decode is reported by that client
(:class:`~gradfed_ipfs.errors.SecAggPeerRejected`), which applies no pairwise mask with it, and
left out by the aggregator: to them it is a dropout before masking, so a client whose shares
nobody could use costs no key shares. A client that
shared its keys but has no usable masked vector at the aggregator within ``mask_timeout`` is
dropped; its dangling pairwise masks are removed with the survivors' shares, as long as at least
``threshold`` clients survive and answer and ``threshold`` of them hold its key share. Otherwise
:class:`~gradfed_ipfs.errors.SecureAggregationError` is raised and no sum is produced.

Not covered: a sender that announces different CIDs for one message to different peers
(equivocation) is not detected, except for the unmasking request, where the signed views catch
it. Clients trust the ``server-key`` the aggregator's authenticated pubsub identity announced.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from multiformats import CID

from ..._types import FloatArray, GradientLike
from ...errors import BlockStoreError, DecodeError, SecAggPeerRejected, SecureAggregationError
from ...kubo.pubsub import TOPIC_PREFIX, PubsubTransport
from ...storage.base import BlockStore
from ...tensor.aggregation import as_float32_vector
from ..exchange.stats import RoundStats
from ..secagg.blocks import encode_masked_block
from ..secagg.codec import (
    answer_to_json,
    bundle_to_json,
    json_block,
    keys_to_json,
    pack_masked,
    release_from_json,
    release_to_json,
    request_from_json,
    to_hex,
    view_to_json,
)
from ..secagg.protocol import RandBytes, SecAggClient, SecAggServer, check_threshold
from ..secagg.wire import KINDS, SecAggChannel
from .settings import SecAggSettings
from .steps import (
    collect_answers,
    collect_masked,
    fetch_bundles,
    fetch_roster,
    fetch_server_key,
    fetch_views,
    replay_masked,
)

__all__ = [
    "KINDS",
    "RandBytes",
    "SecureRoundConfig",
    "SecureRoundPeer",
    "SecureRoundResult",
    "run_secure_round",
    "secagg_topic",
]


logger = logging.getLogger("gradfed_ipfs.federated")


def secagg_topic(session_id: str) -> str:
    """Return the SecAgg sub-topic of a session: ``gradfed/v1/<session_id>/secagg``."""
    return f"{TOPIC_PREFIX}{session_id}/secagg"


@dataclass(frozen=True)
class SecureRoundConfig:
    """What every party of one SecAgg round must agree on, and how its messages travel.

    Attributes
    ----------
    session_id, round_id
        The round; they bind the masks (the SecAgg context) and scope the announcements.
    clients
        Peer IDs of the round's clients (the fixed roster).
    aggregator
        Peer ID of the aggregator (it may also be a client).
    threshold
        Shamir threshold t: the fewest survivors (and unmasking answers) that yield a sum;
        ``2 <= t <= len(clients)`` and ``t > len(clients) / 2``, checked here.
    length
        Vector length d.
    settings
        The encoding and the phase timeouts (:class:`SecAggSettings`).
    fetch_timeout
        Seconds one message block may take to arrive.
    republish_interval
        Seconds between re-publications of a party's announcements.
    subscriber_timeout
        Seconds :meth:`SecureRoundPeer.start` waits for the other parties to subscribe.
    verifiable
        After the sum, the aggregator reveals its round key and the answers it used in ``done``,
        and every survivor re-runs the unmasking on the blocks the other clients announced
        (:attr:`SecureRoundPeer.released`): the clients then learn the sum too, so use it only
        where the sum is published anyway (the training wrapper without central DP).
    """

    session_id: str
    round_id: int
    clients: tuple[str, ...]
    aggregator: str
    threshold: int
    length: int
    settings: SecAggSettings = field(default_factory=SecAggSettings)
    fetch_timeout: float = 30.0
    republish_interval: float = 0.5
    subscriber_timeout: float = 10.0
    verifiable: bool = False

    def __post_init__(self) -> None:
        if len(set(self.clients)) != len(self.clients) or not self.clients:
            raise SecureAggregationError("clients must be a non-empty list of distinct peer IDs")
        check_threshold(self.threshold, len(self.clients))
        if self.length < 1 or self.round_id < 0:
            raise SecureAggregationError("need length >= 1 and round_id >= 0")
        for name in ("fetch_timeout", "republish_interval"):
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
        Survivor → CID of the (sealed) masked block the aggregator fetched.
    rejected
        Client → why the aggregator left its message out (a bundle, masked vector or answer
        that did not decode or decrypt, or shares another client reported).
    """

    total: FloatArray
    mean: FloatArray
    survivors: list[str]
    dropped: list[str]
    stats: RoundStats
    masked_cids: dict[str, CID] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)


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
        Cryptographic randomness for the client role and the aggregator's key (``os.urandom``;
        tests inject a seeded one).

    Attributes
    ----------
    rejected
        Peer → the error that made this peer's client role leave it out (its share bundle
        or its share for this client did not decode or decrypt).
    released
        In a verifiable round, the survivors' sum this client recomputed itself (float32
        ``(d,)``, the same bytes as the honest aggregator's ``total``); ``None`` otherwise, or
        when the aggregator's release did not check out (the reason is logged).
    view
        The (survivors, dropped) lists this client signed, once it has.
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
        self.rejected: dict[str, SecAggPeerRejected] = {}
        self.released: FloatArray | None = None
        self.view: tuple[list[str], list[str]] | None = None
        self._rand = randbytes
        self._channel: SecAggChannel | None = None
        self._client: SecAggClient | None = None
        self._server: SecAggServer | None = None
        self._server_key: bytes | None = None

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
        cfg = self.config
        peer_id = await self.transport.local_peer_id()
        if peer_id not in cfg.clients and peer_id != cfg.aggregator:
            raise SecureAggregationError(f"{peer_id} is neither a client nor the aggregator")
        if peer_id == cfg.aggregator:  # drawn first, so a seeded run is reproducible
            self._server = SecAggServer(
                cfg.threshold,
                clip_range=cfg.settings.clip_range,
                ring_bits=cfg.settings.ring_bits,
                context=cfg.context,
                randbytes=self._rand,
            )
        self._channel = SecAggChannel(self.store, self.transport, peer_id, cfg)
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

    async def _fetch_server_key(self) -> bytes:
        if self._server_key is None:
            cfg = self.config
            wait = cfg.settings.phase_timeout
            self._server_key = await fetch_server_key(self._ch, cfg.aggregator, wait)
        return self._server_key

    # ------------------------------------------------------------------ client role

    async def share_keys(self) -> None:
        """Client rounds 0-1: advertise keys, then distribute the encrypted share bundle.

        Ends once this client holds every other client's usable shares (ready to mask);
        senders whose shares are unusable land in :attr:`rejected`.
        """
        cfg, ch = self.config, self._ch
        if ch.peer_id not in cfg.clients:
            raise SecureAggregationError(f"{ch.peer_id} is not a client of this round")
        client = SecAggClient(
            ch.peer_id,
            cfg.threshold,
            clip_range=cfg.settings.clip_range,
            ring_bits=cfg.settings.ring_bits,
            context=cfg.context,
            randbytes=self._rand,
        )
        await ch.post("keys", keys_to_json(client.advertise_keys()))
        shares = client.share_keys(await fetch_roster(ch, cfg.clients, cfg.settings.phase_timeout))
        await ch.post("shares", bundle_to_json(ch.peer_id, shares))
        bundles, sharers, bad = await fetch_bundles(ch, cfg.clients, cfg.settings.phase_timeout)
        for c, reason in bad.items():
            self.rejected[c] = SecAggPeerRejected(c, reason)
        mine = [m for m in bundles if m.recipient == ch.peer_id and m.sender in sharers]
        for error in client.receive_shares(mine, sharers | {ch.peer_id}):
            self.rejected[error.peer] = error
        self._client = client

    async def send_masked(self, gradient: GradientLike) -> CID:
        """Client round 2: seal the masked vector to the aggregator, post it; return its CID."""
        client = self._client
        if client is None:
            raise SecureAggregationError("share_keys must run before send_masked")
        values = as_float32_vector(gradient)
        if values.size != self.config.length:
            raise SecureAggregationError(
                f"gradient has {values.size} values, the round expects {self.config.length}"
            )
        server_key = await self._fetch_server_key()
        payload = pack_masked(client.rejected, encode_masked_block(client.masked_input(values)))
        return await self._ch.post("masked", client.seal_for_server(server_key, "masked", payload))

    async def answer_unmask(self) -> bool:
        """Client rounds 3-4: sign the request, check the others' views, answer, wait for done.

        Returns
        -------
        bool
            Whether this client was among the survivors (and answered).

        Raises
        ------
        UnmaskRefused
            If the request names a client as both survivor and dropped, or fewer than
            ``threshold`` survivors signed the lists this client was shown, or some client
            signed different lists (the aggregator showed different survivor sets).
        """
        cfg, ch, client = self.config, self._ch, self._client
        if client is None:
            raise SecureAggregationError("share_keys must run before answer_unmask")
        agg = cfg.aggregator
        wait = cfg.settings.phase_timeout + cfg.settings.mask_timeout
        if not await ch.wait(lambda: ("unmask-request", agg) in ch.inbox, wait):
            raise SecureAggregationError("no unmasking request from the aggregator in time")
        try:
            survivors, dropped = request_from_json(await ch.fetch("unmask-request", agg))
        except (DecodeError, BlockStoreError) as exc:
            raise SecureAggregationError(f"unmasking request unusable: {exc}") from exc
        if ch.peer_id not in survivors:
            return False
        await ch.post("view", view_to_json(client.confirm(survivors, dropped)))
        self.view = (survivors, dropped)
        views = await fetch_views(ch, cfg.clients, survivors, cfg.settings.view_timeout)
        answer = client.unmask(survivors, dropped, views)
        server_key = await self._fetch_server_key()
        sealed = client.seal_for_server(server_key, "unmask-response", answer_to_json(answer))
        await ch.post("unmask-response", sealed)
        await ch.wait(lambda: ("done", agg) in ch.inbox, cfg.settings.response_timeout)
        if cfg.verifiable:
            try:
                self.released = await self.check_release(survivors, dropped)
            except (SecureAggregationError, DecodeError, BlockStoreError) as exc:
                logger.warning("secagg: the aggregator's release does not check out: %s", exc)
        return True

    async def check_release(self, survivors: list[str], dropped: list[str]) -> FloatArray:
        """Re-run the aggregator's steps with the key it revealed; return the survivors' sum.

        Uses only what the parties announced to this client: the masked blocks and answers of
        their authenticated senders, and the survivor lists this client's signed view agreed on.

        Raises
        ------
        SecureAggregationError
            If there is no release, its key is not the round's server key, a survivor's block
            or a named answer is unusable, or the recomputed lists or answers differ.
        """
        cfg, ch, phases = self.config, self._ch, self.config.settings
        if ("done", cfg.aggregator) not in ch.inbox:
            raise SecureAggregationError("no release from the aggregator in time")
        try:
            key, answered = release_from_json(await ch.fetch("done", cfg.aggregator))
        except (DecodeError, BlockStoreError) as exc:
            raise SecureAggregationError(f"release unusable: {exc}") from exc
        server = SecAggServer(
            cfg.threshold, clip_range=phases.clip_range, ring_bits=phases.ring_bits,
            context=cfg.context, private_key=key,
        )  # fmt: skip
        if server.public_key != await self._fetch_server_key():
            raise SecureAggregationError("the revealed key is not the round's server key")
        server.register((await fetch_roster(ch, cfg.clients, phases.phase_timeout)).values())
        server.route_shares(*(await fetch_bundles(ch, cfg.clients, phases.phase_timeout))[:2])
        await replay_masked(
            ch, server, survivors, ring_bits=phases.ring_bits, length=cfg.length,
            timeout=phases.response_timeout,
        )  # fmt: skip
        if server.unmask_request() != (sorted(survivors), sorted(dropped)):
            raise SecureAggregationError("the survivors' blocks give other survivor lists")
        if not set(answered) <= set(survivors):
            raise SecureAggregationError("the release names answers of non-survivors")
        answers = await collect_answers(
            ch, server, answered, timeout=phases.response_timeout, rejected={}
        )
        total = server.finalize(answers)
        if server.answered != sorted(answered):
            raise SecureAggregationError("the named answers are not all usable")
        return total

    async def run_client(self, gradient: GradientLike) -> bool:
        """Every client round in order; return whether this client's vector was summed."""
        await self.share_keys()
        await self.send_masked(gradient)
        return await self.answer_unmask()

    # ------------------------------------------------------------------ aggregator role

    async def aggregate(self) -> SecureRoundResult:
        """Aggregate: publish the server key, collect the sealed masked blocks, unmask the sum.

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
        cfg, ch, server = self.config, self._ch, self._server
        if ch.peer_id != cfg.aggregator or server is None:
            raise SecureAggregationError(f"{ch.peer_id} is not this round's aggregator")
        started = time.monotonic()
        await ch.post("server-key", json_block({"key": to_hex(server.public_key)}))
        phases = cfg.settings
        server.register((await fetch_roster(ch, cfg.clients, phases.phase_timeout)).values())
        bundles, sharers, bad = await fetch_bundles(ch, cfg.clients, phases.phase_timeout)
        server.route_shares(bundles, sharers)  # ciphertexts stay unread: only the sharers
        rejected = {**bad, **server.rejected}
        cids = await collect_masked(
            ch,
            server,
            ring_bits=phases.ring_bits,
            length=cfg.length,
            timeout=phases.mask_timeout,
            rejected=rejected,
        )
        survivors, dropped = server.unmask_request()
        cids = {c: cid for c, cid in cids.items() if c in survivors}
        await ch.post("unmask-request", json_block({"survivors": survivors, "dropped": dropped}))
        wait = phases.view_timeout + phases.response_timeout  # the clients check the views first
        answers = await collect_answers(ch, server, survivors, timeout=wait, rejected=rejected)
        total = server.finalize(answers)
        rejected.update(server.rejected)
        key = server.private_key if cfg.verifiable else None
        await ch.post("done", release_to_json(survivors, dropped, key, server.answered))
        mean = (total / np.float32(len(survivors))).astype(np.float32)
        stats = RoundStats(
            round_id=cfg.round_id,
            participants=len(survivors),
            missing_clients=list(dropped),
            duration_ms=int((time.monotonic() - started) * 1000),
            dropped_clients=list(dropped),
        )
        return SecureRoundResult(total, mean, survivors, dropped, stats, cids, rejected)

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
