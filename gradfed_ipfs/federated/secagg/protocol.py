"""Secure aggregation with dropout recovery (Bonawitz et al. 2017; Flower SecAgg+ style).

Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017,
https://eprint.iacr.org/2017/281. The server learns the sum of the surviving clients' vectors and
nothing else (honest-but-curious server, fewer than ``threshold`` colluding clients).

Protocol, per round (one :class:`SecAggClient` per client, one :class:`SecAggServer`):

0. **Advertise keys.** Each client makes two X25519 key pairs: ``c`` (encrypts shares) and ``s``
   (pairwise masks), and sends both public keys. The server needs >= ``threshold`` clients.
1. **Share keys.** Each client draws a 32-byte self-mask seed ``b_u`` and Shamir-shares ``b_u`` and
   its ``s`` private key (threshold ``t``, :mod:`.shamir`). The shares for
   client ``v`` are encrypted with AES-GCM under HKDF(X25519(c_u, c_v)) and relayed by the server,
   which cannot read them.
2. **Masked input.** Each client encodes its vector in a fixed-point ring Z/2^b (see
   :class:`FixedPoint`) and adds ``PRG(b_u) + Σ_{v>u} PRG(s_uv) - Σ_{v<u} PRG(s_uv)``, where
   ``s_uv`` = HKDF(X25519(s_u, s_v)) and PRG is the ChaCha20 keystream. Pairwise masks cancel in
   the sum; the self-mask protects a client whose pairwise masks are later revealed.
3. **Unmasking.** The server names the survivors (sent a masked vector) and the dropped (shared
   keys, sent nothing). Each responding survivor returns its share of ``b_u`` for every survivor
   and of ``s_u`` for every dropped client, never both for one client. With >= ``t`` responses
   the server rebuilds the seeds, strips the self-masks and the dropped clients' dangling pairwise
   masks, and decodes the sum. Fewer than ``t`` survivors or responses raise
   :class:`~gradfed_ipfs.errors.SecureAggregationError`: there is no partial or wrong sum.

Cryptography comes from the ``cryptography`` package (X25519, HKDF-SHA256, ChaCha20, AES-GCM);
nothing here is a hand-made cipher. Randomness is ``os.urandom`` unless a ``randbytes`` callable
is injected (tests inject a seeded one to be reproducible; never do that in production).

:class:`SecureAggregation` keeps the seed's API (§6.5) and runs the whole protocol in-process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ..._types import FloatArray, GradientLike
from ...errors import FederatedDimensionMismatch, InvalidGradient, SecureAggregationError
from .fixed_point import FixedPoint, RingArray
from .shamir import Share, combine_shares, split_secret

__all__ = [
    "AdvertisedKeys",
    "EncryptedShare",
    "SecAggClient",
    "SecAggResult",
    "SecAggServer",
    "SecureAggregation",
    "UnmaskingShares",
    "run_secure_aggregation",
]

RandBytes = Callable[[int], bytes]

_NONCE = bytes(12)  # each AES-GCM key encrypts exactly one message, so a fixed nonce is safe


@dataclass(frozen=True)
class AdvertisedKeys:
    """Round 0 message: a client's two raw X25519 public keys (32 bytes each)."""

    client_id: str
    cipher_public_key: bytes
    mask_public_key: bytes


@dataclass(frozen=True)
class EncryptedShare:
    """Round 1 message: ``sender``'s shares for ``recipient``, AES-GCM encrypted."""

    sender: str
    recipient: str
    ciphertext: bytes


@dataclass(frozen=True)
class UnmaskingShares:
    """Round 3 message: a survivor's shares of survivors' seeds and dropped clients' keys."""

    client_id: str
    self_mask_shares: dict[str, Share]
    key_shares: dict[str, Share]


def _kdf(secret: bytes, purpose: str, context: bytes) -> bytes:
    info = b"gradfed-secagg/v1|" + purpose.encode() + b"|" + context
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


