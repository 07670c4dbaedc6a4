"""Reduce-scatter inside AgreedSession (issue 14): one process, MemoryPubsubBus peers."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from functools import partial

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedRoundResult, AgreedSession, verify_agreed_history
from gradfed_ipfs._types import FloatArray
from gradfed_ipfs.block import Block
from gradfed_ipfs.errors import RoundVerificationFailed
from gradfed_ipfs.federated.agreed.finished import check_finished_round
from gradfed_ipfs.federated.agreed.history import verify_agreed_round
from gradfed_ipfs.federated.agreed.round.coordinator import coordinator_ranking
from gradfed_ipfs.federated.agreed.slicing import (
    AUTO_MIN_MEMBERS,
    RobustRule,
    choose_slicing,
)
from gradfed_ipfs.federated.sliced import Lying, Silent, SliceFaults
from gradfed_ipfs.federated.sliced.peer import CountingStore
from gradfed_ipfs.federated.sliced.plan import reduce_values
from gradfed_ipfs.formats import PubsubMessage
from gradfed_ipfs.formats.agreed.roster import AgreedMessage, AgreedRecord
from gradfed_ipfs.formats.sliced.slices import SliceRecord
from gradfed_ipfs.kubo import MemoryPubsubBus, PubsubTransport
from gradfed_ipfs.storage import BlockStore, MemoryBlockStore, put_gradient
from gradfed_ipfs.storage.dag import fetch_manifest
from gradfed_ipfs.tensor.aggregation import Krum, MultiKrum, TrimmedMean
from gradfed_ipfs.tensor.bulyan import Bulyan
from gradfed_ipfs.tensor.deterministic import deterministic_update
from gradfed_ipfs.tensor.robust import coordinate_median, trimmed_mean
from tests.federated.agreed.test_rounds import _DeafToRound
from tests.federated.sliced.hostile import Censor, HidingLiar
from tests.helpers import MEMORY_KEYS, signed
from tests.multiprocess.lossy import LossyPubsub

PEERS = ("peer-a", "peer-b", "peer-c", "peer-d")
D = 131_072  # 9 chunks of 64 KiB: four chunk-aligned slices
CHUNK = 65_536
LR = 0.5
FAST = {
    "collect_timeout": 1.0,
    "takeover_timeout": 0.5,
    "round_timeout": 15.0,
    "done_timeout": 1.0,
    "announce_interval": 0.02,
    "fetch_timeout": 2.0,
    "reducer_timeout": 0.3,
    "chunk_bytes": CHUNK,
    "learning_rate": LR,
}


def initial_model(d: int = D) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(d).astype(np.float32)


def gradient(peer: int, round_number: int, d: int = D) -> np.ndarray:
    return np.random.default_rng([peer, round_number]).standard_normal(d).astype(np.float32)


class Peers:
    """Sessions on one bus and one shared store, each counting its own downloads."""

    def __init__(self, store: MemoryBlockStore, bus: MemoryPubsubBus) -> None:
        self.store, self.bus = store, bus
        self.sessions: list[AgreedSession] = []
        self.counting: list[CountingStore] = []

    async def start(
        self,
        peers: Sequence[str],
        members: Sequence[str] = PEERS,
        d: int = D,
        faults: Mapping[int, SliceFaults] | None = None,
        **settings: object,
    ) -> object:
        """Start ``peers`` (``faults``: the reducer hooks of the sessions at those indexes)."""
        genesis = await AgreedSession.commit_genesis(self.store, initial_model(d))
        config = AgreedConfig(members=tuple(members), **{**FAST, **settings})  # type: ignore[arg-type]
        for i, peer in enumerate(peers):
            counting = CountingStore(self.store)
            session = AgreedSession(
                counting,  # type: ignore[arg-type]
                self.bus.endpoint(peer),
                "rs",
                genesis,  # type: ignore[arg-type]
                config,
                faults=(faults or {}).get(i),
            )
            await session.start(initial_model(d))
            counting.downloaded = 0  # the genesis fetch is not the round's
            self.sessions.append(session)
            self.counting.append(counting)
        return genesis

    async def round(self, r: int, d: int = D) -> list[AgreedRoundResult]:
        return list(
            await asyncio.gather(
                *(
                    s.run_round(gradient(PEERS.index(s.peer_id), r, d), weight=1 + i)
                    for i, s in enumerate(self.sessions)
                )
            )
        )

    async def close(self) -> None:
        for session in self.sessions:
            await session.aclose()


async def run_rounds(
    aggregation: str, rounds: int = 1, **settings: object
) -> tuple[list[list[AgreedRoundResult]], Peers, object]:
    peers = Peers(MemoryBlockStore(), MemoryPubsubBus())
    genesis = await peers.start(PEERS, aggregation=aggregation, **settings)
    try:
        return [await peers.round(r) for r in range(rounds)], peers, genesis
    finally:
        await peers.close()


async def reference(round_results: AgreedRoundResult, base: np.ndarray, r: int) -> np.ndarray:
    """The all-to-all update of a result's roster, recomputed in roster order."""
    entries = round_results.roster.entries
    grads = [gradient(PEERS.index(e.peer), r) for e in entries]
    return deterministic_update(base, grads, [e.weight for e in entries], LR)


