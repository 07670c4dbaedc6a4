"""A third party checks an agreed record of the CometBFT control plane: final, then correct.

:func:`verify_final_record` needs a record CID, a commit bundle
(:class:`~gradfed_ipfs.cometbft.finality.FinalityBundle`, written by ``gradfed-ipfs
comet-export``) and a block store: no validator, no member. It first proves from the bundle
alone that the chain's members decided this record final (more than 2/3 of the genesis
validators, each bound to a member, signed a header whose app hash commits the record;
:func:`~gradfed_ipfs.cometbft.finality.verify_finality`), then recomputes the round and its
history from IPFS as :func:`~.history.verify_agreed_history` does.
"""

from __future__ import annotations

from ...._types import CIDLike
from ....cid import parse_cid
from ....cometbft.finality import Finality, FinalityBundle, verify_finality
from ....errors import NotFinal, RoundVerificationFailed
from ....formats.agreed.roster import AgreedRecord
from ....formats.statement import PEER_ID_KEYS, KeyBook
from ....storage.base import BlockStore
from ..history import verify_agreed_history

__all__ = ["verify_final_record"]


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
    """
    finality = verify_finality(bundle)
    cid = str(parse_cid(record))
    if finality.record != cid:
        raise NotFinal(
            f"the bundle proves round {finality.round}'s {finality.record} final, not {cid}"
        )
    records = await verify_agreed_history(
        store, cid, session=finality.session, genesis=finality.genesis, deadline=deadline,
        keys=keys,
    )  # fmt: skip
    last = records[-1]
    if last.round != finality.round or str(last.result) != finality.model:
        raise RoundVerificationFailed(
            f"record {cid} is round {last.round} with result {last.result}; the chain "
            f"finalized round {finality.round} with model {finality.model}"
        )
    return finality, records
