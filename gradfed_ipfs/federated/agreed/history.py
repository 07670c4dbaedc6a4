"""Agreed-round history: load the record chain and re-verify rounds from CIDs alone.

A third party holding only the last round record's CID can walk ``prev`` links back to the
session's first round, check that each round starts from the previous one's result (the first
from the genesis model), and re-aggregate each roster with
:func:`~gradfed_ipfs.tensor.deterministic.deterministic_update`: the result must hash to the
recorded model CID, bit for bit. A reduce-scatter round's record also links its slice
records: they must fit the roster (:func:`~.agreed_slicing.sliced_roster`; senders they list
``missing`` are left out of the recomputation) and each slice result must be its range of the
recomputed model (:func:`~.agreed_slicing.check_slice_results`).

Holders store only every ``model_every``-th model (``AgreedRecord.model_stored``): a base or
result that was not stored is rebuilt by :func:`load_result`, from the newest stored model
before it by re-aggregating the rounds since (each checked against its record); a verifier
walking the whole chain carries each recomputed model into the next round instead.

Lying reducers proven in a round (its fraud records) are excluded for the rest of the session:
:func:`check_exclusions` checks that each record's ``excluded`` is its predecessor's plus the
reducers its fraud records prove (:func:`~.agreed_slicing.proven_liars`), and that no roster
lists a peer excluded before its round. It needs only records, rosters, fraud and slice records
(all kept under retention), so it runs with or without ``recompute``.

Every roster entry must carry its owner's signature of the contribution it lists
(:func:`check_roster_signatures`, offline: the authors' keys are their peer IDs, or a
memory bus's ``bus.keys``), with or without ``recompute``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Final

import numpy as np
from multiformats import CID

from ..._types import CIDLike, FloatArray
from ...cid import parse_cid
from ...errors import (
    BlockStoreError,
    ChainDeadlineExceeded,
    DecodeError,
    GenesisMismatch,
    RoundVerificationFailed,
    ShapeMismatch,
)
from ...formats.agreed.membership import MemberSet
from ...formats.agreed.roster import (
    AgreedRecord,
    Roster,
    verify_roster_coordinator,
    verify_roster_entries,
)
from ...formats.statement import PEER_ID_KEYS, KeyBook
from ...storage.base import UNSET, BlockStore, Unset
from ...storage.dag import fetch_gradient
from ...tensor.deterministic import (
    finish_update,
    partial_update,
    update_coefficients,
)
from ..exchange.encoded import encode_gradient
from ..sliced.proofs import check_partial_frauds
from .config import UpdateRule
from .membership import Admission, moved_after, roster_member_set_problem
from .slicing import check_slice_results, proven_liars, sliced_roster

__all__ = [
    "MAX_CHAIN_ROUNDS",
    "MAX_REBUILD_ROUNDS",
    "MemberState",
    "ModelState",
    "ResultLoad",
    "VerifiedHead",
    "check_exclusions",
    "check_member_sets",
    "check_roster_signatures",
    "load_chain",
    "load_head",
    "load_record",
    "load_result",
    "load_round_inputs",
    "load_roster",
    "member_states",
    "model_cid",
    "recompute_round",
    "verify_agreed_history",
    "verify_agreed_round",
    "verify_head",
    "verify_record",
    "verify_rounds",
]

MAX_CHAIN_ROUNDS: Final = 100_000
"""Most records one chain walk follows."""

MAX_REBUILD_ROUNDS: Final = 1_000
"""Most rounds :func:`load_result` re-aggregates to rebuild a model that was not stored."""

ModelState = tuple[FloatArray, FloatArray | None]
"""A model (float32, ``(d,)``) and its update rule's state (``None`` without a rule)."""


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


def _follows(earlier: AgreedRecord, later: AgreedRecord) -> bool:
    """Whether ``later`` is the next round and starts from ``earlier``'s result."""
    return later.round == earlier.round + 1 and bytes(later.base) == bytes(earlier.result)


