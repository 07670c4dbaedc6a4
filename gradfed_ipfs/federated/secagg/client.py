"""The client's side of the SecAgg protocol (see :mod:`.protocol`)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Collection, Iterable, Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..._types import GradientLike
from ...errors import DecodeError, SecAggPeerRejected, SecureAggregationError, UnmaskRefused
from .codec import load_json
from .crypto import kdf, pair_mask, pair_seed, prg, raw_public, seal, verify_view, view_message
from .fixed_point import FixedPoint, RingArray
from .messages import (
    AdvertisedKeys,
    EncryptedShare,
    RandBytes,
    SignedView,
    UnmaskingShares,
    check_public_keys,
    check_threshold,
    to_server_key,
)
from .shamir import PRIME, Share, split_secret

__all__ = ["SHARE_NONCE", "SecAggClient"]

logger = logging.getLogger("gradfed_ipfs.federated")

SHARE_NONCE = bytes(12)
"""Each share key encrypts exactly one message, so a fixed AES-GCM nonce is safe."""


class SecAggClient:
    """One client's side of the protocol.

    Parameters
    ----------
    client_id
        The client's id; clients are ordered by id (sign of pairwise masks, share x).
    threshold
        t: shares needed to rebuild a secret (at least 2, and more than half the roster).
    clip_range, ring_bits
        The :class:`FixedPoint` settings, identical for every party.
    context
        Bytes binding keys and masks to one session and round (e.g. ``b"session/round"``).
    randbytes
        Cryptographic randomness (``os.urandom``).

    Attributes
    ----------
    rejected
        Sender → the error that rejected its shares for this client (round 1).
    """

    def __init__(
        self,
        client_id: str,
        threshold: int,
        *,
        clip_range: float = 8.0,
        ring_bits: int = 32,
        context: bytes = b"",
        randbytes: RandBytes = os.urandom,
    ) -> None:
        if threshold < 2:
            raise SecureAggregationError(f"threshold must be >= 2, got {threshold}")
        self.client_id = client_id
        self.threshold = threshold
        self.clip_range = clip_range
        self.ring_bits = ring_bits
        self.context = context
        self.rejected: dict[str, SecAggPeerRejected] = {}
        self._rand = randbytes
        self._cipher_key = X25519PrivateKey.from_private_bytes(randbytes(32))
        self._mask_key = X25519PrivateKey.from_private_bytes(randbytes(32))
        self._sign_key = Ed25519PrivateKey.from_private_bytes(randbytes(32))
        self._seed = b""
        self._roster: dict[str, AdvertisedKeys] = {}
        self._held: dict[str, tuple[Share, Share]] = {}  # sender -> (share of b, share of s_sk)
        self._sharers: set[str] = set()  # the masking neighbourhood, this client included
        self._view: tuple[frozenset[str], frozenset[str]] | None = None
        self._answered = False
        self._masked_sent = False

    def advertise_keys(self) -> AdvertisedKeys:
        """Round 0: return this client's public keys."""
        return AdvertisedKeys(
            self.client_id,
            raw_public(self._cipher_key.public_key()),
            raw_public(self._mask_key.public_key()),
            raw_public(self._sign_key.public_key()),
        )

    def _share_key(self, other: str, sender: str, recipient: str) -> bytes:
        peer = X25519PublicKey.from_public_bytes(self._roster[other].cipher_public_key)
        shared = self._cipher_key.exchange(peer)
        return kdf(shared, f"share-enc|{sender}|{recipient}", self.context)

    def _seal_share(self, recipient: str, body: bytes) -> EncryptedShare:
        key = self._share_key(recipient, self.client_id, recipient)
        aad = f"{self.client_id}|{recipient}".encode()
        return EncryptedShare(
            self.client_id, recipient, AESGCM(key).encrypt(SHARE_NONCE, body, aad)
        )

    def share_keys(self, roster: Mapping[str, AdvertisedKeys]) -> list[EncryptedShare]:
        """Round 1: share ``b_u`` and the mask private key with every client in ``roster``.

        Parameters
        ----------
        roster
            Every registered client's keys, including this client's.

        Returns
        -------
        list of EncryptedShare
            One ciphertext per other client, for the server to relay.
        """
        if self._roster:
            raise SecureAggregationError("keys were already shared this round")
        if roster.get(self.client_id) != self.advertise_keys():
            raise SecureAggregationError(f"roster does not hold {self.client_id}'s own keys")
        check_threshold(self.threshold, len(roster))
        for keys in roster.values():
            check_public_keys(keys)
        self._roster = dict(roster)
        self._seed = self._rand(32)
        ids = sorted(roster)
        sk = self._mask_key.private_bytes_raw()
        seed_shares = split_secret(self._seed, len(ids), self.threshold, self._rand)
        key_shares = split_secret(sk, len(ids), self.threshold, self._rand)
        out = []
        for idx, other in enumerate(ids):
            b_share, s_share = seed_shares[idx], key_shares[idx]
            if other == self.client_id:
                self._held[other] = (b_share, s_share)
                self._sharers.add(other)
                continue
            body = json.dumps(
                {"x": b_share.x, "b": hex(b_share.y), "s": hex(s_share.y)}, sort_keys=True
            ).encode()
            out.append(self._seal_share(other, body))
        return out

    def _open_share(self, msg: EncryptedShare) -> tuple[Share, Share]:
        key = self._share_key(msg.sender, msg.sender, self.client_id)
        aad = f"{msg.sender}|{self.client_id}".encode()
        try:
            plain = AESGCM(key).decrypt(SHARE_NONCE, msg.ciphertext, aad)
        except InvalidTag as exc:
            raise DecodeError("share failed to decrypt") from exc
        body = load_json(plain, "decrypted share")
        x = sorted(self._roster).index(self.client_id) + 1
        if not isinstance(body, dict) or body.get("x") != x or type(body.get("x")) is not int:
            raise DecodeError(f"share is not a JSON object with x = {x}")
        ys = []
        for name in ("b", "s"):
            text = body.get(name)
            if not (isinstance(text, str) and text.startswith("0x") and len(text) <= 140):
                raise DecodeError(f"share field {name!r} is not a hex field element")
            try:
                y = int(text, 16)
            except ValueError as exc:
                raise DecodeError(f"share field {name!r} is not hex") from exc
            if not 0 <= y < PRIME:
                raise DecodeError(f"share field {name!r} is outside the field")
            ys.append(y)
        return Share(x, ys[0]), Share(x, ys[1])

    def receive_shares(
        self, shares: Iterable[EncryptedShare], sharers: Collection[str] | None = None
    ) -> list[SecAggPeerRejected]:
        """Round 1 (end): decrypt and keep the shares other clients sent to this client.

        Parameters
        ----------
        shares
            The ciphertexts the server relayed to this client.
        sharers
            The clients every party agrees shared keys (this client's masking neighbourhood);
            ``None`` takes the senders of ``shares``. A sharer with no usable share for this
            client is rejected.

        Returns
        -------
        list of SecAggPeerRejected
            One per rejected sender (also kept in :attr:`rejected`). To this client a rejected
            sender is a dropout before masking: :meth:`masked_input` applies no pairwise mask
            with it, and the server must be told (it then drops the sender, and removes no mask
            of this client's for it).
        """
        if not self._roster:
            raise SecureAggregationError("share_keys must run before receive_shares")
        got: dict[str, list[EncryptedShare]] = {}
        for msg in shares:
            if msg.recipient != self.client_id or msg.sender not in self._roster:
                raise SecureAggregationError(f"unexpected share {msg.sender} -> {msg.recipient}")
            got.setdefault(msg.sender, []).append(msg)
        expected = set(got) if sharers is None else set(sharers)
        if not expected <= set(self._roster):
            raise SecureAggregationError(f"sharers {sorted(expected - set(self._roster))} unknown")
        new = []
        for sender in sorted(expected - {self.client_id}):
            msgs = got.get(sender, [])
            try:
                if len(msgs) != 1:
                    raise DecodeError(f"{len(msgs)} shares for {self.client_id}, expected 1")
                self._held[sender] = self._open_share(msgs[0])
            except DecodeError as exc:
                error = SecAggPeerRejected(sender, f"share for {self.client_id}: {exc}")
                self.rejected[sender] = error
                new.append(error)
                logger.info("secagg: %s", error)
            self._sharers.add(sender)
        return new

    def masked_input(self, gradient: GradientLike) -> RingArray:
        """Round 2: return the encoded gradient plus self-mask and pairwise masks.

        Parameters
        ----------
        gradient
            This client's vector, shape ``(d,)``; values are clipped to ``clip_range``.

        Returns
        -------
        numpy.ndarray
            Shape ``(d,)``, the ring dtype; uniformly distributed to anyone without the seeds.
        """
        if self._masked_sent:
            # Two vectors under the same masks would reveal their difference to the server.
            raise SecureAggregationError("a masked input was already sent this round")
        if not self._roster:
            raise SecureAggregationError("share_keys must run before masked_input")
        # Clients that shared usable keys with this one, and this client. A rejected sender
        # gets no pairwise mask: it will be dropped, and nobody may hold its key shares.
        neighbours = sorted(self._sharers - set(self.rejected))
        if len(neighbours) < self.threshold:
            raise SecureAggregationError(
                f"only {len(neighbours)} clients shared keys; threshold is {self.threshold}"
            )
        codec = FixedPoint(len(self._roster), self.clip_range, self.ring_bits)
        masked = codec.encode(gradient)
        dtype, d = codec.dtype, masked.shape[0]
        masked += prg(kdf(self._seed, "self-mask", self.context), d, dtype)
        for other in neighbours:
            if other == self.client_id:
                continue
            peer = X25519PublicKey.from_public_bytes(self._roster[other].mask_public_key)
            mask = pair_mask(self._mask_key.exchange(peer), self.context, d, dtype)
            if self.client_id < other:
                masked += mask
            else:
                masked -= mask
        self._masked_sent = True
        return masked

    def seal_for_server(self, server_key: bytes, kind: str, plaintext: bytes) -> bytes:
        """Encrypt one message (``kind``: ``masked``, ``unmask-response``) to the server only.

        AES-256-GCM under HKDF(X25519(c_u, server)), bound to ``kind``, this client and the
        context, with a random nonce; only the holder of the server's private key reads it, and
        it authenticates this client to the server.

        Raises
        ------
        SecureAggregationError
            If ``server_key`` is not a usable X25519 public key.
        """
        try:
            shared = self._cipher_key.exchange(X25519PublicKey.from_public_bytes(server_key))
        except ValueError as exc:
            raise SecureAggregationError("the server's public key is unusable") from exc
        key = to_server_key(shared, kind, self.client_id, self.context)
        return seal(key, plaintext, f"{kind}|{self.client_id}".encode(), self._rand(12))

    def _check_request(
        self, survivors: Collection[str], dropped: Collection[str]
    ) -> tuple[frozenset[str], frozenset[str]]:
        alive, gone = frozenset(survivors), frozenset(dropped)
        if alive & gone:
            raise UnmaskRefused(
                f"survivor and dropped sets must be disjoint; {sorted(alive & gone)} are in both "
                "(both secrets of a client would unmask its vector)"
            )
        if self.client_id not in alive:
            raise UnmaskRefused(f"{self.client_id} is not among the survivors")
        if not (alive | gone) <= self._sharers:
            raise UnmaskRefused(
                f"request names non-sharers {sorted((alive | gone) - self._sharers)}"
            )
        if alive - set(self._held):
            raise UnmaskRefused(f"survivors {sorted(alive - set(self._held))} were rejected")
        if len(alive) < self.threshold:
            raise UnmaskRefused(f"only {len(alive)} survivors; threshold is {self.threshold}")
        return alive, gone

    def confirm(self, survivors: Collection[str], dropped: Collection[str]) -> SignedView:
        """Round 3: check the server's view and sign it; a client signs one view per round.

        Raises
        ------
        UnmaskRefused
            If the view is invalid (see :meth:`unmask`) or differs from one already signed.
        """
        view = self._check_request(survivors, dropped)
        if self._view is not None and self._view != view:
            raise UnmaskRefused(f"{self.client_id} already signed a different survivor set")
        self._view = view
        signature = self._sign_key.sign(view_message(self.context, *view))
        return SignedView(self.client_id, tuple(sorted(view[0])), tuple(sorted(view[1])), signature)

    def _check_views(
        self, view: tuple[frozenset[str], frozenset[str]], signed: Iterable[SignedView]
    ) -> None:
        if self._view != view:
            raise UnmaskRefused(f"{self.client_id} did not sign this survivor set")
        signers = set()
        for other in signed:
            keys = self._roster.get(other.client_id)
            message = view_message(self.context, other.survivors, other.dropped)
            if keys is None or not verify_view(keys.signing_public_key, other.signature, message):
                continue  # not that client's signature: proves nothing either way
            if (frozenset(other.survivors), frozenset(other.dropped)) != view:
                raise UnmaskRefused(
                    f"the server showed {other.client_id} a different survivor set than "
                    f"{self.client_id}; refusing to unmask"
                )
            if other.client_id in view[0]:
                signers.add(other.client_id)
        if len(signers) < self.threshold:
            raise UnmaskRefused(
                f"only {len(signers)} survivors signed the survivor set; "
                f"threshold is {self.threshold}"
            )

    def unmask(
        self,
        survivors: Collection[str],
        dropped: Collection[str],
        views: Iterable[SignedView] | None = None,
    ) -> UnmaskingShares:
        """Round 4: reveal seed shares of survivors and key shares of dropped clients, once.

        Parameters
        ----------
        survivors
            Clients whose masked vector the server sums (must include this client).
        dropped
            Clients that shared keys but are not summed.
        views
            The survivors' :class:`SignedView` s, this client's included (it must have called
            :meth:`confirm`). ``None`` skips the consistency check: only for an in-process
            server that shows every client the same sets.

        Returns
        -------
        UnmaskingShares
            The shares the server asked for (key shares only of those this client holds).

        Raises
        ------
        UnmaskRefused
            If a client is both survivor and dropped, this client is not a survivor, a named
            client did not share keys, a survivor was rejected, fewer than ``t`` survive, or
            (with ``views``) fewer than ``t`` survivors signed this view or anyone signed another.
        """
        if self._answered:
            raise SecureAggregationError("unmasking shares were already sent this round")
        view = self._check_request(survivors, dropped)
        if views is not None:
            self._check_views(view, views)
        self._answered = True
        alive, gone = view
        return UnmaskingShares(
            self.client_id,
            {u: self._held[u][0] for u in sorted(alive)},
            {u: self._held[u][1] for u in sorted(gone) if u in self._held},
            {u: self._pair_seed(u) for u in sorted(gone) if u in self._held},
        )

    def _pair_seed(self, other: str) -> bytes:
        """Return the seed of this client's pairwise mask with ``other`` (a dropout's)."""
        peer = X25519PublicKey.from_public_bytes(self._roster[other].mask_public_key)
        return pair_seed(self._mask_key.exchange(peer), self.context)
