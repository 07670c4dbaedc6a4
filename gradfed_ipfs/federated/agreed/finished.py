"""A late peer re-verifies a reduce-scatter round the others finished, from its record.

It hears none of the round's slice messages any more, so it re-aggregates the round from the
record (:func:`~.agreed_history.verify_record`: every contribution fetched whole) and checks
its fraud records (:func:`~.agreed_slicing.proven_liars`) instead.
"""

from __future__ import annotations

from typing import NamedTuple

from multiformats import CID

from ..._types import CIDLike, FloatArray
from ...cid import parse_cid
from ...errors import BlockStoreError, DecodeError, RoundVerificationFailed
from ...formats.agreed.roster import AgreedRecord, Roster
from ...formats.sliced.slices import FraudRecord
from ...storage.base import BlockStore
from .config import UpdateRule
from .history import ModelState, load_record, verify_record
from .slicing import proven_liars

__all__ = ["FinishedRound", "check_finished_round"]


class FinishedRound(NamedTuple):
    """Another peer's record of a sliced round, re-verified by :func:`check_finished_round`."""

    record: AgreedRecord
    model: FloatArray
    """The recomputed model (float32, ``(d,)``); it hashes to ``record.result``."""
    missing: tuple[str, ...]
    """Roster peers the slice records leave out."""
    liars: frozenset[str]
    """Reducers the record's fraud records prove lying."""
    records: tuple[CID, ...]
    """Its slice and fraud records and the lies these name (what a keeper pins alone)."""


async def check_finished_round(
    store: BlockStore,
    record_cid: CIDLike,
    roster: Roster,
    roster_cid: CID,
    *,
    prev: CID | None,
    rule: UpdateRule | None = None,
    base: ModelState | None = None,
    encoding: str | None = None,
) -> FinishedRound:
    """Re-verify a peer's record of a sliced round of ``roster`` that follows ``prev``.

    For a peer that joins a reduce-scatter round the others have finished: it hears none of
    the round's slice messages any more, so it re-aggregates the round from the record (every
    contribution fetched whole, as :func:`verify_agreed_round`) and checks its fraud records
    (:func:`~.agreed_slicing.proven_liars`) instead. ``base`` is the round's base model and
    rule state when the caller holds them (else loaded; rebuilt if it was not stored).
    ``encoding`` is the session's contribution encoding (``AgreedConfig.packing`` label,
    ``None``: dense): a record naming another is refused.

    Raises
    ------
    RoundVerificationFailed
        If the record is not a sliced record of ``roster_cid`` after ``prev`` (same session,
        genesis, round and base), or does not verify.
    """
    cid = parse_cid(record_cid)
    try:
        record = await load_record(store, cid)
    except (BlockStoreError, DecodeError) as exc:
        raise RoundVerificationFailed(f"record {cid}: {exc}") from exc
    if (
        record.slices is None
        or (record.session, record.round) != (roster.session, roster.round)
        or bytes(record.genesis) != bytes(roster.genesis)
        or bytes(record.base) != bytes(roster.base)
        or bytes(record.roster) != bytes(roster_cid)
        or (None if record.prev is None else bytes(record.prev))
        != (None if prev is None else bytes(prev))
        or record.encoding != encoding
    ):
        raise RoundVerificationFailed(
            f"record {cid} is not a sliced record of roster {roster_cid} after {prev} "
            f"(contributions {encoding or 'dense'})"
        )
    used, model, _ = await verify_record(store, record, rule, base)
    liars = await proven_liars(store, record, roster)
    records = [*record.slices, *(record.frauds or ())]
    try:  # proven_liars fetched them: local now
        for fraud in record.frauds or ():
            records.append(FraudRecord.from_block(await store.get(fraud)).claimed)
    except (BlockStoreError, DecodeError) as exc:
        raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
    missing = tuple(p for p in roster.peers if p not in used.peer_set)
    return FinishedRound(record, model, missing, liars, tuple(records))