async def test_reduce_scatter_rounds_equal_all_to_all_with_less_download_and_reverify() -> None:
    sliced, rs_peers, genesis = await run_rounds("reduce-scatter", rounds=2)
    whole, a2a_peers, _ = await run_rounds("all-to-all", rounds=2)
    for r in range(2):
        assert {res.aggregation for res in sliced[r]} == {"reduce-scatter"}
        assert {res.aggregation for res in whole[r]} == {"all-to-all"}
        # Same roster peers and weights, so the same model bytes and CID in both modes.
        assert (
            {res.model for res in sliced[r]}
            == {res.model for res in whole[r]}
            == {whole[r][0].model}
        )
        assert len({res.record for res in sliced[r]}) == 1
        assert all(len(res.slices) == len(PEERS) and not res.missing for res in sliced[r])
    base = initial_model()
    for r in range(2):
        want = await reference(sliced[r][0], base, r)
        assert (await put_gradient(MemoryBlockStore(), want)) == sliced[r][0].model
        base = want
    for rs, a2a in zip(rs_peers.counting, a2a_peers.counting, strict=True):
        # 2 rounds: all-to-all fetches 3 whole gradients a round, reduce-scatter ~2·3/4 of one
        # and 1/4 to verify a slice author's own check values: 7/12 of all-to-all.
        assert a2a.downloaded >= 2 * 3 * D * 4
        assert rs.downloaded <= 2 * 2.5 * D * 4
        assert rs.downloaded < 0.65 * a2a.downloaded
    head = sliced[1][0].record
    records = await verify_agreed_history(
        rs_peers.store, head, keys=MEMORY_KEYS, session="rs", genesis=genesis
    )  # type: ignore[arg-type]
    assert [rec.round for rec in records] == [0, 1]
    assert all(rec.slices is not None and len(rec.slices) == 4 for rec in records)


async def test_a_record_whose_slices_do_not_fit_its_roster_fails_verification() -> None:
    results, peers, _ = await run_rounds("reduce-scatter")
    store = peers.store
    record = AgreedRecord.from_block(await store.get(results[0][0].record))
    assert record.slices is not None
    first = SliceRecord.from_block(await store.get(record.slices[0]))
    forged = SliceRecord(**{**first.__dict__, "missing": (), "weight_sum": first.weight_sum + 1})
    bad = AgreedRecord(**{**record.__dict__, "slices": (forged.to_block().cid, *record.slices[1:])})
    await store.put(forged.to_block())
    bad_cid = await store.put(bad.to_block())
    with pytest.raises(RoundVerificationFailed, match="does not fit"):
        await verify_agreed_round(store, bad_cid)
    # A slice record that lies about its result (but fits the roster) is caught too.
    lie = await put_gradient(store, np.zeros(first.length, np.float32))
    liar = SliceRecord(**{**first.__dict__, "result": lie})
    await store.put(liar.to_block())
    lied = AgreedRecord(**{**record.__dict__, "slices": (liar.to_block().cid, *record.slices[1:])})
    with pytest.raises(RoundVerificationFailed, match="wrong result"):
        await verify_agreed_round(store, await store.put(lied.to_block()))


