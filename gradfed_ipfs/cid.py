"""Make, parse and verify CIDs (CIDv1, sha2-256, base32) with ``multiformats``.

Two codecs are used: ``raw`` (0x55) for gradient blocks (Arrow IPC bytes) and ``dag-cbor``
(0x71) for structured records (chunk manifests, round records, graph nodes, checkpoints).
The string form is multibase base32-lower: ``bafkrei…`` for raw, ``bafyrei…`` for dag-cbor;
Kubo computes the same CID for the same bytes with ``block/put``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from typing import Final, Literal

import dag_cbor.decoding
from multiformats import CID, multibase, multicodec, multihash

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

# Fast paths for the only CIDs this library makes: CIDv1, raw or dag-cbor, sha2-256, i.e. the
# 36 bytes 0x01 <codec> 0x12 0x20 <digest>. multiformats validates every argument at run time
# (typing_validation, varint and registry look-ups): ~0.3 ms to make a CID, ~1 ms to decode
# one, ~0.35 ms to render one, which made CID handling a third of a sliced round's CPU
# (benchmarks/bench_load.py). Anything else goes through multiformats unchanged; the fast
# paths build the same CID objects (tests/test_cid.py compares them).
_SHA2_256_FN: Final = multihash.get("sha2-256")
_BASE32: Final = multibase.get("base32")
_BASE58BTC: Final = multibase.get("base58btc")
_CODECS: Final = {RAW: multicodec.get("raw"), DAG_CBOR: multicodec.get("dag-cbor")}
_new_instance = getattr(CID, "_new_instance", None)  # private; without it, no fast path


def _fast_cid(raw: bytes, base: multibase.Multibase) -> CID | None:
    """Return the CID whose binary form is ``raw`` when it is one of ours, else ``None``."""
    if len(raw) != 36 or raw[0] != 1 or raw[2] != SHA2_256 or raw[3] != 32:
        return None
    codec = _CODECS.get(raw[1])
    if codec is None or _new_instance is None:
        return None
    return _new_instance(CID, base, 1, codec, _SHA2_256_FN, raw[2:])  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=1 << 14)
def _known_cid(raw: bytes, base32: bool) -> CID | None:
    """Return :func:`_fast_cid` of ``raw``, remembered (base32 or base58btc).

    A round's records and manifests name the same CIDs again and again, and multiformats'
    ``_new_instance`` costs ~10 µs (it hashes multiformats objects).
    """
    return _fast_cid(raw, _BASE32 if base32 else _BASE58BTC)


class _FastDecodeCID(CID):
    """``CID`` for dag-cbor's decoder: tag-42 links of our kind skip multiformats' checks."""

    __slots__ = ()

    @staticmethod
    def decode(cid: str | bytes | bytearray | memoryview) -> CID:
        if not isinstance(cid, str):
            fast = _known_cid(bytes(cid), False)  # base58btc: what CID.decode gives for bytes
            if fast is not None:
                return fast
        return CID.decode(cid)


# dag-cbor's decoder resolves ``CID`` in its module when it meets a link; every manifest,
# roster and record decode goes through it (N links per manifest).
dag_cbor.decoding.CID = _FastDecodeCID  # type: ignore[attr-defined]


_multiformats_cid_bytes = CID.__bytes__


def _cid_bytes(cid: CID) -> bytes:
    """``bytes(cid)`` without multiformats' run-time checks: the same bytes, ~50x cheaper.

    ``CID.__bytes__`` encodes its two varints through ``typing_validation`` (~25 µs each);
    ``bytes(cid)`` is every block's and message's dict key and every dag-cbor link, about 1,500
    times per peer and agreed round (7 ms of a 3-peer round's CPU per peer at d = 1M). A CIDv1
    whose codec code fits one varint byte is ``0x01 <code> <multihash>``; any other goes to
    multiformats (``tests/test_cid.py`` compares the two).
    """
    # The slots behind ``version``, ``codec`` and ``digest``: their properties cost ~1.7 µs of
    # the ~3.2 µs a call took, on the roster phase's hot path (O(N) a board change a member).
    if cid._version == 1:
        code = cid._codec.code
        if code < 0x80:
            return bytes((1, code)) + cid._digest
    return _multiformats_cid_bytes(cid)


CID.__bytes__ = _cid_bytes  # type: ignore[method-assign,assignment]


def _cid_hash(cid: CID) -> int:
    """``hash(cid)`` from its bytes: consistent with ``CID.__eq__``, ~8x cheaper.

    multiformats hashes ``(CID, version, codec, digest)``, and the codec's hash is a tuple of
    five more fields (~4 µs a call); CIDs key the text and parse caches (:func:`cid_to_str`
    is asked O(N²) times a round in an N-member process). Two CIDs are equal exactly when
    their version, codec and multihash are, that is when their bytes are.
    """
    return hash(bytes(cid))


CID.__hash__ = _cid_hash  # type: ignore[method-assign,assignment]


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
    code = RAW if name == "raw" else DAG_CBOR
    fast = _fast_cid(bytes((1, code, SHA2_256, 32)) + digest, _BASE32)
    if fast is not None:
        return fast
    return CID("base32", 1, name, multihash.wrap(digest, "sha2-256"))  # pragma: no cover


_CACHED: Final = 1 << 14
"""CIDs whose parse and text form are remembered (a round names N² of them: decoding one costs
~0.4 ms and rendering one in base32 ~0.35 ms in multiformats, more than moving a small block)."""


@functools.lru_cache(maxsize=_CACHED)
def _decode(value: str | bytes) -> CID:
    if isinstance(value, bytes):
        fast = _fast_cid(value, _BASE58BTC)
    elif value.startswith("bafk") or value.startswith("bafy"):  # base32 CIDv1 raw / dag-cbor
        try:
            binary = base64.b32decode(value[1:].upper() + "=" * (-(len(value) - 1) % 8))
        except ValueError:
            binary = b""
        fast = _fast_cid(binary, _BASE32)
        if fast is not None and _text(fast) != value:
            fast = None  # not the canonical spelling: multiformats decides
    else:
        fast = None
    return CID.decode(value) if fast is None else fast


@functools.lru_cache(maxsize=_CACHED)
def _text(cid: CID) -> str:
    if cid.version == 1 and cid.base is _BASE32:
        return "b" + base64.b32encode(bytes(cid)).decode("ascii").rstrip("=").lower()
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
    if cid.version == 1 and cid.base is not _BASE32:
        # CID.set re-validates everything (~0.1 ms); the fields are already a valid CID's
        code = cid.codec.code
        if code in _CODECS:
            fast = _known_cid(bytes((1, code)) + cid.digest, True)
            if fast is not None:
                return fast
        if _new_instance is not None:
            return _new_instance(CID, _BASE32, 1, cid.codec, cid.hashfun, cid.digest)  # type: ignore[no-any-return]
        cid = cid.set(base="base32")  # pragma: no cover
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
    multihash_bytes = cid.digest
    if len(multihash_bytes) == 34 and multihash_bytes[:2] == b"\x12\x20":  # sha2-256, 32 bytes
        return bytes(multihash_bytes[2:])
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
