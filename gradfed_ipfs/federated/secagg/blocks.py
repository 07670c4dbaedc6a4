"""Masked SecAgg vectors as Arrow IPC blocks (``gradfed.encoding=secagg-u32`` / ``secagg-u64``).

A masked vector is a ring element of Z/2^32 or Z/2^64 (see
:class:`~gradfed_ipfs.federated.secagg.FixedPoint`), not a gradient: reading its words as
float32 would produce NaN and infinity patterns. It is therefore stored with its own encoding,
one record batch with a single non-nullable unsigned column:

``masked``            UInt32 (``secagg-u32``) or UInt64 (``secagg-u64``), the ring words
``gradfed.encoding``  ``secagg-u32`` or ``secagg-u64``
``gradfed.count``     the number of words
``gradfed.shape``     ``[count]``

:func:`decode_masked_block` treats its input as untrusted: anything but exactly this layout
(wrong magic, encoding, column name or type, count, nulls, extra columns, compressed bodies,
repeated batches, or a ring width the caller did not expect) raises
:class:`~gradfed_ipfs.errors.MalformedArrow`.
"""

from __future__ import annotations

import json
from typing import Final

import numpy as np
import pyarrow as pa

from ...errors import MalformedArrow
from ...formats.arrow import (
    MAX_DECODED_ELEMENTS,
    META_COUNT,
    META_ENCODING,
    META_SHAPE,
    encode_arrow_file,
    open_arrow_file,
)
from .fixed_point import RingArray

__all__ = ["MASKED_COLUMN", "SECAGG_ENCODINGS", "decode_masked_block", "encode_masked_block"]

MASKED_COLUMN: Final = "masked"
SECAGG_ENCODINGS: Final = {"secagg-u32": 32, "secagg-u64": 64}
_ARROW_TYPES: Final = {32: pa.uint32(), 64: pa.uint64()}
_NP_TYPES: Final = {32: np.uint32, 64: np.uint64}


def encode_masked_block(masked: RingArray) -> bytes:
    """Encode a masked ring vector (uint32 or uint64, shape ``(d,)``) as Arrow IPC file bytes.

    Raises
    ------
    MalformedArrow
        If ``masked`` is not a one-dimensional uint32 or uint64 array.
    """
    array = np.asarray(masked)
    if array.ndim != 1:
        raise MalformedArrow(f"a masked vector is one-dimensional, got shape {array.shape}")
    bits = {np.dtype(np.uint32): 32, np.dtype(np.uint64): 64}.get(array.dtype)
    if bits is None:
        raise MalformedArrow(f"a masked vector is uint32 or uint64, got {array.dtype}")
    metadata = {
        META_ENCODING: f"secagg-u{bits}",
        META_COUNT: str(array.size),
        META_SHAPE: json.dumps([array.size]),
    }
    column = pa.array(np.ascontiguousarray(array), type=_ARROW_TYPES[bits])
    return encode_arrow_file({MASKED_COLUMN: column}, metadata)


def decode_masked_block(
    data: bytes | bytearray | memoryview,
    *,
    ring_bits: int,
    expected_length: int | None = None,
    max_elements: int = MAX_DECODED_ELEMENTS,
) -> RingArray:
    """Decode untrusted bytes written by :func:`encode_masked_block`.

    Parameters
    ----------
    data
        The block's bytes.
    ring_bits
        The ring width the round uses (32 or 64); a block of the other width is rejected.
    expected_length
        The vector length the round expects, if known.
    max_elements
        Upper bound on the number of words.

    Returns
    -------
    numpy.ndarray
        A writable copy, dtype ``uint32`` or ``uint64``, shape ``(count,)``.

    Raises
    ------
    MalformedArrow
        If the bytes are not exactly a masked-vector block of the expected width and length.
    """
    if ring_bits not in _NP_TYPES:
        raise MalformedArrow(f"ring_bits must be 32 or 64, got {ring_bits}")
    # The footer scan checks the declared row counts (and refuses compressed bodies) before
    # any batch is read, so a small block cannot make us decompress or copy a large one.
    schema, batches = open_arrow_file(data, max_rows=max_elements, expected_rows=expected_length)
    metadata = _masked_metadata(schema, ring_bits)
    count = _declared_count(metadata, max_elements, expected_length)
    parts = []
    for batch in batches:
        column = batch.column(0)
        if column.null_count:
            raise MalformedArrow(f"{MASKED_COLUMN!r} column has nulls")
        parts.append(column.to_numpy(zero_copy_only=True))
    total = sum(p.size for p in parts)
    if total != count:
        raise MalformedArrow(f"{META_COUNT} says {count} words, the column holds {total}")
    dtype = _NP_TYPES[ring_bits]
    if not parts:
        return np.empty(0, dtype=dtype)
    return np.concatenate(parts).astype(dtype, copy=True)


def _masked_metadata(schema: pa.Schema, ring_bits: int) -> dict[str, str]:
    """Return a masked block's metadata once its encoding, width and column are checked."""
    raw_meta = schema.metadata or {}
    try:
        metadata = {k.decode("utf-8"): v.decode("utf-8") for k, v in raw_meta.items()}
    except UnicodeDecodeError as exc:
        raise MalformedArrow(f"schema metadata is not UTF-8: {exc}") from exc
    encoding = metadata.get(META_ENCODING)
    if encoding not in SECAGG_ENCODINGS:
        raise MalformedArrow(f"not a masked SecAgg block (encoding {encoding!r:.40})")
    if SECAGG_ENCODINGS[encoding] != ring_bits:
        raise MalformedArrow(f"block is {encoding}, the round uses a {ring_bits}-bit ring")
    if schema.names != [MASKED_COLUMN]:
        raise MalformedArrow(f"a masked block has exactly one {MASKED_COLUMN!r} column")
    if schema.field(0).type != _ARROW_TYPES[ring_bits]:
        raise MalformedArrow(f"{MASKED_COLUMN!r} column has type {schema.field(0).type}")
    return metadata


def _declared_count(
    metadata: dict[str, str], max_elements: int, expected_length: int | None
) -> int:
    """Return the word count a masked block's metadata declares, checked against the bounds."""
    count_text = metadata.get(META_COUNT, "")
    if not (count_text.isascii() and count_text.isdigit() and len(count_text) <= 20):
        raise MalformedArrow(f"{META_COUNT} must be a non-negative integer, got {count_text!r:.40}")
    count = int(count_text)
    if count > max_elements:
        raise MalformedArrow(f"masked block holds {count} words, more than {max_elements}")
    if expected_length is not None and count != expected_length:
        raise MalformedArrow(
            f"masked block holds {count} words, the round expects {expected_length}"
        )
    if metadata.get(META_SHAPE) != json.dumps([count]):
        raise MalformedArrow(f"{META_SHAPE} must be [{count}]")
    return count
