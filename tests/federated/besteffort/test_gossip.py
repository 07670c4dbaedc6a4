"""GossipModelSync: the seed's gossip API over the in-memory bus and over real Kubo pubsub."""

from __future__ import annotations

import asyncio

import pytest

from gradfed_ipfs import DecodeError, InvalidGradient
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.federated import GossipModelSync, ModelUpdate
from gradfed_ipfs.formats import Announcement
from gradfed_ipfs.kubo import KuboPubsub
from tests.polling import apoll_until

CID_A = str(make_cid(b"model a"))
CID_B = str(make_cid(b"model b"))


async def test_collect_counts_distinct_peers_not_messages() -> None:
    alice = GossipModelSync.new("alice", session_id="s")
    bob = alice.subscribe("bob")
    carol = alice.subscribe("carol")
    for _ in range(3):  # a chatty peer must not satisfy the quota alone
        await alice.broadcast_update(CID_A, 1)
    updates = await bob.collect_updates(2, 50)  # times out with the one distinct peer
    assert [(u.peer_id, u.model_cid, u.round_id) for u in updates] == [("alice", CID_A, 1)]
    await carol.broadcast_update(CID_B, 1)
    await alice.broadcast_update(CID_A, 2)
    updates = await alice.collect_updates(5, 50)  # own messages excluded
    assert [(u.peer_id, u.model_cid) for u in updates] == [("carol", CID_B)]
    assert alice.drops["own"] == 4
    assert bob.drops["duplicate"] == 2


async def test_collect_stops_at_expected_peers() -> None:
    alice = GossipModelSync.new("alice", session_id="s")
    bob, carol = alice.subscribe("bob"), alice.subscribe("carol")
    await bob.broadcast_update(CID_A, 7)
    await bob.broadcast_update(CID_A, 7)
    await carol.broadcast_update(CID_B, 7)
    updates = await alice.collect_updates(2, 5_000)
    assert sorted(u.peer_id for u in updates) == ["bob", "carol"]
    assert all(u.round_id == 7 for u in updates)
    assert all(alice.verify_update(u) for u in updates)


async def test_late_subscriber_sees_only_later_messages() -> None:
    alice = GossipModelSync.new("alice", session_id="s")
    await alice.broadcast_update(CID_A, 1)
    late = alice.subscribe("late")
    assert await late.collect_updates(1, 20) == []
    await alice.broadcast_update(CID_A, 2)
    assert [u.round_id for u in await late.collect_updates(1, 1_000)] == [2]


def test_verify_update_really_parses_the_cid() -> None:
    sync = GossipModelSync.new("me")
    assert sync.verify_update(ModelUpdate("p", CID_A, 0, 0))
    assert not sync.verify_update(ModelUpdate("p", "abcd", 0, 0))  # the seed accepted this
    assert not sync.verify_update(ModelUpdate(" ", CID_A, 0, 0))
    assert not sync.verify_update(ModelUpdate("p", "", 0, 0))
    assert not sync.verify_update(ModelUpdate("p", CID_A, -1, 0))


async def test_broadcast_refuses_non_cids_and_forgeries_are_dropped() -> None:
    alice = GossipModelSync.new("alice", session_id="s")
    mallory = alice.subscribe("mallory")
    with pytest.raises(DecodeError):
        await alice.broadcast_update("not a cid", 1)
    with pytest.raises(InvalidGradient):
        await alice.broadcast_update(CID_A, -1)
    forged = Announcement.new("s", 1, "bob", CID_A)  # mallory claims to be bob
    await mallory.transport.publish(mallory.topic, forged.encode())
    await mallory.transport.publish(mallory.topic, b"\x00garbage")
    assert await alice.collect_updates(1, 20) == []
    assert alice.drops["forged_sender"] == 1
    assert alice.drops["malformed"] == 1


async def test_round_filter_and_announce_until() -> None:
    alice = GossipModelSync.new("alice", session_id="s")
    bob = alice.subscribe("bob")
    await bob.broadcast_update(CID_A, 1)
    closed = asyncio.Event()
    announcement = bob.make_announcement(CID_B, 2, num_samples=10, length=4)
    task = asyncio.create_task(bob.announce_until(announcement, closed, interval=0.01))
    found = await alice.collect_announcements(1, 5_000, round_id=2)
    assert [(a.peer_id, a.round, a.num_samples) for a in found] == [("bob", 2, 10)]
    assert alice.drops["other_round"] == 1
    closed.set()
    assert 1 <= await task <= 60
    capped = await bob.announce_until(announcement, asyncio.Event(), interval=0.0, max_count=3)
    assert capped == 3
    kubo = KuboPubsub("http://127.0.0.1:1")
    with pytest.raises(InvalidGradient):
        GossipModelSync("x", kubo).subscribe("y")
    await kubo.aclose()


@pytest.mark.kubo
@pytest.mark.docker
async def test_gossip_over_kubo_pubsub(kubo_swarm3) -> None:  # type: ignore[no-untyped-def]
    a, b = kubo_swarm3[0], kubo_swarm3[2]
    pub_a, pub_b = KuboPubsub(a.api_url), KuboPubsub(b.api_url)
    alice = GossipModelSync(a.peer_id, pub_a, session_id="gossip-kubo")
    bob = alice.subscribe(b.peer_id, pub_b)
    try:
        await alice.start()
        await bob.start()
        assert b.peer_id in await alice.wait_for_peers(1, timeout=30)

        async def bob_sees_alice() -> bool:
            await alice.broadcast_update(CID_A, 3, num_samples=5)
            return bool(await bob.collect_announcements(1, 100))

        await apoll_until(bob_sees_alice, timeout=30, what="an announcement over Kubo pubsub")
        assert bob.filter.accepted == 1
        assert bob.drops["own"] == 0
    finally:
        await alice.aclose()
        await bob.aclose()
        await pub_a.aclose()
        await pub_b.aclose()
