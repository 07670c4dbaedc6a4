"""Gradients as Arrow IPC *file* bytes (magic ``ARROW1``): the payload of every gradient block.

Layout written here (DESIGN §3): one record batch with a non-nullable Float32 column ``value``
holding the flattened (row-major) tensor. Schema metadata says how to read it back:

``gradfed.encoding``  ``dense``, ``sparse``, ``quantized`` or ``sparse-quantized``
``gradfed.shape``     JSON list of ints, e.g. ``[2, 3]``
``gradfed.dtype``     ``float32`` (the dtype of the decoded tensor)
``gradfed.layer``     the layer name, when there is one
``gradfed.offset``    for a chunk of a chunked gradient, the index of its first value

Compressed encodings (DESIGN §3) keep their parameters in the metadata, so decoding needs no
configuration:

``sparse``            ``index`` (UInt32, or Int64 when the tensor has 2³² or more elements)
                      plus ``value`` (Float32): the non-zero entries.
``quantized``         ``q``: Int8 values (``gradfed.bits=8``) or UInt8 bytes holding two int4
                      values each, low nibble first (``gradfed.bits=4``); with
                      ``gradfed.scale``, ``gradfed.zero_point`` and ``gradfed.count``.
``sparse-quantized``  ``index`` plus a ``q`` column as above (top-k + int8).

:func:`load_gradient_from_arrow` and :func:`decode_gradient` decode every encoding to the
dense float32 tensor; :func:`load_layer_from_arrow` returns the stored representation
(:class:`~gradfed_ipfs.tensor.types.SparseGradient` etc.). The loader also accepts the seed's
layout (an Int32 ``index`` column beside ``value`` and no metadata) and any number of record
batches. Decoding a single-batch dense file is zero-copy: the returned array is a read-only
view on the input buffer. Dense blocks are written, and when a caller knows the layout it
expects (:func:`decode_dense_block`: length, shape, chunk offset) read, by template
(:mod:`~gradfed_ipfs.formats.arrow.template`): only bytes identical to this writer's canonical
encoding of that layout take that path; everything else comes here.

Every byte given to the loader is untrusted: the footer and batch headers are checked before
pyarrow reads a batch (:mod:`~gradfed_ipfs.formats.arrow.footer`: no compressed bodies, no
repeated or overlapping batches, declared rows within budget), column types, lengths, index
bounds, shapes and quantization parameters are checked before use, decoded tensors are capped
at ``max_elements`` (and must hold ``expected_length`` elements when the caller knows it), JSON
metadata is depth-limited (:func:`~gradfed_ipfs.formats.limits.load_json`), and anything
malformed raises :class:`~gradfed_ipfs.errors.MalformedArrow`, never a pyarrow, NumPy or
recursion error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import pyarrow as pa

from ..._types import FloatArray, GradientLike
from ...errors import GradientError, MalformedArrow
from ...tensor.types import (
    DenseGradient,
    LayerGradient,
    QuantizedGradient,
    SparseGradient,
    SparseQuantizedGradient,
)
from ..limits import MAX_ARROW_BATCHES, MAX_DECODED_ELEMENTS, check_elements
from .fields import (
    _INDEX,
    _Q,
    _VALUE,
    META_BITS,
    META_COUNT,
    META_DTYPE,
    META_ENCODING,
    META_LAYER,
    META_OFFSET,
    META_SCALE,
    META_SHAPE,
    META_ZERO_POINT,
    check_indices,
    column,
    decode_metadata,
    parse_shape,
    quantized_column,
)
from .footer import scan_arrow_file
from .template import DenseLayout, template_for

__all__ = [
    "ARROW_MAGIC",
    "ENCODINGS",
    "MAX_DECODED_ELEMENTS",
    "META_BITS",
    "META_COUNT",
    "META_DTYPE",
    "META_ENCODING",
    "META_LAYER",
    "META_OFFSET",
    "META_SCALE",
    "META_SHAPE",
    "META_ZERO_POINT",
    "DecodedGradient",
    "decode_dense_block",
    "decode_gradient",
    "encode_arrow_file",
    "load_gradient_from_arrow",
    "load_layer_from_arrow",
    "open_arrow_file",
    "store_gradient_as_arrow",
    "store_layer_as_arrow",
]

ARROW_MAGIC: Final = b"ARROW1"
_MAX_FRAMING: Final = 64 * 1024
"""Most bytes a canonical dense block holds besides its values (~900 with a chunk offset)."""
_UINT32_LIMIT: Final = 2**32

ENCODINGS: Final = ("dense", "sparse", "quantized", "sparse-quantized")
"""Every ``gradfed.encoding`` this module writes and reads."""


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
    gradient: GradientLike,
    *,
    shape: tuple[int, ...] | None = None,
    layer: str | None = None,
    offset: int | None = None,
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
    offset
        For a chunk of a larger gradient: the index of its first value, recorded as
        ``gradfed.offset``. Equal chunks at different offsets then get different CIDs (a
        manifest may not name one block twice).

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
    if layer is None:
        template = template_for((flat.size, recorded, offset), _encode_layout)
        if template is not None:
            return template.encode(flat)
    return _encode_dense(flat, recorded, layer, offset)


def decode_dense_block(
    data: bytes | bytearray | memoryview,
    length: int,
    *,
    shape: tuple[int, ...] | None = None,
    offset: int | None = None,
) -> FloatArray | None:
    """Return the values of a canonical dense block of this layout, else ``None``.

    A read-only view on ``data`` when its bytes are exactly what :func:`store_gradient_as_arrow`
    writes for ``length`` values of ``shape`` (default ``(length,)``) at chunk ``offset``
    (:mod:`~gradfed_ipfs.formats.arrow.template`); ``None`` means "use the full decoder",
    which alone raises for malformed blocks.
    """
    if not 4 * length <= len(data) <= 4 * length + _MAX_FRAMING:
        return None  # not this layout: no template is cut for a length the bytes cannot hold
    layout = (length, (length,) if shape is None else shape, offset)
    template = template_for(layout, _encode_layout)
    return None if template is None else template.decode(data)


def _encode_layout(flat: FloatArray, layout: DenseLayout) -> bytes:
    return _encode_dense(flat, layout[1], None, layout[2])


def _encode_dense(
    flat: FloatArray, recorded: tuple[int, ...], layer: str | None, offset: int | None
) -> bytes:
    metadata = {
        META_ENCODING: "dense",
        META_SHAPE: json.dumps(list(recorded)),
        META_DTYPE: "float32",
    }
    if layer is not None:
        metadata[META_LAYER] = layer
    if offset is not None:
        metadata[META_OFFSET] = str(offset)
    return encode_arrow_file({_VALUE: pa.array(flat, type=pa.float32())}, metadata)


def encode_arrow_file(columns: Mapping[str, pa.Array], metadata: Mapping[str, str]) -> bytes:
    """Write non-nullable ``columns`` and schema ``metadata`` as a one-batch Arrow IPC file."""
    fields = [pa.field(name, col.type, nullable=False) for name, col in columns.items()]
    schema = pa.schema(fields, metadata=dict(metadata))
    batch = pa.record_batch(list(columns.values()), schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def load_gradient_from_arrow(
    data: bytes | bytearray | memoryview,
    *,
    max_elements: int = MAX_DECODED_ELEMENTS,
    expected_length: int | None = None,
) -> FloatArray:
    """Decode a gradient block of any encoding into a float32 array of its recorded shape.

    Single-batch dense files decode zero-copy (a read-only view on ``data``); the seed's
    ``index`` + ``value`` layout and multi-batch files decode to a flat array. Sparse and
    quantized blocks are densified.

    Parameters
    ----------
    data
        The block's bytes (untrusted).
    max_elements
        Most elements the decoded tensor may hold; checked before allocating.
    expected_length
        The element count the caller requires (from a manifest or announcement), if known.

    Raises
    ------
    MalformedArrow
        If ``data`` is not a gradient Arrow IPC file of a known encoding, a column or
        parameter is inconsistent, or the tensor has more than ``max_elements`` elements
        (or not ``expected_length``).
    """
    return decode_gradient(
        data, max_elements=max_elements, expected_length=expected_length
    ).tensor()


def open_arrow_file(
    data: bytes | bytearray | memoryview,
    *,
    max_rows: int = MAX_DECODED_ELEMENTS,
    expected_rows: int | None = None,
) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """Open untrusted Arrow IPC file bytes and return the schema and validated batches.

    The footer and batch headers are checked first
    (:func:`~gradfed_ipfs.formats.arrow.footer.scan_arrow_file`), so no batch is read,
    decompressed or repeated before its declared size passes.

    Parameters
    ----------
    data
        The file's bytes.
    max_rows
        Most rows the batches may declare in total.
    expected_rows
        The total row count required, if known.

    Raises
    ------
    MalformedArrow
        If the bytes are not a well-formed, uncompressed Arrow IPC file within the budget.
    """
    view = memoryview(data)
    if len(view) < 2 * len(ARROW_MAGIC) or bytes(view[:6]) != ARROW_MAGIC:
        raise MalformedArrow("not an Arrow IPC file (missing ARROW1 magic)")
    if bytes(view[-6:]) != ARROW_MAGIC:
        raise MalformedArrow("truncated Arrow IPC file (missing trailing ARROW1 magic)")
    layout = scan_arrow_file(view, max_batches=MAX_ARROW_BATCHES, max_rows=max_rows)
    check_elements(
        layout.rows,
        "Arrow block",
        max_elements=max_rows,
        expected=expected_rows,
        error=MalformedArrow,
    )
    try:
        reader = pa.ipc.open_file(pa.py_buffer(view))
        if reader.num_record_batches != len(layout.batch_rows):
            raise MalformedArrow("pyarrow and the footer scan disagree on the batch count")
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        for batch, rows in zip(batches, layout.batch_rows, strict=True):
            if batch.num_rows != rows:
                raise MalformedArrow(f"a batch holds {batch.num_rows} rows, its header {rows}")
            batch.validate(full=True)
        return reader.schema, batches
    except (pa.ArrowException, OSError, ValueError, IndexError, OverflowError) as exc:
        if isinstance(exc, MalformedArrow):
            raise
        raise MalformedArrow(f"malformed Arrow IPC file: {exc}") from exc


def decode_gradient(
    data: bytes | bytearray | memoryview,
    *,
    max_elements: int = MAX_DECODED_ELEMENTS,
    expected_length: int | None = None,
) -> DecodedGradient:
    """Decode a gradient block and its metadata; every encoding is densified.

    ``encoding`` on the result tells how the block was stored. Parameters as in
    :func:`load_gradient_from_arrow`.

    Raises
    ------
    MalformedArrow
        See :func:`load_gradient_from_arrow`.
    """
    layer, metadata = _decode_layer(data, max_elements, expected_length)
    encoding = metadata.get(META_ENCODING, "dense")
    return DecodedGradient(
        layer.to_dense(), layer.shape, encoding, metadata.get(META_LAYER), metadata
    )


def load_layer_from_arrow(
    data: bytes | bytearray | memoryview,
    *,
    max_elements: int = MAX_DECODED_ELEMENTS,
    expected_length: int | None = None,
) -> tuple[LayerGradient, str | None]:
    """Decode a gradient block into its stored representation and layer name.

    Parameters as in :func:`load_gradient_from_arrow`.

    Returns
    -------
    tuple
        ``(layer, name)``: a ``DenseGradient``, ``SparseGradient``, ``QuantizedGradient`` or
        ``SparseQuantizedGradient``, and ``gradfed.layer`` (or ``None``).

    Raises
    ------
    MalformedArrow
        See :func:`load_gradient_from_arrow`.
    """
    layer, metadata = _decode_layer(data, max_elements, expected_length)
    return layer, metadata.get(META_LAYER)


def store_layer_as_arrow(
    layer: LayerGradient | GradientLike, layer_name: str | None = None
) -> bytes:
    """Encode a dense array or any :class:`LayerGradient` as one Arrow IPC block.

    Parameters
    ----------
    layer
        A NumPy array or sequence (stored dense), or a ``DenseGradient``, ``SparseGradient``,
        ``QuantizedGradient`` or ``SparseQuantizedGradient``.
    layer_name
        Optional name recorded as ``gradfed.layer``.

    Returns
    -------
    bytes
        An ``ARROW1`` file in the layout of the module docstring.

    Raises
    ------
    MalformedArrow
        If the layer is inconsistent: indices out of bounds or of another length than the
        values, or a quantized payload of the wrong size.
    """
    if not isinstance(layer, LayerGradient):
        return store_gradient_as_arrow(layer, layer=layer_name)
    if isinstance(layer, DenseGradient):
        return store_gradient_as_arrow(layer.values, shape=layer.shape, layer=layer_name)
    metadata = {META_ENCODING: layer.kind, META_SHAPE: json.dumps(list(layer.shape))}
    metadata[META_DTYPE] = "float32"
    if layer_name is not None:
        metadata[META_LAYER] = layer_name
    columns: dict[str, pa.Array] = {}
    total = math.prod(layer.shape)
    if isinstance(layer, SparseGradient | SparseQuantizedGradient):
        count = (
            layer.values.size
            if isinstance(layer, SparseGradient)
            else layer.quantized.quantized_values.size
        )
        check_indices(layer.indices, count, total, MalformedArrow)
        index_type = pa.uint32() if total < _UINT32_LIMIT else pa.int64()
        columns[_INDEX] = pa.array(layer.indices, type=index_type)
    if isinstance(layer, SparseGradient):
        columns[_VALUE] = pa.array(layer.values, type=pa.float32())
    else:
        quantized = layer.quantized if isinstance(layer, SparseQuantizedGradient) else layer
        if not isinstance(quantized, QuantizedGradient):
            raise MalformedArrow(f"cannot encode {type(layer).__name__} as Arrow")
        if isinstance(layer, QuantizedGradient) and quantized.quantized_values.size != total:
            raise MalformedArrow(
                f"quantized layer has {quantized.quantized_values.size} values for shape "
                f"{list(layer.shape)}"
            )
        metadata.update(
            {
                META_BITS: str(quantized.bits),
                META_SCALE: repr(quantized.scale),
                META_ZERO_POINT: repr(quantized.min_val),
                META_COUNT: str(quantized.quantized_values.size),
            }
        )
        q_type = pa.int8() if quantized.bits == 8 else pa.uint8()
        payload = quantized.quantized_values if quantized.bits == 8 else quantized.packed()
        columns[_Q] = pa.array(payload, type=q_type)
    return encode_arrow_file(columns, metadata)


def _decode_layer(
    data: bytes | bytearray | memoryview, max_elements: int, expected_length: int | None
) -> tuple[LayerGradient, dict[str, str]]:
    schema, batches = open_arrow_file(data, max_rows=max_elements)
    metadata = decode_metadata(schema.metadata)
    encoding = metadata.get(META_ENCODING, "dense")
    if encoding not in ENCODINGS:
        raise MalformedArrow(f"unknown {META_ENCODING} {encoding!r:.40}")
    dtype = metadata.get(META_DTYPE, "float32")
    if dtype != "float32":
        raise MalformedArrow(f"unsupported {META_DTYPE} {dtype!r:.40}; only float32")
    try:
        if encoding == "dense":
            rows = sum(batch.num_rows for batch in batches)
            check_elements(
                rows,
                "dense block",
                max_elements=max_elements,
                expected=expected_length,
                error=MalformedArrow,
            )
            values = column(schema, batches, _VALUE, (pa.float32(),))
            shape = parse_shape(metadata.get(META_SHAPE), values.size)
            return DenseGradient(values, shape), metadata
        shape = parse_shape(metadata.get(META_SHAPE), None)
        total = math.prod(shape)
        check_elements(
            total,
            f"{encoding} block",
            max_elements=max_elements,
            expected=expected_length,
            error=MalformedArrow,
        )
        if encoding == "quantized":
            quantized = quantized_column(schema, batches, metadata, total)
            return QuantizedGradient(
                quantized.quantized_values,
                quantized.scale,
                quantized.min_val,
                shape,
                quantized.bits,
            ), metadata
        indices = column(schema, batches, _INDEX, (pa.uint32(), pa.int64())).astype(np.int64)
        if encoding == "sparse":
            values = column(schema, batches, _VALUE, (pa.float32(),))
            check_indices(indices, values.size, total, MalformedArrow)
            return SparseGradient(indices, values, shape), metadata
        quantized = quantized_column(schema, batches, metadata, indices.size)
        check_indices(indices, quantized.quantized_values.size, total, MalformedArrow)
        return SparseQuantizedGradient(indices, quantized, shape), metadata
    except GradientError as exc:
        raise MalformedArrow(f"inconsistent {encoding} block: {exc}") from exc
