"""Issue 8, scenario 4: fuzzed decoders of untrusted bytes.

Every decoder that reads bytes from the network gets mutated valid inputs: bit flips,
truncation, extension, splices, overwritten length fields (lying lengths) and, one level up,
structurally valid records whose fields lie (shapes, lengths, counts, types). Each input must
either decode to a value that passes verification or raise a ``GradfedError`` subclass:
nothing else, no hang, and no allocation beyond the input's declared and verified size
(checked with ``tracemalloc`` and pyarrow's memory pool on the lying-size inputs, and with a
small ``max_elements`` cap for the densifying Arrow encodings).

Examples per decoder: ``tests/reliability/profile.py`` (CI 500, ``GRADFED_RELIABILITY=full``
10,000; ``GRADFED_FUZZ_EXAMPLES`` overrides).
"""

from __future__ import annotations

import json
import math
import struct
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import dag_cbor
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multiformats import CID

from gradfed_ipfs import Block, TrimmedMean
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import (
    GradfedError,
    MalformedAnnouncement,
    MalformedArrow,
    MalformedManifest,
)
from gradfed_ipfs.formats import MAX_MESSAGE_BYTES, Announcement, decode_record
from gradfed_ipfs.formats.arrow import (
    META_COUNT,
    META_SHAPE,
    decode_gradient,
    encode_arrow_file,
    load_gradient_from_arrow,
    store_gradient_as_arrow,
    store_layer_as_arrow,
)
from gradfed_ipfs.provenance.round_record import ROUND_RECORD_TYPE, ContributionRef, RoundRecord
from gradfed_ipfs.seed import GradientArrowBlock
from gradfed_ipfs.storage import ChunkManifest, ChunkRef
from gradfed_ipfs.tensor import (
    QuantizedGradient,
    SampleWeightedMean,
    SparseGradient,
    SparseQuantizedGradient,
)

from .profile import FULL, FUZZ_EXAMPLES

FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=not FULL,  # CI: the same examples every run; full: fresh ones
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SLOW_DECODE = 5.0
"""Seconds any one decode may take (inputs are at most a few KiB; a normal decode is <1 ms)."""

MAX_ELEMENTS = 1 << 16
"""Cap on decoded elements given to the Arrow loader: bounds what a sparse/quantized block may
densify to, so a lying shape cannot make the decoder allocate more than 256 KiB."""

# --------------------------------------------------------------------------- valid seeds

_RNG = np.random.default_rng(8)


def _cid(seed: int) -> CID:
    return make_cid(seed.to_bytes(4, "big"))


def _arrow_seeds() -> list[bytes]:
    dense = _RNG.standard_normal(24).astype(np.float32)
    sparse_indices = np.array([1, 5, 9, 23], dtype=np.int64)
    return [
        store_gradient_as_arrow(dense),
        store_gradient_as_arrow(dense.reshape(4, 6), layer="fc1.weight"),
        store_gradient_as_arrow(np.empty(0, dtype=np.float32)),
        store_layer_as_arrow(
            SparseGradient(sparse_indices, dense[sparse_indices], (4, 6)), "fc1.weight"
        ),
        store_layer_as_arrow(QuantizedGradient.from_dense(dense, (24,), bits=8)),
        store_layer_as_arrow(QuantizedGradient.from_dense(dense, (3, 8), bits=4)),
        store_layer_as_arrow(
            SparseQuantizedGradient(
                sparse_indices,
                QuantizedGradient.from_dense(dense[sparse_indices], (4,), bits=8),
                (24,),
            )
        ),
    ]


ARROW_SEEDS = _arrow_seeds()


def _manifest() -> ChunkManifest:
    chunks = (ChunkRef(_cid(1), 0, 100), ChunkRef(_cid(2), 100, 100), ChunkRef(_cid(3), 200, 56))
    return ChunkManifest((16, 16), 256, chunks)


MANIFEST_SEED = _manifest().encode()


def _round_record() -> RoundRecord:
    return RoundRecord(
        session="fuzz",
        round=3,
        contributions=[
            ContributionRef("peer-a", str(_cid(10)), 12),
            ContributionRef("peer-b", str(_cid(11)), None),
        ],
        aggregation=TrimmedMean(beta=0.2),
        aggregate_cid=str(_cid(12)),
        previous=str(_cid(13)),
        compression={"codec": "topk", "ratio": 0.01},
        privacy={"epsilon_spent": 0.4, "delta": 1e-5},
        timestamp_ms=1_700_000_000_000,
    )


