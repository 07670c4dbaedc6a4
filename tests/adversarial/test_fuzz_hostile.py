"""Issue 15: hypothesis fuzz of every decoder from hostile seeds.

The seeds are the attacks themselves (ZSTD and LZ4 bodies, duplicated footers, lying row
counts, deep JSON, manifests naming one chunk twice, records listing one peer twice) plus
honest blocks; :func:`tests.reliability.test_fuzz_decoders.mutated` mutates them further.
Each input must decode or raise a ``GradfedError`` subclass (never ``RecursionError``,
``MemoryError`` or a pyarrow error), and pyarrow's pool may not grow by more than the input.

Examples per decoder: 100; ``GRADFED_RELIABILITY=full`` runs 10,000
(``GRADFED_FUZZ_EXAMPLES`` overrides both).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import dag_cbor
import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradfed_ipfs import Block, GradfedError
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.federated.secagg.blocks import decode_masked_block, encode_masked_block
from gradfed_ipfs.formats import (
    Announcement,
    decode_gradient,
    decode_record,
    load_layer_from_arrow,
    store_gradient_as_arrow,
    store_layer_as_arrow,
)
from gradfed_ipfs.formats.limits import load_json
from gradfed_ipfs.provenance import ComputationGraphStore
from gradfed_ipfs.provenance.round_record import ROUND_RECORD_TYPE, RoundRecord
from gradfed_ipfs.storage.dag import MANIFEST_FORMAT, ChunkManifest
from gradfed_ipfs.tensor import QuantizedGradient, SparseGradient
from tests.reliability.profile import FULL
from tests.reliability.test_fuzz_decoders import mutated

from .hostile import compressed_block, duplicated_footer_block, lying_rows_block, nested_shape_block

EXAMPLES = int(os.environ.get("GRADFED_FUZZ_EXAMPLES", "10000" if FULL else "100"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not FULL,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MAX_ELEMENTS = 1 << 16
"""Decoded-element cap handed to the decoders: what a lying shape may densify to."""

_RNG = np.random.default_rng(15)
_DENSE = _RNG.standard_normal(64).astype(np.float32)

ARROW_SEEDS = [
    store_gradient_as_arrow(_DENSE.reshape(8, 8)),
    store_layer_as_arrow(SparseGradient([1, 5, 9], _DENSE[:3], [64])),
    store_layer_as_arrow(QuantizedGradient.from_dense(_DENSE, (64,), bits=8)),
    store_layer_as_arrow(QuantizedGradient.from_dense(_DENSE, (64,), bits=4)),
    compressed_block(4096, "zstd"),
    compressed_block(4096, "lz4"),
    duplicated_footer_block(copies=4, rows=64),
    duplicated_footer_block(copies=4, rows=64, codec="zstd"),
    lying_rows_block(rows=64, claimed=2**40),
    nested_shape_block(depth=40, count=64),
]
MASKED_SEEDS = [
    encode_masked_block(np.arange(64, dtype=np.uint32)),
    compressed_block(4096, column="masked"),
]


def _manifest(cids: list[object]) -> bytes:
    chunks = [{"cid": c, "offset": 32 * i, "length": 32} for i, c in enumerate(cids)]
    record = {
        "format": MANIFEST_FORMAT,
        "version": 1,
        "dtype": "float32",
        "shape": [32 * len(cids)],
        "length": 32 * len(cids),
        "chunks": chunks,
    }
    return bytes(dag_cbor.encode(record))


MANIFEST_SEEDS = [
    _manifest([make_cid(b"a"), make_cid(b"b")]),
    _manifest([make_cid(b"a")] * 8),  # one chunk named 8 times
]


def _record(peers: list[str]) -> bytes:
    record = {
        "type": ROUND_RECORD_TYPE,
        "version": 1,
        "session": "s",
        "round": 1,
        "contributions": [
            {"peer": p, "gradient": make_cid(p.encode()), "weight": 1} for p in peers
        ],
        "aggregation": {"method": "FedAvg", "params": {}},
        "compression": {},
        "privacy": {"noise": True, "clip": 1.0},
        "aggregate": make_cid(b"agg"),
        "previous": None,
        "timestamp_ms": 0,
    }
    return bytes(dag_cbor.encode(record))


RECORD_SEEDS = [_record(["a", "b"]), _record(["a", "a"])]


def deep_json(depth: int, opener: str) -> bytes:
    closer = {"[": "]", "{": "}"}[opener]
    inner = "[1]" if opener == "[" else "{}"
    if opener == "{":
        return ('{"a":' * depth + inner + closer * depth).encode()
    return (opener * depth + inner + closer * depth).encode()


deep = st.builds(deep_json, st.integers(0, 5000), st.sampled_from(["[", "{"]))


def within_budget(decode: Callable[[bytes], object], data: bytes) -> None:
    """Decode or raise a GradfedError; pyarrow's pool grows by at most the input's size."""
    before = pa.total_allocated_bytes()
    try:
        result = decode(data)
    except GradfedError:
        result = None
    grown = pa.total_allocated_bytes() - before
    assert grown <= len(data) + 4096, f"pyarrow grew by {grown} for {len(data)} input bytes"
    del result


@FUZZ
@given(mutated(ARROW_SEEDS))
def test_fuzz_gradient_blocks(data: bytes) -> None:
    within_budget(lambda d: decode_gradient(d, max_elements=MAX_ELEMENTS), data)
    within_budget(lambda d: load_layer_from_arrow(d, max_elements=MAX_ELEMENTS), data)


@FUZZ
@given(mutated(MASKED_SEEDS), st.sampled_from([None, 64, 4096]))
def test_fuzz_masked_blocks(data: bytes, expected: int | None) -> None:
    within_budget(lambda d: decode_masked_block(d, ring_bits=32, expected_length=expected), data)


@FUZZ
@given(st.integers(0, 3000), st.integers(1, 256))
def test_fuzz_deep_shape_metadata(depth: int, count: int) -> None:
    block = nested_shape_block(depth, count)
    within_budget(decode_gradient, block)


@FUZZ
@given(mutated(MANIFEST_SEEDS))
def test_fuzz_manifests(data: bytes) -> None:
    within_budget(ChunkManifest.decode, data)


@FUZZ
@given(mutated(RECORD_SEEDS))
def test_fuzz_round_records(data: bytes) -> None:
    def decode(raw: bytes) -> RoundRecord:
        return RoundRecord.from_ipld(decode_record(Block.new(raw, "dag-cbor"), ROUND_RECORD_TYPE))

    within_budget(decode, data)


@FUZZ
@given(deep | mutated([b'{"version":1,"session":"s","round":0}']))
def test_fuzz_json_decoders(data: bytes) -> None:
    within_budget(Announcement.decode, data)
    within_budget(lambda d: load_json(d, "fuzz"), data)
    within_budget(ComputationGraphStore.from_checkpoint, data)
