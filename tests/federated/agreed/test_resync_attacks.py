"""Issue 32, attack 3: heads a member announces are checked before anyone adopts them.

In-memory bus, one shared block store. A member (``peer-c``, honest for 3 rounds) announces
``done`` for heads that must not be adopted: a round-3 record extending the real head with a
stored fake model and a roster nobody serves; a round of 2**53 - 1 naming a missing record;
a record of another genesis; a verifiable record only it voted for.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Sequence

import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs._types import CIDLike
from gradfed_ipfs.block import Block
from gradfed_ipfs.cid import make_cid, parse_cid
from gradfed_ipfs.errors import NoVerifiableHead, RoundVerificationFailed
from gradfed_ipfs.federated.agreed import (
    AgreedConfig,
    AgreedSession,
    ResyncResult,
    count_votes,
    has_majority,
    verify_agreed_history,
)
from gradfed_ipfs.federated.agreed.round.coordinator import Head
from gradfed_ipfs.formats.agreed.roster import AgreedRecord, Roster
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore, put_gradient
from gradfed_ipfs.storage.base import UNSET, Unset
from gradfed_ipfs.tensor.deterministic import deterministic_update
from tests.adversarial.hostile import FORGED_FILL, forged_head
from tests.helpers import MEMORY_KEYS, roster_signature, signed_entry
from tests.polling import apoll_until

D = 1000
FAST = {
    "collect_timeout": 0.3,
    "takeover_timeout": 0.3,
    "round_timeout": 8.0,
    "done_timeout": 1.0,
    "announce_interval": 0.02,
    "max_announce_interval": 0.2,
    "fetch_timeout": 2.0,
}
EVIL = "peer-c"


class CountingStore(MemoryBlockStore):
    """A memory store that counts the gets of each CID (found or not)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: Counter[bytes] = Counter()

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        self.asked[bytes(parse_cid(cid))] += 1
        return await super().get(cid, timeout=timeout)


@pytest.fixture
async def store() -> AsyncIterator[CountingStore]:
    async with CountingStore() as s:
        yield s


def initial_model() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(D).astype(np.float32)


def delta(peer: int, round_number: int) -> np.ndarray:
    return (0.01 * np.random.default_rng([peer, round_number]).standard_normal(D)).astype(
        np.float32
    )


class Session:
    """The members, the bus and the genesis of one test session."""

    def __init__(self, store: CountingStore, members: tuple[str, ...]) -> None:
        self.store, self.members, self.bus = store, members, MemoryPubsubBus()
        self.config = AgreedConfig(members=members, min_peers=3, **FAST)  # type: ignore[arg-type]
        self.genesis: CID | None = None
        self.open: list[AgreedSession] = []

    async def join(self, peer: str) -> AgreedSession:
        if self.genesis is None:
            self.genesis = await AgreedSession.commit_genesis(self.store, initial_model())
        transport = self.bus.endpoint(peer)
        session = AgreedSession(self.store, transport, "s1", self.genesis, self.config)
        await session.start(initial_model())
        self.open.append(session)
        return session

    async def honest_rounds(self, sessions: Sequence[AgreedSession], rounds: int) -> None:
        for _ in range(rounds):
            results = await asyncio.gather(
                *(s.run_round(delta(i, s.round), weight=1 + i) for i, s in enumerate(sessions))
            )
            assert len({str(r.record) for r in results}) == 1

    async def close(self) -> None:
        for session in self.open:
            await session.aclose()


@pytest.fixture
async def three(store: CountingStore) -> AsyncIterator[Session]:
    s = Session(store, ("peer-a", "peer-b", EVIL))
    yield s
    await s.close()


@pytest.fixture
async def four(store: CountingStore) -> AsyncIterator[Session]:
    """peer-d joins late: peer-a, peer-b and the evil peer-c ran the honest rounds."""
    s = Session(store, ("peer-a", "peer-b", EVIL, "peer-d"))
    yield s
    await s.close()


