"""Issue 8, scenario 5: corruption at rest, on real Kubo daemons.

Two ways a pinned block's bytes go bad:

* **on disk**: the block's flatfs file under ``$IPFS_PATH/blocks/`` (named by the base32 of
  its multihash) is overwritten with mutated bytes while the daemon runs;
* **in transit**: a proxy transport in front of the RPC API alters ``block/get`` answers.

Every fetch of a corrupted block must raise ``BlockCorrupt`` (Kubo's default
``Datastore.HashOnRead=false`` serves the altered file as it is; our store re-hashes). Counts:
``tests/reliability/profile.py`` (CI 100, ``GRADFED_RELIABILITY=full`` 1,000).
"""

from __future__ import annotations

import base64
import random
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest

from gradfed_ipfs import BlockCorrupt, BlockTimeout, put_gradient
from gradfed_ipfs.federated.accumulate import DistributedGradientAccumulator
from gradfed_ipfs.kubo import KuboDaemon
from gradfed_ipfs.storage import Block, KuboBlockStore

from .profile import CORRUPTIONS

pytestmark = pytest.mark.kubo

MUTATIONS = ("flip", "truncate", "extend", "zero", "random", "swap")


def flatfs_path(daemon: KuboDaemon, block: Block) -> Path:
    """The flatfs file holding ``block`` in ``daemon``'s repo (keyed by its multihash)."""
    key = base64.b32encode(bytes(block.cid.digest)).decode().rstrip("=")
    matches = list((daemon.repo / "blocks").glob(f"*/{key}.data"))
    assert len(matches) == 1, f"no flatfs file for {block.cid} ({key})"
    return matches[0]


def mutate(data: bytes, kind: str, rng: random.Random, other: bytes) -> bytes:
    """``data`` altered by one mutation of ``kind``; never equal to ``data``."""
    out = bytearray(data)
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del out[rng.randrange(len(out)) :]
    elif kind == "extend":
        out += rng.randbytes(rng.randint(1, 64))
    elif kind == "zero":
        start = rng.randrange(len(out))
        out[start : start + rng.randint(1, 256)] = b"\0" * len(out[start : start + 256])
    elif kind == "random":
        out = bytearray(rng.randbytes(len(data)))
    else:  # another block's bytes under this block's name
        out = bytearray(other)
    if bytes(out) == data:
        out.append(0)
    return bytes(out)


def _gradient_blocks(rng: np.random.Generator, count: int) -> list[Block]:
    from gradfed_ipfs.formats.arrow import store_gradient_as_arrow

    return [
        Block.new(store_gradient_as_arrow(rng.standard_normal(int(rng.integers(16, 4096)))))
        for _ in range(count)
    ]


async def test_corrupted_flatfs_file_is_never_accepted(fresh_daemon: KuboDaemon) -> None:
    rng = random.Random(8)
    blocks = _gradient_blocks(np.random.default_rng(8), 8)
    outcomes: Counter[str] = Counter()
    async with KuboBlockStore(fresh_daemon.api_url, timeout=5.0) as store:
        for block in blocks:
            await store.put(block)
        paths = {block.cid: flatfs_path(fresh_daemon, block) for block in blocks}
        for i in range(CORRUPTIONS):
            block = blocks[i % len(blocks)]
            other = blocks[(i + 1) % len(blocks)]
            kind = MUTATIONS[i % len(MUTATIONS)]
            paths[block.cid].write_bytes(mutate(block.data, kind, rng, other.data))
            try:
                with pytest.raises(BlockCorrupt) as info:
                    await store.get(block.cid)
            finally:
                paths[block.cid].write_bytes(block.data)
            assert info.value.cid == block.cid, f"corruption {i} ({kind})"
            outcomes[type(info.value).__name__] += 1
        # Restored files are served again, and every block is still pinned.
        for block in blocks:
            assert (await store.get(block.cid)).data == block.data
            assert await store.is_pinned(block.cid)
    assert outcomes == {"BlockCorrupt": CORRUPTIONS}


