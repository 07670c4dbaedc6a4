"""The chunks of a manifest that cover one value range, without decoding every chunk link.

A reducer of a sliced round needs one chunk (its slice) of each of N−1 manifests that list N
chunks each: N² links per peer. :meth:`ChunkManifest.decode
<gradfed_ipfs.formats.manifest.ChunkManifest.decode>` builds a CID object for every link
(~10-20 µs each: most of a reducer's CPU at N = 64). :func:`decode_manifest_window` checks
the same things on the bytes and builds CIDs for the covering chunks only.

Its fast path reads only the canonical layout ``put_gradient`` writes (dag-cbor, keys in
canonical order, minimal integers, raw sha2-256 CIDv1 links) and answers only when
``ChunkManifest.decode`` would accept the bytes: every chunk's length in range, contiguous from
0, no block named twice, the lengths summing to the declared length, the shape's product equal
to it, at most ``max_length`` values and :data:`~gradfed_ipfs.formats.manifest.MAX_CHUNKS`
chunks. Anything else goes to ``ChunkManifest.decode``, which stays the one judge of what is a
valid manifest and of every error raised.
"""

from __future__ import annotations

import math
import re
from typing import Final

from ..block import MAX_BLOCK_SIZE
from ..cid import parse_cid
from .limits import MAX_DECODED_ELEMENTS
from .manifest import MANIFEST_FORMAT, MANIFEST_VERSION, MAX_CHUNKS, ChunkManifest, ChunkRef

__all__ = ["decode_manifest_window"]

_UINT: Final = rb"([\x00-\x17]|\x18.|\x19..|\x1a....|\x1b.{8})"
_INT: Final = re.compile(_UINT, re.DOTALL)
_RAW_LINK: Final = b"\x01\x55\x12\x20"  # CIDv1, raw, sha2-256, 32 bytes
_ENTRY: Final = re.compile(
    rb"\xa3\x63cid\xd8\x2a\x58\x25\x00" + _RAW_LINK + rb"(.{32})"
    rb"\x66length" + _UINT + rb"\x66offset" + _UINT,
    re.DOTALL,
)
_HEAD: Final = re.compile(rb"\xa6\x65dtype\x67float32\x65shape([\x80-\x97])", re.DOTALL)
_CHUNKS: Final = re.compile(rb"\x66chunks([\x81-\x97]|\x98.|\x99..|\x9a....)", re.DOTALL)
_FORMAT: Final = MANIFEST_FORMAT.encode()
_TAIL: Final = re.compile(
    rb"\x66format\x78"
    + re.escape(bytes([len(_FORMAT)]) + _FORMAT)
    + rb"\x66length"
    + _UINT
    + rb"\x67version"
    + re.escape(bytes([MANIFEST_VERSION])),
    re.DOTALL,
)
_MINIMUM: Final = {2: 24, 3: 256, 5: 1 << 16, 9: 1 << 32}
"""Smallest argument of a head of that many bytes (dag-cbor's integers are minimal)."""
_MAX_INT: Final = 1 << 53
_MAX_CHUNK_VALUES: Final = MAX_BLOCK_SIZE // 4


class _Slow(Exception):
    """Internal: not the fast layout (or not valid); ``ChunkManifest.decode`` decides."""


def decode_manifest_window(
    data: bytes, offset: int, stop: int, *, max_length: int = MAX_DECODED_ELEMENTS
) -> ChunkManifest:
    """Return the manifest ``data`` with only its chunks overlapping values ``offset … stop``.

    The same as ``ChunkManifest.decode(data, max_length=max_length)`` with every other chunk
    left out.

    Raises
    ------
    MalformedManifest
        Whatever ``ChunkManifest.decode`` raises for ``data``.
    """
    try:
        return _fast(bytes(data), offset, stop, max_length)
    except _Slow:
        whole = ChunkManifest.decode(data, max_length=max_length)
    chunks = tuple(c for c in whole.chunks if c.offset < stop and c.stop > offset)
    return ChunkManifest(whole.shape, whole.length, chunks, whole.dtype, whole.version)


def _uint(raw: bytes) -> int:
    """Return the argument of a CBOR head (its bytes), refusing non-minimal ones."""
    if len(raw) == 1:
        return raw[0] & 31
    value = int.from_bytes(raw[1:], "big")
    if value < _MINIMUM[len(raw)]:
        raise _Slow
    return value


def _fast(data: bytes, offset: int, stop: int, max_length: int) -> ChunkManifest:
    if len(data) > MAX_BLOCK_SIZE:
        raise _Slow
    head = _HEAD.match(data)
    if head is None:
        raise _Slow
    shape = []
    pos = head.end()
    for _ in range(head.group(1)[0] & 31):
        item = _INT.match(data, pos)
        if item is None:
            raise _Slow
        shape.append(_uint(item.group(1)))
        pos = item.end()
    chunks = _CHUNKS.match(data, pos)
    if chunks is None:
        raise _Slow
    count = _uint(chunks.group(1))
    if not 0 < count <= MAX_CHUNKS:
        raise _Slow
    covering, total, pos = _entries(data, chunks.end(), count, offset, stop)
    tail = _TAIL.fullmatch(data, pos)
    if tail is None:
        raise _Slow
    length = _uint(tail.group(1))
    if (
        length != total
        or length > max_length
        or length >= _MAX_INT
        or any(d >= _MAX_INT for d in shape)
        or math.prod(shape) != length
    ):
        raise _Slow
    refs = tuple(ChunkRef(parse_cid(_RAW_LINK + d), s, n) for d, s, n in covering)
    return ChunkManifest(tuple(shape), length, refs)


def _entries(
    data: bytes, pos: int, count: int, offset: int, stop: int
) -> tuple[list[tuple[bytes, int, int]], int, int]:
    """Read ``count`` contiguous chunk entries from ``pos``.

    Returns those overlapping ``[offset, stop)`` (digest, start, length), the values they
    cover in all, and where the entries end.
    """
    digests = set()
    covering = []
    total = 0
    for _ in range(count):
        entry = _ENTRY.match(data, pos)
        if entry is None:
            raise _Slow
        digest, raw_length, raw_start = entry.groups()
        length = raw_length[0] if len(raw_length) == 1 else _uint(raw_length)
        start = raw_start[0] if len(raw_start) == 1 else _uint(raw_start)
        if start != total or not 0 < length <= _MAX_CHUNK_VALUES or digest in digests:
            raise _Slow
        digests.add(digest)
        if start < stop and start + length > offset:
            covering.append((digest, start, length))
        total += length
        pos = entry.end()
    return covering, total, pos