async def heard(session: AgreedSession, peer: str, round_number: int) -> None:
    """Wait until ``session`` has heard ``peer``'s head of ``round_number``."""

    async def ready() -> bool:
        head = session.board.heads.get(peer)
        return head is not None and head.round == round_number

    await apoll_until(ready, timeout=5.0, what=f"{peer}'s round-{round_number} head")


async def announce(evil: AgreedSession, round_number: int, result: CID, record: CID) -> None:
    """The evil member announces (and keeps announcing) ``record`` as its head."""
    await evil._parts.messages.done(round_number, result, record)


async def late_peer_resyncs_to_honest(
    late: AgreedSession, honest: AgreedSession, round_number: int
) -> ResyncResult:
    for peer in ("peer-a", "peer-b"):
        await heard(late, peer, 2)
    await heard(late, EVIL, round_number)
    synced = await late.resync(timeout=5.0)
    assert synced.changed
    assert (synced.round, synced.head, synced.model) == (3, honest.head, honest.model_cid)
    np.testing.assert_array_equal(late.model, honest.model)
    assert EVIL in synced.refused
    assert "peer-a" not in synced.refused
    return synced


async def test_forged_head_with_stored_fake_model_is_refused(three: Session) -> None:
    a, b, evil = [await three.join(p) for p in three.members]
    await three.honest_rounds([a, b, evil], 3)
    honest_model, honest_head = b.model.copy(), b.head
    assert honest_head is not None
    result, record = await forged_head(three.store, honest_head, D)
    with pytest.raises(RoundVerificationFailed):  # control: the verifier rejects it
        await verify_agreed_history(three.store, record, session="s1", genesis=three.genesis)
    await announce(evil, 3, result, record)

    await heard(b, EVIL, 3)
    stays = await b.resync(timeout=2.0)  # the honest peer
    assert not stays.changed
    assert (b.round, b.head) == (3, honest_head)
    np.testing.assert_array_equal(b.model, honest_model)
    assert str(record) in stays.refused[EVIL]

    await a.aclose()  # peer-a restarts, from nothing
    restarted = await three.join("peer-a")
    await heard(restarted, "peer-b", 2)
    await heard(restarted, EVIL, 3)
    synced = await restarted.resync(timeout=5.0)
    assert synced.changed
    assert (synced.round, synced.head) == (3, honest_head)
    np.testing.assert_array_equal(restarted.model, honest_model)
    assert float(np.mean(restarted.model)) != pytest.approx(FORGED_FILL)
    assert "Block" in synced.refused[EVIL]  # its roster is nowhere
    assert synced.recomputed == 3  # every round it had not followed was re-aggregated


async def test_done_at_the_last_round_naming_a_missing_record_is_forgotten(
    four: Session,
) -> None:
    a, b, evil = [await four.join(p) for p in four.members[:3]]
    await four.honest_rounds([a, b, evil], 3)
    late = await four.join("peer-d")
    missing = Roster.new("s1", four.genesis, 0, a.model_cid, "x", [], {}).to_block().cid
    await announce(evil, 2**53 - 1, a.model_cid, missing)

    synced = await late_peer_resyncs_to_honest(late, b, 2**53 - 1)
    assert "BlockNotFound" in synced.refused[EVIL]
    assert four.store.asked[bytes(missing)] == 1
    again = await late.resync(timeout=1.0)  # re-announced: not fetched again
    assert not again.changed
    assert EVIL in again.refused
    assert four.store.asked[bytes(missing)] == 1


async def test_done_naming_a_record_of_another_genesis_is_ignored(four: Session) -> None:
    a, b, evil = [await four.join(p) for p in four.members[:3]]
    await four.honest_rounds([a, b, evil], 3)
    late = await four.join("peer-d")
    other = await put_gradient(four.store, initial_model() + 1)
    roster = Roster.new("s1", other, 5, other, EVIL, [EVIL], {EVIL: (other, 1)})
    roster_cid = await four.store.put(roster.to_block())
    foreign = AgreedRecord("s1", other, 5, None, other, roster_cid, other, 1.0)
    record = await four.store.put(foreign.to_block())
    await announce(evil, 5, other, record)

    synced = await late_peer_resyncs_to_honest(late, b, 5)
    assert "belongs to" in synced.refused[EVIL]


