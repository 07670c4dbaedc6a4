"""Kubo RPC answers as bytes, without I/O: error messages, NDJSON bodies, bounded lines.

Kubo signals an error with a non-200 status and a ``{"Message", "Type": "error"}`` body, or, on
streaming endpoints such as ``block/rm``, with ``Error`` fields inside a 200 NDJSON body.
``pubsub/sub`` is an endless NDJSON stream; :class:`LineSplitter` cuts it into lines holding at
most one capped line in memory. :mod:`gradfed_ipfs.kubo.rpc` drives these on live answers.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from ..errors import DecodeError

__all__ = ["LineSplitter", "iter_ndjson", "parse_rpc_error"]


def iter_ndjson(body: bytes | str) -> Iterator[dict[str, Any]]:
    """Yield each JSON object of a newline-delimited JSON body (blank lines skipped).

    Raises
    ------
    DecodeError
        If a line is not a JSON object.
    """
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise DecodeError(f"not NDJSON: {line[:80]!r}") from exc
        if not isinstance(item, dict):
            raise DecodeError(f"NDJSON line is not an object: {line[:80]!r}")
        yield item


def parse_rpc_error(status: int, body: bytes | str, *, streamed: bool = False) -> str | None:
    """Return Kubo's error message for an answer, or ``None`` when it is a success.

    Kubo signals errors either with a non-200 status and a ``{"Message", "Type": "error"}`` body,
    or (streaming endpoints such as ``block/rm``, flagged by ``streamed``) with HTTP 200 and
    ``Error`` fields in NDJSON lines. A 200 answer of any other endpoint is a success whatever
    its bytes are (``block/get`` returns raw block data, which must not be parsed).
    """
    if status == 200 and not streamed:
        return None
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    if status != 200:
        try:
            answer = json.loads(text)
        except (ValueError, RecursionError):
            return f"HTTP {status}: {text.strip()[:500]}"
        if isinstance(answer, dict) and answer.get("Message"):
            return str(answer["Message"])[:2000]
        return f"HTTP {status}: {text.strip()[:500]}"
    with contextlib.suppress(DecodeError):
        for item in iter_ndjson(text):
            if item.get("Error"):
                return str(item["Error"])[:2000]
            if item.get("Type") == "error" and item.get("Message"):
                return str(item["Message"])[:2000]
    return None


class LineSplitter:
    """Split a byte stream into lines of at most ``max_line`` bytes, holding no more than that.

    Parameters
    ----------
    max_line
        Longest line kept, in bytes (without the newline). A longer line is dropped as its
        bytes arrive and counted in :attr:`oversized`.
    """

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self.oversized = 0
        self._buffer = bytearray()
        self._skipping = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """Take the next bytes of the stream; return the complete lines they end."""
        lines: list[bytes] = []
        start = 0
        while start <= len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if not self._skipping:
                if len(self._buffer) + len(piece) > self.max_line:
                    self._skipping = True
                    self.oversized += 1
                    self._buffer.clear()
                else:
                    self._buffer += piece
            if end < 0:
                break
            if not self._skipping:
                lines.append(bytes(self._buffer))
            self._buffer.clear()
            self._skipping = False
            start = end + 1
        return lines

    def close(self) -> list[bytes]:
        """End of stream: return the last line if it had no newline."""
        rest = [] if self._skipping or not self._buffer else [bytes(self._buffer)]
        self._buffer.clear()
        return rest
