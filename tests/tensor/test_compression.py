from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gradfed_ipfs.errors import ConfigError, InvalidCompressionRatio, ShapeMismatch
from gradfed_ipfs.tensor import (
    CODECS,
    Codec,
    ErrorFeedback,
    Int4,
    Int8,
    RandomK,
    SparseGradient,
    SparseQuantizedGradient,
    Threshold,
    TopK,
    TopKInt8,
)
from gradfed_ipfs.tensor.compression import GradientCompressor, top_k_indices

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-1e4, max_value=1e4)
vectors = hnp.arrays(np.float32, st.integers(1, 400), elements=finite32)


# ---------------------------------------------------------------- seed §11


def test_top_k_seed() -> None:
    sparse = GradientCompressor.top_k([1, 5, 2, 8, 3], [5], 2)
    assert sparse.nnz() == 2
    assert set(sparse.values.tolist()) == {8.0, 5.0}
    np.testing.assert_array_equal(sparse.indices, [1, 3])  # ascending index order


def test_top_k_invalid_k() -> None:
    with pytest.raises(InvalidCompressionRatio) as info:
        GradientCompressor.top_k([1, 2, 3], None, 0)
    assert info.value.ratio == 0.0
    with pytest.raises(InvalidCompressionRatio) as info:
        GradientCompressor.top_k([1, 2], None, 4)
    assert info.value.ratio == 2.0


def test_threshold_seed() -> None:
    sparse = GradientCompressor.threshold([0.1, 5, 0.2, 8, 0.3], None, 1.0)
    assert sparse.nnz() == 2
    np.testing.assert_array_equal(sparse.values, [5, 8])
    # inclusive, NaN never kept
    kept = GradientCompressor.threshold([1.0, float("nan"), -1.0, 0.9], None, 1.0)
    np.testing.assert_array_equal(kept.indices, [0, 2])


def test_quantize_alias() -> None:
    quantized = GradientCompressor.quantize([1, 2, 3, 4, 5], [5])
    np.testing.assert_array_equal(quantized.quantized_values, [-128, -64, -1, 63, 127])


# ---------------------------------------------------------------- top-k properties


@given(vectors, st.data())
def test_top_k_keeps_exactly_the_k_largest(values: np.ndarray, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, values.size))
    sparse = GradientCompressor.top_k(values, None, k)
    assert sparse.nnz() == k
    assert np.unique(sparse.indices).size == k
    assert np.all(np.diff(sparse.indices) > 0)
    np.testing.assert_array_equal(sparse.values, values[sparse.indices])
    dropped = np.delete(np.abs(values), sparse.indices)
    if dropped.size:
        assert np.abs(sparse.values).min() >= dropped.max()


def test_top_k_ties_prefer_lower_index() -> None:
    np.testing.assert_array_equal(top_k_indices(np.ones(6, dtype=np.float32), 3), [0, 1, 2])
    values = np.array([1, -3, 3, 2, 3, -3], dtype=np.float32)
    np.testing.assert_array_equal(top_k_indices(values, 2), [1, 2])


def test_top_k_nan_ranks_last() -> None:
    values = np.array([np.nan, 1, np.nan, 2], dtype=np.float32)
    np.testing.assert_array_equal(top_k_indices(values, 2), [1, 3])


# ---------------------------------------------------------------- random sparsification


@pytest.mark.parametrize("ratio", [0.0, -0.1, 1.5])
def test_random_sparsification_validates(ratio: float) -> None:
    with pytest.raises(InvalidCompressionRatio):
        GradientCompressor.random_sparsification([1, 2, 3], None, ratio, 0)


def test_random_sparsification_seeded_is_deterministic() -> None:
    values = np.arange(1, 101, dtype=np.float32)
    a = GradientCompressor.random_sparsification(values, None, 0.3, np.random.default_rng(7))
    b = GradientCompressor.random_sparsification(values, None, 0.3, 7)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_allclose(a.values, values[a.indices] / np.float32(0.3))


@given(vectors, st.floats(0.01, 1.0), st.integers(0, 2**32 - 1))
def test_random_exact_k(values: np.ndarray, ratio: float, seed: int) -> None:
    sparse = GradientCompressor.random_sparsification(values, None, ratio, seed, exact=True)
    k = min(values.size, max(1, round(ratio * values.size)))
    assert sparse.nnz() == k
    assert np.unique(sparse.indices).size == k
    np.testing.assert_allclose(
        sparse.values, values[sparse.indices] * np.float32(values.size / k), rtol=1e-6
    )


def test_random_k_is_unbiased() -> None:
    values = np.linspace(-1, 1, 50, dtype=np.float32)
    rng = np.random.default_rng(11)
    total = np.zeros(50)
    rounds = 4000
    for _ in range(rounds):
        total += GradientCompressor.random_sparsification(
            values, None, 0.2, rng, exact=True
        ).to_dense()
    np.testing.assert_allclose(total / rounds, values, atol=0.1)


# ---------------------------------------------------------------- codecs


def test_registry_ids_match() -> None:
    assert sorted(CODECS) == [
        "dense",
        "int4",
        "int8",
        "randomk",
        "threshold",
        "topk",
        "topk-int8",
    ]
    for codec_id, codec in CODECS.items():
        assert codec.codec_id == codec_id
        assert isinstance(codec, Codec)


