"""decode_dag_cbor returns exactly what dag_cbor.decode returns, and raises what it raises."""

from __future__ import annotations

import math
from typing import Any

import dag_cbor
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.formats import fast_cbor
from gradfed_ipfs.formats.fast_cbor import decode_dag_cbor, encode_dag_cbor
from gradfed_ipfs.formats.manifest import ChunkManifest, ChunkRef
from gradfed_ipfs.formats.sliced.slices import SliceRecord

LINKS = [make_cid(bytes([i])) for i in range(3)] + [make_cid(b"r", "dag-cbor")]

leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)  # non-ASCII text too: the fast path hands it over
    | st.binary(max_size=12)
    | st.sampled_from(LINKS)
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


def outcome(decode: Any, data: bytes) -> tuple[str, Any]:
    """Return ``("ok", value)`` or ``("error", exception type)``."""
    try:
        return "ok", decode(data)
    except Exception as exc:  # the reference raises several unrelated types
        return "error", type(exc)


def same(a: Any, b: Any) -> bool:
    """Equal with types, floats by bits (-0.0 is not 0.0) and bool not int."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return math.copysign(1.0, a) == math.copysign(1.0, b) and a == b
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(values)
def test_valid_encodings_decode_to_the_same_values(value: Any) -> None:
    data = dag_cbor.encode(value)
    assert same(decode_dag_cbor(data), dag_cbor.decode(data))


@settings(max_examples=400, deadline=None)
@given(values, st.data())
def test_mutated_bytes_decode_or_fail_exactly_as_dag_cbor(value: Any, data: st.DataObject) -> None:
    raw = bytearray(dag_cbor.encode(value))
    position = data.draw(st.integers(0, len(raw) - 1))
    change = data.draw(st.sampled_from(["flip", "cut", "append", "insert"]))
    if change == "flip":
        raw[position] ^= data.draw(st.integers(1, 255))
    elif change == "cut":
        del raw[position:]
    elif change == "append":
        raw += data.draw(st.binary(min_size=1, max_size=3))
    else:
        raw[position:position] = data.draw(st.binary(min_size=1, max_size=2))
    fast, reference = outcome(decode_dag_cbor, bytes(raw)), outcome(dag_cbor.decode, bytes(raw))
    assert fast[0] == reference[0]
    if fast[0] == "ok":
        assert same(fast[1], reference[1])
    else:
        assert fast[1] is reference[1]


@pytest.mark.parametrize(
    "data",
    [
        bytes([0x18, 0x05]),  # 5 in a one-byte argument: not minimal
        bytes([0x19, 0x00, 0x10]),  # 16 in two bytes
        bytes([0xA2, 0x61, 0x62, 0x01, 0x61, 0x61, 0x02]),  # keys out of order
        bytes([0xA2, 0x61, 0x61, 0x01, 0x61, 0x61, 0x02]),  # a repeated key
        bytes([0xF9, 0x3C, 0x00]),  # a float16
        bytes([0xFB, 0x7F, 0xF8, 0, 0, 0, 0, 0, 0]),  # NaN
        bytes([0xC1, 0x00]),  # tag 1
        bytes([0xD8, 0x2A, 0x41, 0x01]),  # tag 42 without the 0x00 prefix
        bytes([0x9F, 0xFF]),  # indefinite-length list
        bytes([0x01, 0x02]),  # two top-level items
    ],
)
def test_what_dag_cbor_refuses_is_refused(data: bytes) -> None:
    fast, reference = outcome(decode_dag_cbor, data), outcome(dag_cbor.decode, data)
    assert fast[0] == reference[0] == "error"
    assert fast[1] is reference[1]


def test_records_and_manifests_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without this, every test above would pass with a fast path that always hands over."""
    links = [make_cid(bytes([i, 7])) for i in range(5)]
    record = SliceRecord(
        LINKS[3],
        LINKS[0],
        1,
        10,
        5,
        "trimmed_mean:0.1",
        0.5,
        tuple((f"peer-{i}", c) for i, c in enumerate(links)),
        ("peer-9",),
        9,
        LINKS[1],
    ).to_block()
    manifest = ChunkManifest(
        (10, 5), 50, tuple(ChunkRef(c, 10 * i, 10) for i, c in enumerate(links))
    ).to_block()
    want = [dag_cbor.decode(record.data), dag_cbor.decode(manifest.data)]
    monkeypatch.setattr(fast_cbor.dag_cbor, "decode", None)  # a hand-over would now raise
    assert [decode_dag_cbor(record.data), decode_dag_cbor(manifest.data)] == want
    assert SliceRecord.from_block(record).inputs[4] == ("peer-4", links[4])
    assert ChunkManifest.decode(manifest.data).chunks[2].cid == links[2]


