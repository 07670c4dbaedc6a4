"""The regional-round record: round trip, canonical bytes, and hostile blocks refused."""

from __future__ import annotations

from typing import Any

import dag_cbor
import pytest

from gradfed_ipfs.block import Block
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import MalformedManifest
from gradfed_ipfs.formats.regional import RegionalRecord, region_session

GENESIS = make_cid(b"genesis", "raw")
RESULT = make_cid(b"result", "raw")
EU = make_cid(b"eu record", "dag-cbor")
US = make_cid(b"us record", "dag-cbor")


def record(**changes: Any) -> RegionalRecord:
    fields: dict[str, Any] = {
        "session": "s",
        "genesis": GENESIS,
        "round": 3,
        "combine": "hierarchical",
        "allowed": (),
        "regions": (("eu", EU), ("us", US)),
        "result": RESULT,
    }
    return RegionalRecord(**{**fields, **changes})


def raw_block(**changes: Any) -> Block:
    body = dag_cbor.decode(record().to_block().data)
    assert isinstance(body, dict)
    body.update(changes)
    return Block.new(dag_cbor.encode(body), "dag-cbor")


def test_round_trip_and_identical_bytes() -> None:
    original = record(combine="in-regions", allowed=("eu",), regions=(("eu", EU),))
    block = original.to_block()
    assert RegionalRecord.from_block(block) == original
    assert bytes(block.cid) == bytes(RegionalRecord.from_block(block).to_block().cid)
    assert str(block.cid).startswith("bafyrei")
    assert region_session("s", "eu") == "s/region/eu"


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"regions": [["us", US], ["eu", EU]]}, "sorted"),
        ({"regions": [["eu", EU], ["eu", US]]}, "sorted"),
        ({"regions": []}, "regions expected"),
        ({"regions": [["eu", RESULT]]}, "codec"),
        ({"regions": [["e/u", EU]]}, "region"),
        ({"regions": [["eu"]]}, "region entry"),
        ({"combine": "median"}, "combine"),
        ({"combine": "in-regions"}, "allowed"),
        ({"combine": "in-regions", "allowed": ["eu"]}, "allowed"),  # us is not allowed
        ({"allowed": ["eu"]}, "allowed"),
        ({"round": -1}, "round"),
        ({"session": ""}, "session"),
        ({"result": "bafk"}, "codec"),
        ({"version": 2}, "version"),
    ],
)
def test_malformed_records_are_refused(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(MalformedManifest, match=match):
        RegionalRecord.from_block(raw_block(**changes))


def test_an_oversized_block_is_refused_before_decoding() -> None:
    block = Block.new(b"\xa0" + b"\x00" * (256 * 1024 + 1), "dag-cbor")
    with pytest.raises(MalformedManifest, match="too large"):
        RegionalRecord.from_block(block)
