"""Node: one daemon's RPC client, store and pubsub; over real Kubo daemons and in memory."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedRoundResult, AgreedSession, Node
from gradfed_ipfs.errors import BlockTimeout, GenesisMismatch, KuboRpcError
from gradfed_ipfs.federated.besteffort import RoundConfig
from gradfed_ipfs.kubo import KuboDaemon, MemoryPubsubBus
from gradfed_ipfs.node import pick_dial_address
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore
from tests.conftest import KuboNode
from tests.polling import apoll_until

CONFIG = RoundConfig(
    min_peers=1,
    collect_timeout=30.0,
    fetch_timeout=30.0,
    subscriber_timeout=20.0,
    republish_interval=0.1,
)


@pytest.fixture
def two_unconnected(kubo_binary: Path) -> Iterator[list[KuboDaemon]]:
    """Two loopback daemons that do not know each other (unlike a ``KuboSwarm``)."""
    daemons = [KuboDaemon(binary=kubo_binary) for _ in range(2)]
    try:
        for daemon in daemons:
            daemon.start()
        yield daemons
    finally:
        for daemon in daemons:
            daemon.stop()


def test_pick_dial_address_prefers_loopback_tcp() -> None:
    addresses = [
        "/ip4/10.0.0.5/tcp/4001",
        "/ip4/127.0.0.1/udp/4001/quic-v1",
        "/ip4/127.0.0.1/tcp/4001/p2p/12D3Relay/p2p-circuit",
        "/ip4/127.0.0.1/tcp/4001",
    ]
    assert pick_dial_address(addresses, "12D3Me") == "/ip4/127.0.0.1/tcp/4001/p2p/12D3Me"
    assert pick_dial_address(["/ip4/10.0.0.5/tcp/1/p2p/X"], "X") == "/ip4/10.0.0.5/tcp/1/p2p/X"
    with pytest.raises(KuboRpcError, match="no TCP address"):
        pick_dial_address(["/ip4/127.0.0.1/udp/1/quic-v1"], "X")


async def test_node_shares_one_rpc_client() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(200, json={"ID": "12D3Fake", "Addresses": []})

    async with Node("http://kubo.test", transport=httpx.MockTransport(handler)) as node:
        assert await node.peer_id() == "12D3Fake"
        assert isinstance(node.store, KuboBlockStore)
        assert node.store.rpc is node.rpc
        assert await node.store.peer_id() == "12D3Fake"
    assert calls == ["/api/v0/id", "/api/v0/id"]  # the second is the store's own call


async def test_runner_needs_the_peer_id_first() -> None:
    node = Node("http://kubo.test", transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    with pytest.raises(KuboRpcError, match="async with"):
        node.runner("s")
    await node.aclose()


async def test_memory_nodes_run_a_round() -> None:
    bus, store = MemoryPubsubBus(), MemoryBlockStore()
    grads = [np.full(1000, v, dtype=np.float32) for v in (1.0, 3.0)]
    async with (
        Node.memory("a", bus=bus, store=store) as a,
        Node.memory("b", bus=bus, store=store) as b,
    ):
        cid = await a.put_gradient(grads[0])
        np.testing.assert_array_equal(await b.fetch_gradient(cid), grads[0])
        assert await a.connect(b) == ""
        assert await a.peers() == []
        runners = [n.runner("mem", config=CONFIG) for n in (a, b)]
        results = await asyncio.gather(
            *(r.run_round(0, g, num_samples=1) for r, g in zip(runners, grads, strict=True))
        )
    for result in results:
        np.testing.assert_array_equal(result.aggregate, np.full(1000, 2.0, dtype=np.float32))
        assert result.stats.participants == 2


@pytest.mark.kubo
async def test_nodes_connect_exchange_and_run_a_round(two_unconnected: list[KuboDaemon]) -> None:
    first, second = two_unconnected
    rng = np.random.default_rng(7)
    grads = [rng.standard_normal(300_000).astype(np.float32) for _ in range(2)]  # chunked DAGs
    async with Node(first.api_url, timeout=20.0) as a, Node(second.api_url, timeout=20.0) as b:
        assert await a.peer_id() == first.peer_id
        assert await a.peers() == []
        cid = await a.put_gradient(grads[0])
        with pytest.raises(BlockTimeout):  # not connected: b cannot find a's blocks
            await b.fetch_gradient(cid, timeout=0.5, retries=0)

        dialled = await b.connect(a.api_url)  # by API URL
        assert dialled.endswith(f"/p2p/{first.peer_id}")
        assert first.peer_id in await b.peers()

        async def a_sees_b() -> bool:
            return second.peer_id in await a.peers()

        await apoll_until(a_sees_b, timeout=10, what="the connection at a")
        await a.connect(b)  # by Node: already connected, still fine
        np.testing.assert_array_equal(await b.fetch_gradient(cid), grads[0])

        runners = [a.runner("node-test", config=CONFIG), b.runner("node-test", config=CONFIG)]
        results = await asyncio.gather(
            *(
                r.run_round(1, g, num_samples=n)
                for r, g, n in zip(runners, grads, (1, 3), strict=True)
            )
        )
    reference = (grads[0] * 1 + grads[1] * 3) / 4
    for result, other in zip(results, (second.peer_id, first.peer_id), strict=True):
        assert set(result.contributors) == {other}
        np.testing.assert_allclose(result.aggregate, reference, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- agreed sessions

AGREED = {"collect_timeout": 5.0, "round_timeout": 30.0, "announce_interval": 0.05}
D = 1000


def initial(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(D).astype(np.float32)


def delta(index: int, round_number: int) -> np.ndarray:
    return (0.01 * np.random.default_rng([index, round_number]).standard_normal(D)).astype(
        np.float32
    )


async def agreed_rounds(nodes: list[Node], session: str, rounds: int) -> list[AgreedSession]:
    """Join ``session`` on every node and run ``rounds`` rounds; check each round's CIDs agree."""
    members = tuple([await node.peer_id() for node in nodes])
    config = AgreedConfig(members=members, **AGREED)  # type: ignore[arg-type]
    sessions = [await node.session(session, initial(), config) for node in nodes]
    expected = initial()
    for r in range(rounds):
        results: list[AgreedRoundResult] = await asyncio.gather(
            *(s.run_round(delta(i, r), weight=1 + i) for i, s in enumerate(sessions))
        )
        assert len({str(result.model) for result in results}) == 1, r
        assert all(result.roster.peers == tuple(sorted(members)) for result in results)
        weights = np.arange(1, len(nodes) + 1) / sum(range(1, len(nodes) + 1))
        step = sum(w * delta(i, r).astype(np.float64) for i, w in enumerate(weights))
        expected = (expected.astype(np.float64) + step).astype(np.float32)
    for session in sessions:
        np.testing.assert_allclose(session.model, expected, rtol=0, atol=1e-6)
    return sessions


