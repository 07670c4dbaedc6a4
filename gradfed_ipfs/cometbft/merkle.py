"""CometBFT's simple Merkle tree (RFC 6962 hashing): roots, inclusion proofs, their check.

The same tree CometBFT hashes block headers and validator sets with
(``crypto/merkle/tree.go``): a leaf hashes to ``SHA-256(0x00 || leaf)``, an inner node to
``SHA-256(0x01 || left || right)``, an empty tree to ``SHA-256("")``; ``n > 1`` items split at
the largest power of two below ``n``. A proof of item ``index`` of ``total`` is its *aunts*, the
sibling hashes from the leaf upwards (``Proof.Aunts`` in CometBFT): ``⌈log2 total⌉`` hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

__all__ = ["MAX_PROOF_DEPTH", "merkle_aunts", "merkle_root", "root_from_aunts"]

MAX_PROOF_DEPTH: Final = 64
"""Most aunts a proof may have (a tree of up to 2**64 leaves)."""


def _leaf(item: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + item).digest()


def _inner(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """Return the largest power of two strictly below ``n`` (``n ≥ 2``)."""
    k = 1 << (n.bit_length() - 1)
    return k >> 1 if k == n else k


def merkle_root(items: Sequence[bytes]) -> bytes:
    """Return the 32-byte root of ``items`` (CometBFT's ``merkle.HashFromByteSlices``)."""
    if not items:
        return hashlib.sha256(b"").digest()
    if len(items) == 1:
        return _leaf(items[0])
    k = _split(len(items))
    return _inner(merkle_root(items[:k]), merkle_root(items[k:]))


def merkle_aunts(items: Sequence[bytes], index: int) -> list[bytes]:
    """Return the proof of ``items[index]``: its aunts, innermost first.

    Raises
    ------
    IndexError
        If ``index`` is not in ``[0, len(items))``.
    """
    if not 0 <= index < len(items):
        raise IndexError(f"item {index} of {len(items)}")
    if len(items) == 1:
        return []
    k = _split(len(items))
    if index < k:
        return [*merkle_aunts(items[:k], index), merkle_root(items[k:])]
    return [*merkle_aunts(items[k:], index - k), merkle_root(items[:k])]


def root_from_aunts(item: bytes, index: int, total: int, aunts: Sequence[bytes]) -> bytes | None:
    """Return the root that ``aunts`` prove ``item`` at ``index`` of ``total`` under.

    ``None`` if the proof has the wrong shape for ``index`` and ``total`` (too many or too few
    aunts, an aunt not 32 bytes, an index out of range): such a proof proves nothing.
    """
    if not 0 <= index < total or len(aunts) > MAX_PROOF_DEPTH:
        return None
    if any(len(a) != 32 for a in aunts):
        return None
    return _from_aunts(_leaf(item), index, total, list(aunts))


def _from_aunts(leaf: bytes, index: int, total: int, aunts: list[bytes]) -> bytes | None:
    if total == 1:
        return leaf if not aunts else None
    if not aunts:
        return None
    k = _split(total)
    if index < k:
        left = _from_aunts(leaf, index, k, aunts[:-1])
        return None if left is None else _inner(left, aunts[-1])
    right = _from_aunts(leaf, index - k, total - k, aunts[:-1])
    return None if right is None else _inner(aunts[-1], right)