@pytest.mark.parametrize("codec_id", sorted(CODECS))
@given(values=vectors)
def test_every_codec_within_its_error_bound(codec_id: str, values: np.ndarray) -> None:
    codec = CODECS[codec_id]
    payload = codec.encode(values)
    decoded = codec.decode(payload)
    assert decoded.dtype == np.float32
    assert decoded.shape == (values.size,)
    assert payload.shape == (values.size,)
    assert np.abs(decoded - values).max() <= codec.error_bound(values)


@pytest.mark.parametrize("codec_id", sorted(CODECS))
def test_every_codec_keeps_zeros_finite_and_shape(codec_id: str) -> None:
    codec = CODECS[codec_id]
    zeros = np.zeros((3, 4), dtype=np.float32)
    payload = codec.encode(zeros, zeros.shape)
    assert payload.shape == (3, 4)
    decoded = codec.decode(payload)
    assert np.isfinite(decoded).all()
    np.testing.assert_array_equal(decoded, 0)
    assert codec.estimated_ratio(1_000_000) > 0


@pytest.mark.parametrize("codec_id", sorted(CODECS))
def test_every_codec_handles_empty(codec_id: str) -> None:
    payload = CODECS[codec_id].encode(np.zeros(0, dtype=np.float32))
    assert CODECS[codec_id].decode(payload).size == 0


def test_estimated_ratios() -> None:
    n = 1_000_000
    assert TopK(ratio=0.01).estimated_ratio(n) == pytest.approx(50)
    assert Int8().estimated_ratio(n) == pytest.approx(4, rel=1e-4)
    assert Int4().estimated_ratio(n) == pytest.approx(8, rel=1e-4)
    assert TopKInt8(ratio=0.01).estimated_ratio(n) == pytest.approx(80, rel=1e-3)
    # the estimate matches the real payload
    values = np.random.default_rng(0).normal(size=n).astype(np.float32)
    payload = TopKInt8(ratio=0.01).encode(values)
    assert 4 * n / payload.memory_size() == pytest.approx(80, rel=1e-3)


def test_codec_settings_validated() -> None:
    with pytest.raises(InvalidCompressionRatio):
        TopK(ratio=0)
    with pytest.raises(InvalidCompressionRatio):
        TopK(k=0)
    with pytest.raises(InvalidCompressionRatio):
        RandomK(ratio=2)
    with pytest.raises(InvalidCompressionRatio):
        TopKInt8(ratio=0)
    with pytest.raises(ConfigError):
        Threshold(threshold=-1)


def test_top_k_int8_combined() -> None:
    values = np.array([0.1, -4, 0.2, 8, 0.3, 2], dtype=np.float32)
    payload = GradientCompressor.top_k_quantized(values, None, 3)
    assert isinstance(payload, SparseQuantizedGradient)
    np.testing.assert_array_equal(payload.indices, [1, 3, 5])
    np.testing.assert_allclose(payload.to_dense(), [0, -4, 0, 8, 0, 2], atol=12 / 510 + 1e-6)


def test_random_k_codec_advances_its_generator() -> None:
    codec = RandomK(ratio=0.1, rng=np.random.default_rng(5))
    values = np.arange(100, dtype=np.float32)
    first = codec.encode(values)
    second = codec.encode(values)
    assert isinstance(first, SparseGradient)
    assert isinstance(second, SparseGradient)
    assert not np.array_equal(first.indices, second.indices)
    replay = RandomK(ratio=0.1, rng=np.random.default_rng(5)).encode(values)
    assert isinstance(replay, SparseGradient)
    np.testing.assert_array_equal(first.indices, replay.indices)


# ---------------------------------------------------------------- error feedback


@pytest.mark.parametrize("codec", [TopK(ratio=0.1), Int4(), TopKInt8(ratio=0.2)], ids=repr)
@given(
    rounds=st.lists(
        hnp.arrays(np.float32, 32, elements=st.floats(-100, 100, width=32)),
        min_size=1,
        max_size=6,
    )
)
def test_error_feedback_conserves_the_sum(codec: Codec, rounds: list[np.ndarray]) -> None:
    feedback = ErrorFeedback(codec)
    sent = np.zeros(32, dtype=np.float64)
    for gradient in rounds:
        sent += codec.decode(feedback.encode("peer-a", gradient))
    residual = feedback.residual("peer-a")
    assert residual is not None
    expected = np.sum(rounds, axis=0, dtype=np.float64)
    np.testing.assert_allclose(sent + residual, expected, atol=1e-3 * len(rounds))


def test_error_feedback_delays_what_top_k_drops() -> None:
    feedback = ErrorFeedback(TopK(k=1))
    first = feedback.encode("p", [3.0, 2.0])
    np.testing.assert_array_equal(first.to_dense(), [3, 0])
    np.testing.assert_array_equal(feedback.residual("p"), [0, 2])
    second = feedback.encode("p", [0.0, 1.0])
    np.testing.assert_array_equal(second.to_dense(), [0, 3])
    np.testing.assert_array_equal(feedback.residual("p"), [0, 0])


def test_error_feedback_streams_are_separate() -> None:
    feedback = ErrorFeedback(TopK(k=1))
    feedback.encode("a", [1.0, 0.5])
    feedback.encode("b", [0.25, 1.0])
    np.testing.assert_array_equal(feedback.residual("a"), [0, 0.5])
    np.testing.assert_array_equal(feedback.residual("b"), [0.25, 0])
    assert feedback.streams == ["a", "b"]
    with pytest.raises(ShapeMismatch):
        feedback.encode("a", [1.0, 2.0, 3.0])
    feedback.reset("a")
    assert feedback.residual("a") is None
    feedback.reset()
    assert feedback.streams == []
