"""Field-level checks of gradient Arrow blocks: metadata keys, columns, shapes, quantization.

Helpers of :mod:`gradfed_ipfs.formats.arrow` (which re-exports the ``META_*`` keys); each
raises :class:`~gradfed_ipfs.errors.MalformedArrow` on untrusted input that does not fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from ...errors import MalformedArrow
from ...tensor.types import QuantizedGradient, unpack_int4
from ..limits import load_json

__all__ = [
    "META_BITS",
    "META_COUNT",
    "META_DTYPE",
    "META_ENCODING",
    "META_LAYER",
    "META_OFFSET",
    "META_SCALE",
    "META_SHAPE",
    "META_ZERO_POINT",
    "check_indices",
    "column",
    "decode_metadata",
    "parse_shape",
    "quantized_column",
]

META_ENCODING: Final = "gradfed.encoding"
META_SHAPE: Final = "gradfed.shape"
META_DTYPE: Final = "gradfed.dtype"
META_LAYER: Final = "gradfed.layer"
META_BITS: Final = "gradfed.bits"
META_SCALE: Final = "gradfed.scale"
META_ZERO_POINT: Final = "gradfed.zero_point"
META_COUNT: Final = "gradfed.count"
META_OFFSET: Final = "gradfed.offset"

_VALUE: Final = "value"
_INDEX: Final = "index"
_Q: Final = "q"
_FLOAT32_MAX: Final = float(np.finfo(np.float32).max)
_MAX_DIMS: Final = 32
_MAX_NONZERO_PRODUCT: Final = 2**60  # times 4 bytes stays below NumPy's intp limit


def check_indices(
    indices: NDArray[np.int64], count: int, total: int, error: type[Exception]
) -> None:
    """Refuse indices of another count than ``count`` or outside ``0..total-1``."""
    if indices.size != count:
        raise error(f"{indices.size} indices for {count} values")
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= total):
        raise error(f"sparse index out of bounds for {total} elements")


def quantized_column(
    schema: pa.Schema, batches: list[pa.RecordBatch], metadata: Mapping[str, str], count: int
) -> QuantizedGradient:
    """Read and check the ``q`` column and quantization metadata of ``count`` values."""
    bits = _meta_int(metadata, META_BITS, 4, 8)
    if bits not in (4, 8):
        raise MalformedArrow(f"{META_BITS} must be 4 or 8, got {bits}")
    declared = _meta_int(metadata, META_COUNT, 0, 2**62)
    if declared != count:
        raise MalformedArrow(f"{META_COUNT} {declared} does not match {count} elements")
    scale = _meta_float(metadata, META_SCALE)
    zero_point = _meta_float(metadata, META_ZERO_POINT)
    if not scale > 0:
        raise MalformedArrow(f"{META_SCALE} must be > 0, got {scale}")
    # Dequantizing computes (q + 2**(bits-1))·scale + zero_point in float32: refuse parameters
    # whose top level overflows (a finite scale of 3e38 would decode to inf).
    with np.errstate(over="ignore"):
        top = np.float32(2**bits - 1) * np.float32(scale)
        if not (np.isfinite(top) and np.isfinite(top + np.float32(zero_point))):
            raise MalformedArrow(
                f"{META_SCALE} {scale:g} and {META_ZERO_POINT} {zero_point:g} dequantize beyond "
                "float32"
            )
    if bits == 8:
        q = column(schema, batches, _Q, (pa.int8(),))
        if q.size != count:
            raise MalformedArrow(f"'q' has {q.size} values, expected {count}")
    else:
        packed = column(schema, batches, _Q, (pa.uint8(),))
        if packed.size != (count + 1) // 2:
            raise MalformedArrow(f"'q' has {packed.size} bytes, expected {(count + 1) // 2}")
        q = unpack_int4(packed, count)
    return QuantizedGradient(q, scale, zero_point, [count], bits)


def _meta_int(metadata: Mapping[str, str], key: str, low: int, high: int) -> int:
    text = metadata.get(key)
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 20:
        raise MalformedArrow(f"{key} must be a non-negative integer, got {text!r:.40}")
    value = int(text)
    if not low <= value <= high:
        raise MalformedArrow(f"{key} {value} outside [{low}, {high}]")
    return value


def _meta_float(metadata: Mapping[str, str], key: str) -> float:
    text = metadata.get(key)
    try:
        value = float(text) if text is not None and len(text) <= 64 else math.nan
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and abs(value) <= _FLOAT32_MAX):
        raise MalformedArrow(f"{key} must be a finite float32, got {text!r:.40}")
    return value


def column(
    schema: pa.Schema, batches: list[pa.RecordBatch], name: str, types: tuple[pa.DataType, ...]
) -> NDArray[Any]:
    """Return column ``name`` of one of ``types`` over every batch (zero-copy for one batch)."""
    index = schema.get_field_index(name)
    if index < 0:
        raise MalformedArrow(f"Arrow IPC block missing {name!r} column")
    if schema.field(index).type not in types:
        if name == _VALUE:
            raise MalformedArrow("'value' column is not Float32")
        raise MalformedArrow(f"{name!r} column has type {schema.field(index).type}")
    parts: list[NDArray[Any]] = []
    for batch in batches:
        column = batch.column(index)
        if column.null_count:
            raise MalformedArrow(f"{name!r} column has nulls")
        parts.append(column.to_numpy(zero_copy_only=True))
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return np.empty(0, dtype=schema.field(index).type.to_pandas_dtype())
    return np.concatenate(parts)


def decode_metadata(raw: Mapping[bytes, bytes] | None) -> dict[str, str]:
    """Return schema metadata as UTF-8 text."""
    if not raw:
        return {}
    try:
        return {k.decode("utf-8"): v.decode("utf-8") for k, v in raw.items()}
    except UnicodeDecodeError as exc:
        raise MalformedArrow(f"schema metadata is not UTF-8: {exc}") from exc


def parse_shape(text: str | None, size: int | None) -> tuple[int, ...]:
    """Parse ``gradfed.shape``; check it holds ``size`` values when ``size`` is given."""
    if text is None:
        if size is None:
            raise MalformedArrow(f"missing {META_SHAPE} metadata")
        return (size,)
    parsed = load_json(text, META_SHAPE, error=MalformedArrow)
    if not isinstance(parsed, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63 for d in parsed
    ):
        raise MalformedArrow(f"{META_SHAPE} must be a list of non-negative ints, got {text!r:.60}")
    shape = tuple(parsed)
    # NumPy refuses more than 64 dimensions, or dimensions whose non-zero product overflows
    # intp, even for zero elements; such a shape must not get past the decoder.
    if len(shape) > _MAX_DIMS or math.prod(d for d in shape if d) > _MAX_NONZERO_PRODUCT:
        raise MalformedArrow(f"{META_SHAPE} {text!r:.60} is not a shape NumPy can represent")
    if size is not None and math.prod(shape) != size:
        raise MalformedArrow(f"{META_SHAPE} {list(shape)} does not match {size} values")
    return shape
