"""Issue 15, decoding: one test per attack on a decoder, at the smallest size that shows it.

Memory is measured where it is allocated: pyarrow's pool (``pa.total_allocated_bytes()``
around an in-process decode) and, for the bombs, a child process whose address space is capped
(``RLIMIT_AS``), beside a control in which plain pyarrow runs out of that same budget.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import dag_cbor
import numpy as np
import pyarrow as pa
import pytest

from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import (
    DecodeError,
    GraphSerializationError,
    MalformedAnnouncement,
    MalformedArrow,
    MalformedManifest,
)
from gradfed_ipfs.federated.secagg.blocks import decode_masked_block, encode_masked_block
from gradfed_ipfs.formats import (
    MAX_DECODED_ELEMENTS,
    Announcement,
    decode_gradient,
    load_layer_from_arrow,
    store_gradient_as_arrow,
    store_layer_as_arrow,
)
from gradfed_ipfs.formats.limits import json_depth, load_json
from gradfed_ipfs.provenance import ComputationGraphStore
from gradfed_ipfs.storage.dag import MANIFEST_FORMAT, ChunkManifest
from gradfed_ipfs.tensor import QuantizedGradient, SparseGradient

from .child import run_limited
from .hostile import (
    compressed_block,
    duplicated_footer_block,
    lying_rows_block,
    nested_shape_block,
)

BOMB_FLOATS = 2**25
"""A 128 MiB ZSTD/LZ4 bomb: a few KB on the wire."""
BUDGET_MB = 64
"""Address space the child may add after reading the block: half the bomb."""


def pyarrow_growth(decode: Callable[[], object]) -> tuple[BaseException | None, int]:
    """Run ``decode``; return what it raised and how much pyarrow's pool grew meanwhile."""
    before = pa.total_allocated_bytes()
    try:
        decode()
    except BaseException as exc:  # the caller asserts on the type
        return exc, pa.total_allocated_bytes() - before
    return None, pa.total_allocated_bytes() - before


# --------------------------------------------------------------------------- nested JSON


def test_nested_shape_json_is_malformed_not_recursion_error() -> None:
    block = nested_shape_block(2000)
    assert len(block) < 14_000  # the 13 KB block of the issue
    with pytest.raises(MalformedArrow, match="nested 2000 deep"):
        decode_gradient(block)
    with pytest.raises(MalformedArrow, match="nested"):
        load_layer_from_arrow(block)


def test_nested_json_in_announcements_and_graph_checkpoints() -> None:
    deep = b"[" * 5000 + b"]" * 5000
    with pytest.raises(MalformedAnnouncement, match="nested 5001 deep") as info:
        Announcement.decode(b'{"version": 1, "x": ' + deep + b"}")
    assert getattr(info.value, "reason", None) == "malformed"
    with pytest.raises(GraphSerializationError, match="nested"):
        ComputationGraphStore.from_checkpoint(b'{"nodes": ' + deep + b"}")


def test_json_depth_ignores_brackets_inside_strings() -> None:
    assert json_depth('{"a": "[[[[[[[[", "b": [[1]]}') == 3
    assert json_depth(r'["\"[[[[", 1]') == 1
    for n in (3, 200):  # short texts are scanned in Python, long ones in NumPy: one answer
        text = "][" + "[" * n + '"]]]"' + "]" * n + "{"
        assert json_depth(text) == json_depth(text + " " * 300) == n
    assert load_json("[[1, 2]]", "x") == [[1, 2]]
    with pytest.raises(DecodeError, match="nested 3 deep"):
        load_json("[[[1]]]", "x", max_depth=2)


# --------------------------------------------------------------------------- compressed bombs


@pytest.fixture(scope="module")
def bomb_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bombs")
    files = {}
    for codec in ("zstd", "lz4"):
        files[codec] = folder / f"{codec}.arrow"
        files[codec].write_bytes(compressed_block(BOMB_FLOATS, codec))
    files["masked"] = folder / "masked.arrow"
    files["masked"].write_bytes(compressed_block(BOMB_FLOATS, column="masked"))
    return files


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_compressed_bomb_is_refused_before_decompression(
    codec: str, bomb_files: dict[str, Path]
) -> None:
    data = bomb_files[codec].read_bytes()
    assert len(data) < 600_000  # 128 MiB of floats in a few KB (zstd) or ~0.5 MB (lz4)
    error, grown = pyarrow_growth(lambda: decode_gradient(data))
    assert isinstance(error, MalformedArrow), error
    assert "compressed" in str(error)
    assert grown == 0
    setup = f"""
        from gradfed_ipfs.formats.arrow import decode_gradient
        data = open({str(bomb_files[codec])!r}, "rb").read()
    """
    guarded = run_limited(setup, "decode_gradient(data)", budget_mb=BUDGET_MB)
    assert guarded.error == "MalformedArrow", guarded.outcome
    assert guarded.pa_peak < 2**20
    # Control: plain pyarrow decompresses the same bytes and does not fit in that budget.
    plain = "pa.ipc.open_file(pa.py_buffer(data)).get_batch(0)"
    control = run_limited(setup, plain, budget_mb=BUDGET_MB)
    assert control.error in ("ArrowMemoryError", "MemoryError"), control.outcome


def test_secagg_masked_block_is_checked_before_decompression(
    bomb_files: dict[str, Path],
) -> None:
    data = bomb_files["masked"].read_bytes()
    error, grown = pyarrow_growth(
        lambda: decode_masked_block(data, ring_bits=32, expected_length=1000)
    )
    assert isinstance(error, MalformedArrow), error
    assert grown == 0
    setup = f"""
        from gradfed_ipfs.federated.secagg.blocks import decode_masked_block
        data = open({str(bomb_files["masked"])!r}, "rb").read()
    """
    guarded = run_limited(
        setup, "decode_masked_block(data, ring_bits=32, expected_length=1000)", budget_mb=BUDGET_MB
    )
    assert guarded.error == "MalformedArrow", guarded.outcome
    assert guarded.pa_peak < 2**20