async def test_trimmed_mean_round_is_sliced_and_equals_its_all_to_all_round() -> None:
    rule = RobustRule(TrimmedMean(beta=0.25))
    assert rule.slice_rule == "trimmed_mean:0.25"
    sliced, peers, genesis = await run_rounds("reduce-scatter", rule=rule)
    whole, _, _ = await run_rounds("all-to-all", rule=rule)
    assert {res.aggregation for res in sliced[0]} == {"reduce-scatter"}
    assert {res.model for res in sliced[0]} == {whole[0][0].model}
    await verify_agreed_history(
        peers.store,
        sliced[0][0].record,
        keys=MEMORY_KEYS,
        session="rs",
        genesis=genesis,
        rule=rule,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("rule", ["trimmed_mean:0.2", "median"])
def test_robust_rules_per_slice_equal_the_whole_vector_bit_for_bit(rule: str) -> None:
    rng = np.random.default_rng(3)
    base = rng.standard_normal(10_000).astype(np.float32)
    rows = [rng.standard_normal(10_000).astype(np.float32) for _ in range(6)]
    whole = reduce_values(rule, base, rows, [1] * 6, 0.3)
    step = trimmed_mean(rows, 0.2) if rule != "median" else coordinate_median(rows)
    expected = (base.astype(np.float64) + 0.3 * step.astype(np.float64)).astype(np.float32)
    assert whole.tobytes() == expected.tobytes()  # the one trimmed-mean / median formula
    parts = [
        reduce_values(rule, base[a:b], [row[a:b] for row in rows], [1] * 6, 0.3)
        for a, b in [(0, 1), (1, 4097), (4097, 9999), (9999, 10_000)]
    ]
    assert np.concatenate(parts).tobytes() == whole.tobytes()


def test_choose_slicing_falls_back_for_whole_vector_rules_and_small_gradients() -> None:
    def config(aggregation: str, **more: object) -> AgreedConfig:
        return AgreedConfig(members=PEERS, aggregation=aggregation, **more)  # type: ignore[arg-type]

    rule, reason = choose_slicing(config("auto"), D)  # 4 members: all-to-all is as fast
    assert rule is None
    assert f"4 members < {AUTO_MIN_MEMBERS}" in reason
    eight = tuple(f"peer-{i}" for i in range(AUTO_MIN_MEMBERS))
    many = AgreedConfig(members=eight, aggregation="auto")
    assert choose_slicing(many, AUTO_MIN_MEMBERS * 4096)[0] == "fedavg"
    assert choose_slicing(config("reduce-scatter"), D)[0] == "fedavg"  # forced: any N
    rule, reason = choose_slicing(config("auto"), 1000)
    assert rule is None
    assert "too small" in reason
    for strategy in (Krum(f=1), MultiKrum(f=1, m=2), Bulyan(f=1)):
        rule, reason = choose_slicing(config("auto", rule=RobustRule(strategy)), D)
        assert rule is None
        assert "whole vectors" in reason
        rule, reason = choose_slicing(config("reduce-scatter", rule=RobustRule(strategy)), D)
        assert rule is None
        assert "whole vectors" in reason
    assert choose_slicing(config("reduce-scatter"), 1000)[0] == "fedavg"  # forced: any d >= n
    assert choose_slicing(config("all-to-all"), D)[0] is None
    with pytest.raises(ValueError, match="aggregation"):
        config("butterfly")


async def test_auto_runs_krum_and_tiny_gradients_all_to_all_and_says_why() -> None:
    krum, _, _ = await run_rounds("auto", rule=RobustRule(Krum(f=1)))
    assert {res.aggregation for res in krum[0]} == {"all-to-all"}
    assert all("whole vectors" in res.aggregation_reason for res in krum[0])
    assert len({res.model for res in krum[0]}) == 1
    assert not krum[0][0].slices
    peers = Peers(MemoryBlockStore(), MemoryPubsubBus())
    await peers.start(PEERS[:3], members=PEERS[:3], d=1000, aggregation="auto")
    try:
        tiny = await peers.round(0, d=1000)
    finally:
        await peers.close()
    assert {res.aggregation for res in tiny} == {"all-to-all"}
    assert all("too small" in res.aggregation_reason for res in tiny)


async def test_a_silent_reducer_is_taken_over_and_a_dead_peer_does_not_stop_the_round() -> None:
    # Three live sessions, one of them never reducing; the fourth member contributed, then died.
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    peers = Peers(store, bus)
    genesis = await peers.start(
        PEERS[:3],
        aggregation="reduce-scatter",
        done_timeout=0.0,
        fetch_timeout=1.0,
        faults={1: Silent()},  # session 1 never reduces
    )  # the dead peer sends no done and no projections: do not wait long for them
    dead = PEERS[3]
    contribution = await put_gradient(store, gradient(3, 0), chunk_bytes=CHUNK)
    message = AgreedMessage(
        "contrib",
        "rs",
        genesis,
        0,
        dead,
        contribution,
        base=genesis,
        weight=4,  # type: ignore[arg-type]
    )
    try:
        await bus.endpoint(dead).publish(peers.sessions[0].topic, await signed(message, bus))
        results = await peers.round(0)
    finally:
        await peers.close()
    assert len({res.model for res in results}) == 1
    assert results[0].roster.peers == PEERS
    want = await reference(results[0], initial_model(), 0)
    assert results[0].model == await put_gradient(MemoryBlockStore(), want)
    assert all(res.aggregation == "reduce-scatter" and not res.missing for res in results)


async def lying_round(
    index: int, **settings: object
) -> tuple[MemoryBlockStore, object, Peers, AgreedSession, list[AgreedRoundResult]]:
    """Round 0 of reduce-scatter sessions (``settings``) in which session ``index`` adds 1e-2
    to what it reduces; return the store, genesis, peers, the liar and the others' results."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    peers = Peers(store, bus)
    genesis = await peers.start(
        PEERS, aggregation="reduce-scatter", faults={index: Lying(1e-2)}, **settings
    )
    liar = peers.sessions[index]
    try:
        results = await peers.round(0)
    finally:
        await peers.close()
    honest = [res for s, res in zip(peers.sessions, results, strict=True) if s is not liar]
    want = await reference(results[0], initial_model(), 0)
    assert {res.model for res in honest} == {await put_gradient(MemoryBlockStore(), want)}
    return store, genesis, peers, liar, honest


async def test_a_lying_reducer_is_caught_and_the_honest_peers_exclude_it() -> None:
    store, genesis, peers, liar, honest = await lying_round(2)
    assert all(res.liars == (liar.peer_id,) for res in honest)
    assert all("lying" in res.rejected[liar.peer_id] for res in honest)
    assert all(liar.peer_id in s.excluded for s in peers.sessions if s is not liar)
    # The record links the recomputed slice, not the lie: it re-verifies.
    await verify_agreed_history(
        store, honest[0].record, keys=MEMORY_KEYS, session="rs", genesis=genesis
    )  # type: ignore[arg-type]


class GarbageResults(SliceFaults):
    """A reducer whose slice records are well formed but name a block that is no gradient."""

    async def commit(
        self, store: BlockStore, block: Block, values: FloatArray
    ) -> tuple[Block, FloatArray]:
        junk = Block.new(b"not a gradient")
        await store.put(junk)
        record = dataclasses.replace(SliceRecord.from_block(block), result=junk.cid).to_block()
        await store.put(record)
        return record, values


async def test_a_reducer_whose_result_is_garbage_is_excluded_and_the_record_reverifies() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    peers = Peers(store, bus)
    genesis = await peers.start(PEERS, aggregation="reduce-scatter", faults={2: GarbageResults()})
    liar = peers.sessions[2]
    try:
        results = await asyncio.gather(
            *(s.run_round(gradient(i, 0, D), weight=1 + i) for i, s in enumerate(peers.sessions)),
            return_exceptions=True,  # the garbage peer's own round is its own business
        )
    finally:
        await peers.close()
    honest = [res for s, res in zip(peers.sessions, results, strict=True) if s is not liar]
    assert all(isinstance(res, AgreedRoundResult) for res in honest), results
    want = await reference(honest[0], initial_model(), 0)
    assert {res.model for res in honest} == {await put_gradient(MemoryBlockStore(), want)}
    assert all(res.liars == (liar.peer_id,) for res in honest)
    # The fraud record against an unreadable result is checked like any other: it re-verifies.
    await verify_agreed_history(
        store, honest[0].record, keys=bus.keys, session="rs", genesis=genesis
    )  # type: ignore[arg-type]


async def test_a_sender_whose_chunk_is_lost_is_missing_everywhere_and_the_record_verifies() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    peers = Peers(store, bus)
    genesis = await peers.start(
        PEERS[:3], aggregation="reduce-scatter", done_timeout=0.0, fetch_timeout=1.0
    )
    gone = PEERS[3]
    # Its manifest is served (the roster lists it) but its last chunk never is.
    contribution = await put_gradient(store, gradient(3, 0), chunk_bytes=CHUNK)
    manifest = await fetch_manifest(store, contribution)
    await store.delete(manifest.chunks[-1].cid)
    message = AgreedMessage(
        "contrib",
        "rs",
        genesis,
        0,
        gone,
        contribution,
        base=genesis,
        weight=4,  # type: ignore[arg-type]
    )
    try:
        await bus.endpoint(gone).publish(peers.sessions[0].topic, await signed(message, bus))
        results = await peers.round(0)
    finally:
        await peers.close()
    assert results[0].roster.peers == PEERS
    assert all(res.missing == (gone,) for res in results)
    assert all("missing" in res.rejected[gone] for res in results)
    live = [e for e in results[0].roster.entries if e.peer != gone]
    want = deterministic_update(
        initial_model(),
        [gradient(PEERS.index(e.peer), 0) for e in live],
        [e.weight for e in live],
        LR,
    )
    assert {res.model for res in results} == {await put_gradient(MemoryBlockStore(), want)}
    # The record re-verifies: its slice records say who is missing, so the verifier leaves it out.
    await verify_agreed_history(
        store, results[0].record, keys=bus.keys, session="rs", genesis=genesis
    )  # type: ignore[arg-type]


async def test_a_member_left_out_of_the_roster_assembles_the_same_model_from_the_slices() -> None:
    peers = Peers(MemoryBlockStore(), MemoryPubsubBus())
    await peers.start(PEERS, aggregation="reduce-scatter", min_peers=3, collect_timeout=0.5)
    early, late = peers.sessions[:3], peers.sessions[3]
    try:
        first = await asyncio.gather(*(s.run_round(gradient(i, 0)) for i, s in enumerate(early)))
        # The late member contributes after the roster: it only gathers the slices.
        mine = await late.run_round(gradient(3, 0))
    finally:
        await peers.close()
    assert {res.model for res in first} == {mine.model}
    assert mine.record == first[0].record
    assert not mine.included
    assert mine.roster.peers == PEERS[:3]
    assert mine.aggregation == "reduce-scatter"


class DropMessages(LossyPubsub):
    """Drops ``sender``'s (``None``: anyone's) incoming messages of ``kind``: the first
    ``count``, or all (``None``)."""

    def __init__(
        self, inner: PubsubTransport, sender: str | None, kind: str, count: int | None
    ) -> None:
        super().__init__(inner, loss=0.0, seed=0)
        self.sender, self.tag, self.count = sender, f'"kind":"{kind}"'.encode(), count

    async def _lossy(self, messages: AsyncIterator[PubsubMessage]) -> AsyncIterator[PubsubMessage]:
        async for message in messages:
            sent = self.sender is None or message.from_peer == self.sender
            mine = sent and self.tag in message.data
            if mine and (self.count is None or self.count > 0):
                self.dropped += 1
                if self.count is not None:
                    self.count -= 1
                continue
            yield message


async def test_a_peer_that_derives_the_roster_first_keeps_announcing_its_contribution() -> None:
    """Seen across processes (bench_rounds): a peer that heard every contribution first derives
    the complete roster (min_peers = all) and moves on to reduce its slice; if the others lost
    its contribution's announcements, they can only learn it from further re-announcements
    (nobody published the roster yet), so those must go on until the round's done."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    members = PEERS[:3]
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    ranking = coordinator_ranking("rs", genesis, 0, members)
    early = ranking[1]  # not the coordinator: it derives the roster, nobody publishes it
    config = AgreedConfig(
        members=members, aggregation="reduce-scatter", **{**FAST, "round_timeout": 6.0}
    )  # type: ignore[arg-type]
    sessions, lossy = [], []
    for peer in members:
        endpoint = bus.endpoint(peer)
        transport: PubsubTransport = endpoint
        if peer != early:
            transport = DropMessages(endpoint, early, "contrib", 2)
            lossy.append(transport)
        session = AgreedSession(store, transport, "rs", genesis, config)
        await session.start(initial_model())
        sessions.append(session)
    try:
        results = await asyncio.gather(
            *(s.run_round(gradient(PEERS.index(s.peer_id), 0), weight=1) for s in sessions)
        )
        assert len({(r.model, r.record) for r in results}) == 1
        assert all(len(r.roster.entries) == 3 for r in results)
        assert {r.aggregation for r in results} == {"reduce-scatter"}
        assert [t.dropped for t in lossy] == [2, 2]  # both lost the first two announcements
    finally:
        for session in sessions:
            await session.aclose()


