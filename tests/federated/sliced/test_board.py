"""The slice board keeps members' messages only, at most ``member_cap`` from each (issue 32, 7)."""

from __future__ import annotations

import asyncio
import dataclasses
import tracemalloc
from collections.abc import AsyncIterator, Iterator

import pytest
from multiformats import CID

from gradfed_ipfs.block import Block
from gradfed_ipfs.federated.exchange.announcer import Reannouncer
from gradfed_ipfs.federated.sliced.peer import (
    MemorySliceBoard,
    PubsubSliceBoard,
    ReduceScatterConfig,
    ReduceScatterPeer,
)
from gradfed_ipfs.federated.sliced.transport import member_cap
from gradfed_ipfs.formats.pubsub import PubsubMessage
from gradfed_ipfs.formats.sliced.slices import SliceMessage
from gradfed_ipfs.kubo import KuboPubsub, MemoryPubsubBus, PubsubWrapper
from tests.federated.sliced.test_peer import CHUNK, LR, Round, make_round, reference

RECORD = 40_000  # bytes of each flood message's inline record: about the 40 KB


def _junk(i: int) -> Block:
    return Block.new(i.to_bytes(4, "big") * (RECORD // 4), "dag-cbor")


def _flood(sender: str, roster: CID, count: int, first_phase: int = 0) -> Iterator[SliceMessage]:
    """``count`` distinct slice messages carrying ~40 KB each (made one at a time)."""
    for i in range(count):
        block = _junk(i)
        yield SliceMessage(
            "slice", sender, roster, first_phase + i // 4, i % 4, block.cid, block=block.data
        )


async def _round(r: Round, board: MemorySliceBoard) -> set[CID]:
    config = ReduceScatterConfig(chunk_bytes=CHUNK, learning_rate=LR, phase_timeout=20)
    peers = [ReduceScatterPeer(p, r.store, board, config) for p in r.roster.peers]
    results = await asyncio.gather(
        *(peer.run(r.roster, r.roster_cid, r.base, r.grads[peer.peer]) for peer in peers)
    )
    assert all(not res.missing and not res.liars for res in results)
    return {res.model_cid for res in results}


async def test_a_strangers_flood_is_not_kept_and_the_round_completes() -> None:
    r = await make_round(4)
    board = MemorySliceBoard(members=r.roster.peers)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for message in _flood("stranger", r.roster_cid, 2_000):
            await board.publish(message)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 2_000_000  # kept, the 2,000 messages would hold 80 MB
    assert board.messages == []
    assert board.dropped["stranger"] == 2_000
    assert await _round(r, board) == {await reference(r)}
    assert {m.sender for m in board.messages} <= set(r.roster.peers)


async def test_a_member_flooding_past_its_cap_is_capped_and_the_round_completes() -> None:
    r = await make_round(4)
    flooder = "member-not-in-this-roster"
    board = MemorySliceBoard(members=(*r.roster.peers, flooder))
    cap = member_cap(5)
    # Phases no round reaches: kept (up to the cap), but about nothing the round reads.
    for message in _flood(flooder, r.roster_cid, cap + 500, first_phase=100):
        await board.publish(message)
    assert sum(1 for m in board.messages if m.sender == flooder) == cap
    assert board.dropped["flood"] == 500
    assert await _round(r, board) == {await reference(r)}
    for peer in r.roster.peers:  # every honest member's check values landed
        assert any(m.sender == peer and m.kind == "proj" for m in board.messages)
    assert board.dropped["flood"] == 500  # no honest message was refused
    # Once its round is forgotten, the member has room again (a re-publication lands).
    board.forget(_junk(999_999).cid)
    again = next(_flood(flooder, r.roster_cid, 1, first_phase=100))
    await board.publish(again)
    assert again in board.messages


async def test_a_refused_message_is_not_remembered_as_heard() -> None:
    r = await make_round(4)
    board = MemorySliceBoard(members=r.roster.peers)
    for message in _flood("stranger", r.roster_cid, 3):
        await board.publish(message)
        await board.publish(message)  # a re-publication is refused again, not a duplicate
    assert board.dropped["stranger"] == 6
    assert board.messages == []


class _Watched(PubsubWrapper):
    """A pubsub transport telling the test how many of a sender's messages the board has read.

    The board's listener asks for the next message once it has handled the last one.
    """

    def __init__(self, inner: KuboPubsub, sender: str, count: int) -> None:
        super().__init__(inner)
        self.sender, self.count = sender, count
        self.read = 0
        self.done = asyncio.Event()

    def subscribe(self, topic: str) -> AsyncIterator[PubsubMessage]:
        return self._watch(self.inner.subscribe(topic))

    async def _watch(self, messages: AsyncIterator[PubsubMessage]) -> AsyncIterator[PubsubMessage]:
        async for message in messages:
            yield message
            if message.from_peer == self.sender:
                self.read += 1
                if self.read >= self.count:
                    self.done.set()


@pytest.mark.kubo
async def test_a_strangers_flood_over_kubo_pubsub_is_not_kept(
    kubo_swarm3,  # type: ignore[no-untyped-def]
) -> None:
    member, other, stranger = (n.peer_id for n in kubo_swarm3)
    members = (member, other)
    topic = "gradfed/v1/test-board/slices"
    roster = _junk(999_999).cid
    pubsubs = [KuboPubsub(n.api_url) for n in kubo_swarm3]
    watched = _Watched(pubsubs[0], stranger, 300)
    announcer = Reannouncer(pubsubs[1], topic, 0.1, 0.5)
    board = PubsubSliceBoard(watched, topic, member, members=members)  # type: ignore[arg-type]
    theirs = PubsubSliceBoard(pubsubs[1], topic, other, members=members, announcer=announcer)
    announcing = asyncio.create_task(announcer.run())
    try:
        async with board, theirs:
            flood = _flood(stranger, roster, 10_000)

            async def flooding() -> None:  # until the board has read 300 (from subscribing on)
                while not watched.done.is_set():
                    await pubsubs[2].publish(topic, next(flood).encode())

            sent = asyncio.create_task(flooding())
            await asyncio.wait_for(watched.done.wait(), 120)
            await sent
            assert board.messages == []
            assert board.dropped["stranger"] >= 300
            # A member's message still lands (re-published until heard).
            mine = SliceMessage("proj", other, roster, values=(1.0, 2.0))
            await theirs.publish(mine)
            assert await board.wait_for(lambda: mine in board.messages, 60)
            assert {m.sender for m in board.messages} == {other}
    finally:
        announcing.cancel()
        await asyncio.gather(announcing, return_exceptions=True)
        for pubsub in pubsubs:
            await pubsub.aclose()


async def test_a_members_unsigned_or_foreign_signed_messages_are_dropped() -> None:
    """A member's board message counts only as its own signed statement (issue 32)."""
    r = await make_round(4)
    bus = MemoryPubsubBus()
    topic = "gradfed/v1/s/slices"
    member, other = r.roster.peers[0], r.roster.peers[1]
    board = PubsubSliceBoard(bus.endpoint(member), topic, member, members=r.roster.peers)
    await board.__aenter__()
    try:
        plain = SliceMessage("proj", other, r.roster_cid, cid=None, values=(1.0,) * 4)
        bus.deliver(other, topic, plain.encode())  # unsigned
        # Signed by another member's key, sent as ``other``: its author is not the sender.
        foreign = await plain.sign(bus.signer(r.roster.peers[2]), bus.keys)
        bus.deliver(other, topic, foreign.encode())
        signed = await dataclasses.replace(plain, values=(2.0,) * 4).sign(
            bus.signer(other), bus.keys
        )
        bus.deliver(other, topic, signed.encode())
        assert await board.wait_for(lambda: len(board.messages) == 1, 5.0)
    finally:
        await board.__aexit__(None, None, None)
    assert board.dropped["unsigned"] == 1
    assert board.dropped["malformed"] == 1  # the foreign signature
    (kept,) = board.messages
    assert (kept.sender, kept.values) == (other, (2.0,) * 4)
    assert kept.signed is not None
    assert kept.signed.author == other


async def test_keyed_waiters_wake_on_their_record_and_on_their_level_reaching_a_count() -> None:
    r = await make_round(4)
    board = MemorySliceBoard(members=r.roster.peers)
    a, b, c, d = r.roster.peers
    block = _junk(0)

    def partial(sender: str, k: int) -> SliceMessage:
        return SliceMessage("partial", sender, r.roster_cid, 0, k, block.cid, block=block.data)

    # Two slices of two steps: partials 0 and 2 are level 0; one was heard before counting.
    await board.publish(partial(a, 0))
    board.count_levels(r.roster_cid, 2, 2, r.roster.peers)
    own = board.record_key(r.roster_cid, 0, 2, "partial")
    level = board.level_key(r.roster_cid, 0, 0, 2)
    woken: list[str] = []

    async def wait(name: str, key: object) -> None:
        heard = board.messages

        def ready() -> bool:
            return len(heard) > 1  # another record than the first was kept

        assert await board.wait_for(ready, 60.0, on=[key])  # a missed wake: outer timeout
        woken.append(name)

    waiters = [asyncio.create_task(wait("own", own)), asyncio.create_task(wait("level", level))]
    await asyncio.sleep(0)
    await board.publish(partial(b, 1))  # level 1 (another step's partial): wakes neither
    await board.publish(partial(c, 5))  # out of the plan (index ≥ S·G): not counted
    for _ in range(3):
        await asyncio.sleep(0)
    assert woken == []
    await board.publish(partial(d, 2))  # step 2 recorded: its own key, and level 0 reaches 2
    await asyncio.wait_for(asyncio.gather(*waiters), 5.0)
    assert sorted(woken) == ["level", "own"]
