"""Training peers whose member set changes (issue 33): join, leave, eviction, on the memory bus.

Three genesis members train; a fourth (allow-listed) joins the running session with
``run(join=True)`` and is sampled from the next round on; one member leaves by
:meth:`Peer.leave`; one stops without leaving and is evicted after ``evict_after`` absent
rounds. Every round samples from its own members, the survivors end on one model, and
:func:`verify_agreed_history` re-checks the chain with the training rule and the member sets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, verify_agreed_history
from gradfed_ipfs.errors import ConfigError
from gradfed_ipfs.federated.agreed import Admission
from gradfed_ipfs.formats.agreed.membership import MemberSet
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore
from gradfed_ipfs.training import Client, FedAvg, FederationConfig, Peer, SecAgg, VectorAdapter
from tests.polling import apoll_until
from tests.training.test_peer_node import D
from tests.training.test_sanity import TIMING

GENESIS = ("peer-a", "peer-b", "peer-c")
JOINER = "peer-d"
ADMISSION = Admission("allow-list", (JOINER,), evict_after=2)
CONFIG: FederationConfig[np.ndarray] = FederationConfig(rounds=60, final_evaluation=False)


def paced(index: int) -> Client[np.ndarray]:
    """Moves the model towards this peer's target; each training takes at least 50 ms."""
    target = np.random.default_rng(index).standard_normal(D).astype(np.float32)

    def train(model: np.ndarray, _config: object) -> tuple[np.ndarray, int, Mapping[str, float]]:
        time.sleep(0.05)  # a stand-in for compute: the others keep training while d joins
        return model + 0.1 * (target - model), index + 1, {}

    return Client(train)


def make_peer(
    store: MemoryBlockStore, bus: MemoryPubsubBus, name: str, index: int, lines: list[str]
) -> Peer[np.ndarray]:
    return Peer(
        store=store, pubsub=bus.endpoint(name), client=paced(index), adapter=VectorAdapter(),
        initial_model=np.zeros(D, np.float32), config=CONFIG, session="members",
        agreed=AgreedConfig(members=GENESIS, admission=ADMISSION, **TIMING),  # type: ignore[arg-type]
        log=lines.append,
    )  # fmt: skip


async def until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    async def check() -> bool:
        return condition()

    await apoll_until(check, timeout=timeout, what=what)


def with_members(lines: list[str], count: int) -> bool:
    return any(f"({count} members)" in line for line in lines)


async def test_peers_follow_a_join_a_leave_and_an_eviction_to_one_verified_model() -> None:
    bus, store = MemoryPubsubBus(), MemoryBlockStore()
    names = [*GENESIS, JOINER]
    lines: dict[str, list[str]] = {name: [] for name in names}
    a, b, c, d = (make_peer(store, bus, n, i, lines[n]) for i, n in enumerate(names))
    runs = {
        name: asyncio.ensure_future(p.run()) for name, p in zip(GENESIS, (a, b, c), strict=True)
    }
    try:
        await until(lambda: len(lines["peer-a"]) >= 2, "two rounds")
        runs[JOINER] = asyncio.ensure_future(d.run(join=True, join_timeout=60))
        await until(lambda: bool(lines[JOINER]), "d contributing")
        assert d.session is not None
        assert JOINER in d.session.members

        assert c.leave()
        assert not c.leave()  # once
        left = await asyncio.wait_for(runs["peer-c"], 60)
        assert left.ended == "left"

        runs["peer-b"].cancel()  # stops without leaving: evicted after 2 absent rounds
        await asyncio.gather(runs["peer-b"], return_exceptions=True)
        await until(lambda: with_members(lines["peer-a"], 2), "the eviction")

        first, joined = await asyncio.wait_for(asyncio.gather(runs["peer-a"], runs[JOINER]), 120)
    finally:
        for run in runs.values():
            run.cancel()
        await asyncio.gather(*runs.values(), return_exceptions=True)
    assert first.ended == joined.ended == "done"
    assert first.entries[-1].model == joined.entries[-1].model
    counts = [entry.members for entry in first.entries]
    assert (counts[0], counts[-1], 4 in counts) == (3, 2, True), counts
    assert joined.entries[0].round > 0
    assert JOINER in joined.entries[0].sampled
    assert all(JOINER not in e.sampled for e in first.entries if e.members == 3 and e.round < 2)
    assert all(e.members == len(e.sampled) for e in first.entries)  # fraction 1: every member

    assert a.session is not None
    assert a.session.head is not None
    records = await verify_agreed_history(
        store, a.session.head, session="members", genesis=a.session.genesis, rule=a.rule,
        keys=bus.keys, admission=ADMISSION, members=GENESIS,
    )  # fmt: skip
    changes = []
    for record in records:
        if record.members is not None:
            member_set = MemberSet.from_block(await store.get(record.members))
            changes += [(change.op, change.peer) for change in member_set.changes]
    assert changes == [("join", JOINER), ("leave", "peer-c"), ("evict", "peer-b")]


