"""Packed chunk blocks: round trips, and hostile bytes refused before anything is allocated."""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from gradfed_ipfs.errors import ConfigError, MalformedPacked
from gradfed_ipfs.formats.packed import (
    PACKED_HEADER_BYTES,
    decode_packed_chunk,
    encode_packed_chunk,
    is_packed,
)
from gradfed_ipfs.tensor import (
    Codec,
    Int2,
    Int4,
    Int8,
    PackedChunk,
    PackSpec,
    TopK,
    TopKInt2,
    TopKInt8,
)

N = 5000
CODECS: list[Codec] = [
    Int8(),
    Int8(clip_sigmas=2.5, block=100),
    Int4(block=333),
    Int2(block=64),
    TopK(ratio=0.03),
    TopKInt8(ratio=0.03, block=16),
    TopKInt2(ratio=0.03, block=16),
]


def values(n: int = N, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * rng.uniform(0.01, 10, n)).astype(np.float32)


def one_block(codec: Codec, v: np.ndarray, tail: int = 0) -> tuple[PackSpec, bytes]:
    spec = codec.packing(tail)
    (chunk,) = codec.pack(v, [(0, v.size)], tail)
    return spec, encode_packed_chunk(spec, chunk)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.packing().label)
def test_round_trip_within_the_quantization_step_and_exact_tail(codec: Codec) -> None:
    v = values()
    spec, data = one_block(codec, v, tail=7)
    assert is_packed(data)
    decoded = decode_packed_chunk(data, spec, 0, N, N)
    assert decoded.dtype == np.float32
    assert decoded.shape == (N,)
    assert decoded[-7:].tobytes() == v[-7:].tobytes()  # the exact tail is untouched
    lossy = v[:-7]
    if spec.sparse:
        k = int(np.ceil(0.03 * lossy.size))
        kept = np.flatnonzero(decoded[:-7])
        assert kept.size <= k
        # The kept entries are the k largest magnitudes.
        largest = np.sort(np.argsort(-np.abs(lossy), kind="stable")[:k])
        assert set(kept) <= set(largest)
    if not spec.sparse and spec.bits in (8, 4) and getattr(codec, "clip_sigmas", None) is None:
        # Symmetric absmax: within half a step of each block's scale (plus one rounding).
        level = {8: 127, 4: 7}[spec.bits]
        for start in range(0, lossy.size, spec.block):
            block = lossy[start : start + spec.block]
            step = np.abs(block).max() / level
            error = np.abs(decoded[start : start + block.size] - block)
            assert error.max() <= step / 2 * (1 + 1e-5) + 1e-30


def test_encoding_sizes_per_value() -> None:
    v = values(65_536)
    sizes = {c.packing().label: len(one_block(c, v)[1]) for c in (Int8(), Int4(), Int2())}
    assert sizes == {
        "int8/1024": PACKED_HEADER_BYTES + 65_536 + 4 * 64,
        "int4/1024": PACKED_HEADER_BYTES + 32_768 + 4 * 64,
        "int2/1024": PACKED_HEADER_BYTES + 16_384 + 4 * 64,
    }
    # 1 % top-k with 2-bit values: one varint byte per index at this density, 2 bits a value.
    _, sparse = one_block(TopKInt2(ratio=0.01), v)
    assert len(sparse) < PACKED_HEADER_BYTES + 656 * (2 + 0.25) + 4 * 1


_DECODE = """
import hashlib, sys
from pathlib import Path
from gradfed_ipfs.formats.packed import decode_packed_chunk
from gradfed_ipfs.tensor import PackSpec
for path in sorted(Path(sys.argv[1]).glob("*.bin")):
    label, n = path.stem.replace("_", "/").rsplit("-", 1)
    out = decode_packed_chunk(path.read_bytes(), PackSpec.parse(label), 0, int(n), int(n))
    print(path.name, hashlib.sha256(out.tobytes()).hexdigest())
"""


def test_decoding_is_bit_identical_in_another_process(tmp_path: Path) -> None:
    v = values()
    expected = []
    for codec in CODECS:
        spec, data = one_block(codec, v)
        name = f"{spec.label.replace('/', '_')}-{N}.bin"
        (tmp_path / name).write_bytes(data)
        digest = hashlib.sha256(decode_packed_chunk(data, spec, 0, N, N).tobytes()).hexdigest()
        expected.append(f"{name} {digest}")
    run = subprocess.run(
        [sys.executable, "-c", _DECODE, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert run.stdout.split("\n")[:-1] == sorted(expected)


def header(data: bytes) -> list[int]:
    return list(struct.unpack_from("<4sBBHIQQQQQ", data))


def with_header(data: bytes, **fields: int) -> bytes:
    names = ["magic", "version", "codec", "reserved", "block", "offset", "length", "stored",
             "exact", "index_bytes"]  # fmt: skip
    values_ = header(data)
    for name, value in fields.items():
        values_[names.index(name)] = value
    return struct.pack("<4sBBHIQQQQQ", *values_) + data[PACKED_HEADER_BYTES:]


def refused(data: bytes, spec: PackSpec, match: str, n: int = N) -> None:
    with pytest.raises(MalformedPacked, match=match):
        decode_packed_chunk(data, spec, 0, n, n)


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0])
def test_an_int8_block_whose_scale_is_not_finite_or_negative_is_refused(bad: float) -> None:
    spec, data = one_block(Int8(), values())
    broken = data[:PACKED_HEADER_BYTES] + struct.pack("<f", bad) + data[PACKED_HEADER_BYTES + 4 :]
    refused(broken, spec, "scale")


