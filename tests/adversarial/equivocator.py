"""Issue 32's attack 2: a member that tells each honest peer a different roster.

:class:`Equivocator` never contributes. As soon as an honest peer contributes to a round, it
sends that peer (only) a roster of its own signed as coordinator listing that peer's
contribution alone (two peers on one base get two rosters of one round), and echoes each
peer's ``done`` back to that peer only, signed as its own vote. :class:`DirectedPubsub` is
the hostile gossip router (or the partition) that makes "only" possible: an honest peer's
transport takes the attacker's messages from the peer's own side topic (:func:`direct_topic`)
instead of the session's topic. Shared by the in-memory test and the attacker process of
``tests/multiprocess``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable

from multiformats import CID

from gradfed_ipfs.errors import DecodeError
from gradfed_ipfs.formats import PubsubMessage
from gradfed_ipfs.formats.agreed.roster import AgreedMessage, Roster, open_message, sign_message
from gradfed_ipfs.kubo import PubsubWrapper
from gradfed_ipfs.kubo.pubsub import PubsubTransport


def direct_topic(topic: str, peer: str) -> str:
    """The side topic on which the attacker reaches ``peer`` alone."""
    return f"{topic}/to/{peer}"


class DirectedPubsub(PubsubWrapper):
    """An honest peer's transport behind a hostile router: ``sender``'s messages reach it only
    through its side topic (those ``sender`` published to everyone are lost)."""

    def __init__(self, inner: PubsubTransport, me: str, sender: str) -> None:
        super().__init__(inner)
        self.me, self.sender = me, sender

    def subscribe(self, topic: str) -> AsyncIterator[PubsubMessage]:
        shared = self.inner.subscribe(topic)
        direct = self.inner.subscribe(direct_topic(topic, self.me))
        return self._merge(topic, shared, direct)

    async def _merge(
        self, topic: str, shared: AsyncIterator[PubsubMessage], direct: AsyncIterator[PubsubMessage]
    ) -> AsyncIterator[PubsubMessage]:
        queue: asyncio.Queue[PubsubMessage] = asyncio.Queue()

        async def pump(
            heard: AsyncIterator[PubsubMessage], keep: Callable[[PubsubMessage], bool]
        ) -> None:
            async for message in heard:
                if keep(message):
                    queue.put_nowait(dataclasses.replace(message, topics=(topic,)))

        tasks = [
            asyncio.create_task(pump(shared, lambda m: m.from_peer != self.sender)),
            asyncio.create_task(pump(direct, lambda m: m.from_peer == self.sender)),
        ]
        try:
            while True:
                yield await queue.get()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


class Equivocator:
    """The attacker (see the module docstring), on its own transport.

    ``split`` counts the rounds it sent two rosters in, ``echoed`` the ``done`` it echoed.
    """

    def __init__(
        self,
        pubsub: PubsubTransport,
        session: str,
        genesis: CID,
        members: tuple[str, ...],
        *,
        pairs: bool = False,
    ) -> None:
        self.pubsub, self.session, self.genesis = pubsub, session, genesis
        self.members, self.pairs = members, pairs
        self.topic = ""
        self.me = ""
        self.split: list[int] = []
        self.echoed: set[tuple[str, bytes]] = set()
        self._contribs: dict[int, dict[str, tuple[AgreedMessage, bytes]]] = {}
        self.sent: list[tuple[str, bytes]] = []  # (peer, statement) of its last rounds
        self._served: set[tuple[int, str]] = set()  # (round, peer) sent a roster

    async def run(self, topic: str) -> None:
        """Listen on ``topic`` and attack until cancelled."""
        self.topic, self.me = topic, await self.pubsub.local_peer_id()
        async for message in self.pubsub.subscribe(topic):
            with contextlib.suppress(DecodeError):
                decoded, signature = open_message(message.data, self.pubsub.keys)
                if decoded.peer == self.me or decoded.peer != message.from_peer:
                    continue
                if decoded.kind == "contrib":
                    await self._contributed(decoded, signature)
                elif decoded.kind == "done":
                    await self._echo(decoded)

    async def _send(self, peer: str, message: AgreedMessage) -> None:
        signer = await self.pubsub.signer()
        statement = await sign_message(message, signer, self.pubsub.keys)
        await self.pubsub.publish(direct_topic(self.topic, peer), statement.block.data)
        self.sent = [*self.sent[-15:], (peer, statement.block.data)]

    async def repeat(self, interval: float) -> None:
        """Send what was sent again every ``interval`` seconds (over lossy gossip)."""
        while True:
            await asyncio.sleep(interval)
            for peer, data in list(self.sent):
                await self.pubsub.publish(direct_topic(self.topic, peer), data)

    async def _contributed(self, message: AgreedMessage, signature: bytes) -> None:
        """Send each peer, once it can, a roster of this round: of it alone, or with ``pairs``
        of it and the next honest peer (cyclic: every two rosters overlap, none is shared)."""
        r, heard = message.round, self._contribs.setdefault(message.round, {})
        if message.peer in heard or message.base is None or message.weight is None:
            return
        heard[message.peer] = (message, signature)
        if sum(1 for m, _ in heard.values() if m.base == message.base) < 2:
            return  # one roster each to two peers of one base, sent together (a sure split)
        others = sorted(p for p in self.members if p != self.me)
        for peer in sorted(heard):
            if (r, peer) in self._served:
                continue
            group = [peer, others[(others.index(peer) + 1) % len(others)]] if self.pairs else [peer]
            if not all(p in heard and heard[p][0].base == message.base for p in group):
                continue
            self._served.add((r, peer))
            lines = {p: (heard[p][0].cid, heard[p][0].weight or 1, heard[p][1]) for p in group}
            block = Roster.new(
                self.session, self.genesis, r, message.base, self.me, self.members, lines
            ).to_block()
            roster = AgreedMessage(
                "roster", self.session, self.genesis, r, self.me, block.cid, inline=block.data
            )
            await self._send(peer, roster)
        if sum(1 for k, _ in self._served if k == r) >= 2 and r not in self.split:
            self.split.append(r)  # two peers got two rosters of the round

    async def _echo(self, done: AgreedMessage) -> None:
        """Vote, to ``done``'s sender only, for the head it announced."""
        assert done.record is not None
        key = (done.peer, bytes(done.record))
        if key in self.echoed:
            return
        self.echoed.add(key)
        vote = AgreedMessage(
            "done", self.session, self.genesis, done.round, self.me, done.cid, record=done.record
        )
        await self._send(done.peer, vote)
