"""``Peer(node=...)``: a training peer on a :class:`~gradfed_ipfs.Node`, in memory and on Kubo."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedSession, ConfigError, Node
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore
from gradfed_ipfs.training import (
    Client,
    FederationConfig,
    History,
    Peer,
    VectorAdapter,
    run_simulation,
)
from gradfed_ipfs.training.simulation import SIMULATION_TIMING
from tests.adversarial.hostile import FORGED_FILL, forged_head
from tests.conftest import KuboNode
from tests.polling import apoll_until

D = 16
CONFIG: FederationConfig[np.ndarray] = FederationConfig(rounds=3, final_evaluation=False)


def client(index: int) -> Client[np.ndarray]:
    """Moves the model a tenth of the way to this peer's target; ``index + 1`` samples."""
    target = np.random.default_rng(index).standard_normal(D).astype(np.float32)

    def train(model: np.ndarray, _config: object) -> tuple[np.ndarray, int, Mapping[str, float]]:
        return model + 0.1 * (target - model), index + 1, {}

    return Client(train)


def peer(
    node: Node,
    index: int,
    members: tuple[str, ...],
    session: str,
    *,
    config: FederationConfig[np.ndarray] = CONFIG,
    timing: Mapping[str, float] = SIMULATION_TIMING,
) -> Peer[np.ndarray]:
    return Peer(
        node=node,
        client=client(index),
        adapter=VectorAdapter(),
        initial_model=np.zeros(D, np.float32),
        config=config,
        agreed=AgreedConfig(members=members, **timing),  # type: ignore[arg-type]
        session=session,
    )


def test_peer_takes_a_node_or_a_store_and_pubsub_not_both() -> None:
    node = Node.memory("a")
    common = {
        "client": client(0),
        "adapter": VectorAdapter(),
        "initial_model": np.zeros(D, np.float32),
        "config": CONFIG,
        "agreed": AgreedConfig(members=("a",)),
    }
    for wrong in (
        {"node": node, "store": node.store},
        {"node": node, "store": node.store, "pubsub": node.pubsub},
        {"store": node.store},
        {},
    ):
        with pytest.raises(ConfigError, match="either node= or both store= and pubsub="):
            Peer(**wrong, **common)  # type: ignore[arg-type]
    assert Peer(node=node, **common).store is node.store  # type: ignore[arg-type]


async def test_memory_nodes_train_like_the_simulation() -> None:
    members = tuple(f"peer-{i}" for i in range(3))
    bus, store = MemoryPubsubBus(), MemoryBlockStore()
    nodes = [Node.memory(m, bus=bus, store=store) for m in members]
    async with nodes[0], nodes[1], nodes[2]:
        peers = [peer(node, i, members, "simulation") for i, node in enumerate(nodes)]
        histories: list[History] = await asyncio.gather(*(p.run() for p in peers))
    simulated = await run_simulation(
        [client(i) for i in range(3)],
        adapter=VectorAdapter(),
        initial_model=np.zeros(D, np.float32),
        config=CONFIG,
    )
    finals = {h.entries[-1].model for h in [*histories, *simulated]}
    assert len(finals) == 1  # the same agreed model as Peer(store=, pubsub=)
    assert [len(h.entries) for h in histories] == [3, 3, 3]


@pytest.mark.kubo
async def test_kubo_nodes_train_through_peer(kubo_swarm3: list[KuboNode]) -> None:
    nodes = [Node(daemon.api_url, timeout=20.0) for daemon in kubo_swarm3]
    members = tuple(daemon.peer_id for daemon in kubo_swarm3)
    async with nodes[0], nodes[1], nodes[2]:
        session = f"peer-node-{time.time_ns()}"
        peers = [peer(node, i, members, session) for i, node in enumerate(nodes)]
        histories: list[History] = await asyncio.gather(*(p.run() for p in peers))
    assert len({h.entries[-1].model for h in histories}) == 1
    assert all(len(h.entries) == 3 for h in histories)
    np.testing.assert_array_equal(peers[0].model_vector, peers[2].model_vector)


