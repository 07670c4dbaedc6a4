"""Builders of hostile blocks: each returns the smallest bytes that show one attack (issue 15).

Shared by the attack tests and the fuzzers of ``tests/adversarial`` (and, for forged agreed
heads, by the multi-process peers of ``tests/multiprocess``).
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pyarrow as pa
from multiformats import CID

from gradfed_ipfs.federated.agreed.history import load_record
from gradfed_ipfs.formats.agreed.roster import AgreedRecord, Roster
from gradfed_ipfs.formats.arrow import META_COUNT, META_ENCODING, META_SHAPE, encode_arrow_file
from gradfed_ipfs.storage import BlockStore, put_gradient

_FOOTER_TAIL = 10  # int32 footer length + "ARROW1"


def nested_shape_block(depth: int = 2000, count: int = 1024) -> bytes:
    """A dense block whose ``gradfed.shape`` is ``depth`` nested JSON arrays (13 KB at 2,000)."""
    values = pa.array(np.zeros(count, np.float32))
    metadata = {META_ENCODING: "dense", META_SHAPE: "[" * depth + "]" * depth}
    return encode_arrow_file({"value": values}, metadata)


def compressed_block(
    count: int,
    codec: str = "zstd",
    *,
    column: str = "value",
    metadata: dict[str, str] | None = None,
) -> bytes:
    """A dense block of ``count`` zeros whose body is ZSTD/LZ4 compressed (a decompression bomb)."""
    if column == "masked":
        array = pa.array(np.zeros(count, np.uint32))
        meta = {META_ENCODING: "secagg-u32", META_COUNT: str(count), META_SHAPE: f"[{count}]"}
    else:
        array = pa.array(np.zeros(count, np.float32))
        meta = {META_ENCODING: "dense", META_SHAPE: json.dumps([count])}
    meta.update(metadata or {})
    schema = pa.schema([pa.field(column, array.type, nullable=False)], metadata=meta)
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.ipc.new_file(sink, schema, options=options) as writer:
        writer.write_batch(pa.record_batch([array], schema=schema))
    return bytes(sink.getvalue().to_pybytes())


def _footer_blocks(data: bytes, count: int) -> list[tuple[int, int, int, int]]:
    """``(position in file, offset, meta, body)`` of the footer's ``count`` batch entries.

    The footer's ``recordBatches`` vector is ``count`` contiguous 24-byte structs whose batches
    follow one another in the file (as pyarrow writes them): the first run that fits is it.
    """
    footer_size = struct.unpack_from("<i", data, len(data) - _FOOTER_TAIL)[0]
    start = len(data) - _FOOTER_TAIL - footer_size
    for pos in range(start, len(data) - _FOOTER_TAIL - 24 * count + 1, 4):
        entries = [struct.unpack_from("<qiiq", data, pos + 24 * k) for k in range(count)]
        chained = all(
            entries[k + 1][0] == entries[k][0] + entries[k][1] + entries[k][3]
            for k in range(count - 1)
        )
        plausible = all(
            8 <= offset < start
            and 8 < meta < 4096
            and pad == 0
            and 0 <= body < start
            and data[offset : offset + 4] == b"\xff\xff\xff\xff"
            for offset, meta, pad, body in entries
        )
        if chained and plausible:
            return [(pos + 24 * k, e[0], e[1], e[3]) for k, e in enumerate(entries)]
    raise AssertionError(f"no run of {count} footer blocks found")


def duplicated_footer_block(copies: int = 64, rows: int = 4096, codec: str | None = None) -> bytes:
    """A block whose footer lists its one record batch ``copies`` times."""
    array = pa.array(np.arange(rows, dtype=np.float32))
    schema = pa.schema(
        [pa.field("value", pa.float32(), nullable=False)],
        metadata={META_ENCODING: "dense", META_SHAPE: json.dumps([rows * copies])},
    )
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.ipc.new_file(sink, schema, options=options) as writer:
        for _ in range(copies):
            writer.write_batch(pa.record_batch([array], schema=schema))
    data = bytearray(sink.getvalue().to_pybytes())
    blocks = _footer_blocks(bytes(data), copies)
    first = min(b[1] for b in blocks)
    for pos, _, meta, body in blocks:
        struct.pack_into("<qiiq", data, pos, first, meta, 0, body)
    # Drop the other copies from the body: the footer (patched above) only names the first.
    first_end = first + blocks[0][2] + blocks[0][3]
    footer_size = struct.unpack_from("<i", data, len(data) - _FOOTER_TAIL)[0]
    return bytes(data[:first_end] + data[len(data) - _FOOTER_TAIL - footer_size :])


def lying_rows_block(rows: int = 1000, claimed: int = 2**40) -> bytes:
    """A dense block whose batch header claims ``claimed`` rows (the body holds ``rows``)."""
    data = bytearray(encode_arrow_file({"value": pa.array(np.ones(rows, np.float32))}, {}))
    (_, offset, meta, _) = _footer_blocks(bytes(data), 1)[0]
    needle, patched = struct.pack("<q", rows), 0
    pos = data.find(needle, offset, offset + meta)
    while pos >= 0:
        struct.pack_into("<q", data, pos, claimed)
        patched += 1
        pos = data.find(needle, pos + 8, offset + meta)
    if not patched:
        raise AssertionError("row count not found in the batch header")
    return bytes(data)


FORGED_FILL = 1234.5
"""Every value of the fake model a forged head names."""


async def forged_head(store: BlockStore, head: CID, length: int) -> tuple[CID, CID]:
    """Put a record extending ``head`` by one round whose result is a stored fake model.

    Its roster is never put (nobody serves it), so nobody can re-aggregate the round; the fake
    model (``length`` values of :data:`FORGED_FILL`) is stored. Returns ``(result, record)``.
    """
    real = await load_record(store, head)
    fake = await put_gradient(store, np.full(length, FORGED_FILL, np.float32))
    unserved = Roster.new(real.session, real.genesis, real.round + 1, real.result, "x", [], {})
    record = AgreedRecord(
        real.session, real.genesis, real.round + 1, head, real.result,
        unserved.to_block().cid, fake, real.learning_rate,
    )  # fmt: skip
    return fake, await store.put(record.to_block())
