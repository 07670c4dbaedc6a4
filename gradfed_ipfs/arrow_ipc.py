"""Gradients as Arrow IPC *file* bytes (magic ``ARROW1``): the payload of every gradient block.

Layout written here (DESIGN §3): one record batch with a non-nullable Float32 column ``value``
holding the flattened (row-major) tensor. Schema metadata says how to read it back:

``gradfed.encoding``  ``dense`` (sparse and quantized encodings build on this module)
``gradfed.shape``     JSON list of ints, e.g. ``[2, 3]``
``gradfed.dtype``     ``float32``
``gradfed.layer``     the layer name, when there is one

The loader also accepts the seed's layout (an Int32 ``index`` column beside ``value`` and no
metadata) and any number of record batches. Decoding a single-batch dense file is zero-copy:
the returned array is a read-only view on the input buffer.

Every byte given to the loader is untrusted: anything that is not such a file raises
:class:`~gradfed_ipfs.errors.MalformedArrow`, never a pyarrow exception.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import pyarrow as pa

from ._types import FloatArray, GradientLike
from .errors import MalformedArrow

__all__ = [
    "ARROW_MAGIC",
    "META_DTYPE",
    "META_ENCODING",
    "META_LAYER",
    "META_SHAPE",
    "DecodedGradient",
    "decode_gradient",
    "encode_arrow_file",
    "load_gradient_from_arrow",
    "open_arrow_file",
    "store_gradient_as_arrow",
]

ARROW_MAGIC: Final = b"ARROW1"
META_ENCODING: Final = "gradfed.encoding"
META_SHAPE: Final = "gradfed.shape"
META_DTYPE: Final = "gradfed.dtype"
META_LAYER: Final = "gradfed.layer"

_VALUE: Final = "value"


@dataclass(frozen=True)
class DecodedGradient:
    """A decoded gradient block.

    Attributes
    ----------
    values
        Flat float32 array of ``prod(shape)`` elements (read-only view when zero-copy).
    shape
        The tensor's shape; ``(n,)`` for files without shape metadata.
    encoding
        ``gradfed.encoding`` of the block (``"dense"`` for the seed's layout).
    layer
        The layer name, or ``None``.
    metadata
        All schema metadata, decoded as UTF-8.
    """

    values: FloatArray
    shape: tuple[int, ...]
    encoding: str = "dense"
    layer: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)

    def tensor(self) -> FloatArray:
        """Return the values reshaped to :attr:`shape` (a view, no copy)."""
        return self.values.reshape(self.shape)


def store_gradient_as_arrow(
    gradient: GradientLike, *, shape: tuple[int, ...] | None = None, layer: str | None = None
) -> bytes:
    """Encode a gradient as Arrow IPC file bytes (dense float32 ``value`` column).

    Parameters
    ----------
    gradient
        Array or sequence of numbers; converted to float32 and flattened row-major.
    shape
        Tensor shape to record; defaults to the array's own shape.
    layer
        Optional layer name recorded as ``gradfed.layer``.

    Returns
    -------
    bytes
        An ``ARROW1`` file with one record batch; empty gradients give a zero-row batch.
    """
    array = np.asarray(gradient, dtype=np.float32)
    recorded = tuple(int(d) for d in (array.shape if shape is None else shape))
    flat = np.ascontiguousarray(array).reshape(-1)
    if math.prod(recorded) != flat.size:
        raise MalformedArrow(f"shape {list(recorded)} does not hold {flat.size} values")
    metadata = {
        META_ENCODING: "dense",
        META_SHAPE: json.dumps(list(recorded)),
        META_DTYPE: "float32",
    }
    if layer is not None:
        metadata[META_LAYER] = layer
    return encode_arrow_file({_VALUE: pa.array(flat, type=pa.float32())}, metadata)


def encode_arrow_file(columns: Mapping[str, pa.Array], metadata: Mapping[str, str]) -> bytes:
    """Write non-nullable ``columns`` and schema ``metadata`` as a one-batch Arrow IPC file."""
    fields = [pa.field(name, col.type, nullable=False) for name, col in columns.items()]
    schema = pa.schema(fields, metadata=dict(metadata))
    batch = pa.record_batch(list(columns.values()), schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def load_gradient_from_arrow(data: bytes | bytearray | memoryview) -> FloatArray:
    """Decode a dense gradient block into a float32 array of its recorded shape.

    Single-batch files decode zero-copy (a read-only view on ``data``); the seed's
    ``index`` + ``value`` layout and multi-batch files decode to a flat array.

    Raises
    ------
    MalformedArrow
        If ``data`` is not an Arrow IPC file with a non-null Float32 ``value`` column, its
        shape metadata is inconsistent, or it uses a non-dense encoding.
    """
    decoded = decode_gradient(data)
    if decoded.encoding != "dense":
        raise MalformedArrow(
            f"block has encoding {decoded.encoding!r}; decode it with its codec instead"
        )
    return decoded.tensor()


def open_arrow_file(data: bytes | bytearray | memoryview) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """Open untrusted Arrow IPC file bytes and return the schema and validated batches.

    Raises
    ------
    MalformedArrow
        If the bytes are not a well-formed Arrow IPC file.
    """
    view = memoryview(data)
    if len(view) < 2 * len(ARROW_MAGIC) or bytes(view[:6]) != ARROW_MAGIC:
        raise MalformedArrow("not an Arrow IPC file (missing ARROW1 magic)")
    if bytes(view[-6:]) != ARROW_MAGIC:
        raise MalformedArrow("truncated Arrow IPC file (missing trailing ARROW1 magic)")
    try:
        reader = pa.ipc.open_file(pa.py_buffer(view))
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        for batch in batches:
            batch.validate(full=True)
        return reader.schema, batches
    except (pa.ArrowException, OSError, ValueError, IndexError, OverflowError) as exc:
        raise MalformedArrow(f"malformed Arrow IPC file: {exc}") from exc


def decode_gradient(data: bytes | bytearray | memoryview) -> DecodedGradient:
    """Decode a gradient block's ``value`` column and metadata (any encoding's framing).

    Dense blocks return their values; for other encodings ``values`` holds the raw ``value``
    column and the caller's codec interprets it with :attr:`DecodedGradient.metadata`.

    Raises
    ------
    MalformedArrow
        See :func:`load_gradient_from_arrow`.
    """
    schema, batches = open_arrow_file(data)
    metadata = _decode_metadata(schema.metadata)
    encoding = metadata.get(META_ENCODING, "dense")
    index = schema.get_field_index(_VALUE)
    if index < 0:
        raise MalformedArrow("Arrow IPC block missing 'value' column")
    if schema.field(index).type != pa.float32():
        raise MalformedArrow("'value' column is not Float32")
    values = _column_values(batches, index)
    if encoding == "dense":
        shape = _parse_shape(metadata.get(META_SHAPE), values.size)
    else:
        shape = _parse_shape(metadata.get(META_SHAPE), None)
    return DecodedGradient(values, shape, encoding, metadata.get(META_LAYER), metadata)


def _column_values(batches: list[pa.RecordBatch], index: int) -> FloatArray:
    parts: list[FloatArray] = []
    for batch in batches:
        column = batch.column(index)
        if column.null_count:
            raise MalformedArrow("'value' column has nulls")
        parts.append(column.to_numpy(zero_copy_only=True))
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return np.empty(0, dtype=np.float32)
    return np.concatenate(parts)


def _decode_metadata(raw: Mapping[bytes, bytes] | None) -> dict[str, str]:
    if not raw:
        return {}
    try:
        return {k.decode("utf-8"): v.decode("utf-8") for k, v in raw.items()}
    except UnicodeDecodeError as exc:
        raise MalformedArrow(f"schema metadata is not UTF-8: {exc}") from exc


def _parse_shape(text: str | None, size: int | None) -> tuple[int, ...]:
    """Parse ``gradfed.shape``; check it holds ``size`` values when ``size`` is given."""
    if text is None:
        if size is None:
            raise MalformedArrow(f"missing {META_SHAPE} metadata")
        return (size,)
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise MalformedArrow(f"{META_SHAPE} is not JSON: {text!r:.60}") from exc
    if not isinstance(parsed, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63 for d in parsed
    ):
        raise MalformedArrow(f"{META_SHAPE} must be a list of non-negative ints, got {text!r:.60}")
    shape = tuple(parsed)
    if size is not None and math.prod(shape) != size:
        raise MalformedArrow(f"{META_SHAPE} {list(shape)} does not match {size} values")
    return shape