async def test_a_lie_is_caught_when_a_colluding_sender_withholds_its_check_values() -> None:
    """Every slice has every sender as an input: a sender publishing no check values used to
    leave every slice unchecked. Its contribution is fetched and its values computed instead."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    config = AgreedConfig(members=PEERS, aggregation="reduce-scatter", **FAST)  # type: ignore[arg-type]
    liar, withholder = PEERS[2], PEERS[3]
    sessions, lossy = [], []
    for peer in PEERS:
        transport: PubsubTransport = bus.endpoint(peer)
        if peer != withholder:  # nobody hears the withholder's check values
            transport = DropMessages(transport, withholder, "proj", None)
            lossy.append(transport)
        faults = Lying(1e-2) if peer == liar else None
        session = AgreedSession(store, transport, "rs", genesis, config, faults=faults)
        await session.start(initial_model())
        sessions.append(session)
    try:
        results = await asyncio.gather(
            *(s.run_round(gradient(i, 0), weight=1 + i) for i, s in enumerate(sessions))
        )
    finally:
        for session in sessions:
            await session.aclose()
    assert all(t.dropped > 0 for t in lossy)
    honest = [res for peer, res in zip(PEERS, results, strict=True) if peer != liar]
    want = await reference(results[0], initial_model(), 0)
    assert {res.model for res in honest} == {await put_gradient(MemoryBlockStore(), want)}
    assert all(res.liars == (liar,) for res in honest)
    await verify_agreed_history(
        store, honest[0].record, keys=bus.keys, session="rs", genesis=genesis
    )  # type: ignore[arg-type]


async def late_joiner(
    store: MemoryBlockStore,
    bus: MemoryPubsubBus,
    deafen: Callable[[PubsubTransport], PubsubTransport],
) -> tuple[list[AgreedSession], object]:
    """Four sliced sessions (3 needed); the fourth hears no slice message (as if it was not
    there then) through ``deafen`` of its transport. Returns them and the genesis."""
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    config = AgreedConfig(
        members=PEERS, aggregation="reduce-scatter", min_peers=3, **{**FAST, "collect_timeout": 0.5}
    )  # type: ignore[arg-type]
    sessions = []
    for peer in PEERS:
        transport: PubsubTransport = bus.endpoint(peer)
        if peer == PEERS[3]:
            transport = deafen(DropMessages(transport, None, "slice", None))
        session = AgreedSession(store, transport, "rs", genesis, config)
        await session.start(initial_model())
        sessions.append(session)
    return sessions, genesis


@pytest.mark.parametrize("forged", [False, True])
async def test_a_peer_joining_a_round_the_others_finished_checks_their_record_instead(
    forged: bool,
) -> None:
    """Seen across processes: a restarted peer joined a sliced round after the others had moved
    on, so no slice message of it was announced any more, and it waited until the round timeout.
    It now re-aggregates the round from their record and writes the same one; a member's
    forged record (another result) is refused and that member rejected."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    sessions, genesis = await late_joiner(store, bus, lambda t: t)
    early, late = sessions[:3], sessions[3]
    try:
        first = await asyncio.gather(*(s.run_round(gradient(i, 0)) for i, s in enumerate(early)))
        await asyncio.gather(*(s.run_round(gradient(i, 1)) for i, s in enumerate(early)))
        liar = next(iter(late.board.state(0).done))  # the first record the late peer would try
        if forged:
            record = AgreedRecord.from_block(await store.get(first[0].record))
            other = await put_gradient(store, initial_model())
            fake = await store.put(dataclasses.replace(record, result=other).to_block())
            message = AgreedMessage("done", "rs", genesis, 0, liar, other, record=fake)
            await bus.endpoint(liar).publish(late.topic, await signed(message, bus))
            await late.board.wait_until(
                lambda: bytes(late.board.state(0).done[liar].record) == bytes(fake), 5.0
            )
        # Round 0 is long over (its slices no longer announced); the late peer joins it now.
        mine = await asyncio.wait_for(late.run_round(gradient(3, 0)), 10.0)
    finally:
        for session in sessions:
            await session.aclose()
    assert (mine.model, mine.record, mine.slices) == (
        first[0].model,
        first[0].record,
        first[0].slices,
    )
    assert not mine.included
    assert mine.aggregation == "reduce-scatter"
    assert mine.roster.peers == PEERS[:3]
    if forged:  # tried first and refused (else the record would be the fake one), then rejected
        assert set(mine.rejected) == {liar}
        assert str(fake) in mine.rejected[liar]
    else:
        assert not mine.rejected


