"""Agreed rounds in one process: MemoryPubsubBus peers sharing one MemoryBlockStore."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs import AgreedConfig, AgreedRoundResult, AgreedSession, verify_agreed_history
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import (
    BlockNotFound,
    BlockTimeout,
    DecodeError,
    GenesisMismatch,
    QuorumNotReached,
    RoundMismatch,
)
from gradfed_ipfs.formats import PubsubMessage
from gradfed_ipfs.formats.agreed.roster import AgreedMessage, open_message
from gradfed_ipfs.kubo import MemoryPubsubBus, PubsubTransport
from gradfed_ipfs.storage import MemoryBlockStore, fetch_gradient
from tests.helpers import signed
from tests.multiprocess.lossy import LossyPubsub
from tests.polling import apoll_until

PEERS = ("peer-a", "peer-b", "peer-c")
D = 1000
FAST = {
    "collect_timeout": 1.0,
    "takeover_timeout": 0.5,
    "round_timeout": 8.0,
    "done_timeout": 1.0,
    "announce_interval": 0.02,
    "fetch_timeout": 2.0,
}


def initial_model(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(D).astype(np.float32)


def delta(peer: int, round_number: int) -> np.ndarray:
    rng = np.random.default_rng([peer, round_number])
    return (0.01 * rng.standard_normal(D)).astype(np.float32)


async def make_sessions(
    store: MemoryBlockStore,
    transports: Sequence[PubsubTransport],
    genesis: object,
    **settings: object,
) -> list[AgreedSession]:
    config = AgreedConfig(members=PEERS, **{**FAST, **settings})  # type: ignore[arg-type]
    sessions = [AgreedSession(store, t, "s1", genesis, config) for t in transports]  # type: ignore[arg-type]
    for session in sessions:
        await session.start(initial_model())
    return sessions


@pytest.fixture
async def store() -> AsyncIterator[MemoryBlockStore]:
    async with MemoryBlockStore() as s:
        yield s


async def run_all(
    sessions: Sequence[AgreedSession], indices: Sequence[int]
) -> list[AgreedRoundResult]:
    return list(
        await asyncio.gather(
            *(
                s.run_round(delta(i, s.round), weight=1 + i)
                for s, i in zip(sessions, indices, strict=True)
            )
        )
    )


async def close(sessions: Sequence[AgreedSession]) -> None:
    for session in sessions:
        await session.aclose()


async def one_full_round(
    session: str = "s1",
) -> tuple[MemoryBlockStore, MemoryPubsubBus, CID, list[AgreedRoundResult]]:
    """Round 0 of every member of ``PEERS`` over one memory bus and store (sessions closed)."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    config = AgreedConfig(members=PEERS, **FAST)  # type: ignore[arg-type]
    sessions = [AgreedSession(store, bus.endpoint(p), session, genesis, config) for p in PEERS]
    for one in sessions:
        await one.start(initial_model())
    try:
        return store, bus, genesis, await run_all(sessions, range(len(PEERS)))
    finally:
        await close(sessions)


async def test_three_peers_with_lossy_peer_agree_every_round(store: MemoryBlockStore) -> None:
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    lossy = LossyPubsub(bus.endpoint(PEERS[2]), loss=0.2, seed=7)
    transports = [bus.endpoint(PEERS[0]), bus.endpoint(PEERS[1]), lossy]
    sessions = await make_sessions(store, transports, genesis)
    reference = initial_model().astype(np.float64)
    try:
        for r in range(8):
            results = await run_all(sessions, [0, 1, 2])
            assert len({str(res.model) for res in results}) == 1, r
            assert len({str(res.record) for res in results}) == 1, r
            for res in results:
                assert res.roster.peers == tuple(sorted(PEERS))
                assert res.absent == ()
                assert res.included
            weights = np.array([1.0, 2.0, 3.0]) / 6.0
            step = sum(w * delta(i, r).astype(np.float64) for i, w in enumerate(weights))
            reference = (reference + step).astype(np.float32).astype(np.float64)
        assert lossy.dropped > 0
        model = await fetch_gradient(store, sessions[0].model_cid)
        np.testing.assert_allclose(model, reference, rtol=0, atol=1e-6)
        records = await verify_agreed_history(
            store, sessions[0].head, keys=bus.keys, session="s1", genesis=genesis
        )  # type: ignore[arg-type]
        assert [rec.round for rec in records] == list(range(8))
    finally:
        await close(sessions)


