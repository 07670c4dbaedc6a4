"""The cryptographic building blocks of SecAgg, all from the ``cryptography`` package.

- :func:`kdf`: HKDF-SHA256 to a 32-byte key, bound to a purpose string and the round context;
- :func:`prg`: the ChaCha20 keystream read as ring words (the masks);
- :func:`seal` / :func:`unseal`: one AES-GCM envelope, ``magic | 12-byte nonce | ciphertext``,
  for messages addressed to one party (the server's X25519 key, see
  :meth:`~gradfed_ipfs.federated.secagg.protocol.SecAggClient.seal_for_server`);
- :func:`view_message`: the bytes an Ed25519 signature over a survivor/dropped view covers.

Nothing here is a hand-made cipher.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Final

import numpy as np
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ...errors import DecodeError
from .fixed_point import RingArray

__all__ = [
    "SEALED_MAGIC",
    "kdf",
    "pair_mask",
    "pair_seed",
    "prg",
    "raw_public",
    "seal",
    "unseal",
    "verify_view",
    "view_message",
]

SEALED_MAGIC: Final = b"GFSA1\n"
"""First bytes of a sealed (AES-GCM) SecAgg message."""
_NONCE_BYTES: Final = 12


def kdf(secret: bytes, purpose: str, context: bytes) -> bytes:
    """Derive a 32-byte key from a shared secret for one purpose and one round context."""
    info = b"gradfed-secagg/v1|" + purpose.encode() + b"|" + context
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


def prg(key: bytes, length: int, dtype: type[np.unsignedinteger]) -> RingArray:
    """Expand a 32-byte key into ``length`` uniform ring elements (ChaCha20 keystream)."""
    width = np.dtype(dtype).itemsize
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    stream = encryptor.update(bytes(length * width))
    return np.frombuffer(stream, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)


def pair_mask(
    shared: bytes, context: bytes, length: int, dtype: type[np.unsignedinteger]
) -> RingArray:
    """Return the pairwise mask of two clients from their X25519 shared secret."""
    return prg(pair_seed(shared, context), length, dtype)


def pair_seed(shared: bytes, context: bytes) -> bytes:
    """Return the 32-byte PRG seed of two clients' pairwise mask (revealed only for a dropout)."""
    return kdf(shared, "pair-mask", context)


def raw_public(public_key: X25519PublicKey | Ed25519PublicKey) -> bytes:
    """Return a public key's 32 raw bytes."""
    return public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def seal(key: bytes, plaintext: bytes, aad: bytes, nonce: bytes) -> bytes:
    """Encrypt ``plaintext`` with AES-256-GCM: ``SEALED_MAGIC | nonce (12 B) | ciphertext+tag``."""
    if len(nonce) != _NONCE_BYTES:
        raise ValueError("an AES-GCM nonce is 12 bytes")
    return SEALED_MAGIC + nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def unseal(key: bytes, data: bytes, aad: bytes) -> bytes:
    """Decrypt a :func:`seal` envelope.

    Raises
    ------
    DecodeError
        If ``data`` is not an envelope, or it was not sealed with ``key`` and ``aad``
        (tampered, or meant for someone else).
    """
    head = len(SEALED_MAGIC) + _NONCE_BYTES
    if not data.startswith(SEALED_MAGIC) or len(data) < head + 16:
        raise DecodeError("not a sealed SecAgg message")
    try:
        return AESGCM(key).decrypt(data[len(SEALED_MAGIC) : head], data[head:], aad)
    except InvalidTag as exc:
        raise DecodeError("sealed SecAgg message does not decrypt with this key") from exc


def view_message(context: bytes, survivors: Collection[str], dropped: Collection[str]) -> bytes:
    """Return the bytes a client signs to confirm the survivor/dropped view it was shown."""
    body = json.dumps([sorted(survivors), sorted(dropped)], separators=(",", ":")).encode()
    return b"gradfed-secagg/v1|view|" + context + b"|" + body


def verify_view(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """Return whether ``signature`` is a valid Ed25519 signature of ``message``."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
