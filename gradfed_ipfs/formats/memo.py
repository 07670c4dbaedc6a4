"""``DecodeMemo``: decoded peer bytes remembered by the bytes themselves, bounded.

A round hands one node the same message or record bytes many times (re-publications, an
inline record read by each of its waiting steps, a roster read by the roster phase, the
aggregate step and the history check; in one process simulating N members, N times).
Decoding is a pure function of the bytes and the decoded values are frozen, so the key is
the bytes (with what else the decoder reads, e.g. the pubsub sender) and never a claim about
them such as a CID: no unverified block can poison the memo. Only successful decodes are
kept (bad bytes are checked, and refused, each time). Entries and key bytes are both bounded;
the oldest go first.
"""

from __future__ import annotations

from typing import Final, Generic, TypeVar

__all__ = ["DecodeMemo", "MEMO_BYTES", "MEMO_ENTRIES"]

K = TypeVar("K")
V = TypeVar("V")

MEMO_ENTRIES: Final = 8192
"""Default cap on the decodes one memo keeps."""
MEMO_BYTES: Final = 32 * 1024 * 1024
"""Default cap on the key bytes one memo keeps (the decoded values are about as large)."""


class DecodeMemo(Generic[K, V]):
    """A bounded first-in first-out memo ``key -> decoded value``.

    Parameters
    ----------
    max_entries, max_bytes
        Caps on the entries and on the sum of their ``size`` (bytes).
    """

    def __init__(self, *, max_entries: int = MEMO_ENTRIES, max_bytes: int = MEMO_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._values: dict[K, tuple[V, int]] = {}
        self._bytes = 0
        self.hits = 0

    def get(self, key: K) -> V | None:
        """Return the value kept for ``key``, or ``None``."""
        found = self._values.get(key)
        if found is None:
            return None
        self.hits += 1
        return found[0]

    def put(self, key: K, value: V, size: int) -> V:
        """Keep ``value`` for ``key`` (``size``: its key's bytes); return ``value``."""
        if size > self.max_bytes or key in self._values:
            return value
        self._values[key] = (value, size)
        self._bytes += size
        while len(self._values) > self.max_entries or self._bytes > self.max_bytes:
            oldest = next(iter(self._values))
            self._bytes -= self._values.pop(oldest)[1]
        return value

    def __len__(self) -> int:
        return len(self._values)