async def test_a_peer_that_missed_a_sliced_round_and_its_done_walks_a_later_record_back() -> None:
    """As above, but the late peer hears neither round 0's slices nor its ``done`` messages
    (a peer busy elsewhere, e.g. resyncing): it walks a round-1 record back to round 0's and
    re-verifies that one; before, it waited until ``round_timeout``."""
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    deaf: list[_DeafToRound] = []

    def deafen(transport: PubsubTransport) -> PubsubTransport:
        deaf.append(_DeafToRound(transport, 0, kinds=("done",)))
        return deaf[0]

    sessions, _ = await late_joiner(store, bus, deafen)
    early, late = sessions[:3], sessions[3]
    try:
        first = await asyncio.gather(*(s.run_round(gradient(i, 0)) for i, s in enumerate(early)))
        await asyncio.gather(*(s.run_round(gradient(i, 1)) for i, s in enumerate(early)))
        mine = await asyncio.wait_for(late.run_round(gradient(3, 0)), 10.0)
    finally:
        for session in sessions:
            await session.aclose()
    assert deaf[0].dropped > 0
    assert set(late.board.state(0).done) <= {late.peer_id}  # no other's round-0 done heard
    assert (mine.model, mine.record, mine.slices) == (
        first[0].model,
        first[0].record,
        first[0].slices,
    )


