"""``verify``: re-verify any round record from its CID; the check follows the record's type.

A round record is one of three dag-cbor records: a best-effort round's
:class:`~gradfed_ipfs.provenance.RoundRecord`, an agreed round's
:class:`~gradfed_ipfs.formats.agreed.roster.AgreedRecord` or a regional round's
:class:`~gradfed_ipfs.formats.regional.RegionalRecord`. :func:`verify` reads the block, picks
the check of its type (:func:`~gradfed_ipfs.provenance.verify_round`,
:func:`~gradfed_ipfs.federated.agreed.verify_agreed_round`,
:func:`~gradfed_ipfs.federated.regional.verify_regional_round`) and raises when it fails::

    verified = await verify(record_cid, store)
    print(verified.kind, verified.round)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ._types import CIDLike
from .cid import DAG_CBOR, parse_cid
from .errors import DecodeError, NotARoundRecord, RoundVerificationFailed
from .federated.agreed import UpdateRule, verify_agreed_round
from .federated.regional import verify_regional_round
from .formats.agreed.roster import AgreedRecord
from .formats.records import decode_record
from .formats.regional import RegionalRecord
from .formats.statement import PEER_ID_KEYS, KeyBook
from .provenance.round_record import ROUND_RECORD_TYPE, verify_round
from .storage.base import BlockStore

__all__ = ["RecordKind", "Verified", "record_kind", "verify"]

RecordKind = Literal["round", "agreed", "regional"]
"""A best-effort round record, an agreed round record, or a regional round's top record."""


@dataclass(frozen=True)
class Verified:
    """A round record that re-verified: its kind and its round number."""

    kind: RecordKind
    round: int


async def record_kind(store: BlockStore, record_cid: CIDLike) -> RecordKind:
    """Return which kind of round record ``record_cid`` names.

    Raises
    ------
    NotARoundRecord
        If it names something else (a gradient, a roster, another record).
    BlockStoreError
        If the block cannot be fetched.
    """
    cid = parse_cid(record_cid)
    block = await store.get(cid)
    if block.cid.codec.code != DAG_CBOR:
        raise NotARoundRecord(f"{cid} is not a round record (a {block.cid.codec.name} block)")
    readers = (
        ("round", lambda: decode_record(block, ROUND_RECORD_TYPE)),
        ("agreed", lambda: AgreedRecord.from_block(block)),
        ("regional", lambda: RegionalRecord.from_block(block)),
    )
    for kind, read in readers:
        try:
            read()
        except DecodeError:
            continue
        return kind  # type: ignore[return-value]
    raise NotARoundRecord(
        f"{cid} is not a round record (neither a {ROUND_RECORD_TYPE}, an agreed-round nor a "
        "regional-round v2 dag-cbor record)"
    )


async def verify(
    record_cid: CIDLike,
    store: BlockStore,
    *,
    rule: UpdateRule | None = None,
    keys: KeyBook = PEER_ID_KEYS,
) -> Verified:
    """Re-verify the round record ``record_cid`` names, with the check of its type.

    Parameters
    ----------
    record_cid
        The record's CID.
    store
        Where the record, its roster, contributions and models are fetched.
    rule
        An agreed round's custom update rule, when it has one.
    keys
        Where signers' keys are found (a regional round's votes; memory-bus sessions pass
        ``bus.keys``).

    Raises
    ------
    RoundVerificationFailed
        If the round does not re-verify, or cannot be checked (an input is gone, a DP claim).
    NotARoundRecord
        If the CID names no round record.
    BlockStoreError
        If the record itself cannot be fetched.
    """
    kind = await record_kind(store, record_cid)
    if kind == "agreed":
        return Verified(kind, (await verify_agreed_round(store, record_cid, rule)).round)
    if kind == "regional":
        return Verified(kind, (await verify_regional_round(store, record_cid, keys=keys)).round)
    checked = await verify_round(record_cid, store)
    if not checked.ok:
        raise RoundVerificationFailed(f"round {checked.round}: {checked.status}")
    return Verified(kind, checked.round)
