"""Make, parse and verify CIDs (CIDv1, sha2-256, base32) with ``multiformats``.

Two codecs are used: ``raw`` (0x55) for gradient blocks (Arrow IPC bytes) and ``dag-cbor``
(0x71) for structured records (chunk manifests, round records, graph nodes, checkpoints).
The string form is multibase base32-lower: ``bafkrei…`` for raw, ``bafyrei…`` for dag-cbor;
Kubo computes the same CID for the same bytes with ``block/put``.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Final, Literal

from multiformats import CID, multihash

from ._types import CIDLike
from .errors import BlockCorrupt, DecodeError

__all__ = [
    "CID",
    "DAG_CBOR",
    "RAW",
    "SHA2_256",
    "CodecName",
    "cid_digest",
    "cid_to_str",
    "is_dag_cbor",
    "make_cid",
    "parse_cid",
    "verify_cid",
]

RAW: Final = 0x55
"""Multicodec code of ``raw`` (opaque bytes)."""
DAG_CBOR: Final = 0x71
"""Multicodec code of ``dag-cbor`` (IPLD records with CID links)."""
SHA2_256: Final = 0x12
"""Multihash code of sha2-256."""

CodecName = Literal["raw", "dag-cbor"]
_CODEC_NAMES: Final[dict[int, CodecName]] = {RAW: "raw", DAG_CBOR: "dag-cbor"}


def make_cid(data: bytes | bytearray | memoryview, codec: CodecName | int = "raw") -> CID:
    """Return the CIDv1 of ``data``: sha2-256 over the bytes, with the given codec.

    Parameters
    ----------
    data
        The block's bytes (hashed as they are).
    codec
        ``"raw"`` (0x55, the default) or ``"dag-cbor"`` (0x71), by name or code.
    """
    name = _codec_name(codec)
    digest = hashlib.sha256(data).digest()
    return CID("base32", 1, name, multihash.wrap(digest, "sha2-256"))


_CACHED: Final = 1 << 14
"""CIDs whose parse and text form are remembered (a round names N² of them: decoding one costs
~0.4 ms and rendering one in base32 ~0.35 ms in multiformats, more than moving a small block)."""


@functools.lru_cache(maxsize=_CACHED)
def _decode(value: str | bytes) -> CID:
    return CID.decode(value)


@functools.lru_cache(maxsize=_CACHED)
def _text(cid: CID) -> str:
    return str(cid)


def parse_cid(value: CIDLike) -> CID:
    """Parse a CID from a CID object, a string (any multibase, or CIDv0 ``Qm…``) or bytes.

    The result is always rendered in base32 for CIDv1, so ``str()`` is canonical.

    Raises
    ------
    DecodeError
        If ``value`` is not a CID.
    """
    if isinstance(value, CID):
        cid = value
    else:
        try:
            if isinstance(value, str):
                cid = _decode(value.strip())
            elif isinstance(value, bytes | bytearray | memoryview):
                cid = _decode(bytes(value))
            else:
                raise TypeError(type(value).__name__)
        except (ValueError, KeyError, TypeError) as exc:
            raise DecodeError(f"not a CID: {value!r:.80} ({exc})") from exc
    if cid.version == 1 and cid.base.name != "base32":
        cid = cid.set(base="base32")
    return cid


def cid_to_str(value: CIDLike) -> str:
    """Return the canonical string form (base32 for CIDv1) of a CID."""
    return _text(parse_cid(value))


def cid_digest(value: CIDLike) -> bytes:
    """Return the raw sha2-256 digest (32 bytes) inside a CID.

    Raises
    ------
    DecodeError
        If the CID's hash is not sha2-256, the only hash this library verifies.
    """
    cid = parse_cid(value)
    if cid.hashfun.code != SHA2_256:
        raise DecodeError(f"unsupported hash {cid.hashfun.name} in {cid}; only sha2-256 is used")
    return bytes(cid.raw_digest)


def is_dag_cbor(value: CIDLike) -> bool:
    """Return whether the CID's codec is dag-cbor (a manifest or record) rather than raw."""
    return parse_cid(value).codec.code == DAG_CBOR


def verify_cid(value: CIDLike, data: bytes | bytearray | memoryview) -> CID:
    """Check that ``data`` hashes to the CID ``value``; return the parsed CID.

    Raises
    ------
    BlockCorrupt
        If the sha2-256 of ``data`` differs from the CID's digest.
    DecodeError
        If ``value`` is not a sha2-256 CID.
    """
    cid = parse_cid(value)
    expected = cid_digest(cid)
    actual = hashlib.sha256(data).digest()
    if actual != expected:
        raise BlockCorrupt(
            f"block bytes do not match their CID {cid} (sha2-256 {actual.hex()[:16]}…, "
            f"{len(data)} bytes)",
            cid=cid,
        )
    return cid


def _codec_name(codec: CodecName | int) -> CodecName:
    if isinstance(codec, int):
        try:
            return _CODEC_NAMES[codec]
        except KeyError:
            raise ValueError(f"unsupported codec 0x{codec:x}; use raw or dag-cbor") from None
    if codec not in ("raw", "dag-cbor"):
        raise ValueError(f"unsupported codec {codec!r}; use 'raw' or 'dag-cbor'")
    return codec