async def load_chain(
    store: BlockStore,
    head: CIDLike,
    *,
    session: str,
    genesis: CID,
    stop_at: Collection[bytes] = (),
    max_rounds: int = MAX_CHAIN_ROUNDS,
    deadline: float | None = None,
) -> list[tuple[CID, AgreedRecord]]:
    """Walk ``prev`` links from ``head`` and return ``(cid, record)`` pairs, oldest first.

    The walk stops after a record whose ``prev`` is in ``stop_at`` (CID bytes) or is ``None``.
    ``deadline`` (seconds, ``None`` for none) bounds the whole walk, a fetch in flight included:
    a forged chain of ``max_rounds`` records cannot keep a verifier busy for longer.

    Raises
    ------
    GenesisMismatch
        If a record names another session or genesis.
    RoundVerificationFailed
        If rounds do not count down by one, a record's base is not its predecessor's result,
        the first round does not start from the genesis, or the chain is longer than
        ``max_rounds``.
    ChainDeadlineExceeded
        If the walk has not ended after ``deadline`` seconds (the message says how far it got).
    """
    chain: list[tuple[CID, AgreedRecord]] = []
    start = parse_cid(head)
    scope = asyncio.timeout(deadline)
    try:
        async with scope:
            await _walk(store, start, chain, session, genesis, stop_at, max_rounds)
    except TimeoutError:
        if deadline is None or not scope.expired():
            raise  # a fetch's own timeout (BlockTimeout), not the walk's deadline
        reached = f" (back to round {chain[-1][1].round})" if chain else ""
        raise ChainDeadlineExceeded(
            f"the walk of the chain from {start} passed its {deadline:g}s deadline after "
            f"{len(chain)} records{reached}",
            deadline=deadline,
            records=len(chain),
        ) from None
    oldest = chain[-1][1]
    if oldest.prev is None and (oldest.round != 0 or bytes(oldest.base) != bytes(genesis)):
        raise RoundVerificationFailed(f"the first record of {start} does not start at the genesis")
    chain.reverse()
    return chain


async def _walk(
    store: BlockStore,
    start: CID,
    chain: list[tuple[CID, AgreedRecord]],
    session: str,
    genesis: CID,
    stop_at: Collection[bytes],
    max_rounds: int,
) -> None:
    """:func:`load_chain`'s walk: append ``(cid, record)`` to ``chain``, newest first."""
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
            if not _follows(record, later):
                raise RoundVerificationFailed(
                    f"record {chain[-1][0]} (round {later.round}) does not follow {cid}"
                )
        chain.append((cid, record))
        if record.prev is None or bytes(record.prev) in stop_at:
            break
        cid = record.prev


@dataclass(frozen=True)
class ResultLoad:
    """How :func:`load_head` gets the head's model and rule state (see :func:`load_result`).

    ``length`` values, each fetch waiting ``timeout`` s; rebuilt with ``rule`` from ``known``
    models (or the last stored one) over at most ``max_rebuild`` rounds if not stored.
    """

    length: int
    timeout: float
    rule: UpdateRule | None = None
    known: Mapping[bytes, ModelState] | None = None
    max_rebuild: int = MAX_REBUILD_ROUNDS


async def load_head(
    store: BlockStore,
    head: CID,
    *,
    session: str,
    genesis: CID,
    history: Collection[bytes],
    result: ResultLoad,
    deadline: float | None = None,
) -> tuple[list[tuple[CID, AgreedRecord]], FloatArray, FloatArray | None]:
    """Load the records from ``head`` back to one in ``history`` (or the genesis), and its model.

    The head's model and rule state come from :func:`load_result` (as ``result`` says):
    fetched, or rebuilt if they were not stored. ``deadline`` bounds the walk (see
    :func:`load_chain`).

    Raises
    ------
    GenesisMismatch
        If the chain does not extend ``history`` (nor start at the genesis).
    RoundVerificationFailed
        See :func:`load_chain` and :func:`load_result`.
    ChainDeadlineExceeded
        If the walk passes ``deadline``.
    """
    chain = await load_chain(
        store, head, session=session, genesis=genesis, stop_at=history, deadline=deadline
    )
    first = chain[0][1]
    if first.prev is not None and bytes(first.prev) not in history:
        raise GenesisMismatch(f"head {head} does not extend this peer's history")
    model, state = await load_result(
        store, chain[-1][1], result.rule, timeout=result.timeout, length=result.length,
        known=result.known, max_rounds=result.max_rebuild,
    )  # fmt: skip
    return chain, model, state


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


