"""A head refused for a slow fetch is tried again after a back-off; a missing one is not; a
head heard while a choice was made is not missed.

In-memory bus and blocks; the late peer reads them through a store whose first get of the
honest head record times out, as a newcomer's daemon's does before it is connected to the others.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

from gradfed_ipfs import AgreedSession
from gradfed_ipfs._types import CIDLike
from gradfed_ipfs.block import Block
from gradfed_ipfs.errors import BlockTimeout, DecodeError
from gradfed_ipfs.federated.agreed import Admission
from gradfed_ipfs.formats.agreed.roster import AgreedRecord
from gradfed_ipfs.formats.pubsub import PubsubMessage
from gradfed_ipfs.kubo import MemoryPubsubBus, PubsubTransport, PubsubWrapper
from gradfed_ipfs.storage import MemoryBlockStore
from gradfed_ipfs.storage.base import UNSET, StoreWrapper, Unset
from tests.federated.agreed.test_members_change import NEW, SESSION, config, held, run, started
from tests.federated.agreed.test_rounds import PEERS, close, initial_model
from tests.polling import apoll_until

FETCH_TIMEOUT = 2.0  # test_rounds.FAST's


class SlowStore(StoreWrapper):
    """The first get of a round record of a round in :attr:`slow` times out; the rest pass."""

    def __init__(self, store: MemoryBlockStore, *slow: int) -> None:
        super().__init__(store)
        self.slow = set(slow)
        self.asked: Counter[bytes] = Counter()

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        block = await self.store.get(cid, timeout=timeout)
        self.asked[bytes(block.cid)] += 1
        if self.slow and (round_number := _record_round(block)) in self.slow:
            self.slow.discard(round_number)
            raise BlockTimeout("block did not arrive in time", cid=cid, deadline=FETCH_TIMEOUT)
        return block


def _record_round(block: Block) -> int | None:
    try:
        return AgreedRecord.from_block(block).round
    except DecodeError:
        return None


async def heads_heard(session: AgreedSession, peers: tuple[str, ...], round_number: int) -> None:
    async def ready() -> bool:
        heads = session.board.heads
        return all(p in heads and heads[p].round == round_number for p in peers)

    await apoll_until(ready, timeout=5.0, what=f"the round-{round_number} heads")


async def test_a_head_refused_for_a_fetch_timeout_is_adopted_once_its_back_off_passed() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    settings = config(Admission("allow-list", allow=()))
    genesis, sessions = await started(store, bus, [settings] * 3)
    slow = SlowStore(store, 0)
    late = None
    try:
        results = await run(sessions)
        head = results[0].record
        await sessions[0].aclose()  # peer-a restarts from nothing, reading through a slow view
        late = AgreedSession(slow, bus.endpoint(PEERS[0]), SESSION, genesis, settings)
        await late.start(initial_model())
        await heads_heard(late, PEERS[1:], 0)

        refused_at = time.monotonic()
        first = await late.resync(timeout=5.0)
        assert not first.changed
        assert "BlockTimeout" in first.refused[PEERS[1]]
        again = await late.resync(timeout=5.0)  # within the back-off: not fetched again
        assert not again.changed
        assert slow.asked[bytes(head)] == 1

        async def adopted() -> bool:
            return (await late.resync(timeout=5.0)).changed

        await apoll_until(adopted, timeout=4 * FETCH_TIMEOUT, what="the retried head")
        assert time.monotonic() - refused_at >= FETCH_TIMEOUT
        assert (late.round, late.head) == (1, head)
        assert slow.asked[bytes(head)] >= 2
    finally:
        await close([*sessions[1:], *([late] if late is not None else [])])


async def test_a_joiner_whose_first_fetch_times_out_is_still_admitted_at_its_round() -> None:
    """Every head is heard when the fetch fails: the join retries it, not the next round's."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    settings = config(Admission("allow-list", allow=(NEW,)))
    genesis, sessions = await started(store, bus, [settings] * 3)
    slow = SlowStore(store, 1)
    joiner = AgreedSession(slow, bus.endpoint(NEW), SESSION, genesis, settings)
    try:
        await run(sessions)
        joining = asyncio.create_task(joiner.join(initial_model(), timeout=60.0))
        await held(sessions, "the join", lambda t: NEW in t.joins)
        admitted = await run(sessions)
        admitting = admitted[0].record
        resynced = await joining  # no further round runs: only a retry can admit it
        assert resynced.changed
        assert (joiner.round, joiner.head) == (2, admitting)
        assert slow.asked[bytes(admitting)] >= 2
        after = await run([*sessions, joiner])
        assert len({bytes(r.record) for r in after}) == 1
        assert set(after[0].roster.peers) == {*PEERS, NEW}
    finally:
        await close([*sessions, joiner])


class HeldBack(PubsubWrapper):
    """A transport that holds ``sender``'s messages until :attr:`released` is set."""

    def __init__(self, inner: PubsubTransport, sender: str) -> None:
        super().__init__(inner)
        self.sender, self.released = sender, asyncio.Event()

    def subscribe(self, topic: str) -> AsyncIterator[PubsubMessage]:
        return self._held(self.inner.subscribe(topic))

    async def _held(self, messages: AsyncIterator[PubsubMessage]) -> AsyncIterator[PubsubMessage]:
        async for message in messages:
            if message.from_peer == self.sender and not self.released.is_set():
                continue  # lost, like a message the mesh has not relayed yet: re-announced
            yield message


class HeadArrivesDuringFetch(StoreWrapper):
    """The first get of round 0's record lets the held head in and waits until it is heard."""

    def __init__(self, store: MemoryBlockStore, held: HeldBack) -> None:
        super().__init__(store)
        self.held = held
        self.session: AgreedSession | None = None  # the reader, set once it exists
        self.fired = False

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        block = await self.store.get(cid, timeout=timeout)
        if not self.fired and _record_round(block) == 0 and self.session is not None:
            self.fired = True
            self.held.released.set()
            board = self.session.board

            async def heard() -> bool:
                return self.held.sender in board.heads

            await apoll_until(heard, timeout=5.0, what="the held head")
        return block


async def test_a_head_heard_while_the_last_choice_was_made_ends_the_wait_for_votes() -> None:
    """The choice saw one vote of three; the second arrived during its fetch: adopted at once.

    Waiting for heads "different from those heard now" would wait for a change that already
    came (the members are idle, their heads never change again) until the resync's timeout.
    """
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis, sessions = await started(store, bus, [config(Admission("allow-list", allow=()))] * 3)
    late = None
    try:
        results = await run(sessions)
        await sessions[0].aclose()  # peer-a restarts from nothing; peer-c's head comes late
        held = HeldBack(bus.endpoint(PEERS[0]), PEERS[2])
        hook = HeadArrivesDuringFetch(store, held)
        late = AgreedSession(hook, held, SESSION, genesis, sessions[0].config)
        hook.session = late
        await late.start(initial_model())
        await heads_heard(late, PEERS[1:2], 0)
        resynced = await late.resync(timeout=20.0)
        assert hook.fired
        assert resynced.changed, resynced.refused
        assert (late.round, late.head) == (1, results[0].record)
    finally:
        await close([*sessions[1:], *([late] if late is not None else [])])
