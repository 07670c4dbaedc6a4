"""Fast paths for ``dag_cbor.decode`` and ``dag_cbor.encode``: the canonical subset we write.

Every peer of a sliced round decodes N−1 manifests of N chunk links and N slice records of N
inputs: N² items per peer, and ``dag_cbor``'s pure-Python decoder spends ~20 µs on each
(a stream object, snapshots, per-item option dictionaries). :func:`decode_dag_cbor` walks the
bytes directly. It accepts only what ``dag_cbor`` accepts and returns the same values:
minimal-length heads, definite lengths, ASCII text, map keys in canonical order (length, then
bytes) without repeats, tag 42 over ``0x00``-prefixed bytes (decoded by the same ``CID`` class
``dag_cbor`` uses), finite float64, ``false``/``true``/``null``, no trailing bytes. Anything
else, valid or not (non-ASCII text, deep nesting, a truncated item), goes to ``dag_cbor.decode``,
which stays the one judge of what is valid dag-cbor and of every error raised.

``known`` skips work a caller has already done: a value of the top-level map whose bytes equal
a known encoding may decode to the object given for it, unread (a CBOR item is self-delimiting,
so bytes that start with a complete item's encoding hold exactly that item there); when the
reference decoder answers instead, it is decoded as usual, so callers accept both. A round's N
slice records name the same N inputs; their reader passes that list's encoding once.

:func:`encode_dag_cbor` is the same idea for writing: ``dag_cbor.encode`` checks every value's
type at run time and spends ~1.5 ms on a 4-chunk manifest (an agreed round encodes two
manifests and two records per peer). It writes dicts with text keys (canonical order: length,
then bytes), lists, text, bytes, integers within ±2⁶⁴, finite floats (always float64),
booleans, ``None`` and CIDs (tag 42); anything else (tuples, NaN, NumPy integers, ...) goes to
``dag_cbor.encode``, which raises its own errors or encodes it.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any, Final

import dag_cbor
import dag_cbor.decoding
from multiformats import CID

__all__ = ["decode_dag_cbor", "encode_dag_cbor"]

_MAX_DEPTH: Final = 64
_FLOAT64: Final = struct.Struct(">d")


class _Slow(Exception):
    """Internal: not in the fast subset (or not valid); ``dag_cbor`` decides."""


def decode_dag_cbor(data: bytes, known: Mapping[bytes, Any] | None = None) -> Any:
    """Return ``dag_cbor.decode(data)``, decoding the canonical subset without its overhead.

    Parameters
    ----------
    data
        The dag-cbor bytes.
    known
        Complete dag-cbor encodings of values and what to return for each when it is a value
        of the top-level map (see the module docstring); only the fast path uses them.

    Raises
    ------
    Exception
        Whatever ``dag_cbor.decode`` raises for ``data`` (the fast path never raises).
    """
    data = bytes(data)
    try:
        value, end = _item(data, 0, 0, known or None)
    except Exception:  # any surprise (truncation, a bad CID, ...): the reference decoder judges
        return dag_cbor.decode(data)
    return value if end == len(data) else dag_cbor.decode(data)


def _known(data: bytes, pos: int, known: Mapping[bytes, Any]) -> tuple[Any, int] | None:
    """Return ``(value, next position)`` if a known encoding starts at ``pos``."""
    for encoded, value in known.items():
        if data.startswith(encoded, pos):
            return value, pos + len(encoded)
    return None


def _head(data: bytes, pos: int) -> tuple[int, int, int]:
    """Return ``(major type, argument, next position)`` of a minimally encoded head."""
    lead = data[pos]
    major, info = lead >> 5, lead & 31
    pos += 1
    if info < 24:
        return major, info, pos
    if info > 27:
        raise _Slow
    size = 1 << (info - 24)  # 1, 2, 4 or 8 argument bytes
    end = pos + size
    if end > len(data):
        raise _Slow
    value = int.from_bytes(data[pos:end], "big")
    if value < (24 if size == 1 else 1 << (4 * size)):  # not minimal: 256, 65536, 2**32
        raise _Slow
    return major, value, end


def _item(
    data: bytes, pos: int, depth: int, known: Mapping[bytes, Any] | None = None
) -> tuple[Any, int]:
    if data[pos] >= 0xE0:  # major type 7: simple values and floats
        return _simple(data, pos)
    major, arg, pos = _head(data, pos)
    if major == 0:
        return arg, pos
    if major == 1:
        return -1 - arg, pos
    if major in (2, 3):
        return _string(data, pos, major, arg)
    if depth >= _MAX_DEPTH or (major != 6 and arg > len(data) - pos):  # a tag's arg: its number
        raise _Slow
    if major == 4:
        items = []
        for _ in range(arg):
            value, pos = _item(data, pos, depth + 1)
            items.append(value)
        return items, pos
    if major == 5:
        return _map(data, pos, depth, arg, known)
    if major == 6 and arg == 42:
        link, pos = _item(data, pos, depth + 1)
        if not isinstance(link, bytes) or not link or link[0] != 0:
            raise _Slow
        return dag_cbor.decoding.CID.decode(link[1:]), pos  # type: ignore[attr-defined]
    raise _Slow


def _simple(data: bytes, pos: int) -> tuple[Any, int]:
    """Decode major type 7 at ``pos``: false, true, null or a finite float64."""
    lead = data[pos]
    if lead == 0xF4:
        return False, pos + 1
    if lead == 0xF5:
        return True, pos + 1
    if lead == 0xF6:
        return None, pos + 1
    if lead == 0xFB and pos + 9 <= len(data):
        value = _FLOAT64.unpack_from(data, pos + 1)[0]
        if math.isfinite(value):
            return value, pos + 9
    raise _Slow


def _string(data: bytes, pos: int, major: int, size: int) -> tuple[Any, int]:
    """Decode the ``size`` bytes at ``pos`` of a byte (major 2) or ASCII text (3) string."""
    end = pos + size
    if end > len(data):
        raise _Slow
    raw = data[pos:end]
    if major == 2:
        return raw, end
    if not raw.isascii():
        raise _Slow
    return raw.decode("ascii"), end


def _map(
    data: bytes, pos: int, depth: int, count: int, known: Mapping[bytes, Any] | None
) -> tuple[dict[str, Any], int]:
    """Decode a map of ``count`` canonically ordered text keys whose entries start at ``pos``."""
    mapping: dict[str, Any] = {}
    previous = (-1, b"")
    for _ in range(count):
        key_major, size, pos = _head(data, pos)
        end = pos + size
        key = data[pos:end]
        if key_major != 3 or end > len(data) or not key.isascii() or (size, key) <= previous:
            raise _Slow  # not a text key, or out of canonical order, or repeated
        previous = (size, key)
        hit = None if known is None else _known(data, end, known)
        value, pos = _item(data, end, depth + 1) if hit is None else hit
        mapping[key.decode("ascii")] = value
    return mapping, pos


def encode_dag_cbor(value: Any) -> bytes:
    """Return ``bytes(dag_cbor.encode(value))``, writing the canonical subset directly.

    Raises
    ------
    Exception
        Whatever ``dag_cbor.encode`` raises for ``value`` (the fast path never raises).
    """
    out = bytearray()
    try:
        _encode(value, out, 0)
    except _Slow:
        return bytes(dag_cbor.encode(value))
    return bytes(out)


def _put_head(major: int, arg: int, out: bytearray) -> None:
    lead = major << 5
    if arg < 24:
        out.append(lead | arg)
    elif arg < 0x100:
        out += bytes((lead | 24, arg))
    elif arg < 0x10000:
        out.append(lead | 25)
        out += arg.to_bytes(2, "big")
    elif arg < 0x100000000:
        out.append(lead | 26)
        out += arg.to_bytes(4, "big")
    else:
        out.append(lead | 27)
        out += arg.to_bytes(8, "big")


def _key_bytes(key: object) -> bytes:
    if type(key) is not str:
        raise _Slow
    return key.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError: dag_cbor judges


def _encode(value: Any, out: bytearray, depth: int) -> None:
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        _encode_scalar(value, kind, out)
    elif kind is bytes:
        _put_head(2, len(value), out)
        out += value
    elif depth >= _MAX_DEPTH:
        raise _Slow
    elif kind is list:
        _put_head(4, len(value), out)
        for item in value:
            _encode(item, out, depth + 1)
    elif kind is dict:
        keys = sorted(((_key_bytes(k), k) for k in value), key=lambda pair: (len(pair[0]), pair[0]))
        _put_head(5, len(keys), out)
        for raw, key in keys:
            _put_head(3, len(raw), out)
            out += raw
            _encode(value[key], out, depth + 1)
    elif kind is CID:
        link = b"\x00" + bytes(value)
        out += b"\xd8\x2a"
        _put_head(2, len(link), out)
        out += link
    else:
        raise _Slow


def _encode_scalar(value: Any, kind: type, out: bytearray) -> None:
    """Write a text string, an integer in CBOR's range, null, a bool or a finite float."""
    if kind is str:
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError:
            raise _Slow from None
        _put_head(3, len(raw), out)
        out += raw
    elif kind is int:
        if 0 <= value < 1 << 64:
            _put_head(0, value, out)
        elif -(1 << 64) <= value < 0:
            _put_head(1, -1 - value, out)
        else:
            raise _Slow
    elif value is None:
        out.append(0xF6)
    elif kind is bool:
        out.append(0xF5 if value else 0xF4)
    else:  # a float
        if not math.isfinite(value):
            raise _Slow
        out.append(0xFB)
        out += _FLOAT64.pack(value)