async def test_model_update_rule_is_exact(store: MemoryBlockStore) -> None:
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    sessions = await make_sessions(
        store, [bus.endpoint(p) for p in PEERS], genesis, learning_rate=0.5
    )
    try:
        await run_all(sessions, [0, 1, 2])
        acc = sum((w / 6) * delta(i, 0).astype(np.float64) for i, w in enumerate([1, 2, 3]))
        expected = (initial_model().astype(np.float64) + 0.5 * acc).astype(np.float32)
        np.testing.assert_array_equal(sessions[1].model, expected)
    finally:
        await close(sessions)


async def test_peer_from_another_model_is_refused(store: MemoryBlockStore) -> None:
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    session = AgreedSession(store, bus.endpoint(PEERS[0]), "s1", genesis, AgreedConfig(PEERS))
    with pytest.raises(GenesisMismatch, match="refusing to join"):
        await session.start(initial_model(seed=1))


async def test_min_peers_is_a_real_minimum(store: MemoryBlockStore) -> None:
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    sessions = await make_sessions(
        store, [bus.endpoint(p) for p in PEERS[:2]], genesis, round_timeout=1.5
    )
    try:
        outcomes = await asyncio.gather(
            *(s.run_round(delta(0, 0)) for s in sessions), return_exceptions=True
        )
        for outcome in outcomes:
            assert isinstance(outcome, QuorumNotReached)
            assert (outcome.have, outcome.need) == (2, 3)
        assert all(s.round == 0 for s in sessions)
    finally:
        await close(sessions)


async def test_absent_peer_is_named_and_late_peer_resyncs_then_contributes(
    store: MemoryBlockStore,
) -> None:
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    transports = [bus.endpoint(p) for p in PEERS]
    sessions = await make_sessions(store, transports[:2], genesis, min_peers=2)
    late: list[AgreedSession] = []
    try:
        for _ in range(3):
            results = await run_all(sessions, [0, 1])
            assert results[0].absent == (PEERS[2],)
            assert results[0].roster.peers == PEERS[:2]
            assert results[0].model == results[1].model
        late = await make_sessions(store, transports[2:], genesis, min_peers=2)
        synced = await late[0].resync(timeout=5.0)
        assert synced.changed
        assert (synced.round, synced.model) == (3, sessions[0].model_cid)
        assert len(synced.records) == 3
        np.testing.assert_array_equal(late[0].model, sessions[0].model)
        results = await run_all([*sessions, *late], [0, 1, 2])
        assert len({str(res.model) for res in results}) == 1
        assert all(res.roster.peers == PEERS for res in results)
    finally:
        await close([*sessions, *late])


async def test_diverging_peer_raises_and_resync_repairs_it(store: MemoryBlockStore) -> None:
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    honest = await make_sessions(store, [bus.endpoint(p) for p in PEERS[:2]], genesis)
    # A peer with another learning rate computes another model from the same roster.
    odd = await make_sessions(store, [bus.endpoint(PEERS[2])], genesis, learning_rate=0.5)
    sessions = [*honest, *odd]
    try:
        outcomes = await asyncio.gather(
            *(s.run_round(delta(i, 0), weight=1 + i) for i, s in enumerate(sessions)),
            return_exceptions=True,
        )
        # The honest majority's record wins: only the odd peer is told to resync.
        assert isinstance(outcomes[2], RoundMismatch), outcomes
        assert outcomes[2].theirs.keys() == set(PEERS[:2])
        for outcome in outcomes[:2]:
            assert isinstance(outcome, AgreedRoundResult)
            assert "announced record" in outcome.rejected[PEERS[2]]
            assert not outcome.matched
        synced = await odd[0].resync(timeout=5.0)
        assert synced.changed
        assert odd[0].model_cid == honest[0].model_cid
        assert odd[0].head == honest[0].head
        assert not (await honest[0].resync(timeout=1.0)).changed
    finally:
        await close(sessions)


