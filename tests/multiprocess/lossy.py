"""A test-only pubsub wrapper that drops a share of one peer's incoming messages."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

from gradfed_ipfs.formats import PubsubMessage
from gradfed_ipfs.kubo import PubsubTransport, PubsubWrapper


class LossyPubsub(PubsubWrapper):
    """Wrap a transport; each received message is dropped with probability ``loss`` (seeded)."""

    def __init__(self, inner: PubsubTransport, loss: float, seed: int) -> None:
        super().__init__(inner)
        self.loss = loss
        self.rng = random.Random(seed)
        self.dropped = 0
        self.delivered = 0

    def subscribe(self, topic: str) -> AsyncIterator[PubsubMessage]:
        return self._lossy(self.inner.subscribe(topic))

    async def _lossy(self, messages: AsyncIterator[PubsubMessage]) -> AsyncIterator[PubsubMessage]:
        async for message in messages:
            if self.rng.random() < self.loss:
                self.dropped += 1
                continue
            self.delivered += 1
            yield message