def _prg(key: bytes, length: int, dtype: type[np.unsignedinteger]) -> RingArray:
    """Expand a 32-byte key into ``length`` uniform ring elements (ChaCha20 keystream)."""
    width = np.dtype(dtype).itemsize
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    stream = encryptor.update(bytes(length * width))
    return np.frombuffer(stream, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)


def _raw(public_key: X25519PublicKey) -> bytes:
    return public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _pair_mask(
    shared: bytes, context: bytes, length: int, dtype: type[np.unsignedinteger]
) -> RingArray:
    return _prg(_kdf(shared, "pair-mask", context), length, dtype)


def _check_threshold(threshold: int, n: int) -> None:
    if not 1 <= threshold <= n:
        raise SecureAggregationError(f"need 1 <= threshold <= clients, got t={threshold}, n={n}")


class SecAggClient:
    """One client's side of the protocol.

    Parameters
    ----------
    client_id
        The client's id; clients are ordered by id (sign of pairwise masks, share x).
    threshold
        t: shares needed to rebuild a secret.
    clip_range, ring_bits
        The :class:`FixedPoint` settings, identical for every party.
    context
        Bytes binding keys and masks to one session and round (e.g. ``b"session/round"``).
    randbytes
        Cryptographic randomness (``os.urandom``).
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
        self.client_id = client_id
        self.threshold = threshold
        self.clip_range = clip_range
        self.ring_bits = ring_bits
        self.context = context
        self._rand = randbytes
        self._cipher_key = X25519PrivateKey.from_private_bytes(randbytes(32))
        self._mask_key = X25519PrivateKey.from_private_bytes(randbytes(32))
        self._seed = b""
        self._roster: dict[str, AdvertisedKeys] = {}
        self._held: dict[str, tuple[Share, Share]] = {}  # sender -> (share of b, share of s_sk)
        self._answered = False
        self._masked_sent = False

    def advertise_keys(self) -> AdvertisedKeys:
        """Round 0: return this client's public keys."""
        return AdvertisedKeys(
            self.client_id, _raw(self._cipher_key.public_key()), _raw(self._mask_key.public_key())
        )

    def _share_key(self, other: str, sender: str, recipient: str) -> bytes:
        peer = X25519PublicKey.from_public_bytes(self._roster[other].cipher_public_key)
        shared = self._cipher_key.exchange(peer)
        return _kdf(shared, f"share-enc|{sender}|{recipient}", self.context)

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
        _check_threshold(self.threshold, len(roster))
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
                continue
            body = json.dumps(
                {"x": b_share.x, "b": hex(b_share.y), "s": hex(s_share.y)}, sort_keys=True
            ).encode()
            key = self._share_key(other, self.client_id, other)
            aad = f"{self.client_id}|{other}".encode()
            out.append(
                EncryptedShare(self.client_id, other, AESGCM(key).encrypt(_NONCE, body, aad))
            )
        return out

    def receive_shares(self, shares: Iterable[EncryptedShare]) -> None:
        """Round 1 (end): decrypt and keep the shares other clients sent to this client.

        Parameters
        ----------
        shares
            The ciphertexts the server relayed to this client.
        """
        for msg in shares:
            if msg.recipient != self.client_id or msg.sender not in self._roster:
                raise SecureAggregationError(f"unexpected share {msg.sender} -> {msg.recipient}")
            key = self._share_key(msg.sender, msg.sender, self.client_id)
            aad = f"{msg.sender}|{self.client_id}".encode()
            try:
                body = json.loads(AESGCM(key).decrypt(_NONCE, msg.ciphertext, aad))
            except InvalidTag as exc:
                raise SecureAggregationError(f"share from {msg.sender} failed to decrypt") from exc
            x = int(body["x"])
            self._held[msg.sender] = (Share(x, int(body["b"], 16)), Share(x, int(body["s"], 16)))

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
        neighbours = sorted(self._held)  # clients whose shares arrived, and this client
        if len(neighbours) < self.threshold:
            raise SecureAggregationError(
                f"only {len(neighbours)} clients shared keys; threshold is {self.threshold}"
            )
        codec = FixedPoint(len(self._roster), self.clip_range, self.ring_bits)
        masked = codec.encode(gradient)
        dtype, d = codec.dtype, masked.shape[0]
        masked += _prg(_kdf(self._seed, "self-mask", self.context), d, dtype)
        for other in neighbours:
            if other == self.client_id:
                continue
            peer = X25519PublicKey.from_public_bytes(self._roster[other].mask_public_key)
            mask = _pair_mask(self._mask_key.exchange(peer), self.context, d, dtype)
            if self.client_id < other:
                masked += mask
            else:
                masked -= mask
        self._masked_sent = True
        return masked

    def unmask(self, survivors: Collection[str], dropped: Collection[str]) -> UnmaskingShares:
        """Round 3: reveal seed shares of survivors and key shares of dropped clients, once.

        Parameters
        ----------
        survivors
            Clients whose masked vector the server holds (must include this client).
        dropped
            Clients that shared keys but sent no masked vector.

        Returns
        -------
        UnmaskingShares
            The shares the server asked for.
        """
        alive, gone = set(survivors), set(dropped)
        if self._answered:
            raise SecureAggregationError("unmasking shares were already sent this round")
        if alive & gone or self.client_id not in alive:
            raise SecureAggregationError("survivor and dropped sets must be disjoint")
        if not (alive | gone) <= set(self._held) or len(alive) < self.threshold:
            raise SecureAggregationError("invalid unmasking request")
        self._answered = True
        return UnmaskingShares(
            self.client_id,
            {u: self._held[u][0] for u in sorted(alive)},
            {u: self._held[u][1] for u in sorted(gone)},
        )