class HoldDone(LossyPubsub):
    """Drops incoming ``done`` messages while ``hold`` is set (nothing else)."""

    def __init__(self, inner: PubsubTransport) -> None:
        super().__init__(inner, loss=0.0, seed=0)
        self.hold = True

    async def _lossy(self, messages: AsyncIterator[PubsubMessage]) -> AsyncIterator[PubsubMessage]:
        async for message in messages:
            if not (self.hold and b'"kind":"done"' in message.data):
                yield message


async def test_without_done_wait_a_divergence_is_caught_when_the_next_round_starts(
    store: MemoryBlockStore,
) -> None:
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    settings = {"done_timeout": 0.0, "min_peers": 2}
    honest = await make_sessions(store, [bus.endpoint(p) for p in PEERS[:2]], genesis, **settings)
    held = HoldDone(bus.endpoint(PEERS[2]))
    odd = await make_sessions(store, [held], genesis, learning_rate=0.5, **settings)
    sessions = [*honest, *odd]
    try:
        first = await run_all(sessions, [0, 1, 2])  # the odd peer hears no done: no error yet
        assert first[0].model == first[1].model != first[2].model
        assert not first[2].matched
        held.hold = False  # the re-announced done messages now arrive
        assert await odd[0].board.wait_until(lambda: len(odd[0].board.state(0).done) == 2, 5.0)
        with pytest.raises(RoundMismatch) as caught:
            await odd[0].run_round(delta(2, 1))
        assert caught.value.round == 0
        await odd[0].resync(timeout=5.0)
        assert odd[0].head == honest[0].head
        np.testing.assert_array_equal(odd[0].model, honest[0].model)
    finally:
        await close(sessions)


async def test_contributions_are_fetched_while_a_peer_is_between_rounds(
    store: MemoryBlockStore,
) -> None:
    """A peer still training for round r already fetches the round-r contributions it heard."""
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    sessions = await make_sessions(store, [bus.endpoint(p) for p in PEERS], genesis)
    try:
        await run_all(sessions, [0, 1, 2])
        fast = [
            asyncio.create_task(s.run_round(delta(i, 1), weight=1 + i))
            for i, s in ((0, sessions[0]), (2, sessions[2]))
        ]
        slow = sessions[1]

        async def fetched_before_contributing() -> bool:
            heard = slow.board.state(1).contributions
            tasks = [slow._fetcher.get(c.cid) for c in heard.values()]
            return len(tasks) == 2 and all(t is not None and t.done() for t in tasks)

        await apoll_until(fetched_before_contributing, timeout=5.0, what="prefetched blocks")
        assert slow.round == 1  # it has not started round 1: nothing asked for these fetches
        results = [await slow.run_round(delta(1, 1), weight=2), *await asyncio.gather(*fast)]
        assert len({str(r.model) for r in results}) == 1
        assert all(r.roster.peers == PEERS for r in results)
    finally:
        await close(sessions)


class KuboLikeStore(MemoryBlockStore):
    """A missing block ends in ``BlockTimeout``, as a Kubo fetch does after its timeout."""

    async def get(self, cid, *, timeout=None):  # type: ignore[no-untyped-def,override]
        try:
            return await super().get(cid)
        except BlockNotFound as exc:
            raise BlockTimeout(f"{cid}: still on its way, or nowhere") from exc


async def test_a_roster_nobody_serves_does_not_hold_the_round() -> None:
    # A member announces a roster CID that no daemon has (and no inline bytes); honest peers
    # must give up on it after one fetch timeout and close the round with their own roster.
    # (A skew margin of a minute: its sender's takeover time has come, so it is fetched.)
    async with KuboLikeStore() as store:
        bus = MemoryPubsubBus()
        genesis = await AgreedSession.commit_genesis(store, initial_model())
        sessions = await make_sessions(
            store, [bus.endpoint(p) for p in PEERS[:2]], genesis, min_peers=2, takeover_skew=60.0
        )
        bogus = make_cid(b"a roster nobody stored", "dag-cbor")
        message = AgreedMessage("roster", "s1", genesis, 0, PEERS[2], bogus)
        await bus.endpoint(PEERS[2]).publish(sessions[0].topic, await signed(message, bus))
        try:
            results = await run_all(sessions, [0, 1])
        finally:
            await close(sessions)
    assert results[0].model == results[1].model
    assert all(r.roster.peers == PEERS[:2] for r in results)
    assert all(f"roster {bogus}" in r.rejected for r in results)