async def test_head_with_votes_from_a_minority_of_its_roster_is_refused(
    four: Session,
) -> None:
    a, b, evil = [await four.join(p) for p in four.members[:3]]
    await four.honest_rounds([a, b, evil], 3)
    late = await four.join("peer-d")
    # A round 3 that verifies (real contributions, the exact aggregate) but only evil votes for.
    store, base = four.store, b.model
    grads = [delta(i, 3) for i in range(3)]
    cids = [await put_gradient(store, g) for g in grads]
    entries = {  # the members' own signed contributions (evil relays them)
        p: await signed_entry("s1", four.genesis, 3, b.model_cid, p, c, 1 + i)
        for i, (p, c) in enumerate(zip(four.members[:3], cids, strict=True))
    }
    roster = Roster.new("s1", four.genesis, 3, b.model_cid, EVIL, four.members, entries)
    model = deterministic_update(base, grads, [1, 2, 3], 1.0)
    result = await put_gradient(store, model)
    block = AgreedRecord(
        "s1", four.genesis, 3, b.head, b.model_cid, await store.put(roster.to_block()), result,
        1.0, roster_signature=await roster_signature(roster),  # its own roster, signed
    ).to_block()  # fmt: skip
    record = await store.put(block)
    checked = await verify_agreed_history(
        store, record, session="s1", genesis=four.genesis, keys=MEMORY_KEYS
    )
    assert len(checked) == 4  # control: only its votes are wrong
    await announce(evil, 3, result, record)

    synced = await late_peer_resyncs_to_honest(late, b, 3)
    assert "votes from 1 of its roster's 3 peers" in synced.refused[EVIL]
    stays = await b.resync(timeout=1.0)
    assert not stays.changed
    assert b.head != record


async def test_nothing_verifiable_with_a_majority_behind_it_is_a_typed_error(
    four: Session,
) -> None:
    """The honest majority's head cannot be re-aggregated (a contribution is gone)."""
    a, b, evil = [await four.join(p) for p in four.members[:3]]
    await four.honest_rounds([a, b, evil], 1)
    late = await four.join("peer-d")
    record = await four.store.get(a.head)  # type: ignore[arg-type]
    roster = await four.store.get(AgreedRecord.from_block(record).roster)
    gone = Roster.from_block(roster).entries[0].contribution
    await four.store.delete(gone)  # its manifest: the round cannot be recomputed
    for peer in ("peer-a", "peer-b", EVIL):
        await heard(late, peer, 0)
    with pytest.raises(NoVerifiableHead) as caught:
        await late.resync(timeout=2.0)
    assert set(caught.value.refused) == {"peer-a", "peer-b", EVIL}
    assert late.round == 0
    assert late.head is None


def test_votes_count_roster_peers_and_later_heads_that_extend_the_record() -> None:
    x, y, z = (Roster.new("s1", make_cid(b"g"), r, make_cid(b"g"), "x", [], {}).to_block().cid
               for r in range(3))  # fmt: skip
    heads = {
        "peer-a": Head(0, x, x),
        "peer-b": Head(1, y, y),  # y extends x
        "peer-c": Head(2, z, z),  # z is not linked
        "stranger": Head(0, x, x),
    }
    links = {bytes(y): bytes(x), bytes(z): None}
    roster = ("peer-a", "peer-b", "peer-c")
    assert count_votes(heads, x, roster) == {"peer-a"}
    assert count_votes(heads, x, roster, links) == {"peer-a", "peer-b"}
    assert has_majority({"peer-a", "peer-b"}, roster)
    assert not has_majority({"peer-a", "stranger"}, roster)
    assert not has_majority({"peer-a"}, ("peer-a", "peer-b"))  # half is not more than half
