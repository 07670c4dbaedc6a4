"""Gradient tensor types: dense, sparse, quantized and sparse-quantized layer gradients.

These are the seed's ``tensor`` types (seed-api §4.0-4.4) with NumPy arrays inside. Every
constructor accepts any sequence and converts it once: values to float32, indices to int64,
quantized values to int8, shapes to a tuple of ints.

``LayerGradient`` is the common base of the representations (the seed's tagged enum):
``LayerGradient.Dense``, ``.Sparse``, ``.Quantized`` and ``.SparseQuantized`` name them, and
each has ``shape``, ``to_dense()`` and ``memory_size()``. The per-model ``GradientDelta``
lives in :mod:`.delta`, ``TensorDtype`` and ``TensorMetadata`` in :mod:`.metadata`.
"""

from __future__ import annotations

import math
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._types import FloatArray, GradientLike
from ..errors import InvalidGradient, ShapeMismatch
from .metadata import TensorDtype, TensorMetadata

__all__ = [
    "DenseGradient",
    "LayerGradient",
    "QuantizedGradient",
    "SparseGradient",
    "SparseQuantizedGradient",
    "TensorDtype",
    "TensorMetadata",
    "pack_int4",
    "quantize_values",
    "unpack_int4",
]

_DEGENERATE_RANGE: Final = 1e-8
_QUANT_BLOCK: Final = 1 << 16


def _shape(shape: Sequence[int]) -> tuple[int, ...]:
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise InvalidGradient(f"shape dimensions must be >= 0, got {list(dims)}")
    return dims


def _float32(values: ArrayLike) -> FloatArray:
    return np.ascontiguousarray(values, dtype=np.float32).reshape(-1)