class SecAggServer:
    """The aggregator's side: relays shares, sums masked vectors, unmasks only the sum.

    Parameters
    ----------
    threshold
        t: shares needed to rebuild a secret; also the fewest clients that may be summed.
    clip_range, ring_bits, context
        As for :class:`SecAggClient`.
    """

    def __init__(
        self, threshold: int, *, clip_range: float = 8.0, ring_bits: int = 32, context: bytes = b""
    ) -> None:
        self.threshold = threshold
        self.clip_range = clip_range
        self.ring_bits = ring_bits
        self.context = context
        self.roster: dict[str, AdvertisedKeys] = {}
        self.sharers: set[str] = set()
        self._masked: dict[str, RingArray] = {}
        self._total: RingArray | None = None
        self._asked: tuple[list[str], list[str]] | None = None

    def register(self, keys: Iterable[AdvertisedKeys]) -> dict[str, AdvertisedKeys]:
        """Round 0: collect public keys and return the roster to broadcast.

        Parameters
        ----------
        keys
            Every client's :class:`AdvertisedKeys`.

        Returns
        -------
        dict
            Client id -> keys.
        """
        roster = {k.client_id: k for k in keys}
        _check_threshold(self.threshold, len(roster))
        self.roster = roster
        return dict(roster)

    def route_shares(self, shares: Iterable[EncryptedShare]) -> dict[str, list[EncryptedShare]]:
        """Round 1: group the ciphertexts by recipient; senders become the sharing clients.

        Parameters
        ----------
        shares
            Every ciphertext the clients sent.

        Returns
        -------
        dict
            Recipient id -> the ciphertexts addressed to it.
        """
        by_recipient: dict[str, list[EncryptedShare]] = {}
        for msg in shares:
            if msg.sender not in self.roster or msg.recipient not in self.roster:
                raise SecureAggregationError(f"share {msg.sender} -> {msg.recipient} off roster")
            by_recipient.setdefault(msg.recipient, []).append(msg)
            self.sharers.add(msg.sender)
        if len(self.sharers) < self.threshold:
            raise SecureAggregationError(
                f"only {len(self.sharers)} clients shared keys; threshold is {self.threshold}"
            )
        return by_recipient

    @property
    def codec(self) -> FixedPoint:
        """The fixed-point encoding every party uses (sized by the roster)."""
        return FixedPoint(len(self.roster), self.clip_range, self.ring_bits)

    def receive_masked(self, client_id: str, masked: RingArray) -> None:
        """Round 2: add one masked vector to the running ring sum.

        Parameters
        ----------
        client_id
            A client that shared keys.
        masked
            Its masked vector, shape ``(d,)``, the ring dtype.
        """
        if client_id not in self.sharers or client_id in self._masked:
            raise SecureAggregationError(f"unexpected masked input from {client_id}")
        vector = np.asarray(masked, dtype=self.codec.dtype).reshape(-1)
        if self._total is None:
            self._total = np.zeros_like(vector)
        elif vector.shape != self._total.shape:
            raise FederatedDimensionMismatch(int(self._total.shape[0]), int(vector.shape[0]))
        self._masked[client_id] = vector
        self._total += vector

    def unmask_request(self) -> tuple[list[str], list[str]]:
        """Round 3 (start): return (survivors, dropped); raise if fewer than t survivors."""
        survivors = sorted(self._masked)
        if len(survivors) < self.threshold:
            raise SecureAggregationError(
                f"only {len(survivors)} clients survived masking; threshold is {self.threshold}"
            )
        self._asked = (survivors, sorted(self.sharers - set(survivors)))
        return self._asked

    def finalize(self, responses: Iterable[UnmaskingShares]) -> FloatArray:
        """Round 3 (end): rebuild seeds from >= t responses, remove all masks, decode the sum.

        Parameters
        ----------
        responses
            Survivors' :class:`UnmaskingShares`.

        Returns
        -------
        FloatArray
            The sum of the survivors' (clipped) vectors, shape ``(d,)``, float32.
        """
        if self._asked is None or self._total is None:
            raise SecureAggregationError("finalize called before unmask_request")
        survivors, dropped = self._asked
        answers = [r for r in responses if r.client_id in survivors]
        if len({r.client_id for r in answers}) < self.threshold:
            raise SecureAggregationError(
                f"only {len(answers)} unmasking responses; threshold is {self.threshold}"
            )
        codec, total = self.codec, self._total.copy()
        d = total.shape[0]
        for r in answers:
            if set(r.self_mask_shares) != set(survivors) or set(r.key_shares) != set(dropped):
                raise SecureAggregationError(f"{r.client_id} answered a different request")
        for u in survivors:
            seed = combine_shares([r.self_mask_shares[u] for r in answers], self.threshold)
            total -= _prg(_kdf(seed, "self-mask", self.context), d, codec.dtype)
        for u in dropped:
            sk = combine_shares([r.key_shares[u] for r in answers], self.threshold)
            private = X25519PrivateKey.from_private_bytes(sk)
            if _raw(private.public_key()) != self.roster[u].mask_public_key:
                raise SecureAggregationError(
                    f"reconstructed key of {u} does not match its public key"
                )
            for v in survivors:
                peer = X25519PublicKey.from_public_bytes(self.roster[v].mask_public_key)
                mask = _pair_mask(private.exchange(peer), self.context, d, codec.dtype)
                # v added +mask if v < u, -mask if v > u; undo v's term.
                if v < u:
                    total -= mask
                else:
                    total += mask
        return codec.decode_sum(total)


