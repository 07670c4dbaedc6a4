"""Packed contributions of agreed rounds: per-block quantization and top-k, decoded bit-exactly.

An agreed round's contribution is split into the chunk ranges of
:func:`~gradfed_ipfs.storage.dag.plan_chunks`; each range becomes one :class:`PackedChunk`
(bytes: :mod:`gradfed_ipfs.formats.packed`). A :class:`PackSpec` names what a decoder needs
(the codec id, the values per scale ``block`` and the exact tail), and its :attr:`~PackSpec.label`
is what a round record names. The encoders (:meth:`~gradfed_ipfs.tensor.codecs.Codec.pack`)
may differ between peers; decoding (:func:`unpack_chunk`) is pure float32 NumPy in a fixed
order: one exact subtraction and one correctly rounded multiplication per value, so every peer
gets the same bits on every platform.

Quantization is symmetric with one float32 scale per ``block`` stored values (absmax):

* 8 bits: ``q = rint(v/s)`` in ``[-127, 127]``, ``s = absmax/127``; decoded ``q·s``;
* 4 bits: code ``q + 8`` with ``q`` in ``[-7, 7]``, ``s = absmax/7``; decoded ``(code - 8)·s``;
* 2 bits: code ``c`` in ``0..3``, ``s = absmax/1.5``; decoded ``(c - 1.5)·s``, the levels
  ``±absmax/3, ±absmax`` (no zero: top-k values are large, and error feedback carries the rest).

Top-k keeps the ``k`` largest magnitudes of the lossy part (ties to the lower index); a chunk
holds the kept entries whose index falls in it, as local indices. The last ``exact_tail``
values of the vector (a training session's metrics) are never compressed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

from .._types import FloatArray
from ..errors import ConfigError
from .compression import top_k_indices

__all__ = [
    "DEFAULT_PACK_BLOCK",
    "PACKED_CODECS",
    "PackSpec",
    "PackedChunk",
    "block_counts",
    "dequantize_blocks",
    "keep_count",
    "pack_chunks",
    "quantize_blocks",
    "unpack_chunk",
]

DEFAULT_PACK_BLOCK: Final = 1024
"""Default number of stored values per float32 scale (4/1024 bytes of scale per value)."""

PACKED_CODECS: Final[dict[str, tuple[bool, int]]] = {
    "int8": (False, 8),
    "int4": (False, 4),
    "int2": (False, 2),
    "topk": (True, 32),
    "topk-int8": (True, 8),
    "topk-int2": (True, 2),
}
"""Codec id → ``(sparse, value bits)`` of every encoding agreed rounds take (32: float32)."""

_ZERO: Final[dict[int, np.float32]] = {8: np.float32(0), 4: np.float32(8), 2: np.float32(1.5)}
_LEVEL: Final[dict[int, np.float32]] = {8: np.float32(127), 4: np.float32(7), 2: np.float32(1.5)}
_MAX_BLOCK: Final = 1 << 24


@dataclass(frozen=True)
class PackSpec:
    """What decoding a packed contribution needs; every member of a session uses the same.

    Attributes
    ----------
    codec_id
        A key of :data:`PACKED_CODECS`.
    block
        Stored values per float32 scale, 1 … 2**24 (unused by ``topk``, whose values are float32).
    exact_tail
        The vector's last ``exact_tail`` values are sent as exact float32, never compressed.
    """

    codec_id: str
    block: int = DEFAULT_PACK_BLOCK
    exact_tail: int = 0

    def __post_init__(self) -> None:
        if self.codec_id not in PACKED_CODECS:
            raise ConfigError(
                f"codec {self.codec_id!r} has no packed form for agreed rounds "
                f"(one of {sorted(PACKED_CODECS)})"
            )
        if not 1 <= self.block <= _MAX_BLOCK:
            raise ConfigError(f"block must be in 1..{_MAX_BLOCK}, got {self.block}")
        if self.exact_tail < 0:
            raise ConfigError(f"exact_tail must be >= 0, got {self.exact_tail}")

    @property
    def sparse(self) -> bool:
        """Whether chunks hold indices and values (top-k) rather than every value."""
        return PACKED_CODECS[self.codec_id][0]

    @property
    def bits(self) -> int:
        """Bits per stored value: 32 (float32), 8, 4 or 2."""
        return PACKED_CODECS[self.codec_id][1]

    @property
    def label(self) -> str:
        """The text a round record names: ``<codec>/<block>``, ``+<exact_tail>`` if any."""
        tail = f"+{self.exact_tail}" if self.exact_tail else ""
        return f"{self.codec_id}/{self.block}{tail}"

    @classmethod
    def parse(cls, label: str) -> PackSpec:
        """Invert :attr:`label`.

        Raises
        ------
        ConfigError
            If ``label`` is not one :attr:`label` writes.
        """
        codec, _, rest = label.partition("/")
        block, _, tail = rest.partition("+")
        if not (block.isdigit() and (tail == "" or tail.isdigit())):
            raise ConfigError(f"not a packed encoding label: {label[:64]!r}")
        spec = cls(codec, int(block), int(tail or 0))
        if spec.label != label:  # one spelling per encoding (no leading zeros, no "+0")
            raise ConfigError(f"not a canonical packed encoding label: {label[:64]!r}")
        return spec

    def lossy_length(self, offset: int, length: int, total: int) -> int:
        """Return how many of a chunk's ``length`` values at ``offset`` are compressed.

        The rest of the chunk, up to its end, lies in the exact tail ``total - exact_tail …``.
        """
        cut = max(0, total - self.exact_tail)
        return max(0, min(offset + length, cut) - offset)


@dataclass(frozen=True)
class PackedChunk:
    """One chunk's contents before bit packing (:mod:`gradfed_ipfs.formats.packed`).

    Attributes
    ----------
    offset, length
        The chunk's dense range in the vector.
    lossy
        Values of the range that are compressed (the rest is ``exact``).
    indices
        Sparse: ascending local positions in ``0 … lossy``, int64; ``None`` when dense.
    scales
        float32 scale per ``block`` stored values (empty for float32 values).
    codes
        The stored values: int8 ``q`` (8 bits), uint8 codes (4 and 2 bits, one per value) or
        float32 values (``topk``).
    exact
        The chunk's exact tail values, float32.
    """

    offset: int
    length: int
    lossy: int
    indices: NDArray[np.int64] | None
    scales: FloatArray
    codes: NDArray[np.generic]
    exact: FloatArray


def block_counts(stored: int, block: int) -> NDArray[np.int64]:
    """Return the number of stored values under each scale: ``block`` each, the last fewer."""
    blocks = -(-stored // block)
    counts = np.full(blocks, block, dtype=np.int64)
    if blocks:
        counts[-1] = stored - (blocks - 1) * block
    return counts


def _clipped(values: FloatArray, starts: NDArray[np.int64], counts: NDArray[np.int64],
             sigmas: float) -> FloatArray:  # fmt: skip
    """Clip each block to its ``mean ± sigmas·std`` (INTELLECT-1's outlier clipping)."""
    wide = values.astype(np.float64)
    mean = np.add.reduceat(wide, starts) / counts
    centred = wide - np.repeat(mean, counts)
    std = np.sqrt(np.add.reduceat(centred * centred, starts) / counts)
    lo, hi = np.repeat(mean - sigmas * std, counts), np.repeat(mean + sigmas * std, counts)
    return np.clip(wide, lo, hi).astype(np.float32)


def quantize_blocks(
    values: FloatArray, bits: int, block: int, clip_sigmas: float | None = None
) -> tuple[FloatArray, NDArray[np.generic]]:
    """Return ``(scales, codes)`` of ``values`` at ``bits`` (8, 4, 2) per ``block`` values.

    Values are clipped per block to ``mean ± clip_sigmas·std`` first when given. A block of
    zeros has scale 0.
    """
    counts = block_counts(values.size, block)
    if values.size == 0:
        return np.zeros(0, np.float32), np.zeros(0, np.int8 if bits == 8 else np.uint8)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    if clip_sigmas is not None:
        values = _clipped(values, starts, counts, clip_sigmas)
    absmax = np.maximum.reduceat(np.abs(values), starts)
    scales = (absmax / _LEVEL[bits]).astype(np.float32)
    divisor = np.repeat(np.where(scales > 0, scales, np.float32(1)), counts)
    ratio = values / divisor
    if bits == 2:
        codes = np.clip(np.floor(ratio + np.float32(2)), 0, 3).astype(np.uint8)
        return scales, np.where(np.repeat(scales > 0, counts), codes, np.uint8(2))
    level = _LEVEL[bits]
    q = np.clip(np.rint(ratio), -level, level)
    if bits == 8:
        return scales, q.astype(np.int8)
    return scales, (q + _ZERO[4]).astype(np.uint8)


def dequantize_blocks(
    scales: FloatArray, codes: NDArray[np.generic], bits: int, block: int
) -> FloatArray:
    """Return ``(code - zero)·scale`` in float32: exact subtraction, one rounding (any peer)."""
    if bits == 32:
        return np.asarray(codes, np.float32)
    step = np.repeat(scales.astype(np.float32), block_counts(codes.size, block))
    centred = codes.astype(np.float32)
    np.subtract(centred, _ZERO[bits], out=centred)
    np.multiply(centred, step, out=centred)
    return centred


def _lossy_indices(values: FloatArray, keep: int) -> NDArray[np.int64]:
    """Ascending positions of the ``keep`` largest magnitudes (ties to the lower index)."""
    return top_k_indices(values, min(keep, values.size))


def pack_chunks(
    spec: PackSpec,
    values: FloatArray,
    ranges: list[tuple[int, int]],
    *,
    keep: int | None = None,
    clip_sigmas: float | None = None,
) -> list[PackedChunk]:
    """Encode a flat float32 vector as one :class:`PackedChunk` per ``(offset, length)`` range.

    Parameters
    ----------
    spec
        The encoding (its ``exact_tail`` values are kept exact).
    values
        The vector, ``(d,)`` float32; ``ranges`` tile ``0 … d`` in order.
    keep
        Sparse encodings: how many entries of the lossy part to keep (top-k).
    clip_sigmas
        Quantized values are clipped per block to ``mean ± clip_sigmas·std`` first.
    """
    total = values.size
    cut = max(0, total - spec.exact_tail)
    chosen = _lossy_indices(values[:cut], keep or 0) if spec.sparse else None
    chunks = []
    for offset, length in ranges:
        lossy = spec.lossy_length(offset, length, total)
        exact = np.array(values[offset + lossy : offset + length], np.float32)
        local: NDArray[np.int64] | None = None
        if chosen is None:
            stored = values[offset : offset + lossy]
        else:
            lo, hi = np.searchsorted(chosen, [offset, offset + lossy])
            local = chosen[lo:hi] - offset
            stored = values[offset + local]
        codes: NDArray[np.generic]
        if spec.bits == 32:
            scales, codes = np.zeros(0, np.float32), np.array(stored, np.float32)
        else:
            scales, codes = quantize_blocks(stored, spec.bits, spec.block, clip_sigmas)
        chunks.append(PackedChunk(offset, length, lossy, local, scales, codes, exact))
    return chunks


def unpack_chunk(spec: PackSpec, chunk: PackedChunk) -> FloatArray:
    """Return a chunk's ``length`` dense float32 values (zeros off a sparse chunk's support)."""
    decoded = dequantize_blocks(chunk.scales, chunk.codes, spec.bits, spec.block)
    out = np.zeros(chunk.length, np.float32)
    if chunk.indices is None:
        out[: chunk.lossy] = decoded
    else:
        out[chunk.indices] = decoded
    out[chunk.lossy :] = chunk.exact
    return out


def keep_count(ratio: float, k: int | None, size: int) -> int:
    """Return top-k's ``k``: fixed, or ``ceil(ratio·size)`` and at least 1 (at most ``size``)."""
    if k is not None:
        return min(k, size)
    return min(size, max(1, math.ceil(ratio * size))) if size else 0