ROUND_SEEDS = [
    bytes(dag_cbor.encode(_round_record().to_ipld())),
    bytes(
        dag_cbor.encode(
            RoundRecord(
                "s", 0, [], SampleWeightedMean(), str(_cid(1)), timestamp_ms=1
            ).to_ipld()  # round 0
        )
    ),
]

GARW_SEEDS = [
    GradientArrowBlock.new("fc1", np.arange(12, dtype=np.float32), 7).to_arrow_bytes(),
    GradientArrowBlock.new("x", np.empty(0, dtype=np.float32), 0).to_arrow_bytes(),
]

ANNOUNCEMENT = Announcement.new("fuzz", 4, "12D3KooWpeer", _cid(5), num_samples=32, length=24)
ANNOUNCEMENT_SEEDS = [
    ANNOUNCEMENT.encode(),
    Announcement.new("fuzz", 0, "12D3KooWother", make_cid(b"m", "dag-cbor")).encode(),
]

# --------------------------------------------------------------------------- mutations

LYING_INTS = [0, 1, 0x7F, 0xFF, 0x7FFF_FFFF, 0xFFFF_FFFF, 2**53, 2**63 - 1, 2**64 - 1]


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A valid seed with 1-4 byte-level mutations (the last may be a lying length field)."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(
            st.sampled_from(["flip", "truncate", "extend", "overwrite", "delete", "lie", "dup"])
        )
        size = len(data)
        if kind == "flip" and size:
            pos = draw(st.integers(0, size - 1))
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[draw(st.integers(0, size)) :]
        elif kind == "extend":
            data += draw(st.binary(min_size=1, max_size=64))
        elif kind == "overwrite" and size:
            pos = draw(st.integers(0, size - 1))
            chunk = draw(st.binary(min_size=1, max_size=16))
            data[pos : pos + len(chunk)] = chunk
        elif kind == "delete" and size:
            pos = draw(st.integers(0, size - 1))
            del data[pos : pos + draw(st.integers(1, 16))]
        elif kind == "dup" and size:
            pos = draw(st.integers(0, size - 1))
            data[pos:pos] = data[pos : pos + draw(st.integers(1, 32))]
        elif kind == "lie" and size >= 8:
            # An integer field that lies: a big length at a (usually aligned) offset.
            width = draw(st.sampled_from([4, 8]))
            pos = draw(st.integers(0, (size - width) // 4)) * 4
            value = draw(st.sampled_from(LYING_INTS)) & ((1 << (8 * width)) - 1)
            data[pos : pos + width] = value.to_bytes(
                width, draw(st.sampled_from(["little", "big"]))
            )
    return bytes(data)


ipld_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.sampled_from(LYING_INTS)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.builds(_cid, st.integers(0, 1000))
    | st.just(make_cid(b"x", "dag-cbor"))
)
ipld_values = st.recursive(
    ipld_leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def lying_record(draw: st.DrawFn, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with 1-3 fields (top level or one level down) replaced, removed or added."""
    out = _deep_copy(record)
    for _ in range(draw(st.integers(1, 3))):
        target = out
        # Descend into a nested map or list now and then (e.g. a chunk, a contribution).
        for _depth in range(draw(st.integers(0, 2))):
            children = [v for v in (target.values() if isinstance(target, dict) else target)]
            nested = [c for c in children if isinstance(c, dict | list) and c]
            if not nested:
                break
            target = draw(st.sampled_from(nested))
        if isinstance(target, list):
            index = draw(st.integers(0, len(target) - 1))
            target[index] = draw(ipld_values)
            continue
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        keys = sorted(target)
        if action == "add" or not keys:
            target[draw(st.text(max_size=8))] = draw(ipld_values)
        elif action == "delete":
            del target[draw(st.sampled_from(keys))]
        else:
            target[draw(st.sampled_from(keys))] = draw(ipld_values)
    return out


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


# --------------------------------------------------------------------------- the contract


def decodes_or_gradfed_error(decode: Callable[[bytes], Any], data: bytes) -> Any:
    """Return ``decode(data)``, or ``None`` when it raised a ``GradfedError``.

    Any other exception fails the test with its type (pytest shows the input), and so does a
    decode slower than :data:`SLOW_DECODE` seconds (a near-hang on a crafted input).
    """
    started = time.perf_counter()
    try:
        return decode(data)
    except GradfedError:
        return None
    finally:
        elapsed = time.perf_counter() - started
        assert elapsed < SLOW_DECODE, f"decoding {len(data)} bytes took {elapsed:.1f}s"


# --------------------------------------------------------------------------- Arrow loader


def _check_arrow(data: bytes) -> None:
    decoded = decodes_or_gradfed_error(
        lambda b: decode_gradient(b, max_elements=MAX_ELEMENTS), data
    )
    if decoded is None:
        return
    values = decoded.values
    assert values.dtype == np.float32
    assert values.ndim == 1
    assert values.size == math.prod(decoded.shape)
    assert decoded.encoding in {"dense", "sparse", "quantized", "sparse_quantized"} or isinstance(
        decoded.encoding, str
    )
    if decoded.encoding == "dense":
        # Dense values are a view on the input: never more values than the bytes hold.
        assert values.nbytes <= len(data)
    else:
        assert values.size <= MAX_ELEMENTS
    assert decoded.tensor().shape == decoded.shape


@FUZZ
@given(mutated(ARROW_SEEDS))
def test_fuzz_arrow_loader_mutated_blocks(data: bytes) -> None:
    _check_arrow(data)


arrow_metadata_lies = st.fixed_dictionaries(
    {},
    optional={
        "gradfed.encoding": st.sampled_from(
            ["dense", "sparse", "quantized", "sparse_quantized", "topk", ""]
        ),
        "gradfed.dtype": st.sampled_from(["float32", "float64", "int8"]),
        META_SHAPE: st.one_of(
            st.lists(st.sampled_from([0, 1, 3, 8, 24, 2**31, 2**40, 2**62]), max_size=4).map(
                json.dumps
            ),
            st.sampled_from(["[-1]", "[1.5]", "[true]", "{}", "7", "[[2]]", "[", "null"]),
        ),
        META_COUNT: st.sampled_from(["0", "4", "24", "-1", "1e3", "99999999999999999999", "x"]),
        "gradfed.bits": st.sampled_from(["4", "8", "16", "0", ""]),
        "gradfed.scale": st.sampled_from(["0.1", "0", "-1", "nan", "inf", "1e39", "x"]),
        "gradfed.zero_point": st.sampled_from(["0", "-1.5", "nan", "1e400"]),
    },
)


@FUZZ
@given(
    metadata=arrow_metadata_lies,
    columns=st.sets(st.sampled_from(["value", "index", "q"]), min_size=1),
    n=st.integers(0, 32),
)
def test_fuzz_arrow_loader_lying_metadata(
    metadata: dict[str, str], columns: set[str], n: int
) -> None:
    arrays = {
        "value": pa.array(np.linspace(-1, 1, n, dtype=np.float32), type=pa.float32()),
        "index": pa.array(np.arange(n, dtype=np.uint32) * 3, type=pa.uint32()),
        "q": pa.array(np.arange(n, dtype=np.int8), type=pa.int8()),
    }
    data = encode_arrow_file({name: arrays[name] for name in sorted(columns)}, metadata)
    _check_arrow(data)


@pytest.mark.parametrize(
    "shape",
    [[0, 2**31, 2**31], [0, 2**62, 2**62], [0] * 65, [1] * 40],
    ids=["zero-size-intp-overflow", "zero-size-int64-overflow", "65-dims", "40-dims"],
)
def test_fuzzed_arrow_empty_block_with_unrepresentable_shape_is_malformed(
    shape: list[int],
) -> None:
    # Found by the fuzzer: an empty ``value`` column whose shape has a zero dimension passed
    # the product check, then ``load_gradient_from_arrow`` died in NumPy's reshape with a
    # bare ValueError ("array is too big" / "maximum supported dimension").
    data = encode_arrow_file(
        {"value": pa.array(np.empty(0 if 0 in shape else 1, np.float32), type=pa.float32())},
        {META_SHAPE: json.dumps(shape)},
    )
    with pytest.raises(MalformedArrow, match="NumPy"):
        load_gradient_from_arrow(data)


# --------------------------------------------------------------------------- chunk manifest


def _check_manifest(data: bytes) -> None:
    manifest = decodes_or_gradfed_error(ChunkManifest.decode, data)
    if manifest is None:
        return
    assert math.prod(manifest.shape) == manifest.length
    offset = 0
    for chunk in manifest.chunks:
        assert chunk.offset == offset
        assert chunk.length > 0
        assert chunk.cid.codec.name == "raw"
        offset = chunk.stop
    assert offset == manifest.length
    assert ChunkManifest.decode(manifest.encode()) == manifest


@FUZZ
@given(mutated([MANIFEST_SEED]))
def test_fuzz_chunk_manifest_mutated_bytes(data: bytes) -> None:
    _check_manifest(data)


@FUZZ
@given(lying_record(_manifest().to_ipld()))
def test_fuzz_chunk_manifest_lying_fields(record: dict[str, Any]) -> None:
    _check_manifest(bytes(dag_cbor.encode(record)))


# --------------------------------------------------------------------------- round record


def _read_round_record(data: bytes) -> RoundRecord:
    """What ``RoundRecord.load`` does after the store verified the block's hash."""
    block = Block.new(data, "dag-cbor")
    return RoundRecord.from_ipld(decode_record(block, ROUND_RECORD_TYPE, 1))


def _check_round_record(data: bytes) -> None:
    record = decodes_or_gradfed_error(_read_round_record, data)
    if record is None:
        return
    assert isinstance(record.session, str)
    assert record.round >= 0
    for contribution in record.contributions:
        assert isinstance(contribution.peer_id, str)
        assert contribution.weight is None or contribution.weight >= 0
    # A record that reads back is a record we can write again (or refuse with our error).
    decodes_or_gradfed_error(lambda _: dag_cbor.encode(record.to_ipld()), b"")


@FUZZ
@given(mutated(ROUND_SEEDS))
def test_fuzz_round_record_mutated_bytes(data: bytes) -> None:
    _check_round_record(data)


@FUZZ
@given(lying_record(_round_record().to_ipld()))
def test_fuzz_round_record_lying_fields(record: dict[str, Any]) -> None:
    try:
        data = bytes(dag_cbor.encode(record))
    except Exception:  # the mutated record is not encodable (e.g. a non-string key)
        return
    _check_round_record(data)


# --------------------------------------------------------------------------- GARW


def _check_garw(data: bytes) -> None:
    for strict in (False, True):
        block = decodes_or_gradfed_error(
            lambda b, s=strict: GradientArrowBlock.from_arrow_bytes("cid", "layer", b, strict=s),
            data,
        )
        if block is None:
            continue
        assert block.values.dtype == np.float32
        assert block.values.nbytes <= len(data)
        assert all(0 <= d <= 0xFFFF_FFFF for d in block.shape)
        if strict:
            assert math.prod(block.shape) == block.values.size
        # What decoded re-encodes to a prefix of the input (trailing bytes are ignored).
        again = block.to_arrow_bytes()
        assert data.startswith(again)


@FUZZ
@given(mutated(GARW_SEEDS))
def test_fuzz_garw_reader_mutated_bytes(data: bytes) -> None:
    _check_garw(data)


@FUZZ
@given(
    shape=st.lists(st.sampled_from(LYING_INTS[:6]), max_size=4),
    values_len=st.sampled_from(LYING_INTS[:6]),
    body=st.binary(max_size=64),
)
def test_fuzz_garw_reader_lying_lengths(shape: list[int], values_len: int, body: bytes) -> None:
    header = struct.pack("<4sI", b"GARW", len(shape)) + struct.pack(f"<{len(shape)}I", *shape)
    _check_garw(header + struct.pack("<I", values_len) + body)


# --------------------------------------------------------------------------- announcements


def _check_announcement(data: bytes) -> None:
    announcement = decodes_or_gradfed_error(Announcement.decode, data)
    if announcement is None:
        return
    assert len(data) <= MAX_MESSAGE_BYTES
    assert isinstance(announcement.session, str)
    assert announcement.peer_id
    assert announcement.round >= 0
    assert announcement.length >= 0
    assert announcement.num_samples is None or announcement.num_samples >= 0
    assert Announcement.decode(announcement.encode()) == announcement


@FUZZ
@given(mutated(ANNOUNCEMENT_SEEDS))
def test_fuzz_announcement_parser_mutated_bytes(data: bytes) -> None:
    _check_announcement(data)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from([str(_cid(1)), "bafy", "", "Qm" + "1" * 44]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@FUZZ
@given(
    replaced=st.dictionaries(
        st.sampled_from(
            ["version", "session", "round", "peer_id", "cid", "num_samples", "length", "x"]
        ),
        json_values,
        max_size=3,
    ),
    dropped=st.sets(st.sampled_from(["version", "round", "peer_id", "cid", "length"])),
)
def test_fuzz_announcement_parser_wrong_types(replaced: dict[str, Any], dropped: set[str]) -> None:
    record = json.loads(ANNOUNCEMENT.encode())
    record.update(replaced)
    for key in dropped:
        record.pop(key, None)
    _check_announcement(json.dumps(record).encode())


# --------------------------------------------------------------------------- lying sizes: memory

LYING_INPUTS: list[tuple[str, Callable[[bytes], Any], bytes]] = [
    (
        "garw: 4 G values declared, 8 bytes present",
        lambda b: GradientArrowBlock.from_arrow_bytes("c", "l", b),
        b"GARW" + struct.pack("<II", 0, 0xFFFF_FFFF) + b"\0" * 8,
    ),
    (
        "garw: 4 G dimensions declared",
        lambda b: GradientArrowBlock.from_arrow_bytes("c", "l", b),
        b"GARW" + struct.pack("<I", 0xFFFF_FFFF) + b"\0" * 16,
    ),
    (
        "manifest: bytestring of 2**63 bytes declared",
        ChunkManifest.decode,
        b"\x5b" + (2**63 - 1).to_bytes(8, "big"),
    ),
    (
        "manifest: list of 2**32 chunks declared",
        ChunkManifest.decode,
        b"\x9b" + (2**32).to_bytes(8, "big") + b"\x00" * 16,
    ),
    (
        "arrow: sparse block whose shape claims 2**40 elements",
        lambda b: decode_gradient(b),
        store_layer_as_arrow(
            SparseGradient(np.array([0], dtype=np.int64), np.ones(1, np.float32), (2**40,))
        ),
    ),
    (
        "round record: map of 2**32 entries declared",
        _read_round_record,
        b"\xbb" + (2**32).to_bytes(8, "big") + b"\x00" * 16,
    ),
]


@pytest.mark.parametrize(
    ("what", "decode", "data"), LYING_INPUTS, ids=[w for w, *_ in LYING_INPUTS]
)
def test_lying_size_field_allocates_nothing_big(
    what: str, decode: Callable[[bytes], Any], data: bytes
) -> None:
    # tracemalloc sees Python and NumPy allocations; pyarrow allocates in its own pool, which
    # is measured separately (its peak is not exposed, but a lying batch decoded would hold it).
    pool = pa.default_memory_pool()
    arrow_before = pa.total_allocated_bytes()
    arrow_peak_before = pool.max_memory() or 0
    tracemalloc.start()
    try:
        with pytest.raises(GradfedError):
            decode(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{what}: peak {peak} bytes for a {len(data)}-byte input"
    assert pa.total_allocated_bytes() - arrow_before < 1 << 20, what
    assert (pool.max_memory() or 0) - arrow_peak_before < 1 << 20, f"{what}: pyarrow pool peak"


def test_fuzzed_round_record_contribution_without_weight_is_malformed() -> None:
    # Found by the fuzzer: a contribution map without its "weight" key passed the type checks
    # (``item.get("weight") is None``) and then raised a bare KeyError on ``item["weight"]``.
    record = _round_record().to_ipld()
    del record["contributions"][0]["weight"]
    with pytest.raises(MalformedManifest, match="bad contribution"):
        _read_round_record(bytes(dag_cbor.encode(record)))


@pytest.mark.parametrize("opener", [b"[", b'{"a":'])
def test_fuzzed_announcement_deeply_nested_json_is_malformed(opener: bytes) -> None:
    # Found by the fuzzer: deeply nested JSON under the 64 KiB cap made json.loads raise
    # RecursionError, which escaped Announcement.decode.
    data = opener * (60_000 // len(opener))
    assert len(data) <= MAX_MESSAGE_BYTES
    with pytest.raises(MalformedAnnouncement):
        Announcement.decode(data)


@pytest.mark.parametrize("version", ["true", "1.0", '"1"'])
def test_fuzzed_announcement_version_must_be_the_integer_one(version: str) -> None:
    record = {
        "version": 1,
        "session": "s",
        "round": 1,
        "peer_id": "p",
        "cid": str(make_cid(b"x")),
        "num_samples": 1,
        "length": 1,
        "timestamp_ms": 1,
    }
    Announcement.decode(json.dumps(record).encode())  # the valid one decodes
    forged = json.dumps(record).replace('"version": 1', f'"version": {version}')
    with pytest.raises(MalformedAnnouncement):
        Announcement.decode(forged.encode())
