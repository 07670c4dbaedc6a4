from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import ChecksumFailed, InvalidGradient, ShapeMismatch
from gradfed_ipfs.tensor import GradientDelta
from gradfed_ipfs.tensor.types import (
    DenseGradient,
    LayerGradient,
    QuantizedGradient,
    SparseGradient,
    SparseQuantizedGradient,
    TensorDtype,
    pack_int4,
    unpack_int4,
)

BASE = make_cid(b"base model")

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)


def test_tensor_dtype_sizes_and_names() -> None:
    sizes = [t.element_size for t in TensorDtype]
    assert sizes == [4, 8, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2]
    assert str(TensorDtype.FLOAT32) == "float32"
    assert TensorDtype.BFLOAT16.numpy_dtype == np.uint16
    assert TensorDtype.INT8.numpy_dtype == np.int8


# ---------------------------------------------------------------- seed §11: sparse


def test_sparse_gradient_seed() -> None:
    sparse = SparseGradient([0, 5, 10], [1, 2, 3], [20])
    assert sparse.nnz() == 3
    assert sparse.total_elements() == 20
    assert sparse.sparsity_ratio() == pytest.approx(0.85)
    dense = sparse.to_dense()
    assert (dense[0], dense[5], dense[10]) == (1.0, 2.0, 3.0)
    assert np.count_nonzero(dense) == 3
    assert sparse.metadata.name == "sparse_gradient"
    assert sparse.memory_size() == 24


def test_sparse_to_dense_drops_out_of_range_and_last_duplicate_wins() -> None:
    sparse = SparseGradient([1, 1, 7, -1], [1, 2, 3, 4], [4])
    np.testing.assert_array_equal(sparse.to_dense(), [0, 2, 0, 0])


def test_sparse_verify_shape_errors() -> None:
    with pytest.raises(InvalidGradient, match="Index 7 out of bounds"):
        SparseGradient([7], [1], [4]).verify_shape()
    with pytest.raises(InvalidGradient, match="Indices length 2 != values length 1"):
        SparseGradient([0, 1], [1], [4]).verify_shape()
    SparseGradient([0, 3], [1, 2], [2, 2]).verify_shape()


def test_sparse_zero_total_has_nan_sparsity() -> None:
    assert math.isnan(SparseGradient([], [], [0]).sparsity_ratio())
    assert SparseGradient([], [], []).total_elements() == 1


@given(hnp.arrays(np.float32, st.integers(0, 300), elements=finite32))
def test_sparse_dense_round_trip_is_exact(values: np.ndarray) -> None:
    indices = np.flatnonzero(values)
    sparse = SparseGradient(indices, values[indices], [values.size])
    sparse.verify_shape()
    np.testing.assert_array_equal(sparse.to_dense(), values)


@given(st.data())
def test_sparse_to_dense_and_back_is_exact(data: st.DataObject) -> None:
    total = data.draw(st.integers(1, 500))
    indices = data.draw(st.sets(st.integers(0, total - 1), max_size=total))
    ordered = np.array(sorted(indices), dtype=np.int64)
    nonzero = finite32.filter(lambda v: v != 0)
    values = np.array(
        data.draw(st.lists(nonzero, min_size=ordered.size, max_size=ordered.size)),
        dtype=np.float32,
    )
    sparse = SparseGradient(ordered, values, [total])
    dense = sparse.to_dense()
    back = np.flatnonzero(dense)
    np.testing.assert_array_equal(back, ordered)
    np.testing.assert_array_equal(dense[back], values)


# ---------------------------------------------------------------- seed §11: quantized


def test_quantized_worked_example() -> None:
    quantized = QuantizedGradient.from_dense([1, 2, 3, 4, 5], [5])
    np.testing.assert_array_equal(quantized.quantized_values, [-128, -64, -1, 63, 127])
    assert quantized.scale == pytest.approx(4 / 255)
    assert quantized.min_val == 1.0
    np.testing.assert_allclose(quantized.to_dense(), [1.0, 2.0039, 2.9922, 3.9961, 5.0], atol=1e-4)
    assert np.all(np.abs(quantized.to_dense() - [1, 2, 3, 4, 5]) < 0.02)
    assert quantized.compression_ratio() == pytest.approx(20 / 13)
    assert quantized.memory_size() == 13