def _len_prefixed(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


class LayerGradient(ABC):
    """A layer's gradient in one of four representations (the seed's ``LayerGradient`` enum).

    ``LayerGradient.Dense``, ``.Sparse``, ``.Quantized`` and ``.SparseQuantized`` are the
    concrete classes; ``isinstance(x, LayerGradient)`` accepts any of them.
    """

    kind: ClassVar[str]
    Dense: ClassVar[type[DenseGradient]]
    Sparse: ClassVar[type[SparseGradient]]
    Quantized: ClassVar[type[QuantizedGradient]]
    SparseQuantized: ClassVar[type[SparseQuantizedGradient]]

    shape: tuple[int, ...]

    @abstractmethod
    def to_dense(self) -> FloatArray:
        """Return the flat float32 dense values (``prod(shape)`` elements)."""

    @abstractmethod
    def memory_size(self) -> int:
        """Return the payload size in bytes, as the seed costs it."""

    @abstractmethod
    def payload_parts(self) -> Iterator[bytes | memoryview]:
        """Yield the canonical little-endian payload buffers hashed by the delta checksum."""


@dataclass(eq=False, init=False)
class DenseGradient(LayerGradient):
    """Plain float32 values (the seed's ``LayerGradient::Dense``).

    Attributes
    ----------
    values
        Flat float32 array of ``prod(shape)`` elements, row-major.
    shape
        Tensor dimensions.
    """

    kind: ClassVar[str] = "dense"

    values: FloatArray
    shape: tuple[int, ...]

    def __init__(self, values: GradientLike, shape: Sequence[int] | None = None) -> None:
        array = np.asarray(values, dtype=np.float32)
        self.values = np.ascontiguousarray(array).reshape(-1)
        self.shape = _shape(array.shape if shape is None else shape)
        if math.prod(self.shape) != self.values.size:
            raise ShapeMismatch(list(self.shape), [self.values.size])

    def to_dense(self) -> FloatArray:
        """Return the values (no copy)."""
        return self.values

    def memory_size(self) -> int:
        """Return ``4·len(values)`` bytes."""
        return 4 * self.values.size

    def payload_parts(self) -> Iterator[bytes | memoryview]:
        """Yield the float32 little-endian values."""
        yield np.ascontiguousarray(self.values, dtype="<f4").data.cast("B")


@dataclass(eq=False, init=False)
class SparseGradient(LayerGradient):
    """Non-zero entries at flattened positions (seed §4.1). Nothing is validated on construction.

    Attributes
    ----------
    indices
        int64 flattened row-major positions, length nnz.
    values
        float32 values, one per index.
    shape
        Dense tensor dimensions.
    """

    kind: ClassVar[str] = "sparse"

    indices: NDArray[np.int64]
    values: FloatArray
    shape: tuple[int, ...]

    def __init__(
        self, indices: ArrayLike, values: GradientLike, shape: Sequence[int] | int
    ) -> None:
        self.indices = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        self.values = _float32(values)
        self.shape = _shape([shape] if isinstance(shape, int) else shape)

    @property
    def metadata(self) -> TensorMetadata:
        """``TensorMetadata("sparse_gradient", shape, float32)``."""
        return TensorMetadata("sparse_gradient", self.shape, TensorDtype.FLOAT32)

    def nnz(self) -> int:
        """Return the number of stored entries, ``len(indices)``."""
        return int(self.indices.size)

    def total_elements(self) -> int:
        """Return ``prod(shape)`` (1 for an empty shape)."""
        return math.prod(self.shape)

    def sparsity_ratio(self) -> float:
        """Return ``1 - nnz/total`` as float32 precision (NaN when total is 0)."""
        total = self.total_elements()
        if total == 0:
            return math.nan
        return float(np.float32(1.0) - np.float32(self.nnz()) / np.float32(total))

    def to_dense(self) -> FloatArray:
        """Scatter into zeros: later duplicates win; out-of-range or surplus entries are dropped."""
        total = self.total_elements()
        dense = np.zeros(total, dtype=np.float32)
        count = min(self.indices.size, self.values.size)
        indices, values = self.indices[:count], self.values[:count]
        keep = (indices >= 0) & (indices < total)
        dense[indices[keep]] = values[keep]
        return dense

    def verify_shape(self) -> None:
        """Check every index is in ``[0, total)`` and there is one value per index.

        Raises
        ------
        InvalidGradient
            ``"Index {i} out of bounds for shape {shape}"``, or
            ``"Indices length {a} != values length {b}"``.
        """
        total = self.total_elements()
        bad = np.flatnonzero((self.indices < 0) | (self.indices >= total))
        if bad.size:
            index = int(self.indices[bad[0]])
            raise InvalidGradient(f"Index {index} out of bounds for shape {list(self.shape)}")
        if self.indices.size != self.values.size:
            raise InvalidGradient(
                f"Indices length {self.indices.size} != values length {self.values.size}"
            )

    def memory_size(self) -> int:
        """Return ``4·len(indices) + 4·len(values)`` bytes (indices costed as 32-bit)."""
        return 4 * self.indices.size + 4 * self.values.size

    def payload_parts(self) -> Iterator[bytes | memoryview]:
        """Yield int64 indices then float32 values, little-endian, length-prefixed."""
        yield _len_prefixed(np.ascontiguousarray(self.indices, dtype="<i8").tobytes())
        yield np.ascontiguousarray(self.values, dtype="<f4").data.cast("B")


def _quantize_into(
    flat: FloatArray, lo: np.float32, scale: np.float32, offset: np.float32
) -> NDArray[np.int8]:
    """Return ``clamp(round_half_away((flat - lo)/scale - offset))`` as int8.

    Rounding is exact (Rust's ``f32::round``: truncate, then step away from zero when the
    fraction is at least 0.5). The work runs over cache-sized blocks with preallocated
    buffers, so the eleven element-wise steps touch main memory only to read the input and
    write the output.
    """
    out = np.empty(flat.size, dtype=np.int8)
    block = min(_QUANT_BLOCK, max(flat.size, 1))
    z = np.empty(block, dtype=np.float32)
    whole = np.empty(block, dtype=np.float32)
    frac = np.empty(block, dtype=np.float32)
    mask = np.empty(block, dtype=bool)
    for start in range(0, flat.size, block):
        stop = min(start + block, flat.size)
        m = stop - start
        zb, wb, fb, mb = z[:m], whole[:m], frac[:m], mask[:m]
        np.subtract(flat[start:stop], lo, out=zb)
        np.divide(zb, scale, out=zb)
        np.subtract(zb, offset, out=zb)
        np.trunc(zb, out=wb)
        np.subtract(zb, wb, out=fb)
        np.greater_equal(fb, 0.5, out=mb)
        np.add(wb, mb, out=wb)
        np.less_equal(fb, -0.5, out=mb)
        np.subtract(wb, mb, out=wb)
        np.clip(wb, -offset, offset - 1, out=wb)
        np.copyto(out[start:stop], wb, casting="unsafe")
    return out


def quantize_values(
    values: GradientLike, bits: int = 8
) -> tuple[NDArray[np.int8], np.float32, np.float32]:
    """Affine min/max quantization to signed ``bits``-bit integers (the seed's formula).

    ``levels = 2**bits - 1``; ``scale = (max - min)/levels`` (1.0 when ``|max - min| < 1e-8``);
    ``q = clamp(round_half_away((v - min)/scale - 2**(bits-1)), -2**(bits-1), 2**(bits-1)-1)``,
    computed in float32. Dequantizing gives ``(q + 2**(bits-1))·scale + min``, within
    ``scale/2`` of ``v`` (plus float32 rounding, ~1e-7·max|v|).

    Parameters
    ----------
    values
        Any array-like of finite numbers; flattened.
    bits
        8 (int8, 256 levels) or 4 (int4, 16 levels).

    Returns
    -------
    tuple
        ``(q, scale, min_val)``: int8 array of logical values, float32 scale and minimum.

    Raises
    ------
    InvalidGradient
        If ``bits`` is not 4 or 8, or a value is NaN or infinite.
    """
    if bits not in (4, 8):
        raise InvalidGradient(f"quantization bits must be 4 or 8, got {bits}")
    flat = _float32(values)
    if flat.size == 0:
        return np.empty(0, dtype=np.int8), np.float32(1.0), np.float32(0.0)
    lo, hi = np.float32(flat.min()), np.float32(flat.max())
    if not (np.isfinite(lo) and np.isfinite(hi)):  # NaN propagates through min and max
        raise InvalidGradient("cannot quantize non-finite values")
    levels = np.float32(2**bits - 1)
    offset = np.float32(2 ** (bits - 1))
    span = np.float32(hi - lo)
    scale = np.float32(1.0) if abs(float(span)) < _DEGENERATE_RANGE else span / levels
    return _quantize_into(flat, lo, np.float32(scale), offset), np.float32(scale), lo


@dataclass(eq=False, init=False)
class QuantizedGradient(LayerGradient):
    """Affine-quantized values (seed §4.2), int8 or int4 (two values per byte on the wire).

    Dequantize with ``v = (q + 2**(bits-1))·scale + min_val``. Error bound: ``scale/2`` per
    element, where ``scale = (max - min)/255`` for int8 and ``/15`` for int4.

    Attributes
    ----------
    quantized_values
        int8 logical values in ``[-128, 127]`` (int8) or ``[-8, 7]`` (int4), one per element.
    scale
        float32 step between levels.
    min_val
        float32 zero point (the minimum of the input).
    shape
        Tensor dimensions.
    bits
        8 or 4.
    """

    kind: ClassVar[str] = "quantized"

    quantized_values: NDArray[np.int8]
    scale: float
    min_val: float
    shape: tuple[int, ...]
    bits: int

    def __init__(
        self,
        quantized_values: ArrayLike,
        scale: float,
        min_val: float,
        shape: Sequence[int] | int,
        bits: int = 8,
    ) -> None:
        if bits not in (4, 8):
            raise InvalidGradient(f"quantization bits must be 4 or 8, got {bits}")
        self.quantized_values = np.ascontiguousarray(quantized_values, dtype=np.int8).reshape(-1)
        self.scale = float(np.float32(scale))
        self.min_val = float(np.float32(min_val))
        self.shape = _shape([shape] if isinstance(shape, int) else shape)
        self.bits = bits

    @classmethod
    def from_dense(
        cls, values: GradientLike, shape: Sequence[int] | int | None = None, bits: int = 8
    ) -> QuantizedGradient:
        """Quantize ``values`` with :func:`quantize_values` (shape defaults to ``[len]``)."""
        q, scale, lo = quantize_values(values, bits)
        dims = [q.size] if shape is None else shape
        return cls(q, float(scale), float(lo), dims, bits)

    @property
    def metadata(self) -> TensorMetadata:
        """``TensorMetadata("quantized_gradient", shape, int8)``."""
        return TensorMetadata("quantized_gradient", self.shape, TensorDtype.INT8)

    def to_dense(self) -> FloatArray:
        """Dequantize in float32: ``(q + 2**(bits-1))·scale + min_val``."""
        offset = np.float32(2 ** (self.bits - 1))
        dense = self.quantized_values.astype(np.float32)
        dense += offset
        dense *= np.float32(self.scale)
        dense += np.float32(self.min_val)
        return dense

    def packed(self) -> NDArray[np.uint8]:
        """Return the wire payload: int8 bytes, or two int4 values per byte (low nibble first)."""
        if self.bits == 8:
            return self.quantized_values.view(np.uint8)
        return pack_int4(self.quantized_values)

    def compression_ratio(self) -> float:
        """Return dense bytes / quantized bytes: ``4n/(n+8)`` for int8 (0.0 when n is 0)."""
        n = self.quantized_values.size
        if n == 0:
            return 0.0
        return float(np.float32(4 * n) / np.float32(self.memory_size()))

    def memory_size(self) -> int:
        """Return payload bytes plus 8 for scale and zero point (``n + 8``, or ``⌈n/2⌉ + 8``)."""
        n = self.quantized_values.size
        return (n if self.bits == 8 else (n + 1) // 2) + 8

    def payload_parts(self) -> Iterator[bytes | memoryview]:
        """Yield bits, scale, zero point and the packed values."""
        yield struct.pack("<Bff", self.bits, self.scale, self.min_val)
        yield _len_prefixed(self.packed().tobytes())


def pack_int4(values: NDArray[np.int8]) -> NDArray[np.uint8]:
    """Pack int4 values in ``[-8, 7]`` two per byte: ``(q + 8)`` nibbles, low nibble first."""
    nibbles = (values.astype(np.int16) + 8).astype(np.uint8)
    if nibbles.size % 2:
        nibbles = np.concatenate([nibbles, np.zeros(1, dtype=np.uint8)])
    pairs = nibbles.reshape(-1, 2)
    return np.ascontiguousarray(pairs[:, 0] | (pairs[:, 1] << 4))


def unpack_int4(packed: NDArray[np.uint8], count: int) -> NDArray[np.int8]:
    """Invert :func:`pack_int4`, returning ``count`` int8 values in ``[-8, 7]``."""
    out = np.empty(packed.size * 2, dtype=np.int8)
    out[0::2] = (packed & 0x0F).astype(np.int8)
    out[1::2] = (packed >> 4).astype(np.int8)
    out -= 8
    return out[:count]


@dataclass(eq=False, init=False)
class SparseQuantizedGradient(LayerGradient):
    """Top-k indices with int8/int4-quantized values: the combined sparsify + quantize codec.

    Error bound: exact zeros off the support; ``quantized.scale/2`` on it.

    Attributes
    ----------
    indices
        int64 flattened positions, length nnz.
    quantized
        The nnz values, quantized (its shape is ``(nnz,)``).
    shape
        Dense tensor dimensions.
    """

    kind: ClassVar[str] = "sparse-quantized"

    indices: NDArray[np.int64]
    quantized: QuantizedGradient
    shape: tuple[int, ...]

    def __init__(
        self, indices: ArrayLike, quantized: QuantizedGradient, shape: Sequence[int] | int
    ) -> None:
        self.indices = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        self.quantized = quantized
        self.shape = _shape([shape] if isinstance(shape, int) else shape)

    def to_sparse(self) -> SparseGradient:
        """Return the dequantized :class:`SparseGradient`."""
        return SparseGradient(self.indices, self.quantized.to_dense(), self.shape)

    def to_dense(self) -> FloatArray:
        """Dequantize and scatter into zeros."""
        return self.to_sparse().to_dense()

    def memory_size(self) -> int:
        """Return ``4·nnz`` index bytes plus the quantized values' size."""
        return 4 * self.indices.size + self.quantized.memory_size()

    def payload_parts(self) -> Iterator[bytes | memoryview]:
        """Yield the int64 indices, then the quantized payload."""
        yield _len_prefixed(np.ascontiguousarray(self.indices, dtype="<i8").tobytes())
        yield from self.quantized.payload_parts()


LayerGradient.Dense = DenseGradient
LayerGradient.Sparse = SparseGradient
LayerGradient.Quantized = QuantizedGradient
LayerGradient.SparseQuantized = SparseQuantizedGradient
