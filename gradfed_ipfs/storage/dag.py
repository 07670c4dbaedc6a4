"""Large gradients as chunked DAGs: Arrow chunk blocks linked by a dag-cbor manifest.

Kubo refuses blocks over 2 MiB and bitswap will not move much larger ones, so a gradient whose
Arrow encoding exceeds ``chunk_bytes`` (default 1 MiB) is split into contiguous value ranges.
Each range is its own dense Arrow block (raw codec 0x55, see :mod:`gradfed_ipfs.formats.arrow`)
that records its offset (``gradfed.offset``), so equal ranges are still distinct blocks: a
manifest may not name one block twice. A dag-cbor manifest (codec 0x71) links them with real
IPLD links (CBOR tag 42)::

    {"format": "gradfed/chunked-gradient", "version": 1, "dtype": "float32",
     "shape": [d0, d1, ...], "length": n,
     "chunks": [{"cid": CID, "offset": 0, "length": k0}, {"cid": CID, "offset": k0, ...}, ...]}

The manifest CID is the gradient's CID; a small gradient keeps its single raw-block CID.

A compressed gradient (``compression=``, an agreed round's contribution) has the same ranges and
manifest, but each chunk (or the single raw block) is a packed block
(:mod:`gradfed_ipfs.formats.packed`) decoding to that range's float32 values; its readers pass
the expected :class:`~gradfed_ipfs.tensor.packing.PackSpec` as ``packing=`` (a dense block is
then refused, as a packed one is without it).
Pinning the manifest with ``pin/add`` (recursive) pins every chunk.

Fetching is concurrent (bounded), every chunk is re-hashed on arrival (the store's ``get``
verifies) and decoded straight into its slice of one preallocated float32 array. Manifests are
untrusted input: :meth:`ChunkManifest.decode` (:mod:`gradfed_ipfs.formats.manifest`, re-exported
here) validates every field and raises :class:`~gradfed_ipfs.errors.MalformedManifest`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Final

import numpy as np
from multiformats import CID

from .._types import CIDLike, FloatArray, GradientLike
from ..cid import DAG_CBOR, RAW, cid_to_str, parse_cid
from ..errors import (
    BlockCorrupt,
    DecodeError,
    DimensionMismatch,
    InvalidGradient,
    MalformedArrow,
    MalformedManifest,
    MalformedPacked,
)
from ..formats.arrow import (
    META_OFFSET,
    decode_dense_block,
    decode_gradient,
    load_layer_from_arrow,
    store_gradient_as_arrow,
)
from ..formats.limits import MAX_DECODED_ELEMENTS
from ..formats.manifest import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    MAX_CHUNKS,
    ChunkManifest,
    ChunkRef,
)
from ..formats.manifest_window import decode_manifest_window
from ..formats.packed import decode_packed_chunk, encode_packed_chunk
from ..tensor.codecs import Codec
from ..tensor.packing import PackSpec
from ..tensor.types import DenseGradient
from .base import MAX_BLOCK_SIZE, UNSET, Block, BlockStore, Unset
from .fetch_retries import Arrivals, get_with_retries

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_CONCURRENCY",
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "MAX_CHUNKS",
    "ChunkRef",
    "ChunkManifest",
    "ProgressCallback",
    "fetch_chunks",
    "fetch_gradient",
    "fetch_manifest",
    "plan_chunks",
    "put_gradient",
    "values_per_chunk",
]

logger = logging.getLogger("gradfed_ipfs.storage.dag")

DEFAULT_CHUNK_BYTES: Final = 1024 * 1024
"""Default largest encoded chunk, in bytes (1 MiB)."""
DEFAULT_CONCURRENCY: Final = 16
"""Default number of chunks fetched or stored at once (16 MiB in flight: at RTT 150 ms and
100 Mbit/s a fetch reached 0.72-0.79 x raw TCP with 8, 0.66-1.00 x with 16; bench_wan.py)."""
_ARROW_OVERHEAD: Final = 4096  # generous bound of the Arrow framing + metadata of one chunk

ProgressCallback = Callable[[int, int], None]
"""``progress(done_bytes, total_bytes)``: float32 bytes of the gradient decoded so far."""


def values_per_chunk(chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Return how many float32 values fit in one chunk block of at most ``chunk_bytes``.

    Parameters
    ----------
    chunk_bytes
        Largest encoded chunk in bytes, 64 KiB … 2 MiB.

    Raises
    ------
    InvalidGradient
        If ``chunk_bytes`` is outside 64 KiB … 2 MiB.
    """
    if not 65_536 <= chunk_bytes <= MAX_BLOCK_SIZE:
        raise InvalidGradient(f"chunk_bytes must be in 65536..{MAX_BLOCK_SIZE}, got {chunk_bytes}")
    return (chunk_bytes - _ARROW_OVERHEAD) // 4 // 64 * 64


