"""Agreed-round history: load the record chain and re-verify rounds from CIDs alone.

A third party holding only the last round record's CID can walk ``prev`` links back to the
session's first round, check that each round starts from the previous one's result (the first
from the genesis model), and re-aggregate each roster with
:func:`~gradfed_ipfs.tensor.deterministic.deterministic_update`: the result must hash to the
recorded model CID, bit for bit. A reduce-scatter round's record also links its slice
records: they must fit the roster (:func:`~.agreed_slicing.sliced_roster`; senders they list
``missing`` are left out of the recomputation) and each slice result must be its range of the
recomputed model (:func:`~.agreed_slicing.check_slice_results`).

Lying reducers proven in a round (its fraud records) are excluded for the rest of the session:
:func:`check_exclusions` checks that each record's ``excluded`` is its predecessor's plus the
reducers its fraud records prove (:func:`~.agreed_slicing.proven_liars`), and that no roster
lists a peer excluded before its round. It needs only records, rosters, fraud and slice records
(all kept under retention), so it runs with or without ``recompute``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Final, NamedTuple

import numpy as np
from multiformats import CID

from ..._types import CIDLike, FloatArray
from ...cid import parse_cid
from ...errors import (
    BlockStoreError,
    DecodeError,
    GenesisMismatch,
    RoundVerificationFailed,
    ShapeMismatch,
)
from ...formats.roster import AgreedRecord, Roster
from ...formats.slices import FraudRecord
from ...storage.base import BlockStore
from ...storage.dag import fetch_gradient
from ...tensor.deterministic import deterministic_update
from .agreed_config import UpdateRule
from .agreed_slicing import check_slice_results, proven_liars, sliced_roster
from .chain_proof import check_partial_frauds
from .encoded import encode_gradient

__all__ = [
    "MAX_CHAIN_ROUNDS",
    "FinishedRound",
    "check_exclusions",
    "check_finished_round",
    "load_chain",
    "load_head",
    "load_record",
    "load_round_inputs",
    "load_roster",
    "model_cid",
    "recompute_round",
    "verify_agreed_history",
    "verify_agreed_round",
]

MAX_CHAIN_ROUNDS: Final = 100_000
"""Most records one chain walk follows."""


async def load_record(
    store: BlockStore, cid: CIDLike, *, timeout: float | None = None
) -> AgreedRecord:
    """Fetch and decode a round record (``MalformedManifest`` if it is not one)."""
    block = await (store.get(cid) if timeout is None else store.get(cid, timeout=timeout))
    return AgreedRecord.from_block(block)


async def load_roster(store: BlockStore, cid: CIDLike, *, timeout: float | None = None) -> Roster:
    """Fetch and decode a roster (``MalformedManifest`` if it is not one)."""
    block = await (store.get(cid) if timeout is None else store.get(cid, timeout=timeout))
    return Roster.from_block(block)


async def model_cid(model: FloatArray) -> CID:
    """Return the CID ``put_gradient`` gives a model, computed without a daemon."""
    return (await encode_gradient(model)).cid


async def load_chain(
    store: BlockStore,
    head: CIDLike,
    *,
    session: str,
    genesis: CID,
    stop_at: Collection[bytes] = (),
    max_rounds: int = MAX_CHAIN_ROUNDS,
) -> list[tuple[CID, AgreedRecord]]:
    """Walk ``prev`` links from ``head`` and return ``(cid, record)`` pairs, oldest first.

    The walk stops after a record whose ``prev`` is in ``stop_at`` (CID bytes) or is ``None``.

    Raises
    ------
    GenesisMismatch
        If a record names another session or genesis.
    RoundVerificationFailed
        If rounds do not count down by one, a record's base is not its predecessor's result,
        the first round does not start from the genesis, or the chain is longer than
        ``max_rounds``.
    """
    chain: list[tuple[CID, AgreedRecord]] = []
    start = parse_cid(head)
    cid: CID | None = start
    while cid is not None:
        if len(chain) >= max_rounds:
            raise RoundVerificationFailed(f"chain from {start} is longer than {max_rounds} rounds")
        record = await load_record(store, cid)
        if record.session != session or bytes(record.genesis) != bytes(genesis):
            raise GenesisMismatch(
                f"record {cid} belongs to {record.session}/{record.genesis}, "
                f"not {session}/{genesis}"
            )
        if chain:
            later = chain[-1][1]
            if record.round != later.round - 1 or bytes(record.result) != bytes(later.base):
                raise RoundVerificationFailed(
                    f"record {chain[-1][0]} (round {later.round}) does not follow {cid}"
                )
        chain.append((cid, record))
        if record.prev is None or bytes(record.prev) in stop_at:
            break
        cid = record.prev
    oldest = chain[-1][1]
    if oldest.prev is None and (oldest.round != 0 or bytes(oldest.base) != bytes(genesis)):
        raise RoundVerificationFailed(f"the first record of {start} does not start at the genesis")
    chain.reverse()
    return chain


async def load_head(
    store: BlockStore,
    head: CID,
    *,
    session: str,
    genesis: CID,
    history: Collection[bytes],
    length: int,
    timeout: float,
) -> tuple[list[tuple[CID, AgreedRecord]], FloatArray]:
    """Load the records from ``head`` back to one in ``history`` (or the genesis), and its model.

    Raises
    ------
    GenesisMismatch
        If the chain does not extend ``history`` (nor start at the genesis).
    RoundVerificationFailed
        See :func:`load_chain`.
    """
    chain = await load_chain(store, head, session=session, genesis=genesis, stop_at=history)
    first = chain[0][1]
    if first.prev is not None and bytes(first.prev) not in history:
        raise GenesisMismatch(f"head {head} does not extend this peer's history")
    model = await fetch_gradient(
        store, chain[-1][1].result, timeout=timeout, expected_length=length
    )
    return chain, np.array(model, np.float32).reshape(-1)


async def check_exclusions(
    store: BlockStore, chain: list[tuple[CID, AgreedRecord]]
) -> frozenset[str]:
    """Check the proven liars along ``chain`` (oldest first); return its last record's.

    The first record's predecessor (when there is one) gives the liars known before it.

    Raises
    ------
    RoundVerificationFailed
        If a roster lists a peer excluded before its round, a fraud record proves nothing
        (:func:`~.agreed_slicing.proven_liars`), a record's ``excluded`` is not its
        predecessor's plus its own proven liars, or a block cannot be fetched or decoded.
    """
    before: frozenset[str] = frozenset()
    try:
        first = chain[0][1] if chain else None
        if first is not None and first.prev is not None:
            before = frozenset((await load_record(store, first.prev)).excluded or ())
        for cid, record in chain:
            liars: frozenset[str] = frozenset()
            if before or record.frauds:
                roster = await load_roster(store, record.roster)
                listed = before & set(roster.peers)
                if listed:
                    raise RoundVerificationFailed(
                        f"round {record.round}: roster {record.roster} lists proven lying "
                        f"reducer(s) {', '.join(sorted(listed))}"
                    )
                liars = await proven_liars(store, record, roster)
            after = before | liars
            if tuple(sorted(after)) != (record.excluded or ()):
                raise RoundVerificationFailed(
                    f"round {record.round}: record {cid} excludes {list(record.excluded or ())}, "
                    f"its history proves {sorted(after)}"
                )
            before = after
    except (BlockStoreError, DecodeError) as exc:
        raise RoundVerificationFailed(f"exclusions: {exc}") from exc
    return before


async def load_round_inputs(
    store: BlockStore, record: AgreedRecord
) -> tuple[Roster, FloatArray, list[FloatArray]]:
    """Fetch a record's roster, base model and every listed contribution, each hash-checked.

    Returns
    -------
    tuple
        The roster, the base model (float32, ``(d,)``) and the contributions in roster order.

    Raises
    ------
    RoundVerificationFailed
        If the roster does not belong to the record, or a block cannot be fetched or decoded
        (or has another length than the base model).
    """
    try:
        roster = await load_roster(store, record.roster)
        if (
            roster.round != record.round
            or roster.session != record.session
            or bytes(roster.base) != bytes(record.base)
            or bytes(roster.genesis) != bytes(record.genesis)
        ):
            raise RoundVerificationFailed(f"roster {record.roster} is not round {record.round}'s")
        if record.slices is not None:
            roster = await sliced_roster(store, record, roster)
        model = await fetch_gradient(store, record.base)
        gradients = await asyncio.gather(
            *(
                fetch_gradient(store, entry.contribution, expected_length=model.size)
                for entry in roster.entries
            )
        )  # concurrently: one after another, N fetches cost N bitswap round trips
    except (BlockStoreError, DecodeError, ShapeMismatch) as exc:
        raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
    return roster, np.asarray(model, np.float32).reshape(-1), list(gradients)


async def recompute_round(
    store: BlockStore, record: AgreedRecord, rule: UpdateRule | None = None
) -> tuple[Roster, FloatArray]:
    """Re-aggregate a record's roster on its base model; return the roster and the new model.

    A record written with a custom update rule (``record.rule``) needs that ``rule``; it is
    applied from the previous record's state, and its new state must hash to ``record.state``.

    Raises
    ------
    RoundVerificationFailed
        If the roster does not belong to the record, a block cannot be fetched or decoded, or
        the record names a rule and none is given.
    """
    if record.rule is not None and rule is None:
        raise RoundVerificationFailed(f"round {record.round} used rule {record.rule!r}: pass it")
    roster, model, gradients = await load_round_inputs(store, record)
    if rule is not None and record.rule is not None:
        try:
            prev = None if record.prev is None else await load_record(store, record.prev)
            state = None
            if prev is not None and prev.state is not None:
                state = await fetch_gradient(store, prev.state)
        except (BlockStoreError, DecodeError) as exc:
            raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
        new, new_state = rule.apply(model, roster, gradients, record.learning_rate, state)
        if (None if new_state is None else bytes(await model_cid(new_state))) != (
            None if record.state is None else bytes(record.state)
        ):
            raise RoundVerificationFailed(f"round {record.round}: the rule state does not match")
        return roster, np.ascontiguousarray(new, np.float32).reshape(-1)
    weights = [entry.weight for entry in roster.entries]
    return roster, deterministic_update(model, gradients, weights, record.learning_rate)


async def verify_agreed_round(
    store: BlockStore, record_cid: CIDLike, rule: UpdateRule | None = None
) -> AgreedRecord:
    """Re-aggregate one round from its record CID and check the result (and rule state) CIDs.

    Raises
    ------
    RoundVerificationFailed
        If anything is missing, malformed, or the recomputed model hashes to another CID.
    """
    cid = parse_cid(record_cid)
    try:
        record = await load_record(store, cid)
    except (BlockStoreError, DecodeError) as exc:
        raise RoundVerificationFailed(f"record {cid}: {exc}") from exc
    await _verified_model(store, record, rule)
    return record


async def _verified_model(
    store: BlockStore, record: AgreedRecord, rule: UpdateRule | None
) -> tuple[Roster, FloatArray]:
    """Recompute a record's model, check its CID and slice results; return roster and model."""
    roster, model = await recompute_round(store, record, rule)
    recomputed = await model_cid(model)
    if bytes(recomputed) != bytes(record.result):
        raise RoundVerificationFailed(
            f"round {record.round}: roster re-aggregates to {recomputed}, "
            f"record says {record.result}"
        )
    if record.slices is not None:
        await check_slice_results(store, record, model)
    if record.frauds:
        try:
            full = await load_roster(store, record.roster)
        except (BlockStoreError, DecodeError) as exc:
            raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
        await check_partial_frauds(store, record.frauds, full, model.size)
    return roster, model


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
) -> FinishedRound:
    """Re-verify a peer's record of a sliced round of ``roster`` that follows ``prev``.

    For a peer that joins a reduce-scatter round the others have finished: it hears none of
    the round's slice messages any more, so it re-aggregates the round from the record (every
    contribution fetched whole, as :func:`verify_agreed_round`) and checks its fraud records
    (:func:`~.agreed_slicing.proven_liars`) instead.

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
    ):
        raise RoundVerificationFailed(
            f"record {cid} is not a sliced record of roster {roster_cid} after {prev}"
        )
    used, model = await _verified_model(store, record, rule)
    liars = await proven_liars(store, record, roster)
    records = [*record.slices, *(record.frauds or ())]
    try:  # proven_liars fetched them: local now
        for fraud in record.frauds or ():
            records.append(FraudRecord.from_block(await store.get(fraud)).claimed)
    except (BlockStoreError, DecodeError) as exc:
        raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
    missing = tuple(p for p in roster.peers if p not in set(used.peers))
    return FinishedRound(record, model, missing, liars, tuple(records))


async def verify_agreed_history(
    store: BlockStore,
    head: CIDLike,
    *,
    session: str,
    genesis: CIDLike,
    recompute: bool = True,
    max_rounds: int = MAX_CHAIN_ROUNDS,
    rule: UpdateRule | None = None,
) -> list[AgreedRecord]:
    """Verify the chain ending at ``head``: links, genesis, exclusions, (by default) every result.

    Without ``recompute`` a sliced round's slice records are still checked against its roster
    (:func:`~.agreed_slicing.sliced_roster`): records, rosters, slice and fraud records are what
    retention keeps forever.

    Returns
    -------
    list of AgreedRecord
        The verified records, oldest first.

    Raises
    ------
    RoundVerificationFailed, GenesisMismatch
        See :func:`load_chain`, :func:`check_exclusions` and :func:`verify_agreed_round`.
    """
    start = parse_cid(head)
    try:
        chain = await load_chain(
            store, start, session=session, genesis=parse_cid(genesis), max_rounds=max_rounds
        )
    except (BlockStoreError, DecodeError) as exc:
        raise RoundVerificationFailed(f"chain from {start}: {exc}") from exc
    await check_exclusions(store, chain)
    if recompute:
        for cid, _ in chain:
            await verify_agreed_round(store, cid, rule)
        return [record for _, record in chain]
    for _, record in chain:  # kept under retention: the slice records still fit their rosters
        if record.slices is not None:
            try:
                roster = await load_roster(store, record.roster)
            except (BlockStoreError, DecodeError) as exc:
                raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
            await sliced_roster(store, record, roster)
    return [record for _, record in chain]
