from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gradfed_ipfs.errors import MalformedArrow
from gradfed_ipfs.formats import (
    decode_gradient,
    encode_arrow_file,
    load_gradient_from_arrow,
    load_layer_from_arrow,
    open_arrow_file,
    store_gradient_as_arrow,
    store_layer_as_arrow,
)
from gradfed_ipfs.tensor import (
    CODECS,
    DenseGradient,
    GradientCompressor,
    LayerGradient,
    QuantizedGradient,
    SparseGradient,
    SparseQuantizedGradient,
)

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-1e4, max_value=1e4)


def schema_of(data: bytes) -> pa.Schema:
    schema, _ = open_arrow_file(data)
    return schema


def same_layer(a: LayerGradient, b: LayerGradient) -> None:
    assert type(a) is type(b)
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.to_dense(), b.to_dense())


# ---------------------------------------------------------------- round trips


def test_sparse_block_layout_and_round_trip() -> None:
    sparse = SparseGradient([0, 5, 10], [1, 2, 3], [4, 5])
    data = store_layer_as_arrow(sparse, "fc.weight")
    schema = schema_of(data)
    assert schema.field("index").type == pa.uint32()
    assert schema.field("value").type == pa.float32()
    assert schema.metadata[b"gradfed.encoding"] == b"sparse"
    layer, name = load_layer_from_arrow(data)
    assert name == "fc.weight"
    assert isinstance(layer, SparseGradient)
    np.testing.assert_array_equal(layer.indices, [0, 5, 10])
    dense = load_gradient_from_arrow(data)
    assert dense.shape == (4, 5)
    np.testing.assert_array_equal(dense.reshape(-1), sparse.to_dense())
    decoded = decode_gradient(data)
    assert decoded.encoding == "sparse"
    assert decoded.layer == "fc.weight"


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_block_layout_and_round_trip(bits: int) -> None:
    values = np.linspace(-1, 2, 11, dtype=np.float32)
    quantized = QuantizedGradient.from_dense(values, [11], bits=bits)
    data = store_layer_as_arrow(quantized)
    schema = schema_of(data)
    assert schema.metadata[b"gradfed.encoding"] == b"quantized"
    assert schema.metadata[b"gradfed.bits"] == str(bits).encode()
    assert schema.field("q").type == (pa.int8() if bits == 8 else pa.uint8())
    _, batches = open_arrow_file(data)
    assert batches[0].num_rows == (11 if bits == 8 else 6)
    layer, _ = load_layer_from_arrow(data)
    assert isinstance(layer, QuantizedGradient)
    np.testing.assert_array_equal(layer.quantized_values, quantized.quantized_values)
    assert (layer.scale, layer.min_val, layer.bits) == (quantized.scale, quantized.min_val, bits)
    np.testing.assert_array_equal(load_gradient_from_arrow(data), quantized.to_dense())


def test_dense_inputs() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    for layer in (array, DenseGradient(array), array.tolist()):
        data = store_layer_as_arrow(layer, "w")  # type: ignore[arg-type]
        np.testing.assert_array_equal(load_gradient_from_arrow(data), array)
        assert decode_gradient(data).encoding == "dense"


@pytest.mark.parametrize("codec_id", sorted(CODECS))
@given(values=hnp.arrays(np.float32, st.integers(0, 300), elements=finite32))
def test_every_codec_payload_round_trips_through_arrow(codec_id: str, values: np.ndarray) -> None:
    codec = CODECS[codec_id]
    payload = codec.encode(values)
    data = store_layer_as_arrow(payload, codec_id)
    layer, name = load_layer_from_arrow(data)
    assert name == codec_id
    same_layer(layer, payload)
    np.testing.assert_array_equal(load_gradient_from_arrow(data), codec.decode(payload))


