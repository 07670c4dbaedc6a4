"""Resync in an admission session refuses a head whose member sets fail and tries the next.

Issue 32, item 9 in part: the chain's member sets were checked only after a head was chosen,
so a head that verified and had its votes but named a member set its rounds do not call for
made ``resync`` raise ``RoundVerificationFailed`` instead of falling back to the next head.
"""

from __future__ import annotations

import asyncio
import dataclasses

from gradfed_ipfs.federated.agreed import Admission, AgreedConfig, AgreedSession
from gradfed_ipfs.formats.agreed.membership import MemberChange, MemberSet
from gradfed_ipfs.formats.agreed.roster import AgreedMessage, AgreedRecord, Roster
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore, put_gradient
from gradfed_ipfs.tensor.deterministic import deterministic_update
from tests.federated.agreed.test_rounds import FAST, PEERS, close, delta, initial_model
from tests.helpers import roster_signature, signed, signed_entry
from tests.polling import apoll_until

SESSION = "s1"


async def test_a_head_whose_member_set_fails_is_refused_and_the_next_adopted() -> None:
    a, b, late = PEERS
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    config = AgreedConfig(
        members=PEERS,
        min_peers=1,
        admission=Admission("allow-list"),
        **FAST,  # type: ignore[arg-type]
    )
    sessions = {p: AgreedSession(store, bus.endpoint(p), SESSION, genesis, config) for p in PEERS}
    for session in sessions.values():
        await session.start(initial_model())
    honest = [sessions[a], sessions[b]]
    try:
        for _ in range(2):  # rounds 0 and 1 without the late peer
            results = await asyncio.gather(
                *(s.run_round(delta(i, s.round)) for i, s in enumerate(honest))
            )
            assert len({bytes(res.record) for res in results}) == 1
        head, base, model = sessions[a].head, sessions[a].model_cid, sessions[a].model
        current = MemberSet(SESSION, genesis, 0, PEERS)  # round 0's: the initial members
        assert current.to_block().cid == sessions[a].member_set_cid
        assert head is not None
        await close(honest)
        # Round 2 as peer-a alone would build it (its own signed contribution, the exact
        # aggregate, its roster signed) but naming a member set that evicts peer-b.
        forged_set = dataclasses.replace(
            current, round=2, prev=sessions[a].member_set_cid, members=(a, late),
            changes=(MemberChange("evict", b),),
        )  # fmt: skip
        set_cid = await store.put(forged_set.to_block())
        grad = delta(0, 2)
        entry = await signed_entry(SESSION, genesis, 2, base, a, await put_gradient(store, grad))
        roster = Roster.new(SESSION, genesis, 2, base, a, PEERS, {a: entry}, set_cid)
        result = await put_gradient(store, deterministic_update(model, [grad], [1], 1.0))
        forged = AgreedRecord(
            SESSION, genesis, 2, head, base, await store.put(roster.to_block()), result, 1.0,
            members=set_cid, roster_signature=await roster_signature(roster),
        )  # fmt: skip
        forged_cid = await store.put(forged.to_block())
        # peer-a's vote for it (and, since it extends the real head, for that head too).
        endpoint = bus.endpoint(a)
        done = AgreedMessage("done", SESSION, genesis, 2, a, result, record=forged_cid)
        await endpoint.publish(sessions[late].topic, await signed(done, bus))
        board = sessions[late].board

        async def heard() -> bool:
            return board.heads.get(a) is not None and board.heads[a].round == 2

        await apoll_until(heard, timeout=10.0, what="peer-a's round-2 head")
        synced = await sessions[late].resync(timeout=5.0)
    finally:
        await close(list(sessions.values()))
    assert synced.changed
    assert sessions[late].head == head
    assert sessions[late].round == 2
    assert "member set" in synced.refused[a]