async def test_corrupted_chunk_of_a_pinned_dag_fails_the_peer_gradient(
    fresh_daemon: KuboDaemon,
) -> None:
    gradient = np.random.default_rng(9).standard_normal(50_000).astype(np.float32)
    async with KuboBlockStore(fresh_daemon.api_url, timeout=5.0) as store:
        root = await put_gradient(store, gradient, chunk_bytes=65_536)
        assert root.codec.name == "dag-cbor"
        chunk_cids = [c for c in await store.list_cids() if c.codec.name == "raw"]
        victim = await store.get(chunk_cids[len(chunk_cids) // 2])
        flatfs_path(fresh_daemon, victim).write_bytes(
            mutate(victim.data, "flip", random.Random(1), b"")
        )
        accumulator = DistributedGradientAccumulator("corruption")
        with pytest.raises(BlockCorrupt):
            await accumulator.add_peer_gradient("peer-a", root, store)
        # Nothing of the rejected gradient is held.
        assert accumulator.peer_count == 0
        assert accumulator.peer_cids == {}


async def test_corrupted_block_is_not_served_over_bitswap(
    fresh_daemon: KuboDaemon, kubo_binary: Path
) -> None:
    """A peer's corrupted flatfs file never reaches another daemon: bitswap re-hashes too."""
    block = _gradient_blocks(np.random.default_rng(10), 1)[0]
    async with KuboBlockStore(fresh_daemon.api_url, timeout=5.0) as owner:
        await owner.put(block)
    flatfs_path(fresh_daemon, block).write_bytes(mutate(block.data, "flip", random.Random(2), b""))
    fetcher = KuboDaemon(binary=kubo_binary)
    try:
        fetcher.start()
        fetcher.connect(fresh_daemon)
        async with KuboBlockStore(fetcher.api_url, timeout=3.0) as store:
            # Kubo drops the bad block on arrival; the fetch ends by timeout, never with bytes.
            with pytest.raises(BlockTimeout):
                await store.get(block.cid, timeout=2.0)
            assert not await store.has(block.cid)
    finally:
        fetcher.stop()


async def test_hash_on_read_daemon_refuses_corrupted_file(kubo_binary: Path) -> None:
    """With ``Datastore.HashOnRead=true`` Kubo itself refuses the file: ``BlockCorrupt`` too."""
    daemon = KuboDaemon(binary=kubo_binary, extra_config=[("Datastore.HashOnRead", "true")])
    block = _gradient_blocks(np.random.default_rng(11), 1)[0]
    try:
        daemon.start()
        async with KuboBlockStore(daemon.api_url, timeout=3.0) as store:
            await store.put(block)
            flatfs_path(daemon, block).write_bytes(
                mutate(block.data, "flip", random.Random(3), b"")
            )
            with pytest.raises(BlockCorrupt, match="different hash"):
                await store.get(block.cid, timeout=2.0)
    finally:
        daemon.stop()


class CorruptingTransport(httpx.AsyncBaseTransport):
    """Forwards to the daemon; answers every ``block/get`` with randomly mutated bytes."""

    def __init__(self, seed: int) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._rng = random.Random(seed)
        self.count = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        if not request.url.path.endswith("/block/get") or response.status_code != 200:
            return response
        body = await response.aread()
        kind = MUTATIONS[self.count % len(MUTATIONS)]
        self.count += 1
        altered = mutate(body, kind, self._rng, self._rng.randbytes(len(body)))
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        return httpx.Response(response.status_code, headers=headers, content=altered)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_proxy_serving_altered_bytes_is_never_accepted(kubo_node: object) -> None:
    api = kubo_node.api_url  # type: ignore[attr-defined]
    blocks = _gradient_blocks(np.random.default_rng(12), 8)
    async with KuboBlockStore(api) as honest:
        for block in blocks:
            await honest.put(block)
    transport = CorruptingTransport(seed=12)
    corrupt = 0
    async with KuboBlockStore(api, transport=transport) as tampered:
        for i in range(CORRUPTIONS):
            block = blocks[i % len(blocks)]
            with pytest.raises(BlockCorrupt):
                await tampered.get(block.cid)
            corrupt += 1
        accumulator = DistributedGradientAccumulator("proxy")
        with pytest.raises(BlockCorrupt):
            await accumulator.add_peer_gradient("peer-a", blocks[0].cid, tampered)
        assert accumulator.peer_count == 0
    async with KuboBlockStore(api) as honest:
        for block in blocks:
            await honest.unpin(block.cid)
    assert corrupt == transport.count - 1 == CORRUPTIONS
