"""decode_manifest_window answers as ChunkManifest.decode (then filtered) does, errors too."""

from __future__ import annotations

from typing import Any

import dag_cbor
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import MalformedManifest
from gradfed_ipfs.formats import manifest_window
from gradfed_ipfs.formats.manifest import ChunkManifest, ChunkRef
from gradfed_ipfs.formats.manifest_window import decode_manifest_window


def manifest(lengths: list[int], shape: tuple[int, ...] | None = None) -> bytes:
    refs, offset = [], 0
    for i, n in enumerate(lengths):
        refs.append(ChunkRef(make_cid(i.to_bytes(4, "big")), offset, n))
        offset += n
    return ChunkManifest(shape or (offset,), offset, tuple(refs)).encode()


def reference(data: bytes, offset: int, stop: int, max_length: int) -> ChunkManifest:
    whole = ChunkManifest.decode(data, max_length=max_length)
    chunks = tuple(c for c in whole.chunks if c.offset < stop and c.stop > offset)
    return ChunkManifest(whole.shape, whole.length, chunks)


def outcome(decode: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", decode(*args)
    except MalformedManifest as exc:
        return "error", str(exc)


def both(data: bytes, offset: int, stop: int, max_length: int = 1 << 40) -> tuple[Any, Any]:
    fast = outcome(lambda: decode_manifest_window(data, offset, stop, max_length=max_length))
    slow = outcome(lambda: reference(data, offset, stop, max_length))
    return fast, slow


@pytest.mark.parametrize(
    ("lengths", "shape"),
    [
        ([15_625] * 64, None),
        ([10] * 30 + [3], None),
        ([1], None),
        ([5, 5, 5, 5], (4, 5)),
        ([5, 5, 5, 5], (2, 2, 5)),
        ([300_000, 70_000], None),  # multi-byte integer heads
        ([1 << 19] * 2, None),  # the largest chunk
        ([24, 23, 256, 255, 65_536, 65_535], None),  # every head width at its edge
    ],
)
def test_windows_of_valid_manifests_match_the_full_decode(
    lengths: list[int], shape: tuple[int, ...] | None
) -> None:
    data = manifest(lengths, shape)
    total = sum(lengths)
    for offset, stop in [(0, total), (0, 1), (total - 1, total), (total // 3, total // 2)]:
        fast, slow = both(data, offset, stop)
        assert fast == slow, (offset, stop)
        assert fast[0] == "ok"


def test_more_than_a_budget_of_values_is_refused_alike() -> None:
    data = manifest([100] * 4)
    fast, slow = both(data, 0, 10, max_length=399)
    assert fast == slow
    assert fast[0] == "error"


@pytest.mark.parametrize(
    "record",
    [
        {"offset": [0, 10, 10]},  # a gap
        {"offset": [0, 11, 20]},  # not contiguous
        {"length": [10, 0, 10]},  # an empty chunk
        {"length": [10, 1 << 20, 10]},  # a chunk over the block limit
        {"cid": [0, 0, 1]},  # one block named twice
        {"total": 31},  # lengths do not sum to it
        {"shape": [5, 7]},  # the shape does not hold the length
        {"shape": [True]},
        {"codec": "dag-cbor"},  # a chunk that is not a raw block
        {"extra": 1},
    ],
)
def test_hand_made_malformed_manifests_are_refused_alike(record: dict[str, Any]) -> None:
    offsets = record.get("offset", [0, 10, 20])
    lengths = record.get("length", [10, 10, 10])
    ids = record.get("cid", [0, 1, 2])
    codec = record.get("codec", "raw")
    body: dict[str, Any] = {
        "format": "gradfed/chunked-gradient", "version": 1, "dtype": "float32",
        "shape": record.get("shape", [record.get("total", 30)]),
        "length": record.get("total", 30),
        "chunks": [
            {"cid": make_cid(bytes([i]), codec), "offset": o, "length": n}
            for i, o, n in zip(ids, offsets, lengths, strict=True)
        ],
    }  # fmt: skip
    if "extra" in record:
        body["extra"] = record["extra"]
    fast, slow = both(dag_cbor.encode(body), 0, 30)
    assert fast == slow
    assert fast[0] == "error"


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_mutated_manifests_decode_or_fail_exactly_as_the_full_decode(data: st.DataObject) -> None:
    raw = bytearray(manifest(data.draw(st.lists(st.integers(1, 70_000), min_size=1, max_size=5))))
    position = data.draw(st.integers(0, len(raw) - 1))
    change = data.draw(st.sampled_from(["flip", "cut", "insert"]))
    if change == "flip":
        raw[position] ^= data.draw(st.integers(1, 255))
    elif change == "cut":
        del raw[position:]
    else:
        raw[position:position] = data.draw(st.binary(min_size=1, max_size=2))
    offset = data.draw(st.integers(0, 400_000))
    fast, slow = both(bytes(raw), offset, offset + data.draw(st.integers(1, 100_000)))
    assert fast == slow


def test_valid_manifests_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without this, every test above would pass with a fast path that always hands over."""
    data = manifest([15_625] * 64)
    want = reference(data, 20_000, 40_000, 1 << 30)
    monkeypatch.setattr(manifest_window.ChunkManifest, "decode", None)  # a hand-over raises
    got = decode_manifest_window(data, 20_000, 40_000, max_length=1 << 30)
    assert got == want
    assert len(got.chunks) == 2
