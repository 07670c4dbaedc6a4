from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gradfed_ipfs.errors import MalformedArrow
from gradfed_ipfs.formats import (
    decode_gradient,
    load_gradient_from_arrow,
    store_gradient_as_arrow,
)


def seed_layout(values: np.ndarray) -> bytes:
    """The seed's layout: Int32 index + Float32 value, no metadata."""
    schema = pa.schema(
        [pa.field("index", pa.int32(), nullable=False), pa.field("value", pa.float32(), False)]
    )
    batch = pa.record_batch(
        [pa.array(np.arange(values.size, dtype=np.int32)), pa.array(values)], schema=schema
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


@given(
    hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=16),
        elements=st.floats(width=32, allow_nan=True, allow_infinity=True),
    )
)
def test_round_trip_any_float32_array(values: np.ndarray) -> None:
    data = store_gradient_as_arrow(values)
    assert data[:6] == b"ARROW1"
    out = load_gradient_from_arrow(data)
    assert out.shape == values.shape
    assert out.dtype == np.float32
    # Bit-exact, NaN payloads included.
    np.testing.assert_array_equal(out.view(np.uint32), values.view(np.uint32))


def test_seed_round_trip_1000_values() -> None:
    values = np.arange(1000, dtype=np.float32) * np.float32(0.001)
    out = load_gradient_from_arrow(store_gradient_as_arrow(values))
    np.testing.assert_allclose(out, values, atol=1e-6)


def test_empty_round_trip() -> None:
    out = load_gradient_from_arrow(store_gradient_as_arrow([]))
    assert out.size == 0


def test_decoding_is_zero_copy() -> None:
    data = store_gradient_as_arrow(np.ones(1024, dtype=np.float32))
    buffer = memoryview(data)
    out = load_gradient_from_arrow(buffer)
    assert not out.flags.writeable  # a read-only view on `data`, not a fresh copy
    base = np.frombuffer(data, dtype=np.uint8)
    start = base.ctypes.data
    assert start <= out.ctypes.data < start + len(data)


def test_metadata_and_layer() -> None:
    decoded = decode_gradient(store_gradient_as_arrow(np.zeros((2, 3)), layer="fc1.weight"))
    assert decoded.shape == (2, 3)
    assert decoded.layer == "fc1.weight"
    assert decoded.metadata["gradfed.dtype"] == "float32"


@given(st.lists(st.floats(width=32, allow_nan=False), max_size=200))
def test_seed_index_value_layout_loads(values: list[float]) -> None:
    array = np.asarray(values, dtype=np.float32)
    np.testing.assert_array_equal(load_gradient_from_arrow(seed_layout(array)), array)


@pytest.mark.parametrize(
    "data",
    [b"", b"ARROW1", b"not arrow at all", b"ARROW1" + b"\0" * 64 + b"ARROW1", b"\xff" * 100],
)
def test_malformed_bytes_raise_typed_error(data: bytes) -> None:
    with pytest.raises(MalformedArrow):
        load_gradient_from_arrow(data)


def test_truncated_files_raise_typed_error() -> None:
    # Bit flips of every encoding, dense included: tests/tensor/test_arrow_encodings.py.
    data = store_gradient_as_arrow(np.arange(64, dtype=np.float32))
    for cut in (len(data) // 2, len(data) - 1, 10):
        with pytest.raises(MalformedArrow):
            load_gradient_from_arrow(data[:cut])


def test_missing_value_column_and_wrong_type() -> None:
    schema = pa.schema([pa.field("value", pa.float64(), nullable=False)])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(pa.record_batch([pa.array([1.0])], schema=schema))
    with pytest.raises(MalformedArrow, match="not Float32"):
        load_gradient_from_arrow(sink.getvalue().to_pybytes())
    schema = pa.schema([pa.field("other", pa.float32(), nullable=False)])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(pa.record_batch([pa.array([1.0], pa.float32())], schema=schema))
    with pytest.raises(MalformedArrow, match="missing 'value'"):
        load_gradient_from_arrow(sink.getvalue().to_pybytes())


def test_lying_shape_metadata_is_refused() -> None:
    data = store_gradient_as_arrow(np.zeros(6, dtype=np.float32), shape=(2, 3))
    forged = data.replace(b"[2, 3]", b"[3, 3]")
    with pytest.raises(MalformedArrow):
        load_gradient_from_arrow(forged)
