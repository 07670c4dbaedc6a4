"""The server's (aggregator's) side of the SecAgg protocol (see :mod:`.protocol`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterable

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from ..._types import FloatArray
from ...errors import (
    DecodeError,
    FederatedDimensionMismatch,
    SecAggPeerRejected,
    SecureAggregationError,
)
from .crypto import kdf, pair_seed, prg, raw_public, unseal
from .fixed_point import FixedPoint, RingArray
from .messages import (
    AdvertisedKeys,
    EncryptedShare,
    RandBytes,
    UnmaskingShares,
    check_public_keys,
    check_threshold,
    to_server_key,
)
from .shamir import PRIME, combine_shares

__all__ = ["SecAggServer"]

logger = logging.getLogger("gradfed_ipfs.federated")


class SecAggServer:
    """The aggregator's side: relays shares, sums masked vectors, unmasks only the sum.

    Parameters
    ----------
    threshold
        t: shares needed to rebuild a secret; also the fewest clients that may be summed.
    clip_range, ring_bits, context, randbytes
        As for :class:`SecAggClient`; ``randbytes`` draws the server's X25519 key.
    private_key
        The server's raw X25519 private key instead of a fresh one: a client that re-runs the
        aggregator's steps with the key the aggregator revealed (a verifiable round).

    Attributes
    ----------
    roster, sharers
        The registered clients' keys, and the clients that shared keys.
    complaints
        Client → the senders whose shares it rejected (reported with its masked vector).
    rejected
        Client → why its message was ignored (misaddressed shares, a bad unmasking answer).
    answered
        The survivors whose answers :meth:`finalize` used, sorted.
    """

    def __init__(
        self,
        threshold: int,
        *,
        clip_range: float = 8.0,
        ring_bits: int = 32,
        context: bytes = b"",
        randbytes: RandBytes = os.urandom,
        private_key: bytes | None = None,
    ) -> None:
        if threshold < 2:
            raise SecureAggregationError(f"threshold must be >= 2, got {threshold}")
        self.threshold = threshold
        self.clip_range = clip_range
        self.ring_bits = ring_bits
        self.context = context
        self.roster: dict[str, AdvertisedKeys] = {}
        self.sharers: set[str] = set()
        self.complaints: dict[str, set[str]] = {}
        self.rejected: dict[str, str] = {}
        self.answered: list[str] = []
        raw = randbytes(32) if private_key is None else private_key
        self._key = X25519PrivateKey.from_private_bytes(raw)
        self._masked: dict[str, RingArray] = {}
        self._total: RingArray | None = None
        self._asked: tuple[list[str], list[str]] | None = None

    @property
    def public_key(self) -> bytes:
        """The server's raw X25519 public key: clients seal their messages to it."""
        return raw_public(self._key.public_key())

    @property
    def private_key(self) -> bytes:
        """The server's raw X25519 private key (revealed after a verifiable round only)."""
        return self._key.private_bytes_raw()

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
        check_threshold(self.threshold, len(roster))
        for k in roster.values():
            check_public_keys(k)
        self.roster = roster
        return dict(roster)

    def route_shares(
        self, shares: Iterable[EncryptedShare], sharers: Collection[str] | None = None
    ) -> dict[str, list[EncryptedShare]]:
        """Round 1: group the ciphertexts by recipient; note the sharing clients.

        Parameters
        ----------
        shares
            Every ciphertext the clients sent; one from or to a client off the roster is
            skipped (noted in :attr:`rejected`), never an error.
        sharers
            The clients every party agrees shared keys; ``None`` takes the senders.

        Returns
        -------
        dict
            Recipient id -> the ciphertexts addressed to it.
        """
        by_recipient: dict[str, list[EncryptedShare]] = {}
        senders = set()
        for msg in shares:
            if msg.sender not in self.roster or msg.recipient not in self.roster:
                self.rejected[msg.sender] = f"share for {msg.recipient!r:.60} is off the roster"
                logger.info("secagg: share %r -> %r off roster", msg.sender, msg.recipient)
                continue
            by_recipient.setdefault(msg.recipient, []).append(msg)
            senders.add(msg.sender)
        self.sharers = (senders if sharers is None else set(sharers)) & set(self.roster)
        if len(self.sharers) < self.threshold:
            raise SecureAggregationError(
                f"only {len(self.sharers)} clients shared keys; threshold is {self.threshold}"
            )
        return by_recipient

    @property
    def codec(self) -> FixedPoint:
        """The fixed-point encoding every party uses (sized by the roster)."""
        return FixedPoint(len(self.roster), self.clip_range, self.ring_bits)

    def open_from(self, client_id: str, kind: str, data: bytes) -> bytes:
        """Decrypt a message ``client_id`` sealed to this server (``SecAggClient.seal_for_server``).

        Raises
        ------
        SecAggPeerRejected
            If ``client_id`` is off the roster or ``data`` does not decrypt from it.
        """
        keys = self.roster.get(client_id)
        if keys is None:
            raise SecAggPeerRejected(client_id, "not on the roster")
        shared = self._key.exchange(X25519PublicKey.from_public_bytes(keys.cipher_public_key))
        key = to_server_key(shared, kind, client_id, self.context)
        try:
            return unseal(key, data, f"{kind}|{client_id}".encode())
        except DecodeError as exc:
            raise SecAggPeerRejected(client_id, f"{kind}: {exc}") from exc

    def receive_masked(
        self, client_id: str, masked: RingArray, rejected: Collection[str] = ()
    ) -> None:
        """Round 2: add one masked vector to the running ring sum.

        Parameters
        ----------
        client_id
            A client that shared keys.
        masked
            Its masked vector, shape ``(d,)``, the ring dtype.
        rejected
            The sharers whose shares this client rejected; they will not be summed.
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
        self.complaints[client_id] = (set(rejected) & self.sharers) - {client_id}

    def unmask_request(self) -> tuple[list[str], list[str]]:
        """Round 3 (start): return (survivors, dropped); raise if fewer than t survivors.

        A client another client reported (its shares were unusable) is not summed.
        """
        reported = set().union(*self.complaints.values()) if self.complaints else set()
        if self._total is not None:
            for u in sorted(reported & set(self._masked)):
                self._total -= self._masked.pop(u)
        survivors = sorted(self._masked)
        if len(survivors) < self.threshold:
            raise SecureAggregationError(
                f"only {len(survivors)} clients survived masking; threshold is {self.threshold}"
            )
        self._asked = (survivors, sorted(self.sharers - set(survivors)))
        return self._asked

    def _usable(self, answer: UnmaskingShares, survivors: list[str], dropped: list[str]) -> bool:
        x = sorted(self.roster).index(answer.client_id) + 1
        shares = [*answer.self_mask_shares.values(), *answer.key_shares.values()]
        return (
            set(answer.self_mask_shares) == set(survivors)
            and set(answer.key_shares) <= set(dropped)
            and set(answer.pair_seeds) <= set(dropped)
            and all(len(seed) == 32 for seed in answer.pair_seeds.values())
            and all(s.x == x and 0 <= s.y < PRIME for s in shares)
        )

    def finalize(self, responses: Iterable[UnmaskingShares]) -> FloatArray:
        """Round 4 (end): rebuild seeds from >= t answers, remove all masks, decode the sum.

        Parameters
        ----------
        responses
            Survivors' :class:`UnmaskingShares`; an answer to a different request is ignored
            (noted in :attr:`rejected`).

        Returns
        -------
        FloatArray
            The sum of the survivors' (clipped) vectors, shape ``(d,)``, float32.
        """
        if self._asked is None or self._total is None:
            raise SecureAggregationError("finalize called before unmask_request")
        survivors, dropped = self._asked
        answers: dict[str, UnmaskingShares] = {}
        for r in responses:
            if r.client_id not in survivors or r.client_id in answers:
                continue
            if not self._usable(r, survivors, dropped):
                self.rejected[r.client_id] = "answered a different request"
                logger.info("secagg: %s answered a different request", r.client_id)
                continue
            answers[r.client_id] = r
        if len(answers) < self.threshold:
            raise SecureAggregationError(
                f"only {len(answers)} unmasking responses; threshold is {self.threshold}"
            )
        self.answered = sorted(answers)
        codec, total, t = self.codec, self._total.copy(), self.threshold
        d = total.shape[0]
        for u in survivors:
            seed = combine_shares([r.self_mask_shares[u] for r in answers.values()], t)
            total -= prg(kdf(seed, "self-mask", self.context), d, codec.dtype)
        for u in dropped:
            self._remove_masks_of(total, u, survivors, answers)
        return codec.decode_sum(total)

    def _remove_masks_of(
        self, total: RingArray, u: str, survivors: list[str], answers: dict[str, UnmaskingShares]
    ) -> None:
        """Remove, in place, the pairwise masks survivors applied with dropped client ``u``.

        A survivor that reported ``u`` (its shares were unusable) applied none; one that
        answered with the seed of its mask with ``u`` gives it directly. Only the others need
        ``u``'s key, rebuilt from ``t`` key shares, so a client whose shares every survivor
        rejected, or some survivors only, costs no key shares.
        """
        codec, d = self.codec, total.shape[0]
        masked_with = [v for v in survivors if u not in self.complaints.get(v, set())]
        seeds = {
            v: answers[v].pair_seeds[u]
            for v in masked_with
            if v in answers and u in answers[v].pair_seeds
        }
        if set(masked_with) - set(seeds):
            private = self._dropped_key(u, answers)
            for v in sorted(set(masked_with) - set(seeds)):
                peer = X25519PublicKey.from_public_bytes(self.roster[v].mask_public_key)
                seeds[v] = pair_seed(private.exchange(peer), self.context)
        for v in masked_with:
            mask = prg(seeds[v], d, codec.dtype)
            # v added +mask if v < u, -mask if v > u; undo v's term.
            if v < u:
                total -= mask
            else:
                total += mask

    def _dropped_key(self, u: str, answers: dict[str, UnmaskingShares]) -> X25519PrivateKey:
        """Rebuild dropped client ``u``'s mask key from ``t`` survivors' key shares."""
        t = self.threshold
        held = [r.key_shares[u] for r in answers.values() if u in r.key_shares]
        if len(held) < t:
            raise SecureAggregationError(f"only {len(held)} shares of {u}'s key; threshold is {t}")
        private = X25519PrivateKey.from_private_bytes(combine_shares(held, t))
        if raw_public(private.public_key()) != self.roster[u].mask_public_key:
            raise SecureAggregationError(f"reconstructed key of {u} does not match its public key")
        return private