def plan_chunks(length: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[tuple[int, int]]:
    """Split ``length`` values into contiguous ``(offset, length)`` ranges for ``chunk_bytes``.

    Parameters
    ----------
    length
        Number of float32 values.
    chunk_bytes
        Largest encoded chunk in bytes.

    Returns
    -------
    list of (int, int)
        Ranges covering ``0 … length`` in order; all but the last hold
        :func:`values_per_chunk` values.
    """
    per = values_per_chunk(chunk_bytes)
    return [(start, min(per, length - start)) for start in range(0, length, per)]


async def put_gradient(  # noqa: PLR0913 - public face: keyword-only options
    store: BlockStore,
    gradient: GradientLike,
    *,
    shape: tuple[int, ...] | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    concurrency: int = DEFAULT_CONCURRENCY,
    pin: bool = True,
    progress: ProgressCallback | None = None,
    compression: Codec | None = None,
    exact_tail: int = 0,
) -> CID:
    """Store a gradient and return its CID: a raw block, or a chunked DAG when large.

    Parameters
    ----------
    store
        Where to put the blocks.
    gradient
        The gradient (any shape; flattened row-major, converted to float32).
    shape
        Shape to record; defaults to the array's shape.
    chunk_bytes
        Largest block in bytes (≤ 2 MiB); encodings above it are chunked.
    concurrency
        Chunks stored at once.
    pin
        Pin the result (recursively: the manifest pins every chunk).
    progress
        Called with ``(done_bytes, total_bytes)`` after each chunk is stored.
    compression
        Store packed blocks of this codec (:meth:`~gradfed_ipfs.tensor.codecs.Codec.pack`)
        instead of dense ones, over the same chunk ranges; ``None``: dense float32.
    exact_tail
        With ``compression``: the last ``exact_tail`` values are stored exact.

    Returns
    -------
    CID
        A raw CID (``bafkrei…``) for a single block, a dag-cbor CID (``bafyrei…``) for a DAG.
    """
    per = values_per_chunk(chunk_bytes)
    array = np.asarray(gradient, dtype=np.float32)
    recorded = tuple(int(d) for d in (array.shape if shape is None else shape))
    flat = np.ascontiguousarray(array).reshape(-1)
    if math.prod(recorded) != flat.size:
        raise InvalidGradient(f"shape {list(recorded)} does not hold {flat.size} values")
    total = 4 * flat.size
    ranges = plan_chunks(flat.size, chunk_bytes) if flat.size > per else [(0, flat.size)]
    encode = _chunk_encoder(flat, ranges, compression, exact_tail)
    if flat.size <= per:
        data = encode(0) if encode else store_gradient_as_arrow(flat, shape=recorded)
        cid = await store.put(Block.new(data), pin=pin)
        if progress is not None:
            progress(total, total)
        return cid
    cids: list[CID | None] = [None] * len(ranges)
    done = 0

    async def store_one(index: int) -> None:
        nonlocal done
        offset, length = ranges[index]
        # The offset in the metadata keeps equal chunks (zeros, constants) distinct blocks.
        data = (
            encode(index)
            if encode
            else store_gradient_as_arrow(flat[offset : offset + length], offset=offset)
        )
        # Chunks are pinned through the manifest's recursive pin, not one by one.
        cids[index] = await store.put(Block.new(data), pin=False)
        done += 4 * length
        if progress is not None:
            progress(done, total)

    await _bounded(concurrency, (store_one(i) for i in range(len(ranges))))
    chunks = tuple(
        ChunkRef(_set(cid), offset, length)
        for cid, (offset, length) in zip(cids, ranges, strict=True)
    )
    manifest = ChunkManifest(recorded, int(flat.size), chunks)
    # Kubo's `block/put --pin` pins recursively ("pin added blocks recursively"), so the
    # manifest's pin protects every chunk; no separate pin/add round trip is needed.
    cid = await store.put(manifest.to_block(), pin=pin)
    logger.debug("stored %d values as %d chunks under %s", flat.size, len(chunks), cid)
    return cid


def _chunk_encoder(
    flat: FloatArray, ranges: list[tuple[int, int]], compression: Codec | None, exact_tail: int
) -> Callable[[int], bytes] | None:
    """Return ``index → packed block bytes`` of a compressed gradient, ``None`` for dense."""
    if compression is None:
        return None
    spec = compression.packing(exact_tail)
    chunks = compression.pack(flat, ranges, exact_tail)
    return lambda index: encode_packed_chunk(spec, chunks[index])


def _set(cid: CID | None) -> CID:
    if cid is None:  # pragma: no cover - every task either set it or raised
        raise InvalidGradient("a chunk was not stored")
    return cid


async def fetch_manifest(
    store: BlockStore,
    cid: CIDLike,
    *,
    timeout: float | Unset = UNSET,
    retries: int = 2,
    max_length: int = MAX_DECODED_ELEMENTS,
    window: tuple[int, int] | None = None,
) -> ChunkManifest:
    """Fetch and validate the manifest of a chunked gradient.

    With ``window=(offset, stop)`` only the chunks overlapping those values are kept, and only
    their links are decoded (:func:`~gradfed_ipfs.formats.manifest_window.decode_manifest_window`).

    Parameters
    ----------
    store
        Where to get the block.
    cid
        A dag-cbor CID.
    timeout
        Seconds to wait for the block (the store's default when not given).
    retries
        Extra attempts on transient errors (:class:`StoreUnavailable`).
    max_length
        Most values the manifest may declare.

    Raises
    ------
    MalformedManifest
        If ``cid`` is not dag-cbor or the record is not a valid manifest.
    """
    parsed = parse_cid(cid)
    if parsed.codec.code != DAG_CBOR:
        raise MalformedManifest(f"{parsed} is not a dag-cbor CID")
    block = await get_with_retries(
        store, parsed, timeout, retries, f"manifest {cid_to_str(parsed)}"
    )
    try:
        if window is not None:
            return decode_manifest_window(block.data, *window, max_length=max_length)
        return ChunkManifest.decode(block.data, max_length=max_length)
    except MalformedManifest as exc:
        raise MalformedManifest(f"{exc} (manifest {parsed})") from None


ChunkSink = Callable[[ChunkRef, FloatArray], None]
"""Receives each verified chunk's values (a read-only view, valid only during the call)."""


async def fetch_chunks(  # noqa: PLR0913 - public face: keyword-only options
    store: BlockStore,
    manifest: ChunkManifest,
    sink: ChunkSink,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    timeout: float | Unset = UNSET,
    retries: int = 2,
    progress: ProgressCallback | None = None,
    manifest_cid: CID | None = None,
    packing: PackSpec | None = None,
) -> None:
    """Fetch every chunk of ``manifest`` concurrently, verify, decode and pass it to ``sink``.

    Parameters
    ----------
    store
        Where to get the blocks (its ``get`` re-hashes each block against its CID).
    manifest
        A validated manifest.
    sink
        Called once per chunk with its ref and its ``length`` float32 values, in arrival order.
    concurrency
        Chunks in flight at once (≥ 1).
    timeout
        Seconds each block may take (the store's default when not given).
    retries
        Extra attempts per chunk on transient errors (:class:`StoreUnavailable`).
    progress
        Called with ``(done_bytes, total_bytes)`` after each chunk.
    manifest_cid
        Named in error messages when given.
    packing
        The chunks are packed blocks of this encoding (``None``: dense chunks).

    Raises
    ------
    BlockCorrupt
        If a chunk's bytes do not hash to its CID, or it is not a dense chunk (a packed chunk
        of ``packing``) of the declared length; the message names the chunk index and CID.
        Nothing more is fetched.
    BlockTimeout
        If a chunk did not arrive within ``timeout`` while no other chunk arrived either (a
        chunk that times out while others keep arriving is asked for again: it was waiting
        behind them, slow rather than missing); it says how many bytes had arrived.
    BlockNotFound, StoreUnavailable
        If a chunk cannot be fetched.
    """
    if concurrency < 1:
        raise InvalidGradient(f"concurrency must be >= 1, got {concurrency}")
    done = 0
    where = f" of {cid_to_str(manifest_cid)}" if manifest_cid is not None else ""
    arrivals = Arrivals()

    async def fetch_one(index: int, ref: ChunkRef) -> None:
        nonlocal done
        what = f"chunk {index}{where}"
        block = await get_with_retries(store, ref.cid, timeout, retries, what, arrivals)
        if packing is not None:
            values = _decode_packed(block, index, ref, where, packing, manifest.length)
        else:
            dense = decode_dense_block(block.data, ref.length, offset=ref.offset)
            # None: not the canonical bytes of this chunk, the full decoder's turn
            values = _decode_chunk(block, index, ref, where) if dense is None else dense
        sink(ref, values)
        done += 4 * ref.length
        if progress is not None:
            progress(done, manifest.nbytes)

    await _bounded(concurrency, (fetch_one(i, ref) for i, ref in enumerate(manifest.chunks)))


def _decode_packed(
    block: Block, index: int, ref: ChunkRef, where: str, packing: PackSpec, total: int
) -> FloatArray:
    """Decode chunk ``index`` as a packed block of ``packing``, or raise ``BlockCorrupt``."""
    try:
        return decode_packed_chunk(block.data, packing, ref.offset, ref.length, total)
    except MalformedPacked as exc:
        raise BlockCorrupt(f"chunk {index}{where}: {exc}", cid=ref.cid) from exc


def _decode_chunk(block: Block, index: int, ref: ChunkRef, where: str) -> FloatArray:
    """Decode chunk ``index`` in full: a dense block of ``ref.length`` values at ``ref.offset``.

    Raises
    ------
    BlockCorrupt
        If it is not (malformed, another encoding, length or offset).
    """
    try:
        decoded = decode_gradient(block.data, max_elements=ref.length, expected_length=ref.length)
    except MalformedArrow as exc:
        raise BlockCorrupt(
            f"chunk {index}{where} is not a gradient block: {exc}", cid=ref.cid
        ) from exc
    recorded_offset = decoded.metadata.get(META_OFFSET, str(ref.offset))
    if recorded_offset != str(ref.offset):
        raise BlockCorrupt(
            f"chunk {index}{where} was written for offset {recorded_offset!r:.24}, "
            f"the manifest puts it at {ref.offset}",
            cid=ref.cid,
        )
    if decoded.encoding != "dense" or decoded.values.size != ref.length:
        raise BlockCorrupt(
            f"chunk {index}{where} holds {decoded.values.size} {decoded.encoding} values, "
            f"the manifest says {ref.length} dense",
            cid=ref.cid,
        )
    return decoded.values


async def fetch_gradient(  # noqa: PLR0913 - public face: keyword-only options
    store: BlockStore,
    cid: CIDLike,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    timeout: float | Unset = UNSET,
    retries: int = 2,
    progress: ProgressCallback | None = None,
    max_length: int = MAX_DECODED_ELEMENTS,
    expected_length: int | None = None,
    packing: PackSpec | None = None,
) -> FloatArray:
    """Fetch a gradient by CID, raw block or chunked DAG, verified and decoded.

    Parameters
    ----------
    store
        Where to get the blocks.
    cid
        A raw CID (one Arrow block) or a dag-cbor CID (a chunk manifest).
    concurrency, timeout, retries, progress
        See :func:`fetch_chunks`.
    max_length
        Refuse gradients declaring more values than this (before allocating; default
        :data:`~gradfed_ipfs.formats.limits.MAX_DECODED_ELEMENTS`).
    expected_length
        The length the caller requires; a different one raises :class:`DimensionMismatch`
        (before any chunk is fetched, for a chunked gradient).
    packing
        A compressed gradient of this encoding (``expected_length`` required): its blocks
        must be packed blocks of it (:mod:`gradfed_ipfs.formats.packed`); ``None``: dense.

    Returns
    -------
    FloatArray
        The gradient in its recorded shape. Chunked gradients land in one preallocated
        writable array; a raw block decodes to a read-only zero-copy view.

    Raises
    ------
    MalformedManifest
        If a dag-cbor CID does not lead to a valid manifest, or it is too long.
    MalformedArrow
        If a raw block is not a dense gradient.
    MalformedPacked
        With ``packing``: if a raw block is not a packed block of it.
    DimensionMismatch
        If the length differs from ``expected_length``.
    BlockCorrupt, BlockNotFound, StoreUnavailable
        See :func:`fetch_chunks`.
    """
    parsed = parse_cid(cid)
    if packing is not None and (expected_length is None or expected_length > max_length):
        raise InvalidGradient("a packed gradient is fetched with its expected_length (<= max)")
    if parsed.codec.code == RAW:
        block = await get_with_retries(
            store, parsed, timeout, retries, f"block {cid_to_str(parsed)}"
        )
        if packing is not None and expected_length is not None:
            packed = decode_packed_chunk(block.data, packing, 0, expected_length, expected_length)
            if progress is not None:
                progress(packed.nbytes, packed.nbytes)
            return packed
        if expected_length is not None and expected_length <= max_length:
            values = decode_dense_block(block.data, expected_length)
            if values is not None:  # the canonical bytes of a flat gradient of that length
                if progress is not None:
                    progress(values.nbytes, values.nbytes)
                return values
        # Not densified before the encoding is checked: a small sparse block may declare a
        # large shape.
        layer, _ = load_layer_from_arrow(block.data, max_elements=max_length)
        if not isinstance(layer, DenseGradient):
            raise MalformedArrow(f"block {parsed} has encoding {layer.kind!r}, not dense")
        _check_length(layer.values.size, expected_length)
        if progress is not None:
            progress(layer.values.nbytes, layer.values.nbytes)
        return layer.values.reshape(layer.shape)
    if parsed.codec.code != DAG_CBOR:
        raise DecodeError(f"{parsed}: codec {parsed.codec.name} is neither raw nor dag-cbor")
    manifest = await fetch_manifest(
        store, parsed, timeout=timeout, retries=retries, max_length=max_length
    )
    _check_length(manifest.length, expected_length)
    out = np.empty(manifest.length, dtype=np.float32)

    def into_slice(ref: ChunkRef, values: FloatArray) -> None:
        out[ref.offset : ref.stop] = values

    await fetch_chunks(
        store,
        manifest,
        into_slice,
        concurrency=concurrency,
        timeout=timeout,
        retries=retries,
        progress=progress,
        manifest_cid=parsed,
        packing=packing,
    )
    return out.reshape(manifest.shape)


def _check_length(length: int, expected: int | None) -> None:
    if expected is not None and length != expected:
        raise DimensionMismatch([expected], [length])


async def _bounded(limit: int, jobs: Iterator[Awaitable[None]]) -> None:
    """Run ``jobs`` with at most ``limit`` in flight; on the first error cancel the rest."""
    if limit < 1:
        raise InvalidGradient(f"concurrency must be >= 1, got {limit}")
    pending: set[asyncio.Task[None]] = set()
    started: list[asyncio.Task[None]] = []
    try:
        while True:
            # Wait for room *before* creating the next job, so no coroutine is left unawaited.
            if len(pending) >= limit:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    task.result()
            job = next(jobs, None)
            if job is None:
                break
            task = asyncio.ensure_future(job)
            started.append(task)
            pending.add(task)
        while pending:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                task.result()
    except BaseException:
        for task in pending:
            task.cancel()
        # Retrieve every outcome, so no "exception was never retrieved" is logged later.
        await asyncio.gather(*started, return_exceptions=True)
        raise
