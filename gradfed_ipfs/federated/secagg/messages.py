"""The messages of the SecAgg protocol and the checks every party applies to them.

See :mod:`.protocol` for the protocol; :mod:`.client` and :mod:`.server` are its two sides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from ...errors import SecAggPeerRejected, SecureAggregationError
from .crypto import kdf
from .shamir import Share

__all__ = [
    "AdvertisedKeys",
    "EncryptedShare",
    "RandBytes",
    "SignedView",
    "UnmaskingShares",
    "check_public_keys",
    "check_threshold",
    "to_server_key",
]

RandBytes = Callable[[int], bytes]


@dataclass(frozen=True)
class AdvertisedKeys:
    """Round 0 message: a client's raw public keys (32 bytes each).

    ``cipher_public_key`` and ``mask_public_key`` are X25519; ``signing_public_key`` is Ed25519.
    """

    client_id: str
    cipher_public_key: bytes
    mask_public_key: bytes
    signing_public_key: bytes


@dataclass(frozen=True)
class EncryptedShare:
    """Round 1 message: ``sender``'s shares for ``recipient``, AES-GCM encrypted."""

    sender: str
    recipient: str
    ciphertext: bytes


@dataclass(frozen=True)
class SignedView:
    """Round 3 message: a survivor's Ed25519 signature over the view the server showed it."""

    client_id: str
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    signature: bytes


@dataclass(frozen=True)
class UnmaskingShares:
    """Round 4 message: a survivor's shares of survivors' seeds and dropped clients' keys.

    ``pair_seeds`` holds, for each dropped client this survivor masked with, the 32-byte seed of
    their pairwise mask: the server removes that mask even when fewer than ``t`` survivors hold
    the dropped client's key (its shares were usable to some clients only).
    """

    client_id: str
    self_mask_shares: dict[str, Share]
    key_shares: dict[str, Share]
    pair_seeds: dict[str, bytes] = field(default_factory=dict)


def check_threshold(threshold: int, n: int) -> None:
    """Refuse a threshold outside ``2 <= t <= n`` with ``t > n/2``.

    With t = 1 a single client rebuilds another's secrets; with t <= n/2 two disjoint groups
    could each be asked for a different secret of the same client.

    Raises
    ------
    SecureAggregationError
        If ``threshold`` is not allowed for ``n`` clients.
    """
    if threshold < 2 or 2 * threshold <= n or threshold > n:
        raise SecureAggregationError(
            f"need 2 <= threshold <= clients and threshold > clients/2, got t={threshold}, n={n}"
        )


def check_public_keys(keys: AdvertisedKeys) -> None:
    """Refuse keys that are not 32-byte points (or are X25519 low-order points).

    Raises
    ------
    SecAggPeerRejected
        Naming ``keys.client_id``.
    """
    probe = X25519PrivateKey.from_private_bytes(bytes(range(32)))
    raws = (keys.cipher_public_key, keys.mask_public_key, keys.signing_public_key)
    if any(len(k) != 32 for k in raws):
        raise SecAggPeerRejected(keys.client_id, "public keys must be 32 bytes each")
    for raw in raws[:2]:
        try:
            probe.exchange(X25519PublicKey.from_public_bytes(raw))
        except ValueError as exc:  # a low-order point gives an all-zero secret
            raise SecAggPeerRejected(keys.client_id, "unusable X25519 public key") from exc


def to_server_key(shared: bytes, kind: str, client_id: str, context: bytes) -> bytes:
    """Derive the key of one ``kind`` of message ``client_id`` seals to the server."""
    return kdf(shared, f"to-server|{kind}|{client_id}", context)