class _DeafToRound(LossyPubsub):
    """Drops every incoming agreed message of one round (a peer that missed all of it), or only
    those of ``kinds``; messages of other topics pass."""

    def __init__(
        self, inner: PubsubTransport, round_number: int, kinds: tuple[str, ...] | None = None
    ) -> None:
        super().__init__(inner, loss=0.0, seed=0)
        self.round_number, self.kinds = round_number, kinds

    async def _lossy(self, messages: AsyncIterator[PubsubMessage]) -> AsyncIterator[PubsubMessage]:
        async for message in messages:
            try:
                decoded, _ = open_message(message.data, self.keys)
            except DecodeError:
                yield message  # not an agreed message (a slice board's)
                continue
            if decoded.round == self.round_number and (
                self.kinds is None or decoded.kind in self.kinds
            ):
                self.dropped += 1
                continue
            yield message


async def test_a_peer_that_missed_a_whole_round_finds_its_roster_from_a_later_record(
    store: MemoryBlockStore,
) -> None:
    """Peer c hears nothing of round 1 (no roster, no ``done``: they are re-announced only
    until their senders' next round). Once a and b finish round 2 without it, c walks their
    round-2 record back to round 1's and adopts that roster; before, it waited until
    ``round_timeout`` and raised ``QuorumNotReached``, and retrying could never succeed."""
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    deaf = _DeafToRound(bus.endpoint(PEERS[2]), round_number=1)
    transports = [bus.endpoint(PEERS[0]), bus.endpoint(PEERS[1]), deaf]
    sessions = await make_sessions(store, transports, genesis, min_peers=2, round_timeout=60.0)
    try:
        await run_all(sessions, [0, 1, 2])  # round 0, all three
        late = asyncio.ensure_future(sessions[2].run_round(delta(2, 1), weight=3))
        first = await run_all(sessions[:2], [0, 1])  # round 1 (with c's contribution)
        second = await run_all(sessions[:2], [0, 1])  # round 2, without c
        assert all(res.absent == (PEERS[2],) for res in second)
        caught_up = await asyncio.wait_for(late, 30.0)  # well before round_timeout
        assert caught_up.record == first[0].record
        assert deaf.dropped > 0
        third = await sessions[2].run_round(delta(2, 2), weight=3)  # round 2's messages heard
        assert third.record == second[0].record
    finally:
        await close(sessions)


async def test_a_restarted_peer_without_resync_is_told_at_once_that_it_fell_behind(
    store: MemoryBlockStore,
) -> None:
    """A member restarted at round 0 (no resync) while the others are rounds ahead gets
    ``RoundMismatch`` once most members' heads are two rounds past it, not after
    ``round_timeout`` (60 s here; the wait for it is bounded at 20 s), then resyncs and joins in."""
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    transports = [bus.endpoint(p) for p in PEERS]
    sessions = await make_sessions(store, transports[:2], genesis, min_peers=2)
    restarted: list[AgreedSession] = []
    try:
        for _ in range(3):
            await run_all(sessions, [0, 1])
        restarted = await make_sessions(
            store, transports[2:], genesis, min_peers=2, round_timeout=60.0
        )
        heard = restarted[0].board.heads  # the others re-announce their round-2 heads

        async def both_heads() -> bool:
            return len(heard) == 2

        await apoll_until(both_heads, timeout=5.0, what="the others' heads")
        others = asyncio.ensure_future(run_all(sessions, [0, 1]))  # round 3, without it
        with pytest.raises(RoundMismatch) as caught:
            await asyncio.wait_for(restarted[0].run_round(delta(2, 0), weight=3), 20.0)
        assert set(caught.value.theirs) == set(PEERS[:2])
        await others
        synced = await restarted[0].resync(timeout=5.0)
        assert (synced.round, synced.model) == (4, sessions[0].model_cid)
        results = await run_all([*sessions, *restarted], [0, 1, 2])
        assert len({str(res.model) for res in results}) == 1
        assert results[0].roster.peers == PEERS
    finally:
        await close([*sessions, *restarted])
