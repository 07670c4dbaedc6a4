"""Partial-sum records of chained reduce-scatter rounds: strict decoding and value blocks."""

from __future__ import annotations

import dataclasses
from typing import Any

import dag_cbor
import numpy as np
import pytest

from gradfed_ipfs.block import Block
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import MalformedManifest
from gradfed_ipfs.formats.records import encode_record
from gradfed_ipfs.formats.sliced.partials import (
    PARTIAL_BLOCK_VALUES,
    PartialRecord,
    partial_blocks,
    partial_values,
)
from gradfed_ipfs.formats.sliced.slices import SliceMessage

ROSTER = Block.new(dag_cbor.encode({"r": 1}), "dag-cbor").cid
PREV = Block.new(dag_cbor.encode({"p": 1}), "dag-cbor").cid
GRADIENT = make_cid(b"g")


def record(j: int = 1, length: int = PARTIAL_BLOCK_VALUES + 5) -> PartialRecord:
    values = np.linspace(-1, 1, length)
    return PartialRecord(
        roster=ROSTER,
        k=2,
        j=j,
        groups=3,
        offset=4096,
        length=length,
        prev=PREV if j else None,
        inputs=(("a", GRADIENT), ("b", GRADIENT)),
        missing=("z",),
        weight_sum=7,
        values=tuple(b.cid for b in partial_blocks(values)),
    )


def test_values_split_into_megabyte_blocks_and_come_back_bit_for_bit() -> None:
    values = np.random.default_rng(1).standard_normal(2 * PARTIAL_BLOCK_VALUES + 3)
    blocks = partial_blocks(values)
    assert [len(b.data) for b in blocks] == [1 << 20, 1 << 20, 24]
    assert partial_values(blocks, values.size).tobytes() == values.tobytes()
    with pytest.raises(MalformedManifest, match="blocks"):
        partial_values(blocks[:2], values.size)
    with pytest.raises(MalformedManifest, match="bytes"):
        partial_values(blocks, values.size + 1)
    nan = Block.from_parts(
        make_cid(np.array([np.nan] * 3).tobytes()), np.array([np.nan] * 3).tobytes()
    )
    with pytest.raises(MalformedManifest, match="finite"):
        partial_values([*blocks[:2], nan], values.size)
    for bad in (np.array([], np.float64), np.ones(3, np.float32), np.array([1.0, np.inf])):
        with pytest.raises(MalformedManifest):
            partial_blocks(bad)


@pytest.mark.parametrize("j", [0, 1])
def test_a_partial_record_round_trips(j: int) -> None:
    original = record(j)
    assert PartialRecord.from_block(original.to_block()) == original


def fields(**changes: Any) -> Block:
    good = record()
    body: dict[str, Any] = {
        "type": "gradfed.slice-partial",
        "version": 1,
        "roster": good.roster,
        "k": good.k,
        "j": good.j,
        "groups": good.groups,
        "offset": good.offset,
        "length": good.length,
        "prev": good.prev,
        "inputs": [[p, c] for p, c in good.inputs],
        "missing": list(good.missing),
        "weight_sum": good.weight_sum,
        "values": list(good.values),
        **changes,
    }
    return encode_record(body)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"prev": None}, "previous"),
        ({"j": 0}, "previous"),
        ({"j": 2}, "not a partial step"),
        ({"groups": 1}, "integer"),
        ({"values": [GRADIENT]}, "value blocks"),
        ({"values": [PREV, PREV]}, "codec"),
        ({"length": 0}, "integer"),
        ({"inputs": [["a", GRADIENT], ["a", GRADIENT]]}, "repeat"),
        ({"missing": ["z", "y"]}, "sorted"),
        ({"weight_sum": 0}, "integer"),
        ({"type": "gradfed.slice"}, None),
    ],
)
def test_malformed_partial_records_are_refused(changes: dict[str, Any], match: str | None) -> None:
    with pytest.raises(MalformedManifest, match=match):
        PartialRecord.from_block(fields(**changes))


def test_partial_messages_carry_their_record_inline() -> None:
    block = record().to_block()
    message = SliceMessage("partial", "a", ROSTER, 0, 5, block.cid, block=block.data)
    decoded = SliceMessage.decode(message.encode(), "a")
    assert (decoded.kind, decoded.k, decoded.block) == ("partial", 5, block.data)
    assert dataclasses.replace(decoded, block=None) == dataclasses.replace(message, block=None)
