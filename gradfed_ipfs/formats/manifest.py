"""The chunk manifest of a large gradient: a dag-cbor record linking its Arrow chunk blocks.

Layout (see :mod:`gradfed_ipfs.storage.dag`, which writes and fetches chunked gradients)::

    {"format": "gradfed/chunked-gradient", "version": 1, "dtype": "float32",
     "shape": [d0, d1, ...], "length": n,
     "chunks": [{"cid": CID, "offset": 0, "length": k0}, {"cid": CID, "offset": k0, ...}, ...]}

Manifests are untrusted input: :meth:`ChunkManifest.decode` validates every field against the
decode budget (at most ``max_length`` values, :data:`MAX_CHUNKS` chunks, no block named twice)
before anything is fetched or allocated, and raises
:class:`~gradfed_ipfs.errors.MalformedManifest`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from multiformats import CID

from ..block import MAX_BLOCK_SIZE, Block
from ..cid import RAW, parse_cid
from ..errors import MalformedManifest
from .fast_cbor import decode_dag_cbor, encode_dag_cbor
from .limits import MAX_DECODED_ELEMENTS
from .memo import DecodeMemo

__all__ = ["MANIFEST_FORMAT", "MANIFEST_VERSION", "MAX_CHUNKS", "ChunkManifest", "ChunkRef"]

MANIFEST_FORMAT: Final = "gradfed/chunked-gradient"
"""Value of the manifest's ``format`` field."""
MANIFEST_VERSION: Final = 1
"""The manifest layout version written and accepted here."""
MAX_CHUNKS: Final = 65_536
"""Most chunks a manifest may list (64 Ki x 2 MiB = 128 GiB of float32)."""
_MAX_DIMS: Final = 32
_MANIFESTS: Final[DecodeMemo[bytes, ChunkManifest]] = DecodeMemo()


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """One chunk of a chunked gradient.

    Attributes
    ----------
    cid
        Raw CID of the chunk's Arrow block.
    offset
        Index of the chunk's first value in the flat gradient.
    length
        Number of float32 values in the chunk (≥ 1).
    """

    cid: CID
    offset: int
    length: int

    @property
    def stop(self) -> int:
        """One past the chunk's last value index (``offset + length``)."""
        return self.offset + self.length


@dataclass(frozen=True, slots=True)
class ChunkManifest:
    """The dag-cbor record that links a chunked gradient's blocks.

    Attributes
    ----------
    shape
        The tensor's shape (row-major); its product is ``length``.
    length
        Total number of float32 values.
    chunks
        The chunks in offset order, contiguous from 0 to ``length``.
    dtype
        Element type; only ``"float32"``.
    version
        Manifest layout version (:data:`MANIFEST_VERSION`).
    """

    shape: tuple[int, ...]
    length: int
    chunks: tuple[ChunkRef, ...]
    dtype: str = "float32"
    version: int = MANIFEST_VERSION

    @property
    def nbytes(self) -> int:
        """Size of the decoded gradient in bytes (``4 * length``)."""
        return 4 * self.length

    def to_ipld(self) -> dict[str, Any]:
        """Return the manifest as an IPLD data-model dict (CIDs stay ``CID`` objects)."""
        return {
            "format": MANIFEST_FORMAT,
            "version": self.version,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "length": self.length,
            "chunks": [{"cid": c.cid, "offset": c.offset, "length": c.length} for c in self.chunks],
        }

    def encode(self) -> bytes:
        """Return the dag-cbor bytes of the manifest (CIDs as tag-42 links)."""
        return encode_dag_cbor(self.to_ipld())

    def to_block(self) -> Block:
        """Return the manifest as a dag-cbor block (codec 0x71)."""
        return Block.new(self.encode(), "dag-cbor")

    @classmethod
    def decode(
        cls, data: bytes | bytearray | memoryview, *, max_length: int = MAX_DECODED_ELEMENTS
    ) -> ChunkManifest:
        """Decode and validate untrusted manifest bytes.

        Parameters
        ----------
        data
            dag-cbor bytes of a manifest block.
        max_length
            Most values the manifest may declare (checked before anything is allocated).

        Returns
        -------
        ChunkManifest
            The validated manifest.

        Raises
        ------
        MalformedManifest
            If the bytes are not dag-cbor, or any field has the wrong type or value: unknown
            format or version, a dtype other than float32, a shape whose product is not the
            length, a length over ``max_length``, chunks that are not raw sha2-256 CIDs, not
            contiguous from 0, empty, too many, naming one block twice, or whose lengths do
            not sum to the total.
        """
        if len(data) > MAX_BLOCK_SIZE:
            raise MalformedManifest(f"manifest of {len(data)} bytes exceeds {MAX_BLOCK_SIZE}")
        key = bytes(data)  # remembered (DecodeMemo): a session's members read each one
        known = _MANIFESTS.get(key)
        if known is not None and known.length <= max_length:  # the one check it depends on
            return known
        try:
            record = decode_dag_cbor(key)
        except Exception as exc:  # dag_cbor raises many types on garbage input
            raise MalformedManifest(f"manifest is not dag-cbor: {exc}") from exc
        return _MANIFESTS.put(key, cls.from_ipld(record, max_length=max_length), len(key))

    @classmethod
    def from_ipld(cls, record: object, *, max_length: int = MAX_DECODED_ELEMENTS) -> ChunkManifest:
        """Validate a decoded IPLD record; see :meth:`decode`.

        Parameters
        ----------
        record
            The decoded dag-cbor value.
        max_length
            Most values the manifest may declare.

        Returns
        -------
        ChunkManifest
            The validated manifest.
        """
        version, shape, length = _header(record)
        raw_chunks = record["chunks"]  # type: ignore[index]
        if not isinstance(raw_chunks, list) or not raw_chunks:
            raise MalformedManifest("chunks must be a non-empty list")
        if len(raw_chunks) > MAX_CHUNKS:
            raise MalformedManifest(f"{len(raw_chunks)} chunks exceed the cap of {MAX_CHUNKS}")
        chunks = tuple(_chunk(item, index) for index, item in enumerate(raw_chunks))
        # One block named twice would be fetched and decoded twice: a 70 KB manifest could
        # make a verifier fetch one 2 MiB chunk thousands of times.
        # (The multihash alone tells them apart: every chunk is a raw sha2-256 CIDv1, and
        # bytes(cid) costs ~3 µs in multiformats.)
        if len({chunk.cid.digest for chunk in chunks}) != len(chunks):
            raise MalformedManifest("manifest names one chunk block more than once")
        if length > max_length:
            raise MalformedManifest(f"manifest declares {length} values, more than {max_length}")
        expected_offset = 0
        for index, chunk in enumerate(chunks):
            if chunk.offset != expected_offset:
                raise MalformedManifest(
                    f"chunk {index} starts at {chunk.offset}, expected {expected_offset} "
                    "(chunks must be contiguous and in order)"
                )
            expected_offset = chunk.stop
        if expected_offset != length:
            raise MalformedManifest(f"chunk lengths sum to {expected_offset}, not {length}")
        return cls(shape, length, chunks, "float32", version)


