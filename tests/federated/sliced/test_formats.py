"""Slice and fraud records (strict decoders), slice plans, reducer ranking, projections."""

from __future__ import annotations

import base64
from typing import Any

import dag_cbor
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multiformats import CID

import gradfed_ipfs.formats.sliced.slices as slice_formats
from gradfed_ipfs.block import Block
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import InvalidGradient, MalformedAnnouncement, MalformedManifest
from gradfed_ipfs.federated.sliced.config import SliceWork
from gradfed_ipfs.federated.sliced.plan import (
    MIN_SLICE_VALUES,
    can_slice,
    plan_slices,
    projection,
    projection_seed,
    projection_tolerance,
    projection_vector,
    reduce_values,
    reducer_ranking,
    reducer_rankings,
)
from gradfed_ipfs.formats.sliced.slices import (
    MAX_SLICE_MESSAGE_BYTES,
    FraudRecord,
    SliceInputs,
    SliceMessage,
    SliceRecord,
)
from gradfed_ipfs.storage.dag import plan_chunks

ROSTER = Block.new(dag_cbor.encode({"r": 1}), "dag-cbor").cid
OTHER = Block.new(dag_cbor.encode({"r": 2}), "dag-cbor").cid
BASE, G1, G2, RES = (make_cid(x) for x in (b"base", b"g1", b"g2", b"res"))


def record(**changes: Any) -> SliceRecord:
    fields: dict[str, Any] = {
        "roster": ROSTER, "base": BASE, "k": 2, "offset": 100, "length": 50, "rule": "fedavg",
        "learning_rate": 0.5, "inputs": (("a", G1), ("b", G2)), "missing": ("c",),
        "weight_sum": 7, "result": RES,
    }  # fmt: skip
    fields.update(changes)
    return SliceRecord(**fields)


def raw(**changes: Any) -> Block:
    fields = {
        "type": "gradfed.slice", "version": 1, "roster": ROSTER, "base": BASE, "k": 2,
        "offset": 100, "length": 50, "rule": "fedavg", "learning_rate": 0.5,
        "inputs": [["a", G1], ["b", G2]], "missing": ["c"], "weight_sum": 7, "result": RES,
    }  # fmt: skip
    fields.update(changes)
    return Block.new(dag_cbor.encode(fields), "dag-cbor")


def test_slice_record_round_trips_byte_identically() -> None:
    block = record().to_block()
    assert raw().cid == block.cid
    assert SliceRecord.from_block(block) == record()


@pytest.mark.parametrize(
    "changes",
    [
        {"rule": "krum"},
        {"learning_rate": 1},
        {"inputs": []},
        {"inputs": [["a", G1], ["a", G2]]},
        {"inputs": [["a", "not-a-link"]]},
        {"inputs": [["a", G1, 3]]},
        {"missing": ["z", "c"]},
        {"missing": ["a"]},
        {"weight_sum": 0},
        {"weight_sum": True},
        {"length": 0},
        {"k": -1},
        {"roster": BASE},
        {"version": 2},
        {"type": "gradfed.roster"},
    ],
)
def test_slice_record_decoder_refuses_malformed_fields(changes: dict[str, Any]) -> None:
    with pytest.raises(MalformedManifest):
        SliceRecord.from_block(raw(**changes))


EXPECTED = SliceInputs.of([("a", G1), ("b", G2)])


def decoded(block: Block, expected: SliceInputs | None) -> tuple[str, Any]:
    try:
        return "ok", SliceRecord.from_block(block, expected)
    except MalformedManifest as exc:
        return "error", str(exc)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"inputs": [["a", G1]]},
        {"inputs": [["b", G2], ["a", G1]]},
        {"missing": ["a"]},  # the expected inputs, and one of them missing too
        {"missing": []},
        {"weight_sum": 0},
        {"inputs": [["a", G1], ["b", G2]], "pad": 1},  # the known bytes, then an unknown key
    ],
)
def test_expected_inputs_give_the_same_records_and_errors(changes: dict[str, Any]) -> None:
    block = raw(**changes)
    assert decoded(block, EXPECTED) == decoded(block, None)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10_000), st.binary(min_size=1, max_size=2), st.booleans())
def test_mutated_records_decode_alike_with_or_without_expected_inputs(
    position: int, patch: bytes, insert: bool
) -> None:
    data = bytearray(raw().data)
    position %= len(data)
    if insert:
        data[position:position] = patch
    else:
        data[position] ^= patch[0] or 1
    block = Block.new(bytes(data), "dag-cbor")
    assert decoded(block, EXPECTED) == decoded(block, None)


