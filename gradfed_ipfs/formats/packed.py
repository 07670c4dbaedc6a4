"""Packed chunk blocks: an agreed round's compressed contribution, one block per chunk range.

A compressed contribution is stored like a dense one
(:func:`~gradfed_ipfs.storage.dag.put_gradient`: a raw block, or chunks linked by a manifest,
with the same ranges), but each chunk is one
packed block (raw codec) of this layout, all integers little-endian::

    magic "GFPK" | version u8 = 1 | codec u8 | reserved u16 = 0 | block u32
    offset u64 | length u64 | stored u64 | exact u64 | index_bytes u64        (52 bytes)
    indices: index_bytes of LEB128 varints (sparse codecs only)
    scales:  float32 × ceil(stored / block)             (quantized values only)
    values:  stored values: int8 (8 bits), two per byte (4 bits, low nibble first),
             four per byte (2 bits, lowest bits first), or float32 (topk)
    exact:   float32 × exact                            (the chunk's part of the exact tail)

``stored`` is the number of stored values (a sparse chunk's entries; a dense chunk's lossy
values), ``exact`` the number of exact float32 values that end the chunk. A sparse chunk's
indices are deltas: the first entry's local index, then the gap to the previous one (at least
1), each a minimal varint; so indices are strictly ascending and below the chunk's lossy
length. The meaning of the values is :mod:`gradfed_ipfs.tensor.packing`'s.

:func:`decode_packed_chunk` is given the expected encoding, range and vector length (from the
session and the manifest); every header field must match them and the block must have exactly
the size they imply before anything is allocated. Scales must be finite and ``>= 0``, unused
bits of the last byte zero. Any departure raises :class:`~gradfed_ipfs.errors.MalformedPacked`.
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np
from numpy.typing import NDArray

from .._types import FloatArray
from ..errors import MalformedPacked
from ..tensor.packing import PACKED_CODECS, PackedChunk, PackSpec, unpack_chunk

__all__ = [
    "PACKED_HEADER_BYTES",
    "PACKED_MAGIC",
    "decode_packed_chunk",
    "encode_packed_chunk",
    "is_packed",
]

PACKED_MAGIC: Final = b"GFPK"
_VERSION: Final = 1
_HEADER: Final = struct.Struct("<4sBBHIQQQQQ")
PACKED_HEADER_BYTES: Final = _HEADER.size
"""Fixed bytes of every packed chunk block (52)."""
_CODEC_IDS: Final = tuple(PACKED_CODECS)  # the codec byte is an index into this (fixed order)
_MAX_VARINT: Final = 5  # bytes of one index delta: < 2**35, above any chunk length


def is_packed(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` starts like a packed chunk (its magic)."""
    return bytes(data[:4]) == PACKED_MAGIC


