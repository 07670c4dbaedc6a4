"""Re-announcement: publish a message now, then again at doubling intervals until withdrawn.

Pubsub is lossy, so a peer re-publishes what it owes (its contribution, roster, head) until
the phase ends. Re-publishing at a fixed short period floods every peer's CPU; doubling the
delay (``first`` up to ``longest``) keeps a lost message's cost to time while the traffic of a
long phase stays small.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from ...errors import PubsubError
from ...kubo.pubsub import PubsubTransport

__all__ = ["Reannouncer"]


@dataclass
class _Outgoing:
    data: bytes
    due: float
    delay: float


class Reannouncer:
    """Keeps keyed messages on one topic re-published until withdrawn (run :meth:`run`).

    Parameters
    ----------
    pubsub
        The transport.
    topic
        Where to publish.
    first
        Seconds before a message's first re-publication.
    longest
        Longest delay between re-publications, in seconds.
    """

    def __init__(self, pubsub: PubsubTransport, topic: str, first: float, longest: float) -> None:
        self.pubsub = pubsub
        self.topic = topic
        self.first = first
        self.longest = longest
        self.published = 0
        self._outbox: dict[str, _Outgoing] = {}
        self._changed = asyncio.Event()

    async def post(self, key: str, data: bytes) -> None:
        """Publish ``data`` now and keep re-publishing it under ``key`` (replacing the last).

        The first publication is :meth:`run`'s (due at once): the caller does not wait for the
        daemon's answer, so a round's ``done`` costs it no publish round trip.
        """
        self._outbox[key] = _Outgoing(data, time.monotonic(), self.first / 2)
        self._changed.set()

    async def post_now(self, key: str, data: bytes) -> None:
        """Publish ``data`` before returning (the daemon has it), then re-publish like :meth:`post`.

        For a message whose delivery is on the round's critical path: sent before the caller
        starts heavy work on the same daemon (a contribution's put), it is not queued behind it.
        """
        await self._publish(data)
        self._outbox[key] = _Outgoing(data, time.monotonic() + self.first, self.first)
        self._changed.set()

    def withdraw(self, key: str) -> None:
        """Stop re-publishing the message under ``key`` (if any)."""
        self._outbox.pop(key, None)

    async def _publish(self, data: bytes) -> None:
        self.published += 1
        with contextlib.suppress(PubsubError):  # lost like any message; re-published later
            await self.pubsub.publish(self.topic, data)

    async def run(self) -> None:
        """Re-publish due messages forever (cancel the task to stop)."""
        while True:
            self._changed.clear()
            now = time.monotonic()
            for item in list(self._outbox.values()):
                if item.due <= now:
                    item.delay = min(2 * item.delay, self.longest)
                    item.due = now + item.delay
                    await self._publish(item.data)
            due = min((i.due for i in self._outbox.values()), default=now + 3600.0)
            with contextlib.suppress(TimeoutError):  # the next timer, or a new message
                await asyncio.wait_for(self._changed.wait(), max(0.0, due - now))
