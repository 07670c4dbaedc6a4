"""Chunked gradients: manifest validation, chunked put/fetch, corruption, pinning on Kubo."""

from __future__ import annotations

import contextlib

import dag_cbor
import httpx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradfed_ipfs.cid import DAG_CBOR, RAW, make_cid
from gradfed_ipfs.errors import (
    BlockCorrupt,
    BlockNotFound,
    InvalidGradient,
    MalformedManifest,
    StoreUnavailable,
)
from gradfed_ipfs.formats.arrow import store_gradient_as_arrow
from gradfed_ipfs.storage import Block, KuboBlockStore, MemoryBlockStore
from gradfed_ipfs.storage.dag import (
    MANIFEST_FORMAT,
    ChunkManifest,
    ChunkRef,
    fetch_gradient,
    fetch_manifest,
    plan_chunks,
    put_gradient,
    values_per_chunk,
)

CHUNK = 65_536  # smallest chunk size: many chunks from small arrays keeps tests fast


def rng_values(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_plan_chunks_cover_contiguously() -> None:
    per = values_per_chunk(CHUNK)
    assert per % 64 == 0
    assert 4 * per < CHUNK
    ranges = plan_chunks(2 * per + 5, CHUNK)
    assert ranges == [(0, per), (per, per), (2 * per, 5)]
    with pytest.raises(InvalidGradient):
        values_per_chunk(3 * 1024 * 1024)


async def test_small_gradient_keeps_single_raw_cid() -> None:
    store = MemoryBlockStore()
    cid = await put_gradient(store, [1.0, 2.0, 3.0])
    assert cid.codec.code == RAW
    assert cid == make_cid(store_gradient_as_arrow([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(await fetch_gradient(store, cid), [1, 2, 3])


async def test_chunked_round_trip_with_shape_and_progress() -> None:
    store = MemoryBlockStore()
    values = rng_values(3 * values_per_chunk(CHUNK) + 17).reshape(-1, 1)
    seen: list[tuple[int, int]] = []
    cid = await put_gradient(store, values, chunk_bytes=CHUNK)
    assert cid.codec.code == DAG_CBOR
    assert str(cid).startswith("bafyrei")
    manifest = await fetch_manifest(store, cid)
    assert len(manifest.chunks) == 4
    assert manifest.shape == values.shape
    assert all(len(store.blocks[bytes(c.cid)][1]) <= CHUNK for c in manifest.chunks)
    out = await fetch_gradient(store, cid, concurrency=3, progress=lambda d, t: seen.append((d, t)))
    assert out.shape == values.shape
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, values)
    assert len(seen) == 4
    assert seen[-1] == (values.nbytes, values.nbytes)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


async def test_manifest_uses_real_ipld_links() -> None:
    store = MemoryBlockStore()
    cid = await put_gradient(store, rng_values(values_per_chunk(CHUNK) + 1), chunk_bytes=CHUNK)
    data = store.blocks[bytes(cid)][1]
    assert b"\xd8\x2a" in data  # CBOR tag 42 (an IPLD link)
    record = dag_cbor.decode(data)
    assert record["format"] == MANIFEST_FORMAT
    assert record["version"] == 1
    assert record["dtype"] == "float32"
    assert [c["offset"] for c in record["chunks"]] == [0, values_per_chunk(CHUNK)]


async def test_corrupt_chunk_fails_whole_gradient_naming_it() -> None:
    store = MemoryBlockStore()
    cid = await put_gradient(store, rng_values(3 * values_per_chunk(CHUNK)), chunk_bytes=CHUNK)
    manifest = await fetch_manifest(store, cid)
    bad = manifest.chunks[1].cid
    original = store.blocks[bytes(bad)][1]
    store.blocks[bytes(bad)] = (bad, original[:-20] + b"\0" * 20)
    with pytest.raises(BlockCorrupt, match="chunk 1") as info:
        await fetch_gradient(store, cid)
    assert str(bad) in str(info.value)


async def test_chunk_with_wrong_length_is_corrupt() -> None:
    store = MemoryBlockStore()
    short = await store.put(Block.new(store_gradient_as_arrow(np.zeros(10, np.float32))))
    manifest = ChunkManifest((20,), 20, (ChunkRef(short, 0, 20),))
    cid = await store.put(manifest.to_block())
    with pytest.raises(BlockCorrupt, match="chunk 0"):
        await fetch_gradient(store, cid)


async def test_equal_chunks_are_distinct_blocks() -> None:
    store = MemoryBlockStore()
    values = np.zeros(3 * values_per_chunk(CHUNK), np.float32)  # three equal ranges
    cid = await put_gradient(store, values, chunk_bytes=CHUNK)
    manifest = await fetch_manifest(store, cid)
    assert len({bytes(c.cid) for c in manifest.chunks}) == 3
    np.testing.assert_array_equal(await fetch_gradient(store, cid), values)


async def test_chunk_moved_to_another_offset_is_corrupt() -> None:
    store = MemoryBlockStore()
    per = values_per_chunk(CHUNK)
    cid = await put_gradient(store, np.zeros(2 * per, np.float32), chunk_bytes=CHUNK)
    first, second = (await fetch_manifest(store, cid)).chunks
    swapped = ChunkManifest(
        (2 * per,), 2 * per, (ChunkRef(second.cid, 0, per), ChunkRef(first.cid, per, per))
    )
    with pytest.raises(BlockCorrupt, match=f"written for offset '{per}'"):
        await fetch_gradient(store, await store.put(swapped.to_block()), concurrency=1)


class FlakyStore(MemoryBlockStore):
    """Fails the first ``failures`` gets with a transient error."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def get(self, cid, *, timeout=None):  # type: ignore[no-untyped-def,override]
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("daemon hiccup")
        return await super().get(cid)


async def test_transient_errors_are_retried() -> None:
    store = FlakyStore(0)
    values = rng_values(2 * values_per_chunk(CHUNK))
    cid = await put_gradient(store, values, chunk_bytes=CHUNK)
    store.failures = 2
    np.testing.assert_array_equal(await fetch_gradient(store, cid, retries=2), values)
    store.failures = 10
    with pytest.raises(StoreUnavailable):
        await fetch_gradient(store, cid, retries=1)


async def test_missing_chunk_is_not_found() -> None:
    store = MemoryBlockStore()
    cid = await put_gradient(store, rng_values(2 * values_per_chunk(CHUNK)), chunk_bytes=CHUNK)
    manifest = await fetch_manifest(store, cid)
    del store.blocks[bytes(manifest.chunks[0].cid)]
    with pytest.raises(BlockNotFound):
        await fetch_gradient(store, cid)


def valid_record() -> dict[str, object]:
    return {
        "format": MANIFEST_FORMAT,
        "version": 1,
        "dtype": "float32",
        "shape": [2, 3],
        "length": 6,
        "chunks": [
            {"cid": make_cid(b"chunk 0"), "offset": 0, "length": 4},
            {"cid": make_cid(b"chunk 1"), "offset": 4, "length": 2},
        ],
    }


def test_valid_manifest_decodes() -> None:
    manifest = ChunkManifest.decode(dag_cbor.encode(valid_record()))
    assert manifest.shape == (2, 3)
    assert manifest.length == 6
    assert len(manifest.chunks) == 2
    assert ChunkManifest.decode(manifest.encode()) == manifest


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("format", "other"),
        ("version", 2),
        ("version", True),
        ("dtype", "float64"),
        ("shape", [7]),
        ("shape", "2x3"),
        ("shape", [-2, -3]),
        ("length", 7),
        ("length", -1),
        ("chunks", []),
        ("chunks", "x"),
        ("chunks.0.offset", 1),
        ("chunks.1.offset", 3),
        ("chunks.1.length", 3),
        ("chunks.1.length", 0),
        ("chunks.0.cid", "bafkreinotalink"),
        ("chunks.0.cid", make_cid(b"x", "dag-cbor")),
        ("chunks.0.extra", 1),
        ("chunks.1.cid", make_cid(b"chunk 0")),  # one block named twice
        ("extra", 1),
    ],
)
def test_malformed_manifests_are_rejected(path: str, value: object) -> None:
    record = valid_record()
    target: object = record
    *parents, last = path.split(".")
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]  # type: ignore[index]
    target[last] = value  # type: ignore[index]
    with pytest.raises(MalformedManifest):
        ChunkManifest.decode(dag_cbor.encode(record))


@given(st.binary(max_size=300))
def test_garbage_never_escapes_as_another_error(data: bytes) -> None:
    with contextlib.suppress(MalformedManifest):
        ChunkManifest.decode(data)


def test_non_map_and_too_many_chunks() -> None:
    with pytest.raises(MalformedManifest):
        ChunkManifest.decode(dag_cbor.encode([1, 2]))
    record = valid_record()
    link = make_cid(b"c")
    record["chunks"] = [{"cid": link, "offset": i, "length": 1} for i in range(70_000)]
    record["shape"] = [70_000]
    record["length"] = 70_000
    with pytest.raises(MalformedManifest, match="cap"):
        ChunkManifest.from_ipld(record)


async def test_fetch_manifest_refuses_raw_cid() -> None:
    store = MemoryBlockStore()
    cid = await put_gradient(store, [1.0])
    with pytest.raises(MalformedManifest):
        await fetch_manifest(store, cid)


async def test_max_length_refused_before_allocation() -> None:
    store = MemoryBlockStore()
    cid = await put_gradient(store, rng_values(values_per_chunk(CHUNK) + 1), chunk_bytes=CHUNK)
    with pytest.raises(MalformedManifest, match="declares"):
        await fetch_gradient(store, cid, max_length=10)


# ---------------------------------------------------------------------------- real Kubo


@pytest.mark.kubo
async def test_pinning_manifest_pins_every_chunk_and_gc_keeps_them(fresh_daemon) -> None:  # type: ignore[no-untyped-def]
    values = rng_values(3 * values_per_chunk(CHUNK) + 3, seed=7)
    async with KuboBlockStore(fresh_daemon.api_url, timeout=5.0) as store:
        cid = await put_gradient(store, values, chunk_bytes=CHUNK)
        unpinned = await put_gradient(store, rng_values(10, seed=8), pin=False)
        manifest = await fetch_manifest(store, cid)
        async with httpx.AsyncClient(base_url=f"{fresh_daemon.api_url}/api/v0") as rpc:
            pins = (await rpc.post("/pin/ls", params={"type": "recursive"})).json()["Keys"]
            assert str(cid) in pins
            for chunk in manifest.chunks:
                answer = (await rpc.post("/pin/ls", params={"arg": str(chunk.cid)})).json()
                assert answer["Keys"][str(chunk.cid)]["Type"].startswith("indirect")
            gc = await rpc.post("/repo/gc", timeout=60)
            assert gc.status_code == 200
        for chunk in manifest.chunks:
            assert await store.has(chunk.cid)
        assert not await store.has(unpinned)
        np.testing.assert_array_equal(await fetch_gradient(store, cid), values)


@pytest.mark.kubo
async def test_chunked_fetch_over_bitswap(kubo_swarm3) -> None:  # type: ignore[no-untyped-def]
    values = rng_values(4 * values_per_chunk(), seed=11)  # four 1 MiB chunks
    a, b = kubo_swarm3[0], kubo_swarm3[1]
    async with (
        KuboBlockStore(a.api_url, timeout=20.0) as owner,
        KuboBlockStore(b.api_url, timeout=20.0) as fetcher,
    ):
        cid = await put_gradient(owner, values)
        assert cid.codec.code == DAG_CBOR
        np.testing.assert_array_equal(await fetch_gradient(fetcher, cid), values)


class TamperingTransport(httpx.AsyncBaseTransport):
    """Forwards to the real daemon but flips bytes in ``block/get`` answers for one CID."""

    def __init__(self, bad_cid: str) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.bad_cid = bad_cid

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/block/get") and request.url.params["arg"] == self.bad_cid:
            body = bytearray(await response.aread())
            body[len(body) // 2] ^= 0xFF
            return httpx.Response(
                response.status_code, headers=response.headers, content=bytes(body)
            )
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.kubo
async def test_corrupt_chunk_on_owner_side_over_kubo(kubo_node) -> None:  # type: ignore[no-untyped-def]
    values = rng_values(3 * values_per_chunk(CHUNK), seed=3)
    async with KuboBlockStore(kubo_node.api_url, timeout=5.0) as owner:
        cid = await put_gradient(owner, values, chunk_bytes=CHUNK)
        manifest = await fetch_manifest(owner, cid)
    bad = str(manifest.chunks[1].cid)
    transport = TamperingTransport(bad)
    async with KuboBlockStore(kubo_node.api_url, timeout=5.0, transport=transport) as fetcher:
        with pytest.raises(BlockCorrupt, match="chunk 1") as info:
            await fetch_gradient(fetcher, cid)
    assert bad in str(info.value)