async def test_a_finished_round_that_does_not_verify_is_refused() -> None:
    results, peers, _ = await run_rounds("reduce-scatter", rounds=2)
    store, first, second = peers.store, results[0][0], results[1][0]
    roster = second.roster
    check = partial(check_finished_round, store, second.record, roster, second.roster_cid)
    finished = await check(prev=first.record)
    assert bytes(await put_gradient(MemoryBlockStore(), finished.model)) == bytes(second.model)
    assert finished.records == second.slices
    assert not finished.liars
    assert not finished.missing
    with pytest.raises(RoundVerificationFailed, match="not a sliced record"):
        await check(prev=None)  # it follows round 0, not the genesis
    with pytest.raises(RoundVerificationFailed, match="not a sliced record"):
        await check_finished_round(store, first.record, roster, second.roster_cid, prev=None)
    # A forged record of the same round: another result, its slices unchanged.
    record = AgreedRecord.from_block(await store.get(second.record))
    other = await put_gradient(store, initial_model())
    forged = await store.put(dataclasses.replace(record, result=other).to_block())
    with pytest.raises(RoundVerificationFailed, match="re-aggregates"):
        await check_finished_round(store, forged, roster, second.roster_cid, prev=first.record)


async def test_chained_rounds_equal_all_to_all_and_reverify() -> None:
    chained, peers, genesis = await run_rounds(
        "reduce-scatter", rounds=2, chained=True, chain_groups=2
    )
    whole, _, _ = await run_rounds("all-to-all", rounds=2)
    for r in range(2):
        assert {res.model for res in chained[r]} == {whole[r][0].model}
        assert len({res.record for res in chained[r]}) == 1
        assert all(len(res.slices) == 2 for res in chained[r])  # G = 2 groups, S = 2 slices
    records = await verify_agreed_history(
        peers.store,
        chained[1][0].record,
        keys=MEMORY_KEYS,
        session="rs",
        genesis=genesis,  # type: ignore[arg-type]
    )
    assert [rec.round for rec in records] == [0, 1]