def test_quantized_edge_cases() -> None:
    empty = QuantizedGradient.from_dense([], [0])
    assert empty.scale == 1.0
    assert empty.min_val == 0.0
    assert empty.compression_ratio() == 0.0
    constant = QuantizedGradient.from_dense([2.5] * 4)
    assert constant.scale == 1.0
    np.testing.assert_array_equal(constant.to_dense(), [2.5] * 4)
    with pytest.raises(InvalidGradient):
        QuantizedGradient.from_dense([1.0, float("nan")])
    with pytest.raises(InvalidGradient):
        QuantizedGradient.from_dense([1.0], bits=3)


def test_round_half_away_from_zero() -> None:
    # (v - 0)/1 - 128 with span 255 → scale 1: 0.5 steps fall exactly on ties.
    values = np.array([0, 255, 127.5, 128.5, 126.5], dtype=np.float32)
    quantized = QuantizedGradient.from_dense(values)
    assert quantized.scale == 1.0
    # 127.5-128 = -0.5 → -1; 128.5-128 = 0.5 → 1; 126.5-128 = -1.5 → -2
    np.testing.assert_array_equal(quantized.quantized_values, [-128, 127, -1, 1, -2])


@pytest.mark.parametrize("bits", [8, 4])
@given(values=hnp.arrays(np.float32, st.integers(1, 300), elements=finite32))
def test_quantization_error_at_most_half_scale(bits: int, values: np.ndarray) -> None:
    quantized = QuantizedGradient.from_dense(values, bits=bits)
    error = np.abs(quantized.to_dense() - values)
    slack = 8 * np.finfo(np.float32).eps * float(np.abs(values).max())
    if quantized.scale == 1.0 and np.ptp(values) < 1e-8:
        assert error.max() <= 1e-8 + slack
    else:
        assert error.max() <= quantized.scale / 2 + slack
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    assert quantized.quantized_values.min() >= low
    assert quantized.quantized_values.max() <= high


@given(st.lists(st.integers(-8, 7), max_size=99))
def test_int4_pack_unpack(values: list[int]) -> None:
    q = np.asarray(values, dtype=np.int8)
    packed = pack_int4(q)
    assert packed.size == (q.size + 1) // 2
    np.testing.assert_array_equal(unpack_int4(packed, q.size), q)


def test_int4_memory_size_two_values_per_byte() -> None:
    quantized = QuantizedGradient.from_dense(np.arange(10, dtype=np.float32), bits=4)
    assert quantized.memory_size() == 5 + 8
    assert quantized.packed().size == 5


# ---------------------------------------------------------------- layer union


def test_layer_gradient_union() -> None:
    dense = LayerGradient.Dense([[1, 2], [3, 4]])
    assert dense.shape == (2, 2)
    assert dense.memory_size() == 16
    sparse = LayerGradient.Sparse([1], [5], [2, 2])
    quantized = LayerGradient.Quantized.from_dense([1, 2, 3, 4], [2, 2])
    mixed = LayerGradient.SparseQuantized([0, 3], QuantizedGradient.from_dense([1, 2]), [4])
    for layer in (dense, sparse, quantized, mixed):
        assert isinstance(layer, LayerGradient)
        assert layer.to_dense().dtype == np.float32
    np.testing.assert_allclose(mixed.to_dense(), [1, 0, 0, 2])
    assert isinstance(mixed, SparseQuantizedGradient)
    assert mixed.memory_size() == 8 + 2 + 8


def test_dense_shape_checked() -> None:
    with pytest.raises(ShapeMismatch):
        DenseGradient([1, 2, 3], [2, 2])


# ---------------------------------------------------------------- delta


