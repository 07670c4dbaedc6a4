"""Fixed-point encoding of float gradients into the ring Z/2^b for secure aggregation.

Masks are added in a ring where uniform masks hide a value perfectly, so floats are first mapped
to integers mod 2^b (b = 32 or 64). NumPy's unsigned arithmetic wraps mod 2^b, which is exactly
ring addition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
from numpy.typing import NDArray

from ..._types import FloatArray, GradientLike
from ...errors import SecureAggregationError

__all__ = ["FixedPoint", "RingArray"]

RingArray: TypeAlias = NDArray[np.unsignedinteger]
"""A vector of ring elements: ``uint32`` or ``uint64``, shape ``(d,)``."""


@dataclass(frozen=True)
class FixedPoint:
    """Fixed-point encoding of float vectors into the ring Z/2^b (b = 32 or 64).

    A value is clipped to ``[-clip_range, clip_range]`` and stored as ``round(x * scale)`` in two's
    complement. ``scale = 2**(b-2) / (num_clients * clip_range)``, so a sum of ``num_clients``
    clipped values stays within half the signed range and never wraps. The resolution is
    ``1/scale``: for b=32, 5 clients, range 8 it is 3.7e-8.

    Parameters
    ----------
    num_clients
        Most vectors that will be summed (>= 1).
    clip_range
        Largest absolute value kept (gradient units, > 0).
    ring_bits
        32 (uint32 arithmetic) or 64 (uint64).
    """

    num_clients: int
    clip_range: float = 8.0
    ring_bits: int = 32

    def __post_init__(self) -> None:
        if self.ring_bits not in (32, 64):
            raise SecureAggregationError(f"ring_bits must be 32 or 64, got {self.ring_bits}")
        if self.num_clients < 1 or not (np.isfinite(self.clip_range) and self.clip_range > 0):
            raise SecureAggregationError("need num_clients >= 1 and a finite clip_range > 0")

    @property
    def dtype(self) -> type[np.unsignedinteger]:
        """The NumPy ring dtype (``uint32`` or ``uint64``); arithmetic wraps mod 2^b."""
        return np.uint32 if self.ring_bits == 32 else np.uint64

    @property
    def scale(self) -> float:
        """Ring units per gradient unit."""
        return float(2 ** (self.ring_bits - 2)) / (self.num_clients * self.clip_range)

    def encode(self, values: GradientLike) -> RingArray:
        """Clip, scale and round ``values`` (shape ``(d,)``) into ring elements."""
        x = np.clip(
            np.asarray(values, dtype=np.float64).reshape(-1), -self.clip_range, self.clip_range
        )
        # int64 -> unsigned is a two's-complement wrap, which is the ring embedding we want.
        return np.rint(x * self.scale).astype(np.int64).astype(self.dtype)

    def decode_sum(self, total: RingArray) -> FloatArray:
        """Decode a ring sum (shape ``(d,)``) back to float32 gradient units."""
        signed = total.astype(self.dtype).view(np.int32 if self.ring_bits == 32 else np.int64)
        return (signed.astype(np.float64) / self.scale).astype(np.float32)