def test_secagg_is_refused_when_members_can_change() -> None:
    bus, store = MemoryPubsubBus(), MemoryBlockStore()
    with pytest.raises(ConfigError, match="fixed member set"):
        Peer(
            store=store, pubsub=bus.endpoint("peer-a"), client=paced(0), adapter=VectorAdapter(),
            initial_model=np.zeros(D, np.float32), config=CONFIG, strategy=SecAgg(FedAvg()),
            agreed=AgreedConfig(members=GENESIS, admission=ADMISSION),
        )  # fmt: skip


async def test_a_genesis_member_that_left_resumes_and_rejoins_with_its_peer_id() -> None:
    """peer-c leaves; restarted with ``run(resume=True)`` its session is at round 0 in the
    genesis set, so it adopts the members' head, finds itself out and joins again: a new join,
    made at that head's round, admits it and it trains to the end on the others' model."""
    bus, store = MemoryPubsubBus(), MemoryBlockStore()
    admission = Admission("allow-list", (GENESIS[2],))
    config: FederationConfig[np.ndarray] = FederationConfig(rounds=14, final_evaluation=False)
    lines: dict[str, list[str]] = {name: [] for name in [*GENESIS, "again"]}

    def peer(name: str, index: int, log: list[str]) -> Peer[np.ndarray]:
        return Peer(
            store=store, pubsub=bus.endpoint(name), client=paced(index), adapter=VectorAdapter(),
            initial_model=np.zeros(D, np.float32), config=config, session="members",
            agreed=AgreedConfig(members=GENESIS, admission=admission, **TIMING),  # type: ignore[arg-type]
            log=log.append,
        )  # fmt: skip

    a, b, c = (peer(n, i, lines[n]) for i, n in enumerate(GENESIS))
    runs = {n: asyncio.ensure_future(p.run()) for n, p in zip(GENESIS, (a, b, c), strict=True)}
    try:
        await until(lambda: len(lines["peer-a"]) >= 2, "two rounds")
        assert c.leave()
        left = await asyncio.wait_for(runs["peer-c"], 60)
        assert left.ended == "left"
        again = peer("peer-c", 2, lines["again"])
        runs["again"] = asyncio.ensure_future(again.run(resume=True, join_timeout=60))
        first, _, back = await asyncio.wait_for(
            asyncio.gather(runs["peer-a"], runs["peer-b"], runs["again"]), 120
        )
    finally:
        for run in runs.values():
            run.cancel()
        await asyncio.gather(*runs.values(), return_exceptions=True)
    assert back.ended == first.ended == "done"
    assert any("asking to join" in line for line in lines["again"])
    assert back.entries[0].round > left.entries[-1].round + 1  # not round 0 again
    assert back.entries[-1].model == first.entries[-1].model
    assert a.session is not None
    assert a.session.head is not None
    records = await verify_agreed_history(
        store, a.session.head, session="members", genesis=a.session.genesis, rule=a.rule,
        keys=bus.keys, admission=admission, members=GENESIS,
    )  # fmt: skip
    changes = []
    for record in records:
        if record.members is not None:
            member_set = MemberSet.from_block(await store.get(record.members))
            changes += [(change.op, change.peer) for change in member_set.changes]
    assert changes == [("leave", "peer-c"), ("join", "peer-c")]
