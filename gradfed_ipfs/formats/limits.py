"""The decode budget: the one home of the limits every decoder of peer bytes enforces.

Peer bytes enter through :mod:`gradfed_ipfs.formats` (Arrow blocks, manifests, records,
announcements). Each decoder checks what the bytes *declare* (element counts, batch counts,
nesting) against these limits before it allocates, and raises a
:class:`~gradfed_ipfs.errors.DecodeError` subclass, never ``RecursionError`` or ``MemoryError``.

JSON from peers is parsed by :func:`load_json` only: a linear pre-scan refuses nesting deeper
than :data:`MAX_JSON_DEPTH` before :func:`json.loads` (which recurses once per level) runs.
"""

from __future__ import annotations

import json
from typing import Any, Final

import numpy as np

from ..errors import DecodeError, GradfedError

__all__ = [
    "MAX_ARROW_BATCHES",
    "MAX_DECODED_ELEMENTS",
    "MAX_JSON_DEPTH",
    "check_elements",
    "json_depth",
    "load_json",
]

MAX_DECODED_ELEMENTS: Final = 2**28
"""Default cap on the elements one decoded tensor may hold (1 GiB of float32)."""
MAX_JSON_DEPTH: Final = 32
"""Deepest JSON nesting accepted from a peer (shapes and announcements use 1)."""
MAX_ARROW_BATCHES: Final = 1024
"""Most record batches one Arrow block may list (gradfed writes one)."""

_STRUCTURE: Final = b'"[]{}'
_DELETE: Final = bytes(set(range(256)) - set(_STRUCTURE))
"""Every byte but quotes and brackets: what :func:`json_depth` deletes before it scans."""
_SHORT: Final = 256
"""Skeletons up to this many bytes are scanned in Python (NumPy's set-up costs ~40 µs)."""


def json_depth(data: str | bytes) -> int:
    """Return the deepest bracket nesting of JSON text, in linear time without recursion.

    Brackets inside strings do not count. Invalid JSON gets a depth too (it fails later; up
    to its first invalid byte the count is exact, and :func:`json.loads` stops there).
    A bounded scan, not a regular expression (~60 µs per KiB of string): escaped backslashes
    and then escaped quotes are removed (``bytes.replace`` scans left to right, as JSON pairs
    escapes), every byte but quotes and brackets is deleted (``bytes.translate``), and the
    brackets between the remaining quote pairs are counted.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    skeleton = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _DELETE)
    outside = b"".join(skeleton.split(b'"')[::2])  # even pieces: between strings
    if len(outside) <= _SHORT:
        depth = deepest = 0
        for code in outside:
            depth += 1 if code in b"[{" else -1
            deepest = max(deepest, depth)
        return deepest
    codes = np.frombuffer(outside, np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(max(0, np.cumsum(steps).max()))


def load_json(
    data: str | bytes,
    what: str,
    *,
    error: type[GradfedError] = DecodeError,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """Parse untrusted JSON text nested at most ``max_depth`` deep.

    Parameters
    ----------
    data
        The JSON text (UTF-8 bytes or str).
    what
        Names the text in error messages, e.g. ``"gradfed.shape"``.
    error
        The error to raise (a :class:`DecodeError` subclass where the bytes come from a peer).
    max_depth
        Deepest nesting accepted.

    Raises
    ------
    GradfedError
        ``error``, if the text is nested deeper than ``max_depth`` or is not JSON.
    """
    depth = json_depth(data)
    if depth > max_depth:
        raise error(f"{what} is JSON nested {depth} deep, more than {max_depth}")
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise error(f"{what} is not JSON: {type(exc).__name__}: {exc!s:.80}") from None


def check_elements(
    count: int, what: str, *, max_elements: int, expected: int | None, error: type[DecodeError]
) -> None:
    """Refuse a declared element ``count`` above ``max_elements`` or other than ``expected``.

    Raises
    ------
    DecodeError
        ``error``, naming ``what``.
    """
    if count > max_elements:
        raise error(f"{what} declares {count} elements, more than the cap of {max_elements}")
    if expected is not None and count != expected:
        raise error(f"{what} declares {count} elements, {expected} expected")