def test_gradient_delta_seed() -> None:
    delta = GradientDelta(BASE)
    delta.add_dense_gradient("layer1", [1, 2, 3, 4], [2, 2])
    delta.add_dense_gradient("layer2", [5, 6], [2])
    assert len(delta.layer_gradients) == 2
    delta.verify_checksum()
    assert len(delta.checksum) == 64
    assert delta.total_memory_size() == 24
    np.testing.assert_array_equal(delta.dense_layer("layer1"), [[1, 2], [3, 4]])


def test_delta_checksum_covers_base_kind_and_names() -> None:
    def build(base: object, name: str = "w", sparse: bool = False) -> str:
        delta = GradientDelta(base, timestamp=0)  # type: ignore[arg-type]
        if sparse:
            delta.add_sparse_gradient(name, SparseGradient([0, 1], [1, 2], [2]))
        else:
            delta.add_dense_gradient(name, [1, 2], [2])
        return delta.checksum

    reference = build(BASE)
    assert build(str(BASE)) == reference  # same CID, any form
    assert build(make_cid(b"other")) != reference
    assert build(BASE, name="v") != reference
    assert build(BASE, sparse=True) != reference
    delta = GradientDelta(BASE, timestamp=123)
    delta.add_dense_gradient("w", [1, 2], [2])
    assert delta.checksum == reference  # the timestamp is not covered


def test_delta_detects_tampering() -> None:
    delta = GradientDelta(BASE)
    delta.add_quantized_gradient("q", QuantizedGradient.from_dense([1, 2, 3]))
    delta.verify_checksum()
    layer = delta.layer_gradients["q"]
    assert isinstance(layer, QuantizedGradient)
    layer.quantized_values[1] += 1
    with pytest.raises(ChecksumFailed):
        delta.verify_checksum()


@given(st.integers(0, 10_239), finite32)
def test_checksum_changes_with_any_single_value(position: int, new_value: float) -> None:
    values = np.linspace(-1, 1, 10_240, dtype=np.float32)
    delta = GradientDelta(BASE, timestamp=0)
    delta.add_dense_gradient("w", values, [10_240])
    before = delta.checksum
    changed = values.copy()
    changed[position] = new_value
    if changed.view(np.uint32)[position] == values.view(np.uint32)[position]:
        return
    delta.add_dense_gradient("w", changed, [10_240])
    assert delta.checksum != before


def test_checksum_changes_at_element_10000() -> None:
    values = np.zeros(20_000, dtype=np.float32)
    delta = GradientDelta(BASE, timestamp=0)
    delta.add_dense_gradient("w", values)
    before = delta.checksum
    layer = delta.layer_gradients["w"]
    assert isinstance(layer, DenseGradient)
    layer.values[10_000] = 1e-30
    with pytest.raises(ChecksumFailed):
        delta.verify_checksum()
    assert delta.compute_checksum() != before


def test_delta_rejects_non_layers() -> None:
    delta = GradientDelta(BASE)
    with pytest.raises(InvalidGradient):
        delta.add_layer("x", [1, 2, 3])  # type: ignore[arg-type]


@pytest.mark.parametrize("bits", [8, 4])
def test_blockwise_quantizer_matches_reference_across_blocks(bits: int) -> None:
    rng = np.random.default_rng(9)
    values = rng.normal(size=200_003).astype(np.float32)
    values[:3] = [0.0, 255.0, 127.5]  # exact ties once the scale is 1 (int8)
    quantized = QuantizedGradient.from_dense(values, bits=bits)
    lo, scale = np.float32(values.min()), np.float32(quantized.scale)
    offset = np.float32(2 ** (bits - 1))
    z = (values - lo) / scale - offset
    whole = np.trunc(z)
    expected = np.where(np.abs(z - whole) >= 0.5, whole + np.sign(z), whole)
    expected = np.clip(expected, -offset, offset - 1).astype(np.int8)
    np.testing.assert_array_equal(quantized.quantized_values, expected)