@dataclass
class SecAggResult:
    """Outcome of an in-process run: the sum and what the server saw."""

    total: FloatArray
    survivors: list[str]
    dropped: list[str]
    masked: dict[str, RingArray] = field(default_factory=dict)


def run_secure_aggregation(
    inputs: Mapping[str, GradientLike],
    threshold: int,
    *,
    clip_range: float = 8.0,
    ring_bits: int = 32,
    context: bytes = b"",
    drop_before_masking: Collection[str] = (),
    silent_in_unmasking: Collection[str] = (),
    randbytes: RandBytes = os.urandom,
) -> SecAggResult:
    """Run every round of the protocol in-process over ``inputs`` (simulating dropouts).

    Parameters
    ----------
    inputs
        Client id -> vector of shape ``(d,)``.
    threshold
        t.
    clip_range, ring_bits, context, randbytes
        As for :class:`SecAggClient`.
    drop_before_masking
        Clients that share keys, then vanish before sending their masked vector.
    silent_in_unmasking
        Survivors that send their masked vector but do not answer the unmasking request.

    Returns
    -------
    SecAggResult
        The survivors' sum and the masked vectors the server received.
    """
    clients = {
        cid: SecAggClient(
            cid,
            threshold,
            clip_range=clip_range,
            ring_bits=ring_bits,
            context=context,
            randbytes=randbytes,
        )
        for cid in sorted(inputs)
    }
    server = SecAggServer(threshold, clip_range=clip_range, ring_bits=ring_bits, context=context)
    roster = server.register(c.advertise_keys() for c in clients.values())
    routed = server.route_shares(m for c in clients.values() for m in c.share_keys(roster))
    for cid, client in clients.items():
        client.receive_shares(routed.get(cid, []))
    masked = {}
    for cid, client in clients.items():
        if cid not in drop_before_masking:
            masked[cid] = client.masked_input(inputs[cid])
            server.receive_masked(cid, masked[cid])
    survivors, dropped = server.unmask_request()
    answers = [
        clients[v].unmask(survivors, dropped) for v in survivors if v not in silent_in_unmasking
    ]
    return SecAggResult(server.finalize(answers), survivors, dropped, masked)


