"""The decode memo, the JSON depth scan and Block.hashed: cheaper per message, same checks."""

from __future__ import annotations

import json

import pytest

from gradfed_ipfs.block import Block
from gradfed_ipfs.errors import BlockCorrupt, MalformedAnnouncement
from gradfed_ipfs.formats.agreed.roster import AgreedMessage
from gradfed_ipfs.formats.limits import json_depth, load_json
from gradfed_ipfs.formats.memo import DecodeMemo
from gradfed_ipfs.storage import MemoryBlockStore


def test_memo_keeps_at_most_its_entries_and_bytes_oldest_out() -> None:
    memo: DecodeMemo[bytes, int] = DecodeMemo(max_entries=3, max_bytes=10)
    for i in range(5):
        memo.put(bytes([i]), i, 1)
    assert len(memo) == 3
    assert memo.get(bytes([0])) is None
    assert memo.get(bytes([4])) == 4
    memo.put(b"big", 99, 9)  # 3 + 9 bytes > 10: the oldest go until it fits
    assert memo.get(b"big") == 99
    assert memo.get(bytes([2])) is None
    memo.put(b"huge", 1, 11)  # larger than the whole memo: not kept
    assert memo.get(b"huge") is None


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (r'["a\\", [1]]', 2),  # an escaped backslash ends the string
        (r'["a\"]", [1]]', 2),  # an escaped quote does not
        (r'["\\\"[[", {"k": [[]]}]', 4),
        ('"[[["', 0),
        ("[" * 40 + "]" * 40, 40),
    ],
)
def test_json_depth_counts_only_brackets_outside_strings(text: str, depth: int) -> None:
    assert json_depth(text) == depth
    json.loads(text)  # every case is valid JSON


def test_deep_json_is_still_refused_and_bad_bytes_are_not_remembered() -> None:
    with pytest.raises(MalformedAnnouncement, match="nested 33 deep"):
        load_json(b"[" * 33 + b"]" * 33, "x", error=MalformedAnnouncement, max_depth=32)
    for _ in range(2):  # refused each time: a failed decode is not kept
        with pytest.raises(MalformedAnnouncement):
            AgreedMessage.decode(b'{"v": 1}')


async def test_only_blocks_this_process_hashed_skip_the_put_check() -> None:
    good = Block.new(b"payload")
    assert good.hashed
    forged = Block(good.cid, b"other bytes")  # the constructor trusts the CID: not hashed
    assert not forged.hashed
    assert Block.from_parts(good.cid, good.data).hashed
    assert not Block.from_parts(good.cid, b"x", verify=False).hashed
    store = MemoryBlockStore()
    with pytest.raises(BlockCorrupt):
        await store.put(forged)
    await store.put(good)
    store.blocks[bytes(good.cid)] = (good.cid, b"tampered")
    with pytest.raises(BlockCorrupt):
        await store.get(good.cid)  # get always re-hashes
