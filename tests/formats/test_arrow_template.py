"""Dense blocks by template: the same bytes as pyarrow's writer, and only those decoded fast."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gradfed_ipfs.formats import (
    decode_dense_block,
    decode_gradient,
    encode_arrow_file,
    load_gradient_from_arrow,
    store_gradient_as_arrow,
    store_layer_as_arrow,
)
from gradfed_ipfs.formats.arrow import _encode_dense
from gradfed_ipfs.tensor import SparseGradient

FLOATS = hnp.arrays(
    np.float32,
    st.integers(1, 3000),
    elements=st.floats(width=32, allow_nan=True, allow_infinity=True),
)


@given(values=FLOATS, offset=st.none() | st.integers(0, 2**40))
@settings(max_examples=60, deadline=None)
def test_template_encoding_is_the_writers_bytes_and_decodes_to_the_values(
    values: np.ndarray, offset: int | None
) -> None:
    block = store_gradient_as_arrow(values, offset=offset)
    assert block == _encode_dense(values, values.shape, None, offset)  # pyarrow's own bytes
    fast = decode_dense_block(block, values.size, offset=offset)
    assert fast is not None
    assert fast.tobytes() == values.tobytes()  # NaN payloads and signed zeros included
    assert load_gradient_from_arrow(block).tobytes() == values.tobytes()


@pytest.mark.parametrize("shape", [(2, 3), (1, 1, 6), (6,)])
def test_a_recorded_shape_is_part_of_the_layout(shape: tuple[int, ...]) -> None:
    values = np.arange(6, dtype=np.float32).reshape(shape)
    block = store_gradient_as_arrow(values)
    assert block == _encode_dense(values.reshape(-1), shape, None, None)
    assert decode_gradient(block).shape == shape
    fast = decode_dense_block(block, 6, shape=shape)
    assert fast is not None
    assert np.array_equal(fast, values.reshape(-1))
    if shape != (6,):
        assert decode_dense_block(block, 6) is None  # flat (6,) is another layout


def test_only_the_exact_canonical_bytes_of_the_expected_layout_decode_fast() -> None:
    values = np.linspace(-1, 1, 1000, dtype=np.float32)
    block = store_gradient_as_arrow(values, offset=4000)
    assert decode_dense_block(block, 1000, offset=4000) is not None
    assert decode_dense_block(block, 1000, offset=4001) is None  # the manifest says elsewhere
    assert decode_dense_block(block, 1000) is None  # no offset expected
    assert decode_dense_block(block, 999, offset=4000) is None
    assert decode_dense_block(block[:-1], 1000, offset=4000) is None
    assert decode_dense_block(block + b"\0", 1000, offset=4000) is None
    values_at = block.index(values.tobytes())
    for at in (0, 7, values_at - 1, values_at + 4000, len(block) - 1):  # framing bytes
        flipped = bytearray(block)
        flipped[at] ^= 0x01
        assert decode_dense_block(bytes(flipped), 1000, offset=4000) is None
    named = store_gradient_as_arrow(values, offset=4000, layer="fc1")  # metadata differs
    assert decode_dense_block(named, 1000, offset=4000) is None
    sparse = store_layer_as_arrow(SparseGradient(np.arange(1000), values, (1000,)))
    assert decode_dense_block(sparse, 1000) is None
    assert decode_dense_block(b"", 0) is None
    assert decode_dense_block(b"x" * 4100, 1000) is None  # not Arrow at all


def test_the_template_is_never_cut_for_a_length_the_bytes_cannot_hold() -> None:
    # A hostile manifest may declare a huge chunk: no 4 GB template is built for 1 KB of bytes.
    assert decode_dense_block(b"\0" * 1024, 2**30) is None


def test_empty_and_named_gradients_keep_the_writer() -> None:
    empty = store_gradient_as_arrow(np.zeros(0, np.float32))
    assert empty == encode_arrow_file(
        {"value": pa.array([], type=pa.float32())},
        {"gradfed.encoding": "dense", "gradfed.shape": "[0]", "gradfed.dtype": "float32"},
    )
    assert load_gradient_from_arrow(empty).size == 0