def test_known_encodings_stand_for_top_level_values_only() -> None:
    inner = [["a", LINKS[0]], ["b", LINKS[1]]]
    known = {bytes(dag_cbor.encode(inner)): "KNOWN"}
    data = dag_cbor.encode({"x": inner, "y": {"z": inner}, "w": 1})
    assert decode_dag_cbor(data, known) == {"w": 1, "x": "KNOWN", "y": {"z": inner}}
    other = dag_cbor.encode({"x": inner[:1]})
    assert decode_dag_cbor(other, known) == {"x": inner[:1]}
    # Bytes that only start like a known value are still judged by dag_cbor.
    broken = data[:-1]
    assert outcome(lambda b: decode_dag_cbor(b, known), broken) == outcome(dag_cbor.decode, broken)


# Values dag_cbor encodes or refuses that the encoder's fast path must hand over, nested anywhere.
odd_leaves = (
    leaves
    | st.floats()  # NaN and infinities: refused
    | st.integers(min_value=-(2**66), max_value=2**66)  # beyond ±2^64: refused
    | st.text(st.characters(codec=None), max_size=4)  # lone surrogates: refused
    | st.sampled_from([np.float64(1.5), np.float32(2.0), np.int64(3), (1, 2), {1, 2}])
)
odd_values = st.recursive(
    odd_leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=6) | st.integers(0, 3), inner, max_size=4)
    ),
    max_leaves=12,
)


def encoded(encode: Any, value: Any) -> tuple[str, Any]:
    """Return ``("ok", bytes)`` or ``("error", exception type)``."""
    try:
        return "ok", bytes(encode(value))
    except Exception as exc:  # the reference raises several unrelated types
        return "error", type(exc)


@settings(max_examples=300, deadline=None)
@given(values)
def test_encoder_writes_the_bytes_dag_cbor_writes(value: Any) -> None:
    assert encode_dag_cbor(value) == bytes(dag_cbor.encode(value))


@settings(max_examples=300, deadline=None)
@given(odd_values)
def test_encoder_encodes_or_fails_exactly_as_dag_cbor(value: Any) -> None:
    assert encoded(encode_dag_cbor, value) == encoded(dag_cbor.encode, value)


def test_records_and_manifests_are_written_by_the_fast_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without this, the tests above would pass with an encoder that always hands over."""
    links = [make_cid(bytes([i, 7])) for i in range(5)]
    chunks = tuple(ChunkRef(c, 10 * i, 10) for i, c in enumerate(links))
    manifest = ChunkManifest((10, 5), 50, chunks)
    record = SliceRecord(
        LINKS[3], LINKS[0], 1, 10, 5, "fedavg", 0.5,
        tuple((f"peer-{i}", c) for i, c in enumerate(links)), (), 9, LINKS[1],
    )  # fmt: skip
    want = [manifest.encode(), record.to_block().data]
    monkeypatch.setattr(fast_cbor.dag_cbor, "encode", None)  # a hand-over would now raise
    assert [manifest.encode(), record.to_block().data] == want
    value = {"b": 1.5, "aa": [True, None, -3, b"x"], "a": "\u00e9"}
    assert encode_dag_cbor(value).hex() == "a3616162c3a96162fb3ff800000000000062616184f5f6224178"
