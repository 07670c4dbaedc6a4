"""Fraud proofs of chained reduce-scatter rounds: a lying partial sum, re-checked (issue 14).

A chained round's checker names the author of the earliest wrong partial sum of a slice
(:meth:`~.chain.ChainRound.blame`); its fraud record's ``claimed`` is then a
:class:`~gradfed_ipfs.formats.sliced.partials.PartialRecord`, not a slice record.
:func:`partial_fraud_fits` is what such a record must fit, checked with every round record
(:func:`~.agreed_slicing.proven_liars`, with or without recompute: records are kept under
retention); :func:`check_partial_frauds` also re-sums the step from the contributions, when a
round is recomputed (:func:`~.agreed_history.verify_agreed_round`).
"""

from __future__ import annotations

from collections.abc import Sequence

from multiformats import CID

from ...errors import BlockStoreError, DecodeError, GradientError, RoundVerificationFailed
from ...formats.agreed.roster import Roster
from ...formats.sliced.partials import PartialRecord, partial_values
from ...formats.sliced.slices import FraudRecord, SliceRecord
from ...storage.base import Block, BlockStore
from ...tensor.packing import PackSpec
from .plan import chain_senders, chain_sum
from .transport import fetch_range

__all__ = ["check_partial_frauds", "claimed_record", "partial_fraud_fits", "partial_lie_proven"]


def partial_fraud_fits(claimed: PartialRecord, correct: SliceRecord, roster: Roster) -> bool:
    """Return whether ``claimed`` is an earlier step of ``correct``'s slice (same exclusions).

    That is: the same roster, slice and range, ``missing`` senders and weight sum, and a chain
    of at most one group per roster peer, and a step ``j`` before the chain's last.
    """
    return (
        claimed.roster == correct.roster
        and (claimed.k, claimed.offset, claimed.length)
        == (correct.k, correct.offset, correct.length)
        and claimed.missing == correct.missing
        and claimed.weight_sum == correct.weight_sum
        and claimed.j < claimed.groups - 1
        and claimed.groups <= len(roster.entries)
    )


async def partial_lie_proven(
    store: BlockStore,
    claimed: PartialRecord,
    correct: SliceRecord,
    roster: Roster,
    d: int,
    packing: PackSpec | None = None,
) -> bool:
    """Return whether partial sum ``claimed`` differs from what its step honestly sums.

    ``correct`` is the round's agreed record of the same slice (its ``missing`` and weights),
    ``d`` the model's length; the honest partial of step ``j`` is the sum over groups
    ``0 … j`` of ``roster`` (:func:`~.slices.chain_senders`), recomputed from the
    contributions' slices. ``False`` when :func:`partial_fraud_fits` is not true or the
    values are right.

    Raises
    ------
    BlockStoreError, DecodeError
        If a contribution slice or a block of ``claimed`` cannot be fetched.
    """
    if not partial_fraud_fits(claimed, correct, roster):
        return False
    senders = frozenset().union(*chain_senders(roster.peers, claimed.groups)[: claimed.j + 1])
    used = [e for e in roster.entries if e.peer in senders and e.peer not in correct.missing]
    rows = [
        await fetch_range(store, e.contribution, correct.offset, correct.length, d, packing=packing)
        for e in used
    ]
    honest = chain_sum(None, rows, [e.weight for e in used], correct.weight_sum, claimed.length)
    blocks = [await store.get(c) for c in claimed.values]
    try:
        values = partial_values(blocks, claimed.length)
    except DecodeError:
        return True  # not a partial sum at all: no honest step writes it
    return values.tobytes() != honest.tobytes()


async def check_partial_frauds(
    store: BlockStore,
    frauds: Sequence[CID],
    roster: Roster,
    d: int,
    packing: PackSpec | None = None,
) -> None:
    """Re-check, from the contributions, every fraud record among ``frauds`` naming a partial.

    ``packing``: the contributions' encoding when compressed.

    Raises
    ------
    RoundVerificationFailed
        If a block cannot be fetched or decoded, or a claimed partial sum is right after all.
    """
    for cid in frauds:
        try:
            fraud = FraudRecord.from_block(await store.get(cid))
            claimed = claimed_record(await store.get(fraud.claimed))
            if isinstance(claimed, SliceRecord):
                continue  # the one-level proof: the slice results are checked against the model
            correct = SliceRecord.from_block(await store.get(fraud.correct))
            proven = await partial_lie_proven(store, claimed, correct, roster, d, packing)
        except (BlockStoreError, DecodeError, GradientError) as exc:
            raise RoundVerificationFailed(f"fraud record {cid}: {exc}") from exc
        if not proven:
            raise RoundVerificationFailed(f"fraud record {cid}: its partial sum is right")


def claimed_record(block: Block) -> SliceRecord | PartialRecord:
    """Decode a fraud record's ``claimed`` block: a slice record, or a chained round's partial.

    Raises
    ------
    MalformedManifest
        If it is neither.
    """
    try:
        return SliceRecord.from_block(block)
    except DecodeError:
        return PartialRecord.from_block(block)
