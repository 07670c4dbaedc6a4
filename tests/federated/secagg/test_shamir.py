from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradfed_ipfs.errors import SecureAggregationError
from gradfed_ipfs.federated.secagg.shamir import PRIME, Share, combine_shares, split_secret


def rand(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_any_t_shares_rebuild_the_secret() -> None:
    secret = bytes(range(32))
    shares = split_secret(secret, 5, 3, rand(0).bytes)
    assert [s.x for s in shares] == [1, 2, 3, 4, 5]
    for subset in itertools.combinations(shares, 3):
        assert combine_shares(list(subset), 3) == secret
    assert combine_shares(shares, 3) == secret


def test_too_few_or_bad_shares_fail() -> None:
    shares = split_secret(b"\x01" * 32, 5, 3, rand(1).bytes)
    with pytest.raises(SecureAggregationError, match="need 3, have 2"):
        combine_shares(shares[:2], 3)
    with pytest.raises(SecureAggregationError, match="distinct"):
        combine_shares([shares[0], shares[0], shares[1]], 3)
    with pytest.raises(SecureAggregationError):
        split_secret(b"x", 3, 4, rand(1).bytes)
    with pytest.raises(SecureAggregationError):
        split_secret(bytes(65), 3, 2, rand(1).bytes)


def test_t_minus_one_shares_are_consistent_with_every_secret() -> None:
    # Perfect secrecy, concretely: for t = 2, one share (x, y) fits every secret s with the
    # slope a = (y - s) / x, so it pins nothing down.
    share = split_secret(b"\x07" * 32, 3, 2, rand(2).bytes)[0]
    for guess in (0, 1, 2**255):
        slope = (share.y - guess) * pow(share.x, -1, PRIME) % PRIME
        fake_second = Share(2, (guess + 2 * slope) % PRIME)
        rebuilt = combine_shares([share, fake_second], 2, length=66)
        assert int.from_bytes(rebuilt, "big") == guess


def test_corrupted_share_gives_a_different_secret() -> None:
    secret = b"\x42" * 32
    shares = split_secret(secret, 3, 3, rand(3).bytes)
    bad = [shares[0], shares[1], Share(shares[2].x, (shares[2].y + 1) % PRIME)]
    # Shares are not authenticated: a corrupted one silently changes the secret (here by
    # L_3(0) = 1). Secure aggregation therefore checks rebuilt keys against public keys.
    assert combine_shares(bad, 3) != secret
    huge = [shares[0], shares[1], Share(shares[2].x, (shares[2].y + 2**300) % PRIME)]
    with pytest.raises(SecureAggregationError, match="does not fit"):
        combine_shares(huge, 3)


@settings(derandomize=True, deadline=None, max_examples=40)
@given(
    st.binary(min_size=0, max_size=64),
    st.integers(min_value=1, max_value=7),
    st.data(),
)
def test_split_combine_property(secret: bytes, n: int, data: st.DataObject) -> None:
    t = data.draw(st.integers(min_value=1, max_value=n))
    seed = data.draw(st.integers(min_value=0, max_value=2**32))
    shares = split_secret(secret, n, t, random.Random(seed).randbytes)
    chosen = data.draw(st.permutations(shares))[:t]
    assert combine_shares(chosen, t, length=len(secret)) == secret
