"""The transactions of agreed rounds on CometBFT: signed statements with small dag-cbor bodies.

Each transaction is one :mod:`~gradfed_ipfs.formats.statement` whose author is the member
that says it (its Ed25519 peer ID is its key) and whose body is a dag-cbor map:

- ``comet/contribution`` ``{session, round, cid, weight, base}``: the author's contribution to
  ``round`` (its gradient's CID and integer weight) on the model CID ``base``;
- ``comet/attestation`` ``{session, round, peer, cid}``: the author fetched ``peer``'s
  contribution ``cid`` of ``round`` and verified it (bounds, size, hash);
- ``comet/result`` ``{session, round, record, model}``: the author's record CID of ``round``
  and the model CID it names; with a ``roster`` field (:func:`roster_digest` of the roster it
  aggregated), it may come before the round's close and counts once that roster is decided;
- ``comet/validator`` ``{session, chain_id, pub_key, round}`` (in the chain's genesis, with
  ``round`` 0, or a joiner's transaction, with ``round`` its join's): the author's validator
  signs with the raw 32-byte Ed25519 key ``pub_key`` on chain ``chain_id``, so the validator and
  the member are one identity (:func:`validator_binding`); ``round`` dates the binding, so one
  made before its author's last leave or eviction cannot be replayed after it.

CIDs are carried as strings (checked and normalised by :func:`~gradfed_ipfs.cid.parse_cid`), so
a body decodes to plain values; ``session`` binds a statement to one session, so it cannot be
replayed into another session's chain. Decoding checks every field's type and bounds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import dag_cbor

from ..._types import CIDLike
from ...cid import parse_cid
from ...errors import DecodeError, MalformedManifest
from ...formats.agreed.roster import comet_contribution_body
from ...formats.statement import Signer, sign_statement

__all__ = [
    "ATTESTATION",
    "CONTRIBUTION",
    "KINDS",
    "MAX_ROUND",
    "RESULT",
    "VALIDATOR",
    "Attestation",
    "Contribution",
    "Result",
    "RoundTx",
    "ValidatorBinding",
    "attestation_tx",
    "contribution_tx",
    "decode_binding",
    "decode_body",
    "result_tx",
    "roster_digest",
    "validator_binding",
]

CONTRIBUTION: Final = "comet/contribution"
ATTESTATION: Final = "comet/attestation"
RESULT: Final = "comet/result"
VALIDATOR: Final = "comet/validator"
KINDS: Final = (CONTRIBUTION, ATTESTATION, RESULT)
"""The statement kinds of the round machine."""
MAX_ROUND: Final = 2**40
"""Largest round number accepted (bounds the integers a body may carry)."""
_MAX_WEIGHT: Final = 2**53
_MAX_TEXT: Final = 256
_DIGEST_BYTES: Final = 32
_BINDING_FIELDS: Final = {"session", "chain_id", "pub_key", "round"}


@dataclass(frozen=True)
class Contribution:
    """``comet/contribution``: ``peer``'s gradient ``cid`` of weight ``weight`` on ``base``."""

    session: str
    round: int
    cid: str
    weight: int
    base: str
    signature: bytes = b""
    """The transaction's signature (set by the machine; what the roster entry carries)."""


@dataclass(frozen=True)
class Attestation:
    """``comet/attestation``: the author holds and verified ``peer``'s ``cid`` of ``round``."""

    session: str
    round: int
    peer: str
    cid: str


@dataclass(frozen=True)
class Result:
    """``comet/result``: the author's record CID of ``round`` and the model CID it names."""

    session: str
    round: int
    record: str
    model: str
    roster: bytes = b""
    """:func:`roster_digest` of the roster the result aggregated (``b""``: not named; then it
    is only taken after the close)."""


@dataclass(frozen=True)
class ValidatorBinding:
    """``comet/validator``: the author's validator key (raw Ed25519) on chain ``chain_id``."""

    session: str
    chain_id: str
    pub_key: bytes
    round: int
    """The round of the join it goes with (0 in the genesis)."""


RoundTx = Contribution | Attestation | Result


