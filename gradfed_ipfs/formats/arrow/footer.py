"""Check an Arrow IPC file's footer and batch headers before pyarrow reads any batch.

pyarrow's file reader trusts the footer: it reads every record batch the footer lists
(duplicates included) and decompresses ZSTD/LZ4 bodies to whatever size they claim, before a
caller sees a single row. :func:`scan_arrow_file` reads the footer and each batch's message
header (flatbuffers, parsed here with bounds checks) and refuses, with
:class:`~gradfed_ipfs.errors.MalformedArrow`:

- a footer or header that points outside the file;
- dictionary batches (gradfed never writes them);
- more than ``max_batches`` record batches, or two that are the same or overlap;
- a batch whose body is compressed (gradfed never writes compressed buffers);
- more rows in total than ``max_rows`` (checked before anything is allocated).

Layout (Arrow columnar format, "IPC File Format"): ``ARROW1`` + 2 pad bytes, the stream
messages, the ``Footer`` flatbuffer, its int32 length, ``ARROW1``. A footer ``Block`` is the
struct ``{offset: int64, metaDataLength: int32, pad, bodyLength: int64}``; at ``offset`` lies
``0xFFFFFFFF``, an int32 length and a ``Message`` flatbuffer whose header is a ``RecordBatch``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from ...errors import MalformedArrow

__all__ = ["ArrowFileLayout", "scan_arrow_file"]

_MAGIC: Final = b"ARROW1"
_CONTINUATION: Final = 0xFFFFFFFF
_BLOCK_SIZE: Final = 24
_RECORD_BATCH: Final = 3
# Footer fields: 0 version, 1 schema, 2 dictionaries, 3 recordBatches.
_FOOTER_DICTIONARIES: Final = 2
_FOOTER_BATCHES: Final = 3
# Message fields: 0 version, 1 header_type, 2 header, 3 bodyLength.
_MESSAGE_TYPE: Final = 1
_MESSAGE_HEADER: Final = 2
_MESSAGE_BODY: Final = 3
# RecordBatch fields: 0 length, 1 nodes, 2 buffers, 3 compression.
_BATCH_LENGTH: Final = 0
_BATCH_COMPRESSION: Final = 3


@dataclass(frozen=True, slots=True)
class ArrowFileLayout:
    """What the footer declares, checked.

    Attributes
    ----------
    batch_rows
        Row count of each record batch, in footer order.
    """

    batch_rows: tuple[int, ...]

    @property
    def rows(self) -> int:
        """Total rows over every batch."""
        return sum(self.batch_rows)


class _Flatbuffer:
    """Bounds-checked reads of one flatbuffer (``MalformedArrow`` on any bad offset)."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.what = what

    def _unpack(self, fmt: str, pos: int) -> int:
        if pos < 0 or pos + struct.calcsize(fmt) > len(self.data):
            raise MalformedArrow(f"Arrow {self.what} points outside itself")
        value: int = struct.unpack_from(fmt, self.data, pos)[0]
        return value

    def root(self) -> int:
        return self._unpack("<I", 0)

    def field(self, table: int, index: int) -> int | None:
        """Position of field ``index`` of the table at ``table``, or ``None`` if absent."""
        vtable = table - self._unpack("<i", table)
        size = self._unpack("<H", vtable)
        slot = 4 + 2 * index
        if slot + 2 > size:
            return None
        offset = self._unpack("<H", vtable + slot)
        return table + offset if offset else None

    def scalar(self, table: int, index: int, fmt: str, default: int = 0) -> int:
        pos = self.field(table, index)
        return default if pos is None else self._unpack(fmt, pos)

    def table(self, table: int, index: int) -> int | None:
        pos = self.field(table, index)
        return None if pos is None else pos + self._unpack("<I", pos)

    def vector(self, table: int, index: int, item_size: int) -> tuple[int, int]:
        """``(start, count)`` of a vector field (``(0, 0)`` if absent)."""
        pos = self.field(table, index)
        if pos is None:
            return 0, 0
        start = pos + self._unpack("<I", pos)
        count = self._unpack("<I", start)
        if start + 4 + count * item_size > len(self.data):
            raise MalformedArrow(f"Arrow {self.what} vector runs past its end")
        return start + 4, count

    def int64(self, pos: int) -> int:
        return self._unpack("<q", pos)

    def int32(self, pos: int) -> int:
        return self._unpack("<i", pos)