@pytest.mark.parametrize("liar_index", [0, 1, 2, 3])
async def test_a_lying_step_of_a_chained_round_is_excluded_and_the_record_reverifies(
    liar_index: int,
) -> None:
    store, genesis, _, liar, honest = await lying_round(liar_index, chained=True, chain_groups=2)
    assert all(res.liars == (liar.peer_id,) for res in honest)
    # Whether its step was a partial sum or a slice record, the record proves it again.
    await verify_agreed_history(
        store, honest[0].record, keys=MEMORY_KEYS, session="rs", genesis=genesis
    )  # type: ignore[arg-type]


async def test_a_sender_whose_slice_is_above_max_value_is_missing_and_the_model_stays_finite() -> (
    None
):
    # Its chunked contribution is finite but its last chunk holds 3.0e38: the reducer of that
    # slice records it missing (as a non-finite one), and so does every slice after that.
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    peers = Peers(store, bus)
    genesis = await peers.start(PEERS[:3], aggregation="reduce-scatter", done_timeout=0.0)
    hostile = PEERS[3]
    values = gradient(3, 0)
    values[-10:] = 3.0e38
    contribution = await put_gradient(store, values, chunk_bytes=CHUNK)
    message = AgreedMessage(
        "contrib", "rs", genesis, 0, hostile, contribution, base=genesis, weight=2**20,  # type: ignore[arg-type]
    )  # fmt: skip
    try:
        await bus.endpoint(hostile).publish(peers.sessions[0].topic, await signed(message, bus))
        results = await peers.round(0)
    finally:
        await peers.close()
    assert results[0].roster.peers == PEERS
    assert all(res.aggregation == "reduce-scatter" for res in results)
    assert all(res.missing == (hostile,) for res in results)
    assert all(hostile in res.rejected for res in results)
    assert len({res.model for res in results}) == 1
    assert np.isfinite(peers.sessions[0].model).all()
    await verify_agreed_history(
        store, results[0].record, keys=bus.keys, session="rs", genesis=genesis
    )  # type: ignore[arg-type]


