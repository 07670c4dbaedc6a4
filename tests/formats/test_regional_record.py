"""The regional-round record: round trip, canonical bytes, and hostile blocks refused."""

from __future__ import annotations

from typing import Any

import dag_cbor
import pytest

from gradfed_ipfs.block import Block
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import MalformedManifest
from gradfed_ipfs.formats.agreed.roster import MAX_RECORD_BYTES
from gradfed_ipfs.formats.regional import RegionalRecord, RegionVote, RegionVotes, region_session

GENESIS = make_cid(b"genesis", "raw")
RESULT = make_cid(b"result", "raw")
EU = make_cid(b"eu record", "dag-cbor")
US = make_cid(b"us record", "dag-cbor")
EU_VOTES = make_cid(b"eu votes", "dag-cbor")
US_VOTES = make_cid(b"us votes", "dag-cbor")


def record(**changes: Any) -> RegionalRecord:
    fields: dict[str, Any] = {
        "session": "s",
        "genesis": GENESIS,
        "round": 3,
        "combine": "hierarchical",
        "allowed": (),
        "regions": (("eu", EU), ("us", US)),
        "result": RESULT,
        "votes": (EU_VOTES, US_VOTES),
    }
    return RegionalRecord(**{**fields, **changes})


def raw_block(**changes: Any) -> Block:
    body = dag_cbor.decode(record().to_block().data)
    assert isinstance(body, dict)
    body.update(changes)
    return Block.new(dag_cbor.encode(body), "dag-cbor")


def test_round_trip_and_identical_bytes() -> None:
    original = record(
        combine="in-regions", allowed=("eu",), regions=(("eu", EU),), votes=(EU_VOTES,)
    )
    block = original.to_block()
    assert RegionalRecord.from_block(block) == original
    assert bytes(block.cid) == bytes(RegionalRecord.from_block(block).to_block().cid)
    assert str(block.cid).startswith("bafyrei")
    assert region_session("s", "eu") == "s/region/eu"


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"regions": [["us", US, US_VOTES], ["eu", EU, EU_VOTES]]}, "sorted"),
        ({"regions": [["eu", EU, EU_VOTES], ["eu", US, US_VOTES]]}, "sorted"),
        ({"regions": []}, "regions expected"),
        ({"regions": [["eu", RESULT, EU_VOTES]]}, "codec"),
        ({"regions": [["eu", EU, RESULT]]}, "codec"),
        ({"regions": [["e/u", EU, EU_VOTES]]}, "region"),
        ({"regions": [["eu"]]}, "region entry"),
        ({"regions": [["eu", EU]]}, "region entry"),  # v1's entries: no vote set
        ({"combine": "median"}, "combine"),
        ({"combine": "in-regions"}, "allowed"),
        ({"combine": "in-regions", "allowed": ["eu"]}, "allowed"),  # us is not allowed
        ({"allowed": ["eu"]}, "allowed"),
        ({"round": -1}, "round"),
        ({"session": ""}, "session"),
        ({"result": "bafk"}, "codec"),
        ({"version": 1}, "version"),
        ({"version": 3}, "version"),
    ],
)
def test_malformed_records_are_refused(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(MalformedManifest, match=match):
        RegionalRecord.from_block(raw_block(**changes))


def test_an_oversized_block_is_refused_before_decoding() -> None:
    block = Block.new(b"\xa0" + b"\x00" * (MAX_RECORD_BYTES + 1), "dag-cbor")
    with pytest.raises(MalformedManifest, match="too large"):
        RegionalRecord.from_block(block)


def test_a_record_needs_one_vote_set_per_region() -> None:
    with pytest.raises(MalformedManifest, match="one vote set per region"):
        record(votes=(EU_VOTES,)).to_block()


def test_votes_and_vote_sets_round_trip_and_refuse_bad_shapes() -> None:
    vote = RegionVote("s", GENESIS, 3, "eu", EU)
    assert RegionVote.decode(vote.encode()) == vote
    votes = RegionVotes("eu", EU, (b"one", b"two"))
    assert RegionVotes.from_block(votes.to_block()) == votes
    body = dag_cbor.decode(vote.encode())
    assert isinstance(body, dict)
    for changes, match in [
        ({"region": "e/u"}, "region"),
        ({"round": 1 << 53}, "round"),
        ({"record": RESULT}, "codec"),
        ({"session": "x" * 300}, "session"),
    ]:
        with pytest.raises(MalformedManifest, match=match):
            RegionVote.decode(dag_cbor.encode({**body, **changes}))
    raw = dag_cbor.decode(votes.to_block().data)
    assert isinstance(raw, dict)
    for changes, match in [
        ({"votes": []}, "encoded votes"),
        ({"votes": ["text"]}, "encoded votes"),
    ]:
        block = Block.new(dag_cbor.encode({**raw, **changes}), "dag-cbor")
        with pytest.raises(MalformedManifest, match=match):
            RegionVotes.from_block(block)
    with pytest.raises(MalformedManifest, match="too large"):
        RegionVotes.from_block(Block.new(b"\xa0" + b"\x00" * (MAX_RECORD_BYTES + 1), "dag-cbor"))
