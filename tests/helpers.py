"""Helpers shared by the tests: one fake clock, one home."""

from __future__ import annotations


class FakeClock:
    """A monotonic clock the test moves by hand: ``clock.now += 5`` (seconds)."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self.now += seconds
