"""Agreed-round packing math: per-block quantization, top-k, exact tail, error feedback."""

from __future__ import annotations

import numpy as np
import pytest

from gradfed_ipfs.errors import ConfigError
from gradfed_ipfs.tensor import (
    CODECS,
    Codec,
    ErrorFeedback,
    Int2,
    Int4,
    Int8,
    PackSpec,
    Threshold,
    TopK,
    TopKInt2,
    TopKInt8,
)
from gradfed_ipfs.tensor.packing import pack_chunks, quantize_blocks, unpack_chunk

RANGES = [(0, 700), (700, 700), (1400, 600)]


def unpacked(codec: Codec, values: np.ndarray, tail: int = 0) -> np.ndarray:
    spec = codec.packing(tail)
    return np.concatenate([unpack_chunk(spec, c) for c in codec.pack(values, RANGES, tail)])


def test_int2_levels_are_plus_minus_absmax_and_a_third() -> None:
    block = np.array([-3.0, -2.5, -1.2, 0.0, 0.5, 2.1, 3.0], np.float32)  # nearest level
    scales, codes = quantize_blocks(block, 2, 1024)
    assert scales.tolist() == [np.float32(3.0) / np.float32(1.5)]
    assert codes.tolist() == [0, 0, 1, 2, 2, 3, 3]
    got = unpacked(Int2(), np.resize(block, 2000))[:7]
    assert got.tolist() == [-3.0, -3.0, -1.0, 1.0, 1.0, 3.0, 3.0]


def test_a_zero_block_packs_to_zeros_and_top_k_keeps_k() -> None:
    zeros = np.zeros(2000, np.float32)
    for codec in (Int8(), Int4(), Int2(), TopKInt2(ratio=0.01)):
        assert not unpacked(codec, zeros).any()
    v = np.random.default_rng(1).standard_normal(2000).astype(np.float32)
    kept = np.flatnonzero(unpacked(TopK(k=37), v))
    assert kept.size == 37
    assert set(kept) == set(np.argsort(-np.abs(v))[:37])
    assert (unpacked(TopK(k=37), v)[kept] == v[kept]).all()  # float32 values: exact


def test_clipping_bounds_each_block_at_k_sigma() -> None:
    v = np.random.default_rng(2).standard_normal(2000).astype(np.float32)
    v[5] = 1000.0  # one outlier: absmax would waste every level of its block on it
    plain, clipped = unpacked(Int8(block=500), v), unpacked(Int8(block=500, clip_sigmas=3.0), v)
    rest = np.arange(2000) != 5
    # The outlier inflates its block's sigma too (about 45): the gain is several times, not 100.
    assert np.abs(clipped - v)[rest].max() < np.abs(plain - v)[rest].max() / 4
    assert clipped[5] < 200.0  # the outlier is clipped (error feedback carries the rest)


def test_the_tail_is_exact_and_the_tail_alone_is_exact() -> None:
    v = np.random.default_rng(3).standard_normal(2000).astype(np.float32)
    for codec in (Int2(), TopKInt2(ratio=0.001)):
        for tail in (1, 600, 700, 2000):  # inside a chunk, a whole chunk, past one, everything
            got = unpacked(codec, v, tail)
            assert got[2000 - tail :].tobytes() == v[2000 - tail :].tobytes()


def test_packing_spec_names_and_codecs_without_a_packed_form() -> None:
    assert Int8().packing().label == "int8/1024"
    assert TopKInt2(ratio=0.02, block=64).packing(9).label == "topk-int2/64+9"
    assert TopK().packing().sparse
    assert (Int4().packing().bits, TopKInt8().packing().bits, TopK().packing().bits) == (4, 8, 32)
    for codec in (CODECS["dense"], Threshold(), CODECS["randomk"]):
        with pytest.raises(ConfigError, match="no packed form"):
            codec.packing()
    with pytest.raises(ConfigError, match="clip_sigmas"):
        Int8(clip_sigmas=0.0)
    with pytest.raises(ConfigError, match="block"):
        PackSpec("int8", 0)


@pytest.mark.parametrize("codec", [Int2(), Int4(), TopKInt2(ratio=0.02)], ids=str)
def test_error_feedback_sent_plus_residual_is_the_sum_of_updates(codec: Codec) -> None:
    # Each round rounds corrected = g + r and r' = corrected - sent once each (float32), so
    # |Σ sent + r - Σ g| <= Σ_t eps/2·(|corrected_t| + |r_t|) element-wise: that bound is checked.
    feedback, spec, eps = ErrorFeedback(codec), codec.packing(), float(np.finfo(np.float32).eps)
    rng = np.random.default_rng(4)
    total_sent, total_updates, bound = np.zeros(2000), np.zeros(2000), np.zeros(2000)
    for _ in range(20):
        g = rng.standard_normal(2000).astype(np.float32)
        corrected = feedback.corrected("p", g)
        sent = np.concatenate(
            [unpack_chunk(spec, c) for c in pack_chunks(spec, corrected, RANGES, keep=40)]
        )
        feedback.keep("p", corrected, sent)
        residual = feedback.residual("p")
        assert residual is not None
        total_sent += sent
        total_updates += g
        bound += eps / 2 * (np.abs(corrected) + np.abs(residual))
    gap = np.abs(total_sent + residual - total_updates)
    assert (gap <= bound).all()
    assert np.abs(residual).max() > 0.01  # something was held back


def test_error_feedback_decay_scales_the_carried_residual() -> None:
    feedback = ErrorFeedback(TopK(k=1), decay=0.5)
    first = feedback.encode("p", np.array([4.0, 2.0, 1.0], np.float32))
    assert first.to_dense().tolist() == [4.0, 0.0, 0.0]
    assert feedback.corrected("p", np.zeros(3, np.float32)).tolist() == [0.0, 1.0, 0.5]
    with pytest.raises(ConfigError, match="decay"):
        ErrorFeedback(TopK(), decay=float("nan"))


def test_best_effort_encodings_of_the_2_bit_codecs_stay_within_their_bounds() -> None:
    v = np.random.default_rng(5).standard_normal(3000).astype(np.float32)
    for codec in (Int2(), TopKInt2(ratio=0.05), Int8(clip_sigmas=10.0)):
        error = np.abs(codec.decode(codec.encode(v)) - v).max()
        assert error <= codec.error_bound(v)