def test_expected_inputs_are_not_decoded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without this, the tests above would pass with a decoder that ignores ``expected``."""
    monkeypatch.setattr(slice_formats, "_input", None)  # decoding an input now raises
    assert SliceRecord.from_block(record().to_block(), EXPECTED) == record()
    with pytest.raises(TypeError):
        SliceRecord.from_block(raw(inputs=[["a", G1]]), EXPECTED)
    with pytest.raises(MalformedManifest, match="peer ID"):
        SliceInputs.of([("", G1)])


def test_slice_record_decoder_refuses_huge_blocks() -> None:
    with pytest.raises(MalformedManifest, match="too large"):
        SliceRecord.from_block(raw(pad="x" * 300_000))


def test_fraud_record_round_trips_and_refuses_equal_records() -> None:
    fraud = FraudRecord(ROSTER, 3, "liar", ROSTER, OTHER)
    assert FraudRecord.from_block(fraud.to_block()) == fraud
    with pytest.raises(MalformedManifest, match="same"):
        FraudRecord.from_block(FraudRecord(ROSTER, 3, "liar", OTHER, OTHER).to_block())
    with pytest.raises(MalformedManifest):
        FraudRecord.from_block(FraudRecord(ROSTER, 3, "", ROSTER, OTHER).to_block())


@pytest.mark.parametrize(("d", "n"), [(1_000_000, 8), (1_000_000, 32), (1_000_000, 64), (999, 7)])
def test_slices_cover_the_vector_and_follow_the_chunk_grid(d: int, n: int) -> None:
    slices = plan_slices(d, n, 65_536)
    assert len(slices) == n
    assert [off for off, _ in slices] == [0] + [off + ln for off, ln in slices[:-1]]
    assert sum(ln for _, ln in slices) == d
    chunks = plan_chunks(d, 65_536)
    if len(chunks) >= n:
        assert {off for off, _ in slices} <= {off for off, _ in chunks}
        assert max(ln for _, ln in slices) <= 2 * d / n + chunks[0][1]


def test_plan_slices_refuses_more_slices_than_values() -> None:
    with pytest.raises(InvalidGradient):
        plan_slices(3, 4, 65_536)


def test_only_coordinate_wise_rules_on_large_enough_vectors_are_sliced() -> None:
    assert can_slice("fedavg", 8 * MIN_SLICE_VALUES, 8)
    assert can_slice("median", 8 * MIN_SLICE_VALUES, 8)
    assert not can_slice("fedavg", 8 * MIN_SLICE_VALUES - 1, 8)
    for rule in ("krum", "multikrum", "bulyan"):
        assert not can_slice(rule, 1 << 20, 8)
    with pytest.raises(InvalidGradient):
        reduce_values("krum", np.zeros(3, np.float32), [np.zeros(3, np.float32)], [1], 1.0)


def test_reducer_ranking_is_a_deterministic_balanced_rotation() -> None:
    peers = [f"p{i}" for i in range(8)]
    rankings = [reducer_ranking(bytes(ROSTER), k, peers) for k in range(8)]
    assert all(sorted(r) == peers for r in rankings)
    assert sorted(r[0] for r in rankings) == peers  # each peer reduces exactly one slice
    assert rankings == [reducer_ranking(bytes(ROSTER), k, list(reversed(peers))) for k in range(8)]
    assert rankings != [reducer_ranking(bytes(OTHER), k, peers) for k in range(8)]


def test_reducer_rankings_are_every_slice_s_ranking_at_once() -> None:
    peers = [f"p{i}" for i in range(7)]
    for n in (7, 10, 3):  # as many slices as peers, more (wrapping), fewer
        want = [reducer_ranking(bytes(ROSTER), k, peers) for k in range(n)]
        assert reducer_rankings(bytes(ROSTER), n, peers) == want


def test_rankings_read_like_lists_and_their_ranks_invert_them() -> None:
    peers = [f"p{i}" for i in range(7)]
    for ranking in reducer_rankings(bytes(ROSTER), 9, peers):
        copy = list(ranking)
        assert ranking == copy
        assert len(ranking) == len(copy)
        assert [ranking[i] for i in range(-7, 7)] == copy[-7:] + copy
        assert ranking[2:5] == copy[2:5]
        assert ranking[:0] == []
        with pytest.raises(IndexError):
            ranking[7]
        ranks = SliceWork(0, 0, 1, ranking).rank
        assert dict(ranks) == {peer: r for r, peer in enumerate(copy)}
        assert "stranger" not in ranks
        assert "stranger" not in ranking
        assert ranks.get("stranger") is None
    assert reducer_rankings(bytes(ROSTER), 2, []) == [[], []]


def test_projection_catches_a_small_lie_and_passes_float32_rounding() -> None:
    rng = np.random.default_rng(3)
    base = rng.standard_normal(20_000).astype(np.float32)
    rows = [rng.standard_normal(20_000).astype(np.float32) for _ in range(4)]
    weights = [1, 5, 2, 9]
    honest = reduce_values("fedavg", base, rows, weights, 0.7)
    z = projection_vector(projection_seed([bytes(ROSTER), bytes(OTHER)]), 0, base.size)
    total = sum(weights)
    expected = float(z @ base.astype(np.float64)) + 0.7 * sum(
        w / total * float(z @ r.astype(np.float64)) for w, r in zip(weights, rows, strict=True)
    )
    tol = projection_tolerance(z, honest, base)
    assert abs(float(z @ honest.astype(np.float64)) - expected) <= tol
    lie = (honest + np.float32(1e-2)).astype(np.float32)
    assert abs(float(z @ lie.astype(np.float64)) - expected) > tol
    assert projection_seed([bytes(ROSTER)]) != projection_seed([bytes(OTHER)])


def test_projection_vectors_are_seeded_uniform_and_catch_a_one_value_lie() -> None:
    seed = projection_seed([bytes(ROSTER)])
    z = projection_vector(seed, 2, 50_000)
    assert np.array_equal(z, projection_vector(seed, 2, 50_000))  # every peer draws the same
    assert not np.array_equal(z[:100], projection_vector(seed, 3, 100))
    assert z.dtype == np.float64
    assert z.min() >= -1.0
    assert z.max() < 1.0
    assert abs(z.mean()) < 0.02
    assert 0.3 < float(np.mean(z * z)) < 0.37  # uniform on [-1, 1): variance 1/3
    rng = np.random.default_rng(9)
    base = rng.standard_normal(50_000).astype(np.float32)
    honest = (base + rng.standard_normal(50_000).astype(np.float32)).astype(np.float32)
    tol = projection_tolerance(z, honest, base)
    caught = 0
    for i in rng.choice(50_000, 200, replace=False):  # a lie of 1.0 at one coordinate
        lie = honest.copy()
        lie[i] += np.float32(1.0)
        caught += abs(projection(z, lie) - projection(z, honest)) > tol
    assert caught >= 195  # misses only where |z_i| < tolerance (~1 % of coordinates here)


def test_projection_is_the_float64_dot_product() -> None:
    rng = np.random.default_rng(5)
    z = projection_vector(projection_seed([bytes(ROSTER)]), 1, 3_001)
    for values in (rng.standard_normal(3_001).astype(np.float32), rng.standard_normal(3_001)):
        want = float(z @ values.astype(np.float64))
        assert projection(z, values) == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert projection(z[:3], np.array([1.0, 0.0, 2.0], np.float32)) == z[0] + 2 * z[2]


def test_slice_messages_round_trip_and_take_the_pubsub_sender() -> None:
    for message in (
        SliceMessage("slice", "a", ROSTER, 1, 3, OTHER),
        SliceMessage("proj", "a", ROSTER, values=(1.5, -2.0, 0.0)),
        SliceMessage("fraud", "a", ROSTER, 0, 2, OTHER),
    ):
        decoded = SliceMessage.decode(message.encode(), "b")
        assert decoded == SliceMessage(
            message.kind, "b", message.roster, message.phase, message.k, message.cid,
            message.values,
        )  # fmt: skip


def test_a_slice_message_carries_its_records_bytes_when_they_fit() -> None:
    block = record().to_block()
    message = SliceMessage("slice", "a", ROSTER, 0, 1, block.cid, block=block.data)
    decoded = SliceMessage.decode(message.encode(), "b")
    assert decoded.block == block.data
    assert decoded == SliceMessage("slice", "b", ROSTER, 0, 1, block.cid)  # bytes not compared
    big = b"\0" * MAX_SLICE_MESSAGE_BYTES  # its CID need not match: it is never sent
    assert b"block" not in SliceMessage("slice", "a", ROSTER, 0, 1, block.cid, block=big).encode()


def _with_block(kind: str, cid: CID, text: str) -> bytes:
    bare = SliceMessage(kind, "a", ROSTER, 0, 1, cid).encode()  # type: ignore[arg-type]
    return bare[:-1] + b',"block":"' + text.encode() + b'"}'


@pytest.mark.parametrize(
    "data",
    [
        _with_block("slice", record().to_block().cid, base64.b64encode(b"forged").decode()),
        _with_block("slice", record().to_block().cid, "not base64!"),
        _with_block("fraud", record().to_block().cid, base64.b64encode(b"x").decode()),
    ],
    ids=["wrong-hash", "not-base64", "fraud-kind"],
)
def test_inline_record_bytes_that_do_not_hash_to_the_cid_are_refused(data: bytes) -> None:
    with pytest.raises(MalformedAnnouncement):
        SliceMessage.decode(data, "b")


@pytest.mark.parametrize(
    "data",
    [
        b"\xff",
        b"[]",
        b'{"t":"gradfed.slice-msg","kind":"other","roster":"x","phase":0,"k":0,"cid":null,"values":[]}',
        SliceMessage("proj", "a", ROSTER)
        .encode()
        .replace(b'"cid":null', b'"cid":"%s"' % str(OTHER).encode()),
        SliceMessage("slice", "a", ROSTER, 0, 0, OTHER).encode().replace(b'"k":0', b'"k":true'),
        SliceMessage("slice", "a", ROSTER, 0, 0, OTHER)
        .encode()
        .replace(str(OTHER).encode(), str(RES).encode()),
        SliceMessage("proj", "a", ROSTER, values=(1.0,)).encode().replace(b"1.0", b"NaN"),
        SliceMessage("proj", "a", ROSTER, values=(0.0,) * 5000).encode(),
        b"[" * 200 + b"]" * 200,
    ],
)
def test_slice_message_decoder_refuses_malformed_messages(data: bytes) -> None:
    with pytest.raises(MalformedAnnouncement):
        SliceMessage.decode(data, "b")