async def test_a_lingering_peer_is_still_there_for_a_member_that_comes_late() -> None:
    # Prepare: peers 0 and 1 train 2 rounds between them (2 of 3 members suffice) and linger.
    members = tuple(f"peer-{i}" for i in range(3))
    timing = {**SIMULATION_TIMING, "collect_timeout": 0.5, "round_timeout": 5.0}
    config: FederationConfig[np.ndarray] = FederationConfig(
        rounds=2, final_evaluation=False, min_available=2
    )
    bus, store = MemoryPubsubBus(), MemoryBlockStore()
    nodes = [Node.memory(m, bus=bus, store=store) for m in members]

    def member(i: int) -> Peer[np.ndarray]:
        return peer(nodes[i], i, members, "late", config=config, timing=timing)

    async with nodes[0], nodes[1], nodes[2]:
        early = [member(0), member(1)]
        running = [asyncio.create_task(p.run(linger=30.0)) for p in early]

        async def trained() -> bool:
            assert not any(task.done() for task in running), "an early peer stopped"
            return all(p.session is not None and p.session.round >= 2 for p in early)

        await apoll_until(trained, timeout=30.0, what="the early peers' two rounds")
        # Execute: the third member starts only now and resumes from the members' head.
        late = member(2)
        await late.run(resume=True, resync_timeout=5.0, linger=30.0)
        await asyncio.gather(*running)
    # Assert: it adopted the agreed model (it was still announced), and the early peers
    # closed only once it had finished too.
    assert late.session is not None
    assert early[0].session is not None
    assert late.session.model_cid == early[0].session.model_cid
    assert late.session.round == 2


async def test_a_peer_resuming_past_a_forged_head_adopts_the_honest_one() -> None:
    """Issue 32, attack 3, through ``Peer.run(resume=True)``: after 3 honest rounds (peers 0,
    1 and 2 of 4) peer 2 announces a round-3 record extending the real head, naming a stored
    fake model and a roster nobody serves; peer 3 starts from nothing and resumes."""
    members = tuple(f"peer-{i}" for i in range(4))
    timing = {**SIMULATION_TIMING, "collect_timeout": 0.5, "round_timeout": 10.0}
    config: FederationConfig[np.ndarray] = FederationConfig(
        rounds=3, final_evaluation=False, min_available=3
    )
    bus, store = MemoryPubsubBus(), MemoryBlockStore()
    nodes = [Node.memory(m, bus=bus, store=store) for m in members]

    def member(i: int) -> Peer[np.ndarray]:
        return peer(nodes[i], i, members, "forged", config=config, timing=timing)

    async with nodes[0], nodes[1], nodes[2], nodes[3]:
        first = [member(0), member(1), member(2)]
        # peers 0 and 1 linger until peer 3 has announced a head; peer 2 stops
        running = [asyncio.create_task(p.run(linger=30.0)) for p in first[:2]]
        await first[2].run()
        done = first[2].session
        assert done is not None
        assert done.head is not None
        evil = AgreedSession(store, nodes[2].pubsub, "forged", done.genesis, done.config)
        await evil.start()
        try:
            result, record = await forged_head(store, done.head, done.model.size)
            await evil._parts.messages.done(3, result, record)

            async def heard() -> bool:
                heads = [p.session.board.heads.get("peer-2") for p in first[:2] if p.session]
                return all(h is not None and h.record == record for h in heads)

            await apoll_until(heard, timeout=10.0, what="the forged head")
            late = member(3)
            await late.run(resume=True, resync_timeout=5.0)
        finally:
            await evil.aclose()
        await asyncio.gather(*running)
    honest = first[0].session
    assert late.session is not None
    assert honest is not None
    assert (late.session.round, late.session.head) == (3, honest.head)
    assert late.session.model_cid == honest.model_cid != result
    np.testing.assert_array_equal(late.model_vector, first[0].model_vector)
    assert float(np.mean(late.model_vector)) != pytest.approx(FORGED_FILL)