@dataclass(frozen=True)
class MemberState:
    """A member set as a chain reaches it: the set, its CID, the last rosters (oldest first).

    ``moved``: per peer, the first round of the last set along the chain that added or removed
    it (:func:`~.membership.moved_after`; what a join or leave must not predate).
    """

    members: MemberSet
    cid: CID
    rosters: tuple[Roster, ...] = ()
    moved: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def genesis(cls, session: str, genesis: CID, members: Collection[str]) -> MemberState:
        """Round 0's member set: the session's initial ``members``."""
        first = MemberSet(session, genesis, 0, tuple(sorted(members)))
        return cls(first, first.to_block().cid)


async def check_member_sets(
    store: BlockStore,
    chain: list[tuple[CID, AgreedRecord]],
    start: MemberState,
    admission: Admission,
    *,
    keys: KeyBook = PEER_ID_KEYS,
    timeout: float | None = None,
) -> MemberState:
    """Check each record's member set against its predecessor's along ``chain`` (oldest first).

    ``start`` is the member set (and last rosters) before the chain's first record. Each roster
    must expect that round's members and name the set the requests it carries and the absences
    of the last ``admission.evict_after`` rosters make (:func:`~.membership.
    roster_member_set_problem`); its record must name the same set. Returns the state after the
    last record (:func:`member_states`: the state after each).

    Raises
    ------
    RoundVerificationFailed
        If a member set is not the one its round calls for, or a block cannot be had.
    """
    states = await member_states(store, chain, start, admission, keys=keys, timeout=timeout)
    return states[-1] if states else start


async def member_states(
    store: BlockStore,
    chain: list[tuple[CID, AgreedRecord]],
    start: MemberState,
    admission: Admission,
    *,
    keys: KeyBook = PEER_ID_KEYS,
    timeout: float | None = None,
) -> list[MemberState]:
    """Check ``chain``'s member sets as :func:`check_member_sets`; return the state after each.

    Raises
    ------
    RoundVerificationFailed
        If a member set is not the one its round calls for, or a block cannot be had.
    """
    state, keep, states = start, admission.evict_after or 1, []
    for _, record in chain:
        try:
            roster = await load_roster(store, record.roster, timeout=timeout)
            claimed = None
            if record.members is not None:
                wait = UNSET if timeout is None else timeout
                block = await store.get(record.members, timeout=wait)
                claimed = MemberSet.from_block(block)
        except (BlockStoreError, DecodeError) as exc:
            raise RoundVerificationFailed(f"round {record.round}: member set: {exc}") from exc
        named = None if roster.members is None else bytes(roster.members)
        problem = roster_member_set_problem(
            claimed, state.members, state.cid, roster, state.rosters, admission, keys=keys,
            moved=state.moved,
        )  # fmt: skip
        if named != (None if record.members is None else bytes(record.members)):
            problem = "the record and its roster name different member sets"
        if problem:
            raise RoundVerificationFailed(f"round {record.round}: member set: {problem}")
        rosters = (*state.rosters, roster)[-keep:]
        if claimed is None or record.members is None:
            state = MemberState(state.members, state.cid, rosters, state.moved)
        else:
            state = MemberState(claimed, record.members, rosters, moved_after(state.moved, claimed))
        states.append(state)
    return states