class SecureAggregation:
    """The seed's ``SecureAggregation`` API (§6.5) with the real protocol behind it.

    Parameters
    ----------
    min_participants
        Fewest gradients (and registered participants) an aggregation accepts.
    threshold
        Shamir threshold; ``None`` uses a majority, ``n // 2 + 1``, of the gradients passed.
    clip_range, ring_bits
        The :class:`FixedPoint` settings.
    randbytes
        Cryptographic randomness (``os.urandom``).
    """

    def __init__(
        self,
        min_participants: int,
        *,
        threshold: int | None = None,
        clip_range: float = 8.0,
        ring_bits: int = 32,
        randbytes: RandBytes = os.urandom,
    ) -> None:
        if min_participants < 1:
            raise InvalidGradient(f"min_participants must be >= 1, got {min_participants}")
        self.min_participants = min_participants
        self.threshold = threshold
        self.clip_range = clip_range
        self.ring_bits = ring_bits
        self._rand = randbytes
        self._count = 0
        self.last_result: SecAggResult | None = None

    def add_participant(self) -> None:
        """Register one more participant."""
        self._count += 1

    def participant_count(self) -> int:
        """Return the number of registered participants."""
        return self._count

    def can_aggregate(self) -> bool:
        """Return whether enough participants are registered."""
        return self._count >= self.min_participants

    def reset(self) -> None:
        """Forget the registered participants."""
        self._count = 0

    def aggregate_secure(self, gradients: Sequence[GradientLike]) -> FloatArray:
        """Return the mean of ``gradients``, computed through secure aggregation.

        Parameters
        ----------
        gradients
            One vector of shape ``(d,)`` per participant; values beyond ``clip_range`` are clipped.

        Returns
        -------
        FloatArray
            The mean, float32, exact to the fixed-point resolution.
        """
        need = self.min_participants
        if self._count < need or len(gradients) < need:
            have = min(self._count, len(gradients))
            raise SecureAggregationError(f"Not enough participants: need {need}, have {have}")
        vectors = [np.asarray(g, dtype=np.float32).reshape(-1) for g in gradients]
        for v in vectors[1:]:
            if v.shape != vectors[0].shape:
                raise FederatedDimensionMismatch(int(vectors[0].shape[0]), int(v.shape[0]))
        n = len(vectors)
        threshold = self.threshold if self.threshold is not None else n // 2 + 1
        inputs = {f"participant-{i:06d}": v for i, v in enumerate(vectors)}
        self.last_result = run_secure_aggregation(
            inputs,
            threshold,
            clip_range=self.clip_range,
            ring_bits=self.ring_bits,
            randbytes=self._rand,
        )
        return (self.last_result.total / np.float32(n)).astype(np.float32)