def _header(record: object) -> tuple[int, tuple[int, ...], int]:
    """Check a manifest's keys, format, version, dtype, shape and length; return the last three.

    (The version, the shape and the length.)
    """
    if not isinstance(record, dict):
        raise MalformedManifest(f"manifest is not a map but {type(record).__name__}")
    expected_keys = {"format", "version", "dtype", "shape", "length", "chunks"}
    if set(record) != expected_keys:
        raise MalformedManifest(f"manifest keys {sorted(record)} != {sorted(expected_keys)}")
    if record["format"] != MANIFEST_FORMAT:
        raise MalformedManifest(f"unknown manifest format {record['format']!r:.60}")
    version = _int(record["version"], "version")
    if version != MANIFEST_VERSION:
        raise MalformedManifest(f"unsupported manifest version {version}")
    if record["dtype"] != "float32":
        raise MalformedManifest(f"unsupported dtype {record['dtype']!r:.40}")
    raw_shape = record["shape"]
    if not isinstance(raw_shape, list) or len(raw_shape) > _MAX_DIMS:
        raise MalformedManifest(f"shape must be a list of at most {_MAX_DIMS} ints")
    shape = tuple(_int(d, "shape dimension") for d in raw_shape)
    length = _int(record["length"], "length")
    if math.prod(shape) != length:
        raise MalformedManifest(f"shape {list(shape)} does not hold length {length}")
    return version, shape, length


def _int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**53:
        raise MalformedManifest(f"{what} must be a non-negative int, got {value!r:.40}")
    return value


def _chunk(item: object, index: int) -> ChunkRef:
    if not isinstance(item, dict) or set(item) != {"cid", "offset", "length"}:
        raise MalformedManifest(f"chunk {index} must be a map of cid, offset, length")
    cid = item["cid"]
    if not isinstance(cid, CID):
        raise MalformedManifest(f"chunk {index} cid is not an IPLD link")
    if cid.version != 1 or cid.codec.code != RAW or cid.hashfun.name != "sha2-256":
        raise MalformedManifest(f"chunk {index} cid {cid} is not a CIDv1 raw sha2-256 link")
    length = _int(item["length"], f"chunk {index} length")
    if length == 0 or length > MAX_BLOCK_SIZE // 4:
        raise MalformedManifest(f"chunk {index} length {length} outside 1..{MAX_BLOCK_SIZE // 4}")
    return ChunkRef(parse_cid(cid), _int(item["offset"], f"chunk {index} offset"), length)