async def check_roster_signatures(
    store: BlockStore, chain: list[tuple[CID, AgreedRecord]], keys: KeyBook = PEER_ID_KEYS
) -> None:
    """Check every roster of ``chain`` lists only its owners' signed contributions.

    And that a roster leaving an expected peer out is its coordinator's: the record carries
    the coordinator's signature of its ``roster`` message
    (:func:`~gradfed_ipfs.formats.agreed.roster.verify_roster_coordinator`), so a member cannot
    rebuild a round with others' signed contributions left out.

    Raises
    ------
    RoundVerificationFailed
        If an entry is unsigned or its signature is not its owner's of that contribution
        (:func:`~gradfed_ipfs.formats.agreed.roster.verify_roster_entries`), the coordinator's
        signature is missing or wrong, or a roster cannot be fetched or decoded.
    """
    for _, record in chain:
        try:
            block = await store.get(record.roster)
            roster = Roster.from_block(block)
            verify_roster_entries(roster, keys)
            verify_roster_coordinator(roster, block, record.roster_signature, keys)
        except (BlockStoreError, DecodeError) as exc:
            raise RoundVerificationFailed(
                f"round {record.round}: roster {record.roster}: {exc}"
            ) from exc


async def load_round_inputs(
    store: BlockStore,
    record: AgreedRecord,
    *,
    base: FloatArray | None = None,
    rule: UpdateRule | None = None,
) -> tuple[Roster, FloatArray, list[FloatArray]]:
    """Fetch a record's roster, base model and every listed contribution, each hash-checked.

    ``base`` is the record's base model when the caller holds it; else it is loaded
    (:func:`load_result` of the previous record, with ``rule`` if one must be rebuilt).

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
    if base is None:
        base = (await _base_of(store, record, rule))[0]
    model = np.asarray(base, np.float32).reshape(-1)
    roster = await _round_roster(store, record)
    try:
        gradients = await asyncio.gather(
            *(
                fetch_gradient(
                    store, entry.contribution, expected_length=model.size, packing=record.packing
                )
                for entry in roster.entries
            )
        )  # concurrently: one after another, N fetches cost N bitswap round trips
    except (BlockStoreError, DecodeError, ShapeMismatch) as exc:
        raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
    return roster, model, list(gradients)


async def _round_roster(store: BlockStore, record: AgreedRecord) -> Roster:
    """Return the roster ``record`` aggregated: its own, less a sliced round's missing senders."""
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
    except (BlockStoreError, DecodeError, ShapeMismatch) as exc:
        raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
    return roster


STREAM_WINDOW: Final = 16
"""Contributions a fedavg recompute fetches ahead (:func:`_streamed_update`): its memory is
this many gradients, not the roster's N (a thousand members at d = 1M: 64 MB, not 4 GB)."""


