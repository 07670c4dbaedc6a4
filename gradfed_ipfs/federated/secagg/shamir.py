"""Shamir secret sharing over the prime field GF(2**521 - 1) (Shamir 1979).

Secure aggregation shares two 32-byte secrets per client (the self-mask seed and the masking
private key) so that any ``threshold`` clients can rebuild them for the server. This is
polynomial arithmetic over a prime field with Python integers, not a cipher: a secret ``s`` is the
constant term of a random polynomial ``f`` of degree ``threshold - 1``; share ``i`` is
``(i, f(i))``; Lagrange interpolation at 0 recovers ``s`` from any ``threshold`` shares, and fewer
shares reveal nothing about it (every value of ``s`` stays equally likely).

The Mersenne prime 2**521 - 1 is larger than any 64-byte secret, so secrets are embedded as
integers without reduction. Coefficients are drawn by rejection sampling, so they are exactly
uniform over the field.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...errors import SecureAggregationError

__all__ = ["PRIME", "Share", "combine_shares", "split_secret"]

PRIME: int = 2**521 - 1
"""The field modulus, a Mersenne prime."""

_PRIME_BITS = 521
_PRIME_BYTES = (_PRIME_BITS + 7) // 8


@dataclass(frozen=True)
class Share:
    """One point ``(x, y)`` of a sharing polynomial.

    Parameters
    ----------
    x
        The evaluation point, 1..n (never 0: f(0) is the secret).
    y
        ``f(x)`` in ``[0, PRIME)``.
    """

    x: int
    y: int


def _random_field_element(randbytes: Callable[[int], bytes]) -> int:
    mask = (1 << _PRIME_BITS) - 1
    while True:
        value = int.from_bytes(randbytes(_PRIME_BYTES), "big") & mask
        if value < PRIME:
            return value


def split_secret(
    secret: bytes, num_shares: int, threshold: int, randbytes: Callable[[int], bytes]
) -> list[Share]:
    """Split ``secret`` into ``num_shares`` shares, any ``threshold`` of which rebuild it.

    Parameters
    ----------
    secret
        At most 64 bytes.
    num_shares
        n >= 1; shares get x = 1..n.
    threshold
        t with 1 <= t <= n.
    randbytes
        Cryptographic randomness, e.g. ``os.urandom``.

    Returns
    -------
    list of Share
        n shares, in x order.
    """
    if len(secret) > 64:
        raise SecureAggregationError(f"secret too long for the field: {len(secret)} bytes")
    if not 1 <= threshold <= num_shares:
        raise SecureAggregationError(
            f"need 1 <= threshold <= num_shares, got t={threshold}, n={num_shares}"
        )
    coefficients = [int.from_bytes(secret, "big")]
    coefficients += [_random_field_element(randbytes) for _ in range(threshold - 1)]
    shares = []
    for x in range(1, num_shares + 1):
        y = 0
        for c in reversed(coefficients):  # Horner
            y = (y * x + c) % PRIME
        shares.append(Share(x, y))
    return shares


def combine_shares(shares: Sequence[Share], threshold: int, length: int = 32) -> bytes:
    """Rebuild the secret from at least ``threshold`` shares by Lagrange interpolation at 0.

    Parameters
    ----------
    shares
        Shares with distinct x; the first ``threshold`` are used.
    threshold
        The t the secret was split with.
    length
        Byte length of the original secret.

    Returns
    -------
    bytes
        The secret. Wrong or too few shares are an error, never a silently wrong secret when the
        count is short; corrupted shares yield a wrong value (shares are not authenticated here).
    """
    if threshold < 1:
        raise SecureAggregationError(f"threshold must be >= 1, got {threshold}")
    if len(shares) < threshold:
        raise SecureAggregationError(
            f"not enough shares to reconstruct: need {threshold}, have {len(shares)}"
        )
    points = list(shares[:threshold])
    xs = [p.x for p in points]
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise SecureAggregationError("shares must have distinct, non-zero x")
    secret = 0
    for i, p in enumerate(points):
        numerator, denominator = 1, 1
        for j, q in enumerate(points):
            if i != j:
                numerator = numerator * (-q.x) % PRIME
                denominator = denominator * (p.x - q.x) % PRIME
        secret = (secret + p.y * numerator * pow(denominator, -1, PRIME)) % PRIME
    if secret.bit_length() > 8 * length:
        raise SecureAggregationError("reconstructed value does not fit the secret length")
    return secret.to_bytes(length, "big")
