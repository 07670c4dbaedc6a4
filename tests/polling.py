"""Poll a condition against a deadline: the only way tests wait (no fixed sleeps)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


def poll_until(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Call ``condition`` until it is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


async def apoll_until(
    condition: Callable[[], Awaitable[bool]], *, timeout: float, what: str
) -> None:
    """Async :func:`poll_until`."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.2)