async def _streamed_update(
    store: BlockStore, record: AgreedRecord, roster: Roster, model: FloatArray
) -> FloatArray:
    """Return ``deterministic_update`` of ``roster`` on ``model``, bit for bit, streamed.

    The contributions are folded into a float64 partial sum in roster order as they arrive
    (:func:`~gradfed_ipfs.tensor.deterministic.partial_update`), at most
    :data:`STREAM_WINDOW` held at once.

    Raises
    ------
    RoundVerificationFailed
        If a contribution cannot be fetched or decoded, or has another length than ``model``.
    """
    entries = roster.entries
    coefficients = update_coefficients([entry.weight for entry in entries])
    fetches: deque[asyncio.Task[FloatArray]] = deque()
    acc: np.ndarray | None = None
    done = started = 0
    try:
        while done < len(entries):
            while len(fetches) < STREAM_WINDOW and started < len(entries):
                contribution = entries[started].contribution
                fetches.append(
                    asyncio.create_task(
                        fetch_gradient(
                            store, contribution, expected_length=model.size, packing=record.packing
                        )
                    )
                )
                started += 1
            batch = [await fetches.popleft() for _ in range(min(len(fetches), STREAM_WINDOW // 2))]
            acc = partial_update(acc, batch, coefficients[done : done + len(batch)])
            done += len(batch)
    except (BlockStoreError, DecodeError, ShapeMismatch) as exc:
        raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
    finally:
        for task in fetches:
            task.cancel()
        await asyncio.gather(*fetches, return_exceptions=True)
    if acc is None:
        raise RoundVerificationFailed(f"round {record.round}: its roster is empty")
    return finish_update(acc, model, record.learning_rate)


async def recompute_round(
    store: BlockStore,
    record: AgreedRecord,
    rule: UpdateRule | None = None,
    *,
    base: ModelState | None = None,
) -> tuple[Roster, FloatArray]:
    """Re-aggregate a record's roster on its base model; return the roster and the new model.

    A record written with a custom update rule (``record.rule``) needs that ``rule``; it is
    applied from the previous record's state, and its new state must hash to ``record.state``.
    ``base`` is the base model and that state when the caller holds them (else they are
    loaded: :func:`load_result` of the previous record).

    Raises
    ------
    RoundVerificationFailed
        If the roster does not belong to the record, a block cannot be fetched or decoded, or
        the record names a rule and none is given.
    """
    roster, model, _ = await _recompute(store, record, rule, base)
    return roster, model


async def _recompute(
    store: BlockStore, record: AgreedRecord, rule: UpdateRule | None, base: ModelState | None
) -> tuple[Roster, FloatArray, FloatArray | None]:
    """:func:`recompute_round`, also returning the rule's new state (checked against the record)."""
    if record.rule is not None and rule is None:
        raise RoundVerificationFailed(f"round {record.round} used rule {record.rule!r}: pass it")
    if record.rule is not None and rule is not None and rule.label(record.round) != record.rule:
        raise RoundVerificationFailed(
            f"round {record.round} used rule {record.rule!r}, not {rule.label(record.round)!r}"
        )
    model, state = await _base_of(store, record, rule) if base is None else base
    if rule is None or record.rule is None:  # fedavg: summed as the contributions arrive
        model = np.asarray(model, np.float32).reshape(-1)
        roster = await _round_roster(store, record)
        return roster, await _streamed_update(store, record, roster, model), None
    roster, model, gradients = await load_round_inputs(store, record, base=model)
    new, new_state = rule.apply(model, roster, gradients, record.learning_rate, state)
    if (None if new_state is None else bytes(await model_cid(new_state))) != (
        None if record.state is None else bytes(record.state)
    ):
        raise RoundVerificationFailed(f"round {record.round}: the rule state does not match")
    return roster, np.ascontiguousarray(new, np.float32).reshape(-1), new_state


async def _base_of(store: BlockStore, record: AgreedRecord, rule: UpdateRule | None) -> ModelState:
    """Return the model and rule state a record starts from: its predecessor's result."""
    try:
        if record.prev is None:
            return np.asarray(await fetch_gradient(store, record.base), np.float32), None
        prev = await load_record(store, record.prev)
    except (BlockStoreError, DecodeError) as exc:
        raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
    if not _follows(prev, record):
        raise RoundVerificationFailed(f"round {record.round} does not follow {record.prev}")
    return await load_result(store, prev, rule)


async def load_result(
    store: BlockStore,
    record: AgreedRecord,
    rule: UpdateRule | None = None,
    *,
    timeout: float | Unset = UNSET,
    length: int | None = None,
    known: Mapping[bytes, ModelState] | None = None,
    max_rounds: int = MAX_REBUILD_ROUNDS,
) -> ModelState:
    """Return a record's model (float32, ``(d,)``) and its rule's state (``None`` without one).

    Fetched by CID when the record says its holders stored them (``model_stored``); else
    rebuilt from the newest earlier record whose model is stored (or the genesis): each round
    since is re-aggregated from its roster (:func:`recompute_round`, with ``rule`` if the
    records name one) and must hash to its record's result. ``timeout`` bounds the stored
    model's fetch, ``length`` is the number of values it must have; ``known`` maps model
    CIDs (bytes) to models (and states) the caller holds, which end the walk back early.
    Without ``rule``, a custom-rule record's unstored model is fetched all the same (its
    holders put the last one when their session closed), and missing is an error.

    Raises
    ------
    RoundVerificationFailed
        If a block is missing or malformed, the records do not link up, a model has another
        length, a rebuilt model hashes to another CID than its record's, or more than
        ``max_rounds`` rounds would be re-aggregated.
    """
    if not record.model_stored and record.rule is not None and rule is None:
        return await _fetch_unstored(store, record, timeout, length)
    rebuild: list[AgreedRecord] = []
    anchor, held = record, known or {}
    try:
        while bytes(anchor.result) not in held and not anchor.model_stored:
            rebuild.append(anchor)
            if len(rebuild) > max_rounds:
                raise RoundVerificationFailed(
                    f"round {record.round}: no stored model in the last {max_rounds} rounds"
                )
            if anchor.prev is None:
                break
            later, anchor = anchor, await load_record(store, anchor.prev)
            if not _follows(anchor, later):
                raise RoundVerificationFailed(f"round {later.round} does not follow {later.prev}")
        if bytes(anchor.result) in held:
            base = held[bytes(anchor.result)]
        else:
            stored = anchor.result if anchor.model_stored else anchor.base  # else: the genesis
            model = await fetch_gradient(store, stored, timeout=timeout, expected_length=length)
            state = None
            if anchor.model_stored and anchor.state is not None:
                state = await fetch_gradient(store, anchor.state, timeout=timeout)
            base = (np.asarray(model, np.float32).reshape(-1), state)
    except (BlockStoreError, DecodeError, ShapeMismatch) as exc:
        raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
    for later in reversed(rebuild):
        _, model, state = await _recompute(store, later, rule, base)
        await _check_result(later, model)
        base = (model, state)
    return base


async def _fetch_unstored(
    store: BlockStore, record: AgreedRecord, timeout: float | Unset, length: int | None
) -> ModelState:
    """Fetch a custom-rule record's unstored model anyway (holders put the last at close)."""
    try:
        model = await fetch_gradient(store, record.result, timeout=timeout, expected_length=length)
        state = None
        if record.state is not None:
            state = await fetch_gradient(store, record.state, timeout=timeout)
    except (BlockStoreError, DecodeError, ShapeMismatch) as exc:
        raise RoundVerificationFailed(
            f"round {record.round} used rule {record.rule!r} and its model was not stored "
            f"(model_every; {exc}): rebuilding it needs that rule, pass it"
        ) from exc
    return np.asarray(model, np.float32).reshape(-1), state


async def _check_result(record: AgreedRecord, model: FloatArray) -> None:
    recomputed = await model_cid(model)
    if bytes(recomputed) != bytes(record.result):
        raise RoundVerificationFailed(
            f"round {record.round}: roster re-aggregates to {recomputed}, "
            f"record says {record.result}"
        )


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
    await verify_record(store, record, rule)
    return record


async def verify_record(
    store: BlockStore,
    record: AgreedRecord,
    rule: UpdateRule | None = None,
    base: ModelState | None = None,
) -> tuple[Roster, FloatArray, FloatArray | None]:
    """Recompute a record's model; check its CID, slice results and frauds.

    ``base`` as in :func:`recompute_round`. Returns the roster used (a sliced round's leaves
    out the senders its slices miss), the model and the rule's new state.

    Raises
    ------
    RoundVerificationFailed
        If anything is missing, malformed, or does not verify.
    """
    roster, model, state = await _recompute(store, record, rule, base)
    await _check_result(record, model)
    if record.slices is not None:
        await check_slice_results(store, record, model)
    if record.frauds:
        try:
            full = await load_roster(store, record.roster)
        except (BlockStoreError, DecodeError) as exc:
            raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
        await check_partial_frauds(store, record.frauds, full, model.size, record.packing)
    return roster, model, state


async def verify_agreed_history(  # noqa: PLR0913 - public face: keyword-only settings
    store: BlockStore,
    head: CIDLike,
    *,
    session: str,
    genesis: CIDLike,
    recompute: bool = True,
    max_rounds: int = MAX_CHAIN_ROUNDS,
    rule: UpdateRule | None = None,
    deadline: float | None = None,
    keys: KeyBook = PEER_ID_KEYS,
    admission: Admission | None = None,
    members: Collection[str] = (),
) -> list[AgreedRecord]:
    """Verify the chain ending at ``head``: links, genesis, exclusions, signatures, results.

    A session whose members change (``admission``: its :class:`~.membership.Admission`;
    ``members``: its round-0 members) has each round's member set checked against its
    predecessor's (:func:`check_member_sets`); without ``admission`` a record that names a
    member set is refused (it cannot be judged).

    Every roster entry must be its owner's signed contribution (:func:`check_roster_signatures`;
    ``keys``: where the authors' keys are, a memory bus's ``bus.keys``); every result is
    recomputed unless ``recompute`` is false. ``deadline`` bounds the walk of the chain (see
    :func:`load_chain`). Without ``recompute`` a sliced round's slice records are still
    checked against its roster (:func:`~.agreed_slicing.sliced_roster`): records, rosters,
    slice and fraud records are what retention keeps forever.

    Returns
    -------
    list of AgreedRecord
        The verified records, oldest first.

    Raises
    ------
    RoundVerificationFailed, GenesisMismatch
        See :func:`load_chain`, :func:`check_exclusions` and :func:`verify_agreed_round`.
    ChainDeadlineExceeded
        If the walk passes ``deadline``.
    """
    start = parse_cid(head)
    try:
        chain = await load_chain(
            store, start, session=session, genesis=parse_cid(genesis), max_rounds=max_rounds,
            deadline=deadline,
        )  # fmt: skip
    except (BlockStoreError, DecodeError) as exc:
        raise RoundVerificationFailed(f"chain from {start}: {exc}") from exc
    await check_exclusions(store, chain)
    await check_roster_signatures(store, chain, keys)
    if admission is not None:
        start_set = MemberState.genesis(session, parse_cid(genesis), members)
        await check_member_sets(store, chain, start_set, admission, keys=keys)
    elif any(record.members is not None for _, record in chain):
        raise RoundVerificationFailed("the chain changes its members: verify with its admission")
    if recompute:
        await verify_rounds(store, [record for _, record in chain], rule)
        return [record for _, record in chain]
    for _, record in chain:  # kept under retention: the slice records still fit their rosters
        if record.slices is not None:
            try:
                roster = await load_roster(store, record.roster)
            except (BlockStoreError, DecodeError) as exc:
                raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
            await sliced_roster(store, record, roster)
    return [record for _, record in chain]


async def verify_rounds(
    store: BlockStore,
    records: list[AgreedRecord],
    rule: UpdateRule | None = None,
    base: ModelState | None = None,
) -> ModelState:
    """Verify consecutive ``records`` (oldest first, each by :func:`verify_record`).

    Returns the last record's recomputed model and rule state.

    ``base`` is the first record's base model and rule state when the caller holds them (else
    loaded); each recomputed model is the next round's base, so nothing is fetched twice.

    Raises
    ------
    RoundVerificationFailed
        If a round is missing, malformed, or does not verify.
    """
    for record in records:
        _, model, state = await verify_record(store, record, rule, base)
        base = (model, state)
    if base is None:
        raise RoundVerificationFailed("no round to verify")
    return base


@dataclass(frozen=True)
class VerifiedHead:
    """A head :func:`verify_head` checked: its chain, recomputed model, rule state, liars.

    ``chain`` holds the records this peer had not followed, oldest first; ``recomputed`` is how
    many of its last rounds were re-aggregated (the rest had their links and exclusions checked).
    """

    chain: list[tuple[CID, AgreedRecord]]
    model: FloatArray
    state: FloatArray | None
    excluded: frozenset[str]
    recomputed: int


async def verify_head(
    store: BlockStore,
    head: CIDLike,
    *,
    session: str,
    genesis: CID,
    history: Collection[bytes],
    result: ResultLoad,
    deadline: float | None = None,
    keys: KeyBook = PEER_ID_KEYS,
) -> VerifiedHead:
    """Check a head before adopting it: its new records, their exclusions, its last rounds.

    The records from ``head`` back to one in ``history`` (or the genesis) are walked
    (:func:`load_chain`, ``deadline`` bounding the walk) and their proven liars checked
    (:func:`check_exclusions`) and their rosters' entry signatures (:func:`check_roster_signatures`,
    against ``keys``); then the last ``max(1, result.max_rebuild)`` of them (all, for a
    peer that far behind or less) are re-aggregated and checked as :func:`verify_agreed_history`
    does (:func:`verify_rounds`), starting from a model in ``result.known`` or the stored (else
    rebuilt: :func:`load_result`) model before them. The head's model is the recomputed one:
    a stored model that its roster does not re-aggregate to is never adopted. The cost is
    bounded by how far this peer is behind and by ``max_rebuild``, not by the session's length.

    Raises
    ------
    GenesisMismatch
        If a record names another session or genesis, or the chain does not extend ``history``.
    RoundVerificationFailed
        If a block is missing or malformed, or a link, exclusion or result does not verify.
    ChainDeadlineExceeded
        If the walk passes ``deadline``.
    """
    start = parse_cid(head)
    try:
        chain = await load_chain(
            store, start, session=session, genesis=genesis, stop_at=history, deadline=deadline
        )
    except (BlockStoreError, DecodeError) as exc:
        raise RoundVerificationFailed(f"chain from {start}: {exc}") from exc
    first = chain[0][1]
    if first.prev is not None and bytes(first.prev) not in history:
        raise GenesisMismatch(f"head {start} does not extend this peer's history")
    excluded = await check_exclusions(store, chain)
    await check_roster_signatures(store, chain, keys)  # every entry its owner's contribution
    count = min(len(chain), max(1, result.max_rebuild))
    records = [record for _, record in chain[-count:]]
    before = chain[-count - 1][1] if count < len(chain) else None
    base = await _start_of(store, records[0], before, result)
    model, state = await verify_rounds(store, records, result.rule, base)
    return VerifiedHead(chain, model, state, excluded, count)


async def _start_of(
    store: BlockStore, record: AgreedRecord, prev: AgreedRecord | None, result: ResultLoad
) -> ModelState:
    """Return the model (and rule state) ``record`` starts from, as ``result`` says to load it.

    ``prev`` is its predecessor when the caller holds it (else fetched); a model in
    ``result.known`` is taken as it is, else it is fetched or rebuilt (:func:`load_result`).
    """
    known = result.known or {}
    if bytes(record.base) in known:
        return known[bytes(record.base)]
    try:
        if record.prev is None:  # the genesis (load_chain checked the base is it)
            model = await fetch_gradient(
                store, record.base, timeout=result.timeout, expected_length=result.length
            )
            return np.asarray(model, np.float32).reshape(-1), None
        if prev is None:
            prev = await load_record(store, record.prev, timeout=result.timeout)
    except (BlockStoreError, DecodeError, ShapeMismatch) as exc:
        raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
    if not _follows(prev, record):
        raise RoundVerificationFailed(f"round {record.round} does not follow {record.prev}")
    return await load_result(
        store, prev, result.rule, timeout=result.timeout, length=result.length, known=known,
        max_rounds=result.max_rebuild,
    )  # fmt: skip