def test_top_k_int8_block_is_over_20x_smaller_than_dense() -> None:
    values = np.random.default_rng(0).normal(size=200_000).astype(np.float32)
    dense = store_gradient_as_arrow(values)
    payload = GradientCompressor.top_k_quantized(values, None, 2_000)
    compressed = store_layer_as_arrow(payload)
    assert len(dense) / len(compressed) >= 20
    assert isinstance(load_layer_from_arrow(compressed)[0], SparseQuantizedGradient)
    decoded = load_gradient_from_arrow(compressed)
    assert np.abs(decoded - values).max() <= CODECS["topk-int8"].error_bound(values) + 1e-6 or (
        np.abs(decoded - payload.to_dense()).max() == 0
    )


def test_int64_indices_for_huge_tensors_and_size_cap() -> None:
    sparse = SparseGradient([0, 2**32 + 5], [1, 2], [2**33])
    data = store_layer_as_arrow(sparse)
    assert schema_of(data).field("index").type == pa.int64()
    with pytest.raises(MalformedArrow, match="cap"):
        load_gradient_from_arrow(data)
    layer, _ = load_layer_from_arrow(data, max_elements=2**34)
    assert isinstance(layer, SparseGradient)
    np.testing.assert_array_equal(layer.indices, [0, 2**32 + 5])


def test_encoder_refuses_inconsistent_layers() -> None:
    with pytest.raises(MalformedArrow):
        store_layer_as_arrow(SparseGradient([9], [1], [4]))
    with pytest.raises(MalformedArrow):
        store_layer_as_arrow(SparseGradient([0, 1], [1], [4]))
    with pytest.raises(MalformedArrow):
        store_layer_as_arrow(QuantizedGradient([1, 2], 1.0, 0.0, [3]))


# ---------------------------------------------------------------- untrusted bytes


def forged(columns: dict[str, Any], **meta: str) -> bytes:
    metadata = {"gradfed.shape": "[4]", "gradfed.dtype": "float32"}
    metadata.update({k.replace("_", "."): v for k, v in meta.items()})
    return encode_arrow_file(columns, metadata)


def q8(*values: int) -> pa.Array:
    return pa.array(values, pa.int8())


GOOD_Q = {"gradfed.bits": "8", "gradfed.scale": "0.5", "gradfed.zero_point": "0.0"}