@pytest.mark.parametrize("chained", [False, True])
async def test_a_reducer_hiding_its_lie_in_its_own_check_values_is_caught(chained: bool) -> None:
    """Issue 32, attack 5: +5.0 on its slice (or, chained, its partial sum) and its own check
    value shifted by the lie's projection. Weights are 1 + index: W = 10."""
    index = 2
    hiding = HidingLiar(5.0, 10 / (1 + index), LR)  # whatever it announces first
    settings: dict[str, object] = {"chained": True, "chain_groups": 2} if chained else {}
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    peers = Peers(store, bus)
    genesis = await peers.start(
        PEERS, aggregation="reduce-scatter", faults={index: hiding}, **settings
    )
    liar = peers.sessions[index]
    try:
        results = await asyncio.gather(
            *(s.run_round(gradient(i, 0), weight=1 + i) for i, s in enumerate(peers.sessions)),
            return_exceptions=True,  # the liar's own view of the round is its business
        )
    finally:
        await peers.close()
    assert hiding.k is not None  # it lied
    assert hiding.published  # and published its own check values shifted to hide it
    honest = [res for s, res in zip(peers.sessions, results, strict=True) if s is not liar]
    assert all(isinstance(res, AgreedRoundResult) for res in honest), results
    checked = [res for res in honest if isinstance(res, AgreedRoundResult)]
    want = await reference(checked[0], initial_model(), 0)
    assert {res.model for res in checked} == {await put_gradient(MemoryBlockStore(), want)}
    assert all(res.liars == (liar.peer_id,) for res in checked)
    assert all(liar.peer_id in s.excluded for s in peers.sessions if s is not liar)
    await verify_agreed_history(
        store, checked[0].record, keys=bus.keys, session="rs", genesis=genesis
    )  # type: ignore[arg-type]


async def test_a_false_missing_claim_drops_nobody_and_names_the_claimant_round_after_round() -> (
    None
):
    """Issue 32, attack 6: a reducer claims, in every round, that it could not fetch an
    honest sender's slice. The sender stays in every slice; the claimant is rejected."""
    censor, victim = 1, PEERS[2]
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    peers = Peers(store, bus)
    genesis = await peers.start(
        PEERS, aggregation="reduce-scatter", faults={censor: Censor(victim)}
    )
    base = initial_model()
    try:
        for r in range(3):
            results = await peers.round(r)
            assert all(res.missing == () for res in results)
            assert all(victim in res.roster.peers for res in results)
            want = await reference(results[0], base, r)
            assert {res.model for res in results} == {await put_gradient(MemoryBlockStore(), want)}
            honest = [res for i, res in enumerate(results) if i != censor]
            assert all("false missing claim" in res.rejected[PEERS[censor]] for res in honest)
            base = want
    finally:
        await peers.close()
    await verify_agreed_history(
        store, results[0].record, keys=bus.keys, session="rs", genesis=genesis
    )  # type: ignore[arg-type]