def _value_bytes(bits: int, stored: int) -> int:
    return 4 * stored if bits == 32 else -(-stored * bits // 8)


def _scale_count(spec: PackSpec, stored: int) -> int:
    return 0 if spec.bits == 32 else -(-stored // spec.block)


def _varints(deltas: NDArray[np.int64]) -> bytes:
    """Return the minimal LEB128 encoding of non-negative ``deltas``, one after another."""
    if deltas.size == 0:
        return b""
    sizes = np.ones(deltas.size, np.int64)
    for j in range(1, _MAX_VARINT):
        sizes += deltas >= 1 << (7 * j)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    out = np.zeros(int(sizes.sum()), np.uint8)
    for j in range(_MAX_VARINT):
        has = sizes > j
        byte = (deltas[has] >> (7 * j)) & 0x7F
        more = np.where(sizes[has] > j + 1, 0x80, 0)
        out[starts[has] + j] = (byte | more).astype(np.uint8)
    return out.tobytes()


def _pack_codes(codes: NDArray[np.generic], bits: int) -> bytes:
    if bits in (32, 8):
        return np.ascontiguousarray(codes, "<f4" if bits == 32 else np.int8).tobytes()
    per = 8 // bits
    padded = np.zeros(-(-codes.size // per) * per, np.uint8)
    padded[: codes.size] = codes
    lanes = padded.reshape(-1, per)
    packed = np.zeros(lanes.shape[0], np.uint8)
    for lane in range(per):
        packed |= (lanes[:, lane] << (bits * lane)).astype(np.uint8)
    return packed.tobytes()


def encode_packed_chunk(spec: PackSpec, chunk: PackedChunk) -> bytes:
    """Return the block bytes of one packed chunk (canonical: one byte string per content)."""
    indices = b""
    if chunk.indices is not None:
        local = chunk.indices.astype(np.int64)
        indices = _varints(np.diff(local, prepend=np.int64(0)) if local.size else local)
    header = _HEADER.pack(
        PACKED_MAGIC, _VERSION, _CODEC_IDS.index(spec.codec_id), 0, spec.block,
        chunk.offset, chunk.length, int(chunk.codes.size), int(chunk.exact.size), len(indices),
    )  # fmt: skip
    scales = np.ascontiguousarray(chunk.scales, "<f4").tobytes() if spec.bits != 32 else b""
    exact = np.ascontiguousarray(chunk.exact, "<f4").tobytes()
    return header + indices + scales + _pack_codes(chunk.codes, spec.bits) + exact


def _header(
    data: bytes | bytearray | memoryview, spec: PackSpec, offset: int, length: int, total: int
) -> tuple[int, int, int, int]:
    """Check the header against what is expected; return ``(lossy, stored, exact, index_bytes)``."""
    if len(data) < PACKED_HEADER_BYTES:
        raise MalformedPacked(f"{len(data)} bytes are shorter than a packed chunk's header")
    magic, version, codec, reserved, block, at, count, stored, exact, index_bytes = (
        _HEADER.unpack_from(data)
    )
    if magic != PACKED_MAGIC or version != _VERSION or reserved:
        raise MalformedPacked("not a version 1 packed chunk")
    name = _CODEC_IDS[codec] if codec < len(_CODEC_IDS) else f"#{codec}"
    if (name, block) != (spec.codec_id, spec.block):
        raise MalformedPacked(f"chunk encoding {name}/{block}, the session's is {spec.label}")
    if (at, count) != (offset, length):
        raise MalformedPacked(f"chunk covers {at}+{count}, expected {offset}+{length}")
    lossy = spec.lossy_length(offset, length, total)
    if exact != length - lossy or stored > lossy or (not spec.sparse and stored != lossy):
        raise MalformedPacked(
            f"chunk claims {stored} stored and {exact} exact values of {length} ({lossy} lossy)"
        )
    if spec.sparse and not stored <= index_bytes <= _MAX_VARINT * stored:
        raise MalformedPacked(f"{index_bytes} index bytes cannot hold {stored} indices")
    if not spec.sparse and index_bytes:
        raise MalformedPacked("a dense packed chunk has index bytes")
    size = PACKED_HEADER_BYTES + index_bytes + 4 * _scale_count(spec, stored)
    size += _value_bytes(spec.bits, stored) + 4 * exact
    if len(data) != size:
        raise MalformedPacked(f"chunk is {len(data)} bytes, its header implies {size}")
    return lossy, stored, exact, index_bytes


def _indices(raw: NDArray[np.uint8], stored: int, lossy: int) -> NDArray[np.int64]:
    """Decode ``stored`` delta varints into strictly ascending local indices below ``lossy``."""
    ends = np.flatnonzero(raw < 0x80)
    if ends.size != stored or (stored and ends[-1] != raw.size - 1):
        raise MalformedPacked(f"index bytes do not hold exactly {stored} varints")
    if stored == 0:
        return np.zeros(0, np.int64)
    starts = np.concatenate([[0], ends[:-1] + 1])
    sizes = ends - starts + 1
    if sizes.max() > _MAX_VARINT or np.any((raw[ends] == 0) & (sizes > 1)):
        raise MalformedPacked("an index varint is too long or not minimal")
    shifts = 7 * (np.arange(raw.size) - np.repeat(starts, sizes))
    deltas = np.add.reduceat((raw & 0x7F).astype(np.int64) << shifts, starts)
    if np.any(deltas[1:] < 1):
        raise MalformedPacked("indices are repeated or not ascending")
    if np.any(deltas >= lossy):  # each below lossy: the sum cannot overflow int64
        raise MalformedPacked(f"an index is out of range 0..{lossy}")
    indices = np.cumsum(deltas)
    if indices[-1] >= lossy:
        raise MalformedPacked(f"index {int(indices[-1])} is out of range 0..{lossy}")
    return indices


def _codes(raw: NDArray[np.uint8], bits: int, stored: int) -> NDArray[np.generic]:
    if bits == 32:
        return raw.view("<f4").astype(np.float32)
    if bits == 8:
        return raw.view(np.int8)
    per = 8 // bits
    lanes = np.stack([(raw >> (bits * lane)) & ((1 << bits) - 1) for lane in range(per)], axis=1)
    codes = lanes.reshape(-1)
    if np.any(codes[stored:]):
        raise MalformedPacked("the unused bits of the last value byte are not zero")
    return codes[:stored]


def decode_packed_chunk(
    data: bytes | bytearray | memoryview, spec: PackSpec, offset: int, length: int, total: int
) -> FloatArray:
    """Return the ``length`` float32 values of a packed chunk at ``offset`` of ``total`` values.

    Deterministic: the same bytes give the same float32 bits on every peer.

    Raises
    ------
    MalformedPacked
        If the block is not a chunk of ``spec`` for that range (see the module docstring).
    """
    lossy, stored, _, index_bytes = _header(data, spec, offset, length, total)
    raw = np.frombuffer(data, np.uint8, offset=PACKED_HEADER_BYTES)
    indices = _indices(raw[:index_bytes], stored, lossy) if spec.sparse else None
    at = index_bytes
    scale_count = _scale_count(spec, stored)
    scales = raw[at : at + 4 * scale_count].view("<f4").astype(np.float32)
    if not (np.isfinite(scales).all() and (scales >= 0).all()):
        raise MalformedPacked("a scale is not a finite value >= 0")
    at += 4 * scale_count
    value_bytes = _value_bytes(spec.bits, stored)
    codes = _codes(raw[at : at + value_bytes], spec.bits, stored)
    tail = raw[at + value_bytes :].view("<f4").astype(np.float32)
    return unpack_chunk(spec, PackedChunk(offset, length, lossy, indices, scales, codes, tail))
