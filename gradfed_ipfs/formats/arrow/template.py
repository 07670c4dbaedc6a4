"""Dense gradient blocks by template: the canonical bytes around the values, cut once per layout.

A dense gradient block (:func:`~gradfed_ipfs.formats.arrow.store_gradient_as_arrow`) is an
Arrow IPC file whose bytes depend on the values only inside its one data buffer: the schema,
metadata, batch header and footer depend on the length, shape and chunk offset alone. So for
each layout the file is ``prefix + values + suffix``, and this module keeps those two byte
strings (found by encoding two different fills and taking where they differ).

Encoding by template is a join instead of a pyarrow write (~60 µs a block); decoding accepts a
block only if it is byte for byte ``prefix + 4·n bytes + suffix`` of the layout the caller
expects, and is then a view on the data buffer instead of a footer scan, a pyarrow read and a
validation (~90 µs a block). Anything else, including every hostile or foreign encoding, is
left to the full decoder; so the template decides nothing the full decoder would not: it
accepts exactly the canonical bytes, for which both give the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..._types import FloatArray

__all__ = ["DenseLayout", "DenseTemplate", "template_for"]

DenseLayout = tuple[int, tuple[int, ...], int | None]
"""``(values, recorded shape, chunk offset or None)``: what a dense block's framing depends on."""

_MAX_TEMPLATES = 4096
"""Layouts kept: a d-value gradient in 256 KiB chunks has d / 65,536 of them."""


@dataclass(frozen=True)
class DenseTemplate:
    """The canonical bytes before and after a layout's ``4·n`` value bytes."""

    prefix: bytes
    suffix: bytes
    n: int

    def encode(self, flat: FloatArray) -> bytes:
        """Return the block for ``flat`` (float32, C-contiguous, ``n`` values)."""
        return b"".join((self.prefix, flat.data.cast("B"), self.suffix))

    def decode(self, data: bytes | bytearray | memoryview) -> FloatArray | None:
        """Return ``data``'s values (a read-only view) if it is this layout's, else ``None``."""
        view = memoryview(data)
        start, stop = len(self.prefix), len(self.prefix) + 4 * self.n
        if (
            len(view) != stop + len(self.suffix)
            or view[:start] != self.prefix
            or view[stop:] != self.suffix
        ):
            return None
        values: FloatArray = np.frombuffer(view, dtype=np.float32, count=self.n, offset=start)
        return values


def template_for(
    layout: DenseLayout, encode: Callable[[FloatArray, DenseLayout], bytes]
) -> DenseTemplate | None:
    """Return the template of ``layout``, cutting it from two ``encode`` calls the first time.

    ``encode(values, layout)`` must be the full encoder. ``None`` if the two encodings do not
    differ in exactly one run of ``4·n`` bytes (then there is no template: use the encoder).
    """
    return _cut(layout, encode)


@lru_cache(maxsize=_MAX_TEMPLATES)
def _cut(
    layout: DenseLayout, encode: Callable[[FloatArray, DenseLayout], bytes]
) -> DenseTemplate | None:
    n = layout[0]
    if n < 1:
        return None
    zeros = encode(np.zeros(n, np.float32), layout)
    # Every byte of the second fill differs from zero, so the differing run is all 4·n bytes.
    ones = encode(np.frombuffer(b"\x01\x02\x03\x04" * n, np.float32), layout)
    if len(zeros) != len(ones):
        return None
    a, b = np.frombuffer(zeros, np.uint8), np.frombuffer(ones, np.uint8)
    differ = np.flatnonzero(a != b)
    if differ.size != 4 * n or int(differ[-1]) - int(differ[0]) + 1 != 4 * n:
        return None
    start = int(differ[0])
    return DenseTemplate(zeros[:start], zeros[start + 4 * n :], n)