def scan_arrow_file(
    data: bytes | bytearray | memoryview, *, max_batches: int, max_rows: int
) -> ArrowFileLayout:
    """Check the footer and every batch header of untrusted Arrow IPC file bytes.

    Parameters
    ----------
    data
        The whole file.
    max_batches
        Most record batches accepted.
    max_rows
        Most rows accepted over all batches (the caller's element budget).

    Returns
    -------
    ArrowFileLayout
        The declared rows per batch.

    Raises
    ------
    MalformedArrow
        See the module docstring.
    """
    view = memoryview(data)
    size = len(view)
    if size < 2 * len(_MAGIC) + 8 or bytes(view[:6]) != _MAGIC or bytes(view[-6:]) != _MAGIC:
        raise MalformedArrow("not an Arrow IPC file (missing ARROW1 magic)")
    footer_size = struct.unpack_from("<i", view, size - 10)[0]
    footer_start = size - 10 - footer_size
    if footer_size <= 0 or footer_start < 8:
        raise MalformedArrow(f"Arrow footer length {footer_size} does not fit the file")
    footer = _Flatbuffer(bytes(view[footer_start : size - 10]), "footer")
    root = footer.root()
    if footer.vector(root, _FOOTER_DICTIONARIES, _BLOCK_SIZE)[1]:
        raise MalformedArrow("Arrow block has dictionary batches (gradfed never writes them)")
    start, count = footer.vector(root, _FOOTER_BATCHES, _BLOCK_SIZE)
    if count > max_batches:
        raise MalformedArrow(f"Arrow block lists {count} record batches, more than {max_batches}")
    spans = []
    for i in range(count):
        pos = start + i * _BLOCK_SIZE
        offset, meta, body = footer.int64(pos), footer.int32(pos + 8), footer.int64(pos + 16)
        end = offset + meta + body
        if offset < 8 or meta <= 8 or body < 0 or end > footer_start:
            raise MalformedArrow(f"Arrow record batch {i} lies outside the file's body")
        spans.append((offset, end, meta, i))
    rows: list[int] = [0] * count
    previous_end, total = 8, 0
    for offset, end, meta, index in sorted(spans):
        if offset < previous_end:
            raise MalformedArrow(f"Arrow record batch {index} repeats or overlaps another")
        previous_end = end
        rows[index] = _batch_rows(view, offset, meta, end - offset - meta, index)
        total += rows[index]
        if total > max_rows:
            raise MalformedArrow(f"Arrow block declares over {max_rows} rows (batch {index})")
    return ArrowFileLayout(tuple(rows))


def _batch_rows(view: memoryview, offset: int, meta: int, body: int, index: int) -> int:
    """Return the row count of the batch message at ``offset``; refuse compressed bodies."""
    prefix = struct.unpack_from("<I", view, offset)[0]
    skip = 8 if prefix == _CONTINUATION else 4
    length = struct.unpack_from("<i", view, offset + skip - 4)[0]
    if length <= 0 or skip + length > meta:
        raise MalformedArrow(f"Arrow record batch {index} has a bad metadata length")
    message = _Flatbuffer(bytes(view[offset + skip : offset + skip + length]), "batch header")
    root = message.root()
    if message.scalar(root, _MESSAGE_TYPE, "<B") != _RECORD_BATCH:
        raise MalformedArrow(f"Arrow record batch {index} is not a RecordBatch message")
    header = message.table(root, _MESSAGE_HEADER)
    if header is None:
        raise MalformedArrow(f"Arrow record batch {index} has no header")
    if message.table(header, _BATCH_COMPRESSION) is not None:
        raise MalformedArrow(
            f"Arrow record batch {index} is compressed (gradfed never writes compressed buffers)"
        )
    if not 0 <= message.scalar(root, _MESSAGE_BODY, "<q") <= body:
        raise MalformedArrow(f"Arrow record batch {index} body runs past its footer entry")
    rows = message.scalar(header, _BATCH_LENGTH, "<q")
    if rows < 0:
        raise MalformedArrow(f"Arrow record batch {index} has {rows} rows")
    return rows
