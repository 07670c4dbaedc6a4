"""CometBFT's Merkle tree: roots, proofs of every leaf, and proofs that must not verify."""

from __future__ import annotations

import hashlib

import pytest

from gradfed_ipfs.cometbft.merkle import merkle_aunts, merkle_root, root_from_aunts


def _items(n: int) -> list[bytes]:
    return [f"item {i}".encode() for i in range(n)]


def test_small_trees_hash_as_rfc_6962() -> None:
    sha = lambda data: hashlib.sha256(data).digest()  # noqa: E731
    assert merkle_root([]) == sha(b"")
    assert merkle_root([b"a"]) == sha(b"\x00a")
    left, right = sha(b"\x00a"), sha(b"\x00b")
    assert merkle_root([b"a", b"b"]) == sha(b"\x01" + left + right)
    # Three leaves split 2 + 1 (the largest power of two below 3).
    c = sha(b"\x00c")
    assert merkle_root([b"a", b"b", b"c"]) == sha(b"\x01" + sha(b"\x01" + left + right) + c)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 17])
def test_every_leaf_has_a_proof_of_log_size(n: int) -> None:
    items = _items(n)
    root = merkle_root(items)
    for index, item in enumerate(items):
        aunts = merkle_aunts(items, index)
        assert len(aunts) <= max(1, (n - 1).bit_length())
        assert root_from_aunts(item, index, n, aunts) == root


def test_a_proof_does_not_prove_another_leaf_index_or_size() -> None:
    items = _items(6)
    root, aunts = merkle_root(items), merkle_aunts(items, 2)
    assert root_from_aunts(b"forged", 2, 6, aunts) != root
    assert root_from_aunts(items[2], 3, 6, aunts) != root
    assert root_from_aunts(items[2], 2, 17, aunts) != root  # (7 would share the 4-leaf half)
    assert root_from_aunts(items[2], 2, 6, aunts[:-1]) is None
    assert root_from_aunts(items[2], 2, 6, [*aunts, aunts[0]]) is None
    assert root_from_aunts(items[2], 6, 6, aunts) is None
    assert root_from_aunts(items[2], 2, 6, [b"short", *aunts[1:]]) is None