def _text(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not 1 <= len(value) <= _MAX_TEXT:
        raise MalformedManifest(f"field {key!r} must be a string of 1..{_MAX_TEXT} characters")
    return value


def _cid(body: dict[str, Any], key: str) -> str:
    return str(parse_cid(_text(body, key)))


def _int(body: dict[str, Any], key: str, low: int, high: int) -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise MalformedManifest(f"field {key!r} must be an integer in [{low}, {high}]")
    return value


_FIELDS: Final = {
    CONTRIBUTION: {"session", "round", "cid", "weight", "base"},
    ATTESTATION: {"session", "round", "peer", "cid"},
    RESULT: {"session", "round", "record", "model"},
}
_OPTIONAL: Final = {RESULT: {"roster"}}


def roster_digest(lines: Iterable[tuple[str, str, int]]) -> bytes:
    """SHA-256 of dag-cbor ``[[peer, cid, weight], ...]``: a roster's lines in roster order.

    What a ``comet/result`` names, so it can be sent before the chain decides that roster.
    """
    return hashlib.sha256(dag_cbor.encode([[p, c, w] for p, c, w in lines])).digest()


def decode_body(kind: str, body: bytes) -> RoundTx:
    """Decode and check the body of a statement of ``kind`` (one of :data:`KINDS`).

    Raises
    ------
    MalformedManifest
        If ``kind`` is unknown, the body is not a dag-cbor map of exactly its fields, or a
        field has the wrong type or is out of bounds (CIDs must parse).
    """
    fields = _FIELDS.get(kind)
    if fields is None:
        raise MalformedManifest(f"unknown transaction kind {kind!r}")
    try:
        decoded = dag_cbor.decode(body)
    except Exception as exc:  # dag_cbor raises several unrelated types on bad input
        raise MalformedManifest(f"{kind} body is not dag-cbor: {exc}") from exc
    if not isinstance(decoded, dict) or not fields <= set(decoded) <= fields | _OPTIONAL.get(
        kind, set()
    ):
        raise MalformedManifest(f"{kind} body must be a map of {sorted(fields)}")
    try:
        return _build(kind, decoded)
    except DecodeError as exc:
        raise MalformedManifest(f"{kind}: {exc}") from exc


def _build(kind: str, body: dict[str, Any]) -> RoundTx:
    session, number = _text(body, "session"), _int(body, "round", 0, MAX_ROUND)
    if kind == CONTRIBUTION:
        weight = _int(body, "weight", 1, _MAX_WEIGHT)
        return Contribution(session, number, _cid(body, "cid"), weight, _cid(body, "base"))
    if kind == ATTESTATION:
        return Attestation(session, number, _text(body, "peer"), _cid(body, "cid"))
    roster = body.get("roster", b"")
    if not isinstance(roster, bytes) or len(roster) != _DIGEST_BYTES * ("roster" in body):
        raise MalformedManifest(f"field 'roster' must be {_DIGEST_BYTES} bytes")
    return Result(session, number, _cid(body, "record"), _cid(body, "model"), roster)


async def _sign(signer: Signer, kind: str, body: dict[str, Any]) -> bytes:
    statement = await sign_statement(signer, kind, dag_cbor.encode(body))
    return statement.block.data


async def contribution_tx(
    signer: Signer, session: str, round_number: int, cid: CIDLike, weight: int, base: CIDLike
) -> bytes:
    """Return the signed ``comet/contribution`` transaction of ``signer``."""
    body = comet_contribution_body(session, round_number, parse_cid(cid), weight, parse_cid(base))
    return (await sign_statement(signer, CONTRIBUTION, body)).block.data


async def attestation_tx(
    signer: Signer, session: str, round_number: int, peer: str, cid: CIDLike
) -> bytes:
    """Return ``signer``'s signed ``comet/attestation`` of ``peer``'s contribution ``cid``."""
    body = {"session": session, "round": round_number, "peer": peer, "cid": str(parse_cid(cid))}
    return await _sign(signer, ATTESTATION, body)


async def result_tx(
    signer: Signer,
    session: str,
    round_number: int,
    record: CIDLike,
    model: CIDLike,
    roster: bytes = b"",
) -> bytes:
    """Return ``signer``'s signed ``comet/result`` (its record and model CIDs of the round).

    ``roster``: the :func:`roster_digest` of the roster aggregated, so the chain may take the
    result before it decides that roster (``b""``: after the close only).
    """
    body: dict[str, Any] = {"session": session, "round": round_number}
    body |= {"record": str(parse_cid(record)), "model": str(parse_cid(model))}
    if roster:
        body["roster"] = bytes(roster)
    return await _sign(signer, RESULT, body)


def decode_binding(body: bytes) -> ValidatorBinding:
    """Decode and check the body of a ``comet/validator`` statement.

    Raises
    ------
    MalformedManifest
        If it is not a map of ``session``, ``chain_id``, a 32-byte ``pub_key`` and a ``round``
        in ``[0, MAX_ROUND]``.
    """
    try:
        decoded = dag_cbor.decode(body)
    except Exception as exc:  # dag_cbor raises several unrelated types on bad input
        raise MalformedManifest(f"{VALIDATOR} body is not dag-cbor: {exc}") from exc
    if not isinstance(decoded, dict) or set(decoded) != _BINDING_FIELDS:
        raise MalformedManifest(f"{VALIDATOR} body must be a map of {sorted(_BINDING_FIELDS)}")
    key = decoded["pub_key"]
    if not isinstance(key, bytes) or len(key) != 32:
        raise MalformedManifest(f"{VALIDATOR}: pub_key must be 32 bytes (Ed25519)")
    try:
        number = _int(decoded, "round", 0, MAX_ROUND)
        return ValidatorBinding(_text(decoded, "session"), _text(decoded, "chain_id"), key, number)
    except MalformedManifest as exc:
        raise MalformedManifest(f"{VALIDATOR}: {exc}") from exc


async def validator_binding(
    signer: Signer, session: str, chain_id: str, pub_key: bytes, round_number: int
) -> bytes:
    """Return ``signer``'s signed ``comet/validator`` statement binding its validator's key.

    ``round_number`` is the round of the join the binding goes with (0 for a genesis member).
    """
    body = {"session": session, "chain_id": chain_id, "pub_key": bytes(pub_key),
            "round": round_number}  # fmt: skip
    return await _sign(signer, VALIDATOR, body)