@pytest.mark.parametrize(
    "data",
    [
        forged({"value": pa.array([1.0], pa.float32())}, gradfed_encoding="zip"),
        forged({"value": pa.array([1.0], pa.float32())}, gradfed_dtype="float64"),
        # sparse: out of bounds, negative, wrong index type, missing value
        forged(
            {"index": pa.array([4], pa.uint32()), "value": pa.array([1.0], pa.float32())},
            gradfed_encoding="sparse",
        ),
        forged(
            {"index": pa.array([-1], pa.int64()), "value": pa.array([1.0], pa.float32())},
            gradfed_encoding="sparse",
        ),
        forged(
            {"index": pa.array([1], pa.int32()), "value": pa.array([1.0], pa.float32())},
            gradfed_encoding="sparse",
        ),
        forged({"index": pa.array([1], pa.uint32())}, gradfed_encoding="sparse"),
        forged(
            {"index": pa.array([1], pa.uint32()), "value": pa.array([1.0], pa.float32())},
            gradfed_encoding="sparse",
            gradfed_shape="[1e9]",
        ),
        forged(
            {"index": pa.array([1], pa.uint32()), "value": pa.array([1.0], pa.float32())},
            gradfed_encoding="sparse",
            gradfed_shape="[65536, 65536, 65536]",
        ),
        # quantized: wrong count, bits, scale, zero point, column type, missing metadata
        forged(
            {"q": q8(1, 2, 3)},
            gradfed_encoding="quantized",
            gradfed_count="4",
            **{k.replace(".", "_"): v for k, v in GOOD_Q.items()},
        ),
        forged(
            {"q": q8(1, 2, 3, 4)},
            gradfed_encoding="quantized",
            gradfed_count="4",
            gradfed_bits="5",
            gradfed_scale="0.5",
            gradfed_zero_point="0",
        ),
        forged(
            {"q": q8(1, 2, 3, 4)},
            gradfed_encoding="quantized",
            gradfed_count="4",
            gradfed_bits="8",
            gradfed_scale="nan",
            gradfed_zero_point="0",
        ),
        forged(
            {"q": q8(1, 2, 3, 4)},
            gradfed_encoding="quantized",
            gradfed_count="4",
            gradfed_bits="8",
            gradfed_scale="-1",
            gradfed_zero_point="0",
        ),
        forged(
            {"q": q8(1, 2, 3, 4)},
            gradfed_encoding="quantized",
            gradfed_count="4",
            gradfed_bits="8",
            gradfed_scale="1e300",
            gradfed_zero_point="0",
        ),
        forged(
            {"q": q8(1, 2, 3, 4)},
            gradfed_encoding="quantized",
            gradfed_count="4",
            gradfed_bits="8",
            gradfed_scale="1",
            gradfed_zero_point="inf",
        ),
        forged(
            {"q": q8(1, 2, 3, 4)},
            gradfed_encoding="quantized",
            gradfed_count="-4",
            gradfed_bits="8",
            gradfed_scale="1",
            gradfed_zero_point="0",
        ),
        forged(
            {"q": q8(1, 2, 3, 4)},
            gradfed_encoding="quantized",
            gradfed_bits="8",
            gradfed_scale="1",
            gradfed_zero_point="0",
        ),
        forged(
            {"q": pa.array([1, 2, 3, 4], pa.int16())},
            gradfed_encoding="quantized",
            gradfed_count="4",
            gradfed_bits="8",
            gradfed_scale="1",
            gradfed_zero_point="0",
        ),
        forged(
            {"q": pa.array([1, 2, 3], pa.uint8())},
            gradfed_encoding="quantized",
            gradfed_count="4",
            gradfed_bits="4",
            gradfed_scale="1",
            gradfed_zero_point="0",
        ),
        forged(
            {"index": pa.array([0, 9], pa.uint32()), "q": q8(1, 2)},
            gradfed_encoding="sparse-quantized",
            gradfed_count="2",
            gradfed_bits="8",
            gradfed_scale="1",
            gradfed_zero_point="0",
        ),
    ],
)
def test_forged_blocks_raise_malformed_arrow(data: bytes) -> None:
    with pytest.raises(MalformedArrow):
        load_gradient_from_arrow(data)


def test_nulls_are_refused() -> None:
    schema = pa.schema(
        [pa.field("index", pa.uint32()), pa.field("value", pa.float32())],
        metadata={"gradfed.encoding": "sparse", "gradfed.shape": "[4]"},
    )
    batch = pa.record_batch(
        [pa.array([0, None], pa.uint32()), pa.array([1.0, 2.0], pa.float32())], schema=schema
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(batch)
    with pytest.raises(MalformedArrow, match="nulls"):
        load_gradient_from_arrow(sink.getvalue().to_pybytes())


@pytest.mark.parametrize(
    "layer",
    [
        DenseGradient(np.arange(64, dtype=np.float32)),
        SparseGradient([1, 3, 7], [1, 2, 3], [8]),
        QuantizedGradient.from_dense(np.arange(9, dtype=np.float32), bits=4),
        GradientCompressor.top_k_quantized(np.arange(32, dtype=np.float32), None, 4),
    ],
    ids=lambda layer: type(layer).__name__,
)
def test_bit_flips_never_escape_as_foreign_errors(layer: LayerGradient) -> None:
    data = store_layer_as_arrow(layer)
    rng = np.random.default_rng(5)
    for _ in range(300):
        mutated = bytearray(data)
        position = int(rng.integers(len(mutated)))
        mutated[position] ^= 1 << int(rng.integers(8))
        try:
            out = load_gradient_from_arrow(bytes(mutated))
        except MalformedArrow:
            continue
        assert out.dtype == np.float32
