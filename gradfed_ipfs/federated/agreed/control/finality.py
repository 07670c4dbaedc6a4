"""A third party checks an agreed record of the CometBFT control plane: final, then correct.

:func:`verify_final_record` needs a record CID, a commit bundle
(:class:`~gradfed_ipfs.cometbft.finality.FinalityBundle`, written by ``gradfed-ipfs
comet-export``) and a block store: no validator, no member. It first proves from the bundle
alone that the chain's members decided this record final (more than 2/3 of the genesis
validators, each bound to a member, or of the set their signed headers handed the chain on to
as members joined and left, signed a header whose app hash commits the record;
:func:`~gradfed_ipfs.cometbft.finality.verify_finality`), then re-verifies the record's chain
from IPFS as :func:`~.history.verify_agreed_history` does, recomputing every round.

Member sets are judged by the **chain's** rules (:func:`check_chain_member_sets`), which differ
from the pubsub plane's in two ways: a peer on the genesis allow-list is admitted on its signed
join alone under every policy (a voting policy admits the others by vote), and an eviction
(absent rosters, or evidence the app holds) is the chain's decision, taken as proven by the
commits: more than 2/3 of the validators finalized a record that names it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from multiformats import CID

from ...._types import CIDLike
from ....cid import parse_cid
from ....cometbft.abci import RoundsGenesis
from ....cometbft.finality import Finality, FinalityBundle, verify_finality
from ....errors import BlockStoreError, DecodeError, NotFinal, RoundVerificationFailed
from ....formats.agreed.membership import MemberSet
from ....formats.agreed.roster import AgreedRecord
from ....formats.statement import PEER_ID_KEYS, KeyBook
from ....storage.base import BlockStore
from ..history import (
    MemberState,
    check_exclusions,
    check_roster_signatures,
    load_chain,
    load_roster,
    verify_rounds,
)
from ..membership import Admission, AdmissionPolicy, change_problem, moved_after

__all__ = ["check_chain_member_sets", "verify_final_record"]


def _change_problem(
    rounds: RoundsGenesis,
    current: MemberSet,
    claimed: MemberSet,
    r: int,
    keys: KeyBook,
    moved: Mapping[str, int],
) -> str:
    """Return why ``claimed`` is not a set the chain's close of round ``r`` can make."""
    if (claimed.session, bytes(claimed.genesis)) != (current.session, bytes(current.genesis)):
        return "a member set of another session"
    if claimed.round != r + 1 or not claimed.changes:
        return f"a member set of round {claimed.round} (with no change?) after round {r}"
    policy = cast("AdmissionPolicy", rounds.admission)  # the genesis decoder checked it
    removed: set[str] = set()
    joined: set[str] = set()
    for change in claimed.changes:
        listed = change.op == "join" and change.peer in rounds.allow
        admission = Admission("allow-list" if listed else policy, allow=rounds.allow)
        if change.op == "evict":  # the chain's decision (absences or evidence): members only
            problem = "" if change.peer in current.members else f"{change.peer} is no member"
        else:
            problem = change_problem(change, current, r, admission, keys=keys, moved=moved)
        if problem:
            return problem
        (joined if change.op == "join" else removed).add(change.peer)
    if claimed.members != tuple(sorted((set(current.members) - removed) | joined)):
        return "its members are not the set before with its changes"
    return ""


async def check_chain_member_sets(
    store: BlockStore,
    chain: Sequence[tuple[CID, AgreedRecord]],
    rounds: RoundsGenesis,
    *,
    keys: KeyBook = PEER_ID_KEYS,
) -> None:
    """Check each record's member set by the chain's rules (module docstring), from genesis.

    Each roster must expect exactly its round's members and name the set its record names; a
    changed set must link to the one before and be made of valid changes.

    Raises
    ------
    RoundVerificationFailed
        If a set is not one the chain can decide, or a block cannot be had.
    """
    state = MemberState.genesis(rounds.session, parse_cid(rounds.genesis), rounds.members)
    current, current_cid, moved = state.members, state.cid, dict(state.moved)
    for _, record in chain:
        try:
            roster = await load_roster(store, record.roster)
            claimed = None
            if record.members is not None:
                claimed = MemberSet.from_block(await store.get(record.members))
        except (BlockStoreError, DecodeError) as exc:
            raise RoundVerificationFailed(f"round {record.round}: member set: {exc}") from exc
        problem = ""
        if roster.expected != current.members:
            problem = f"the roster expects {len(roster.expected)} peers, not the members"
        elif roster.members != record.members:
            problem = "the record and its roster name different member sets"
        elif claimed is not None and claimed.prev != current_cid:
            problem = "the set does not link to the one before"
        elif claimed is not None:
            problem = _change_problem(rounds, current, claimed, record.round, keys, moved)
        if problem:
            raise RoundVerificationFailed(f"round {record.round}: member set: {problem}")
        if claimed is not None and record.members is not None:
            current, current_cid, moved = claimed, record.members, moved_after(moved, claimed)


async def verify_final_record(
    store: BlockStore,
    record: CIDLike,
    bundle: FinalityBundle,
    *,
    deadline: float | None = None,
    keys: KeyBook = PEER_ID_KEYS,
) -> tuple[Finality, list[AgreedRecord]]:
    """Prove ``record`` final from ``bundle``, then re-verify its chain; return both results.

    Raises
    ------
    FinalityNotProven
        If the bundle does not prove finality (its subclasses say which step failed:
        ``BadCommitSignature``, ``InsufficientVotingPower``, ``AppHashMismatch``, ``NotFinal``),
        or proves another record final (``NotFinal``).
    RoundVerificationFailed
        If the record's chain does not re-verify, or its result is not the chain's final model.
    GenesisMismatch
        If the record is of another session or genesis than the chain's.
    ChainDeadlineExceeded
        If the walk of the chain passes ``deadline``.
    """
    finality = verify_finality(bundle)
    cid = str(parse_cid(record))
    if finality.record != cid:
        raise NotFinal(
            f"the bundle proves round {finality.round}'s {finality.record} final, not {cid}"
        )
    try:
        chain = await load_chain(
            store, parse_cid(cid), session=finality.session,
            genesis=parse_cid(finality.genesis), deadline=deadline,
        )  # fmt: skip
    except (BlockStoreError, DecodeError) as exc:
        raise RoundVerificationFailed(f"chain from {cid}: {exc}") from exc
    await check_exclusions(store, chain)
    await check_roster_signatures(store, chain, keys)
    if finality.chain is not None and finality.chain.admission:
        await check_chain_member_sets(store, chain, finality.chain, keys=keys)
    elif any(r.members is not None for _, r in chain):
        raise RoundVerificationFailed("the members of this chain are fixed; a record changes them")
    records = [r for _, r in chain]
    await verify_rounds(store, records)
    last = records[-1]
    if last.round != finality.round or str(last.result) != finality.model:
        raise RoundVerificationFailed(
            f"record {cid} is round {last.round} with result {last.result}; the chain "
            f"finalized round {finality.round} with model {finality.model}"
        )
    return finality, records