def test_secagg_masked_block_count_is_checked_against_the_round() -> None:
    honest = encode_masked_block(np.arange(5000, dtype=np.uint32))
    with pytest.raises(MalformedArrow, match="5000 elements, 1000 expected"):
        decode_masked_block(honest, ring_bits=32, expected_length=1000)
    with pytest.raises(MalformedArrow, match="over 100 rows"):
        decode_masked_block(honest, ring_bits=32, max_elements=100)


# --------------------------------------------------------------------------- footers and sizes


def test_duplicated_footer_batches_are_refused() -> None:
    block = duplicated_footer_block(copies=64, rows=4096)
    assert len(block) < 19_000  # the 18 KB block of the issue
    # The attack: pyarrow itself reads that one batch 64 times.
    assert pa.ipc.open_file(pa.py_buffer(block)).num_record_batches == 64
    error, grown = pyarrow_growth(lambda: decode_gradient(block))
    assert isinstance(error, MalformedArrow), error
    assert "repeats or overlaps" in str(error)
    assert grown == 0


def test_duplicated_compressed_batches_are_refused() -> None:
    block = duplicated_footer_block(copies=16, rows=2**16, codec="zstd")
    error, grown = pyarrow_growth(lambda: decode_gradient(block))
    assert isinstance(error, MalformedArrow), error
    assert grown == 0


def test_lying_row_count_is_refused_before_pyarrow_reads_the_batch() -> None:
    block = lying_rows_block(rows=1000, claimed=2**40)
    error, grown = pyarrow_growth(lambda: decode_gradient(block))
    assert isinstance(error, MalformedArrow), error
    assert f"over {MAX_DECODED_ELEMENTS} rows" in str(error)
    assert grown == 0


def test_dense_block_must_hold_the_declared_length() -> None:
    block = store_gradient_as_arrow(np.ones(1000, np.float32))
    with pytest.raises(MalformedArrow, match="1000 elements, 999 expected"):
        decode_gradient(block, expected_length=999)
    with pytest.raises(MalformedArrow, match="over 500 rows"):
        decode_gradient(block, max_elements=500)
    assert decode_gradient(block, expected_length=1000).values.size == 1000


def test_small_sparse_block_cannot_declare_a_huge_shape() -> None:
    block = store_layer_as_arrow(SparseGradient([0, 5], [1.0, 2.0], [2**40]))
    assert len(block) < 2000
    error, grown = pyarrow_growth(lambda: decode_gradient(block))
    assert isinstance(error, MalformedArrow), error
    assert "cap" in str(error)
    assert grown == 0
    with pytest.raises(MalformedArrow, match="10 expected"):
        decode_gradient(store_layer_as_arrow(SparseGradient([0], [1.0], [20])), expected_length=10)


def test_quantization_that_overflows_float32_is_refused() -> None:
    q = np.full(8, 127, np.int8)
    with pytest.raises(MalformedArrow, match="beyond float32"):
        decode_gradient(store_layer_as_arrow(QuantizedGradient(q, 3e38, 0.0, [8], 8)))
    honest = decode_gradient(store_layer_as_arrow(QuantizedGradient(q, 1e30, 0.0, [8], 8)))
    assert np.isfinite(honest.values).all()


# --------------------------------------------------------------------------- manifests


def manifest_record(cids: list[object], per: int) -> dict[str, object]:
    chunks = [{"cid": c, "offset": i * per, "length": per} for i, c in enumerate(cids)]
    total = per * len(cids)
    return {
        "format": MANIFEST_FORMAT,
        "version": 1,
        "dtype": "float32",
        "shape": [total],
        "length": total,
        "chunks": chunks,
    }


def test_manifest_naming_one_chunk_many_times_is_refused() -> None:
    chunk = make_cid(b"one 2 MiB chunk")
    data = dag_cbor.encode(manifest_record([chunk] * 1000, 524_000))
    assert len(data) < 72_000  # the 70 KB manifest of the issue
    with pytest.raises(MalformedManifest, match="more than once"):
        ChunkManifest.decode(data)


def test_manifest_total_length_is_bounded() -> None:
    cids = [make_cid(f"chunk {i}".encode()) for i in range(600)]
    data = dag_cbor.encode(manifest_record(cids, 524_000))
    with pytest.raises(MalformedManifest, match="more than 268435456"):
        ChunkManifest.decode(data)
    assert ChunkManifest.decode(data, max_length=2**30).length == 600 * 524_000


def test_shape_json_from_seed_layout_is_depth_limited() -> None:
    values = pa.array(np.zeros(4, np.float32))
    field = pa.field("gradient", pa.float32(), metadata={"shape": "[" * 3000 + "]" * 3000})
    table = pa.Table.from_arrays([values], schema=pa.schema([field]))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(MalformedArrow, match="nested"):
        ComputationGraphStore.load_gradient_from_arrow(sink.getvalue().to_pybytes())


def test_ordinary_blocks_still_decode() -> None:
    values = np.arange(12, dtype=np.float32)
    block = store_gradient_as_arrow(values.reshape(3, 4))
    decoded = decode_gradient(block, expected_length=12)
    np.testing.assert_array_equal(decoded.tensor(), values.reshape(3, 4))
    assert json.loads(decoded.metadata["gradfed.shape"]) == [3, 4]
