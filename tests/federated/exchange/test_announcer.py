"""Reannouncer: posting does not wait for the transport; re-publication at doubling intervals."""

from __future__ import annotations

import asyncio
import contextlib

from gradfed_ipfs.federated.exchange.announcer import Reannouncer
from gradfed_ipfs.kubo.pubsub import MemoryPubsubBus, PubsubMessage


class GatedPubsub:
    """A transport whose publications wait for ``gate`` (a slow daemon), then are recorded."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.sent: list[bytes] = []
        self.sent_event = asyncio.Event()
        self.called = asyncio.Event()  # a publication is waiting on the daemon

    async def publish(self, topic: str, data: bytes) -> None:
        self.called.set()
        await self.gate.wait()
        self.sent.append(data)
        self.sent_event.set()


async def test_post_returns_before_the_transport_answers() -> None:
    # Prepare: a transport that does not answer until released.
    transport = GatedPubsub()
    announcer = Reannouncer(transport, "t", first=60.0, longest=60.0)  # type: ignore[arg-type]
    runner = asyncio.create_task(announcer.run())
    # Execute: post while the transport is stuck (the old post awaited the publication).
    await asyncio.wait_for(announcer.post("done", b"head"), 1.0)
    assert transport.sent == []
    transport.gate.set()
    await asyncio.wait_for(transport.sent_event.wait(), 5.0)
    # Assert: published once by the run loop; the next one is due only after ``first``.
    assert transport.sent == [b"head"]
    assert announcer.published == 1
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)


async def test_posted_message_is_republished_until_withdrawn() -> None:
    # Prepare: a subscriber on an in-memory bus.
    bus = MemoryPubsubBus()
    inbox = bus.endpoint("b").subscribe("t")
    announcer = Reannouncer(bus.endpoint("a"), "t", first=0.01, longest=0.02)
    runner = asyncio.create_task(announcer.run())
    # Execute: post, read three copies, withdraw; then post another message and read until it
    # has been re-published three times (several intervals of the loop, however slow it runs).
    await announcer.post("contrib", b"x")
    copies: list[PubsubMessage] = [await asyncio.wait_for(anext(inbox), 5.0) for _ in range(3)]
    announcer.withdraw("contrib")
    await announcer.post("other", b"y")
    later: list[bytes] = []
    while later.count(b"y") < 3:
        later.append((await asyncio.wait_for(anext(inbox), 5.0)).data)
    # Assert: the same bytes each time; nothing is re-published once withdrawn (a copy sent
    # before the withdrawal may still be queued ahead of the first "y").
    assert [m.data for m in copies] == [b"x"] * 3
    assert b"x" not in later[later.index(b"y") :]
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)


async def test_post_now_publishes_before_returning_then_republishes() -> None:
    # Prepare: a transport held until released, and the run loop.
    transport = GatedPubsub()
    announcer = Reannouncer(transport, "t", first=0.01, longest=0.02)  # type: ignore[arg-type]
    runner = asyncio.create_task(announcer.run())
    # Execute: post_now does not return while the daemon has not taken the message.
    posting = asyncio.create_task(announcer.post_now("contrib", b"c"))
    await asyncio.wait_for(transport.called.wait(), 5.0)  # it is waiting on the transport
    assert not posting.done()
    transport.gate.set()
    await asyncio.wait_for(posting, 5.0)
    # Assert: sent once by post_now itself, then re-published by the loop like post's.
    assert transport.sent[:1] == [b"c"]
    deadline = asyncio.get_running_loop().time() + 5.0
    while len(transport.sent) < 3 and asyncio.get_running_loop().time() < deadline:
        transport.sent_event.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(transport.sent_event.wait(), 1.0)
    assert transport.sent[:3] == [b"c"] * 3
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
