"""When an absent member is evicted (issue 33 item 3), on the in-memory bus.

The rule (:mod:`gradfed_ipfs.federated.agreed.membership`): round ``r``'s roster names the
member set of the rounds from ``r + 1`` on, and it evicts every member missing from its own
roster and the ``evict_after - 1`` before it. So a member whose last contribution is to round
``r - 1`` (it is absent from round ``r`` on) is out of the member set of round
``r + evict_after``, whatever happened in between. Here round 1 splits: one honest peer,
cut off from the others, takes a roster of its own (a fork that loses, one vote against
two). It resyncs to the winning record; its member state must be the one at the fork point,
not the one after its own losing roster, or it counts the absent member's losing-fork absence
as well and refuses the winning chain (its eviction "due" one round early), and the eviction
then lands late or never.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from multiformats import CID

from gradfed_ipfs import AgreedConfig, AgreedRoundResult, AgreedSession, verify_agreed_history
from gradfed_ipfs.federated.agreed import Admission
from gradfed_ipfs.formats import PubsubMessage
from gradfed_ipfs.formats.agreed.membership import MemberChange, MemberSet
from gradfed_ipfs.formats.agreed.roster import AgreedRecord
from gradfed_ipfs.kubo import MemoryPubsubBus, PubsubTransport, PubsubWrapper
from gradfed_ipfs.storage import MemoryBlockStore
from tests.federated.agreed.test_rounds import FAST, close, delta, initial_model
from tests.polling import apoll_until

SESSION = "s1"
MEMBERS = ("peer-a", "peer-b", "peer-c", "peer-d")
GONE = "peer-d"  # never contributes: absent from round 0 on
K = 3
ADMISSION = Admission(evict_after=K)


class Cut(PubsubWrapper):
    """A transport that sends and hears nothing while ``cut`` is set (a partition)."""

    def __init__(self, inner: PubsubTransport) -> None:
        super().__init__(inner)
        self.cut = False

    async def publish(self, topic: str, data: bytes) -> None:
        if not self.cut:
            await self.inner.publish(topic, data)

    def subscribe(self, topic: str) -> AsyncIterator[PubsubMessage]:
        return self._heard(self.inner.subscribe(topic))

    async def _heard(self, heard: AsyncIterator[PubsubMessage]) -> AsyncIterator[PubsubMessage]:
        async for message in heard:
            if not self.cut:
                yield message


async def heard(session: AgreedSession, head: CID | None) -> None:
    """Wait until ``session`` heard another member announce ``head`` (re-announced)."""

    async def check() -> bool:
        heads = session.board.heads.values()
        return head is not None and any(bytes(h.record) == bytes(head) for h in heads)

    await apoll_until(check, timeout=10.0, what=f"{session.peer_id} hearing {head}")


async def run(sessions: Sequence[AgreedSession]) -> list[AgreedRoundResult]:
    return list(
        await asyncio.gather(
            *(s.run_round(delta(i, s.round), weight=1) for i, s in enumerate(sessions))
        )
    )


async def test_a_member_absent_from_round_0_is_out_of_round_k_after_a_split_and_resync() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    config = AgreedConfig(members=MEMBERS, min_peers=1, admission=ADMISSION, **FAST)  # type: ignore[arg-type]
    cut = Cut(bus.endpoint("peer-c"))
    transports = [bus.endpoint("peer-a"), bus.endpoint("peer-b"), cut]
    sessions = [AgreedSession(store, t, SESSION, genesis, config) for t in transports]
    for session in sessions:
        await session.start(initial_model())
    a, _, c = sessions
    try:
        zero = await run(sessions)  # round 0: peer-d's first absence
        assert len({bytes(r.record) for r in zero}) == 1
        assert zero[0].absent == (GONE,)
        cut.cut = True  # round 1 splits: peer-c alone takes its own roster
        split = await run(sessions)
        cut.cut = False
        assert bytes(split[0].record) == bytes(split[1].record) != bytes(split[2].record)
        assert set(split[2].roster.peers) == {"peer-c"}
        await heard(c, a.head)
        resynced = await c.resync(timeout=10.0)  # one vote against two: peer-c follows a, b
        assert resynced.changed, resynced.refused
        assert c.head == a.head
        assert all(s.members == MEMBERS for s in sessions)  # two absences so far: K = 3

        two = await run(sessions)  # round 2: peer-d's third absence, so this roster evicts it
        assert len({bytes(r.record) for r in two}) == 1, [str(r.record) for r in two]
        assert all(s.members == MEMBERS[:3] for s in sessions)  # round K's member set
        three = await run(sessions)
        assert len({bytes(r.record) for r in three}) == 1
        assert three[0].roster.expected == MEMBERS[:3]

        named = []  # the member sets the honest peers' chains name, round by round
        for session in sessions:
            assert session.head is not None
            records = await verify_agreed_history(
                store, session.head, session=SESSION, genesis=genesis, keys=bus.keys,
                admission=ADMISSION, members=MEMBERS,
            )  # fmt: skip
            named.append([(r.round, r.members) for r in records])
        assert named[0] == named[1] == named[2]
        changed = [(n, cid) for n, cid in named[0] if cid is not None]
        assert [n for n, _ in changed] == [K - 1]  # round K - 1's record names round K's set
        evicted = MemberSet.from_block(await store.get(changed[0][1]))
        assert (evicted.round, evicted.members) == (K, MEMBERS[:3])
        assert evicted.changes == (MemberChange("evict", GONE),)
        record = AgreedRecord.from_block(await store.get(three[0].record))
        assert record.round == K
    finally:
        await close(sessions)