async def test_session_needs_the_node_entered() -> None:
    node = Node("http://kubo.test", transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    with pytest.raises(KuboRpcError, match="async with"):
        await node.session("s", initial(), AgreedConfig(members=("a",)))
    await node.aclose()


async def test_session_refuses_a_node_that_is_not_a_member() -> None:
    async with Node.memory("outsider") as node:
        with pytest.raises(GenesisMismatch, match="not a member"):
            await node.session("s", initial(), AgreedConfig(members=("a", "b")))


async def test_memory_nodes_agree_through_node_session() -> None:
    bus, store = MemoryPubsubBus(), MemoryBlockStore()
    async with (
        Node.memory("a", bus=bus, store=store) as a,
        Node.memory("b", bus=bus, store=store) as b,
        Node.memory("c", bus=bus, store=store) as c,
    ):
        # 4 rounds: with model_every=4 the last one stores its model, fetched below
        sessions = await agreed_rounds([a, b, c], "mem-agreed", rounds=4)
        assert sessions[0].round == 4
        genesis = await AgreedSession.commit_genesis(store, initial())
        assert sessions[0].genesis == genesis
        model = await b.fetch_gradient(sessions[2].model_cid)
        np.testing.assert_array_equal(model, sessions[0].model)
    assert all(not s._tasks for s in sessions)  # closed with their nodes


@pytest.mark.kubo
async def test_kubo_nodes_agree_through_node_session(kubo_swarm3: list[KuboNode]) -> None:
    nodes = [Node(daemon.api_url, timeout=20.0) for daemon in kubo_swarm3]
    async with nodes[0], nodes[1], nodes[2]:
        sessions = await agreed_rounds(nodes, f"node-session-{time.time_ns()}", rounds=4)
        for session in sessions:  # every peer hears every head before any stops announcing
            assert len(await session.linger(timeout=20.0, grace=0.0)) == 3
        model = await nodes[1].fetch_gradient(sessions[0].model_cid)
        np.testing.assert_array_equal(model, sessions[2].model)
    assert all(not s._tasks for s in sessions)
