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
import re
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

_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN: Final = np.frombuffer(b"[{", np.uint8)
_CLOSE: Final = np.frombuffer(b"]}", np.uint8)
_OPEN_CODES: Final = frozenset(b"[{")
_CLOSE_CODES: Final = frozenset(b"]}")
_SHORT: Final = 256
"""Texts up to this many bytes are scanned in Python (every Arrow block carries two)."""


def json_depth(data: str | bytes) -> int:
    """Return the deepest bracket nesting of JSON text, in linear time without recursion.

    Brackets inside strings do not count. Invalid JSON gets a depth too (it fails later).
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    stripped = _STRING.sub(b'""', raw)
    if len(stripped) <= _SHORT:  # a shape or a metadata field: NumPy's set-up costs ~40 µs
        depth = deepest = 0
        for code in stripped:
            depth += (code in _OPEN_CODES) - (code in _CLOSE_CODES)
            deepest = max(deepest, depth)
        return deepest
    codes = np.frombuffer(stripped, np.uint8)
    steps = np.isin(codes, _OPEN).astype(np.int64) - np.isin(codes, _CLOSE)
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
