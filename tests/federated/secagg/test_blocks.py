from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from gradfed_ipfs.errors import DecodeError, MalformedArrow
from gradfed_ipfs.federated.secagg.blocks import (
    MASKED_COLUMN,
    decode_masked_block,
    encode_masked_block,
)
from gradfed_ipfs.formats import encode_arrow_file, store_gradient_as_arrow


def ring(bits: int, d: int = 1000, seed: int = 0) -> np.ndarray:
    dtype = np.uint32 if bits == 32 else np.uint64
    return np.random.default_rng(seed).integers(0, np.iinfo(dtype).max, d, dtype=dtype)


def block(column: pa.Array, **meta: str) -> bytes:
    return encode_arrow_file({MASKED_COLUMN: column}, meta)


@pytest.mark.parametrize("bits", [32, 64])
def test_round_trip_is_exact_and_writable(bits: int) -> None:
    vector = ring(bits)
    decoded = decode_masked_block(encode_masked_block(vector), ring_bits=bits, expected_length=1000)
    assert decoded.dtype == vector.dtype
    np.testing.assert_array_equal(decoded, vector)
    decoded += 1  # a copy the caller may sum into


def test_ring_words_that_are_nan_as_float32_survive() -> None:
    nan_words = np.array([0x7FC00000, 0xFFFFFFFF, 0x7F800000], dtype=np.uint32)
    decoded = decode_masked_block(encode_masked_block(nan_words), ring_bits=32)
    np.testing.assert_array_equal(decoded, nan_words)


def test_empty_vector_round_trips() -> None:
    empty = np.empty(0, dtype=np.uint32)
    assert decode_masked_block(encode_masked_block(empty), ring_bits=32).size == 0


@pytest.mark.parametrize(
    "bad", [np.zeros(3, np.float32), np.zeros(3, np.int32), np.zeros((2, 2), np.uint32)]
)
def test_encoder_refuses_non_ring_vectors(bad: np.ndarray) -> None:
    with pytest.raises(MalformedArrow):
        encode_masked_block(bad)


def good_meta(n: int, encoding: str = "secagg-u32") -> dict[str, str]:
    return {
        "gradfed.encoding": encoding,
        "gradfed.count": str(n),
        "gradfed.shape": json.dumps([n]),
    }


u32 = pa.array(np.arange(4, dtype=np.uint32), type=pa.uint32())

MALFORMED: dict[str, tuple[bytes, dict[str, object]]] = {
    "not arrow": (b"\x00" * 64, {}),
    "truncated": (encode_masked_block(ring(32, 4))[:-10], {}),
    "float gradient block": (store_gradient_as_arrow(np.ones(4, np.float32)), {}),
    "no encoding": (block(u32, **{"gradfed.count": "4"}), {}),
    "wrong ring width": (encode_masked_block(ring(64, 4)), {}),
    "column type lies": (block(pa.array([1, 2, 3, 4], pa.int32()), **good_meta(4)), {}),
    "u64 column under u32": (block(pa.array([1, 2, 3, 4], pa.uint64()), **good_meta(4)), {}),
    "count mismatch": (block(u32, **good_meta(5)), {}),
    "count not a number": (block(u32, **{**good_meta(4), "gradfed.count": "-4"}), {}),
    "shape mismatch": (block(u32, **{**good_meta(4), "gradfed.shape": "[2, 2]"}), {}),
    "unexpected length": (encode_masked_block(ring(32, 4)), {"expected_length": 5}),
    "over the cap": (encode_masked_block(ring(32, 4)), {"max_elements": 3}),
    "extra column": (
        encode_arrow_file({MASKED_COLUMN: u32, "extra": u32}, good_meta(4)),
        {},
    ),
    "wrong column name": (encode_arrow_file({"value": u32}, good_meta(4)), {}),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_blocks_raise_malformed_arrow(name: str) -> None:
    data, kwargs = MALFORMED[name]
    with pytest.raises(MalformedArrow):
        decode_masked_block(data, ring_bits=32, **kwargs)  # type: ignore[arg-type]


def test_nulls_are_rejected() -> None:
    # encode_arrow_file declares columns non-nullable; build a nullable one by hand.
    column = pa.array([1, None, 3], type=pa.uint32())
    schema = pa.schema([pa.field(MASKED_COLUMN, pa.uint32())], metadata=good_meta(3))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(pa.record_batch([column], schema=schema))
    with pytest.raises(DecodeError, match="nulls"):
        decode_masked_block(sink.getvalue().to_pybytes(), ring_bits=32)


def test_bad_ring_bits_argument() -> None:
    with pytest.raises(MalformedArrow):
        decode_masked_block(encode_masked_block(ring(32, 4)), ring_bits=16)