def sparse_block(indices: list[int], n: int = 100) -> tuple[PackSpec, bytes]:
    """A topk block of ``n`` values with exactly these (unchecked) local indices."""
    spec = TopK().packing()
    chunk = PackedChunk(0, n, n, np.array(indices, np.int64), np.zeros(0, np.float32),
                        np.ones(len(indices), np.float32), np.zeros(0, np.float32))  # fmt: skip
    return spec, encode_packed_chunk(spec, chunk)


def varint_block(deltas: list[int], n: int = 100) -> bytes:
    """A topk block whose index bytes are these deltas, each a one-byte varint."""
    _spec, data = sparse_block(list(range(len(deltas))), n)
    start = PACKED_HEADER_BYTES
    return data[:start] + bytes(deltas) + data[start + len(deltas) :]


def test_sparse_indices_out_of_range_repeated_or_descending_are_refused() -> None:
    spec = TopK().packing()
    ok = varint_block([3, 1, 5])
    assert np.flatnonzero(decode_packed_chunk(ok, spec, 0, 100, 100)).tolist() == [3, 4, 9]
    refused(varint_block([3, 0, 5]), spec, "repeated or not ascending", 100)  # 3, 3
    refused(varint_block([99, 1]), spec, "out of range", 100)  # 99, 100
    refused(varint_block([3, 97]), spec, "out of range", 100)  # 3, 100
    # Deltas are unsigned: a descending pair can only be written as a gap past the end.
    _, descending = sparse_block([5, 2])
    refused(descending, spec, "out of range", 100)


def test_a_non_minimal_or_overlong_varint_is_refused() -> None:
    spec, data = sparse_block([1, 2])
    start = PACKED_HEADER_BYTES
    # 1 as two bytes (0x81 0x00), then 1: three index bytes, two varints.
    padded = with_header(data, index_bytes=3)
    padded = padded[:start] + bytes([0x81, 0x00, 0x01]) + padded[start + 2 :]
    refused(padded, spec, "not minimal", 100)
    # Six bytes for one varint (35+ bits): longer than any index.
    long = with_header(data, index_bytes=7)
    long = long[:start] + bytes([0x81] * 5 + [0x01, 0x01]) + long[start + 2 :]
    refused(long, spec, "too long", 100)


def test_a_sparse_block_claiming_more_entries_than_the_dimension_is_refused() -> None:
    spec, data = sparse_block([1, 2])
    refused(with_header(data, stored=101), spec, "claims 101 stored", 100)
    refused(with_header(data, stored=2**62), spec, "stored", 100)


def test_a_2_bit_block_of_the_wrong_length_is_refused() -> None:
    spec, data = one_block(Int2(), values())
    refused(data[:-1], spec, "bytes, its header implies")
    refused(data + b"\0", spec, "bytes, its header implies")
    # Unused bits of the last byte: N = 5000 fills the last byte exactly, 4999 leaves 2 bits.
    spec, odd = one_block(Int2(), values(4999))
    last = odd[:-1] + bytes([odd[-1] | 0xC0])
    refused(last, spec, "unused bits", 4999)


def test_another_encoding_range_or_tail_is_refused() -> None:
    spec, data = one_block(Int8(), values())
    refused(data, Int4().packing(), "the session's is int4/1024")
    refused(data, Int8(block=512).packing(), "int8/512")
    refused(data, Int8().packing(7), "exact")  # the session keeps a tail this block lacks
    with pytest.raises(MalformedPacked, match="covers"):
        decode_packed_chunk(data, spec, 64, N, N + 64)
    refused(b"GARW" + data[4:], spec, "not a version 1")
    refused(data[:20], spec, "shorter")


def test_oversized_claims_are_refused_before_allocating() -> None:
    spec, data = one_block(TopKInt2(), values())
    claims = [
        with_header(data, length=2**40),
        with_header(data, stored=2**40),
        with_header(data, index_bytes=2**40),
        with_header(data, exact=2**40),
    ]
    tracemalloc.start()
    try:
        for claim in claims:
            with pytest.raises(MalformedPacked):
                decode_packed_chunk(claim, spec, 0, N, N)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024  # nothing near 2**40 (nor N values) was allocated


def test_labels_parse_back_and_only_canonical_ones() -> None:
    for codec in CODECS:
        for tail in (0, 5):
            spec = codec.packing(tail)
            assert PackSpec.parse(spec.label) == spec
    for wrong in ("int8", "int8/01024", "int8/1024+0", "zstd/1024", "int8/1024+-1", "int8/0"):
        with pytest.raises(ConfigError, match=r"label|codec|block"):
            PackSpec.parse(wrong)
