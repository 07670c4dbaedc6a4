"""Helpers for the structured dag-cbor records: graph nodes, checkpoints, round records.

Every record is a dag-cbor map with a ``type`` string and an integer ``version``; references
to other blocks are real CID links (CBOR tag 42), so IPFS tools (``ipfs dag get``, recursive
pins, bitswap sessions) follow them.
"""

from __future__ import annotations

from typing import Any

import dag_cbor
from multiformats import CID

from ..block import Block
from ..cid import parse_cid
from ..errors import DecodeError, GraphSerializationError, MalformedManifest
from .fast_cbor import decode_dag_cbor, encode_dag_cbor

__all__ = [
    "decode_record",
    "encode_record",
    "from_link",
    "require",
    "to_link",
]


def encode_record(record: dict[str, Any]) -> Block:
    """Encode ``record`` as a dag-cbor block (keys sorted canonically by ``dag_cbor``).

    Raises
    ------
    GraphSerializationError
        If a value is not dag-cbor encodable (NaN or infinite floats, NumPy scalars other
        than float64, sets, ...).
    BlockTooLarge
        If the encoding exceeds the 2 MiB block limit.
    """
    try:
        data = encode_dag_cbor(record)
    except (dag_cbor.encoding.CBOREncodingError, TypeError, ValueError) as exc:
        raise GraphSerializationError(f"record does not encode as dag-cbor: {exc}") from exc
    return Block.new(data, "dag-cbor")


def decode_record(
    block: Block, record_type: str, version: int = 1, *, known: dict[bytes, Any] | None = None
) -> dict[str, Any]:
    """Decode a dag-cbor block and check its ``type`` and ``version``.

    ``known`` encodings of top-level values may come back as their given objects
    (:func:`~gradfed_ipfs.formats.fast_cbor.decode_dag_cbor`).

    Raises
    ------
    MalformedManifest
        If the bytes are not dag-cbor, or not a map of that type and version.
    """
    try:
        record = decode_dag_cbor(block.data, known)
    except Exception as exc:  # dag_cbor raises several unrelated types on bad input
        raise MalformedManifest(f"block {block.cid} is not dag-cbor: {exc}") from exc
    if not isinstance(record, dict) or record.get("type") != record_type:
        raise MalformedManifest(f"block {block.cid} is not a {record_type} record")
    if record.get("version") != version:
        raise MalformedManifest(
            f"block {block.cid}: unsupported {record_type} version {record.get('version')!r}"
        )
    return record


def require(record: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """Return ``record[key]`` if it is an instance of ``kind``, else raise ``MalformedManifest``.

    Booleans are refused where ``int`` is asked for.
    """
    value = record.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _tuple(kind)):
        raise MalformedManifest(f"{where}: field {key!r} is missing or has the wrong type")
    return value


def _tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def to_link(value: str) -> CID | str:
    """Return a CID link when ``value`` parses as a CID, else the text itself."""
    try:
        return parse_cid(value)
    except DecodeError:
        return value


def from_link(value: object, what: str) -> str:
    """Return a link's canonical CID string, or text as it is.

    Raises
    ------
    MalformedManifest
        If ``value`` is neither a CID nor text.
    """
    if isinstance(value, CID):
        return str(parse_cid(value))
    if isinstance(value, str):
        return value
    raise MalformedManifest(f"{what} must be a CID link or text, got {type(value).__name__}")
