"""Regional rounds in one process: MemoryPubsubBus peers, one shared MemoryBlockStore seen
through a per-peer recording wrapper (what each peer fetched)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import dag_cbor
import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs.block import Block
from gradfed_ipfs.errors import ConfigError, QuorumNotReached, RoundVerificationFailed
from gradfed_ipfs.federated.agreed.history import load_record
from gradfed_ipfs.federated.regional import sign_vote
from gradfed_ipfs.federated.regional.session import (
    RegionalConfig,
    RegionalRoundResult,
    RegionalSession,
    regional_topic,
    verify_regional_round,
)
from gradfed_ipfs.formats.agreed.roster import AgreedRecord
from gradfed_ipfs.formats.regional import RegionalRecord, RegionVote
from gradfed_ipfs.formats.statement import KeyDirectory
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore, fetch_gradient, put_gradient
from gradfed_ipfs.storage.base import UNSET, Unset
from gradfed_ipfs.tensor import (
    federated_average_in_regions,
    hierarchical_federated_average,
    region_mean,
)

D = 300
REGIONS = {"eu-1": "eu", "eu-2": "eu", "eu-3": "eu", "us-1": "us", "us-2": "us"}


def bus_keys() -> KeyDirectory:
    """The keys every MemoryPubsubBus derives from these names (for offline verifiers)."""
    bus = MemoryPubsubBus()
    for name in (*REGIONS, "evil"):
        bus.signer(name)
    return bus.keys


KEYS = bus_keys()
FAST = {
    "collect_timeout": 1.0,
    "takeover_timeout": 0.5,
    "round_timeout": 10.0,
    "announce_interval": 0.02,
    "fetch_timeout": 2.0,
}


class RecordingStore:
    """One peer's view of the shared store, recording every CID it fetches."""

    def __init__(self, inner: MemoryBlockStore) -> None:
        self.inner = inner
        self.fetched: set[bytes] = set()

    async def put(self, block: Block, *, pin: bool = True) -> CID:
        return await self.inner.put(block, pin=pin)

    async def get(self, cid: object, *, timeout: float | Unset = UNSET) -> Block:
        block = await self.inner.get(cid, timeout=timeout)  # type: ignore[arg-type]
        self.fetched.add(bytes(block.cid))
        return block

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def gradient(peer: str, round_number: int = 0) -> np.ndarray:
    rng = np.random.default_rng([sorted(REGIONS).index(peer), round_number])
    return rng.standard_normal(D).astype(np.float32)


async def run_peers(
    peers: Sequence[str],
    *,
    rounds: int = 1,
    weights: dict[str, int] | None = None,
    hostile: Callable[[MemoryBlockStore, MemoryPubsubBus, CID], Awaitable[None]] | None = None,
    **settings: object,
) -> tuple[MemoryBlockStore, dict[str, RecordingStore], list[dict[str, RegionalRoundResult]]]:
    store = MemoryBlockStore()
    genesis = await put_gradient(store, np.zeros(D, np.float32))
    config = RegionalConfig(REGIONS, **{**FAST, **settings})  # type: ignore[arg-type]
    bus = MemoryPubsubBus()
    views = {p: RecordingStore(store) for p in peers}
    sessions = {
        p: RegionalSession(views[p], bus.endpoint(p), "reg", genesis, config)  # type: ignore[arg-type]
        for p in peers
    }
    for session in sessions.values():
        await session.start()
    if hostile is not None:
        await hostile(store, bus, genesis)
    results: list[dict[str, RegionalRoundResult]] = []
    try:
        for r in range(rounds):
            outcomes = await asyncio.gather(
                *(
                    s.run_round(gradient(p, r), weight=(weights or {}).get(p, 1))
                    for p, s in sessions.items()
                )
            )
            results.append(dict(zip(sessions, outcomes, strict=True)))
    finally:
        for session in sessions.values():
            await session.aclose()
    return store, views, results


def same(results: dict[str, RegionalRoundResult]) -> RegionalRoundResult:
    assert len({bytes(res.record) for res in results.values()}) == 1
    assert len({bytes(res.result) for res in results.values()}) == 1
    return next(iter(results.values()))


async def test_hierarchical_rounds_agree_and_equal_the_tensor_formula() -> None:
    store, _, rounds = await run_peers(sorted(REGIONS), rounds=2)
    for r, results in enumerate(rounds):
        first = same(results)
        assert [region for region, _ in first.regions] == ["eu", "us"]
        for res in results.values():
            assert res.region_roster.peers == tuple(
                p for p in sorted(REGIONS) if REGIONS[p] == res.region
            )
            assert res.round == r
        tagged = [(REGIONS[p], gradient(p, r)) for p in sorted(REGIONS)]  # roster order
        expected = hierarchical_federated_average(tagged)
        np.testing.assert_array_equal(first.aggregate, expected)
        np.testing.assert_array_equal(await fetch_gradient(store, first.result), expected)
        top = await verify_regional_round(
            store, first.record, session="reg", regions=REGIONS, keys=KEYS
        )
        assert top.combine == "hierarchical"
        assert top.round == r
    assert rounds[1]["eu-1"].record != rounds[0]["eu-1"].record
    with pytest.raises(RoundVerificationFailed, match="another region"):
        await verify_regional_round(
            store, first.record, regions={**REGIONS, "eu-2": "us"}, keys=KEYS
        )
    with pytest.raises(RoundVerificationFailed, match="belongs to"):
        await verify_regional_round(store, first.record, session="other", keys=KEYS)


async def test_weighted_is_the_flat_weighted_mean() -> None:
    weights = {p: 1 + i for i, p in enumerate(sorted(REGIONS))}
    store, _, rounds = await run_peers(sorted(REGIONS), weights=weights, combine="weighted")
    first = same(rounds[0])
    peers = sorted(REGIONS)
    flat = region_mean([gradient(p) for p in peers], [weights[p] for p in peers])
    np.testing.assert_allclose(first.aggregate, flat, rtol=0, atol=1e-6)
    await verify_regional_round(store, first.record, keys=KEYS)


async def test_in_regions_never_fetches_a_disallowed_regions_data() -> None:
    store, views, rounds = await run_peers(sorted(REGIONS), combine="in-regions", allowed=("eu",))
    first = same(rounds[0])
    assert [region for region, _ in first.regions] == ["eu"]
    tagged = [(REGIONS[p], gradient(p)) for p in sorted(REGIONS)]
    np.testing.assert_allclose(
        first.aggregate, federated_average_in_regions(tagged, ["eu"]), rtol=0, atol=1e-6
    )
    us = [res for p, res in rounds[0].items() if REGIONS[p] == "us"]
    us_blocks = {bytes(us[0].region_record), bytes(us[0].region_result)}
    us_blocks |= {bytes(e.contribution) for e in us[0].region_roster.entries}
    eu_blocks = {bytes(e.contribution) for e in rounds[0]["eu-1"].region_roster.entries}
    for peer, view in views.items():
        if REGIONS[peer] == "eu":
            assert not view.fetched & us_blocks, peer
            assert view.fetched & eu_blocks, peer  # the counter does see contributions
        else:
            assert not view.fetched & eu_blocks, peer  # only the eu aggregate leaves eu
    verifier = RecordingStore(store)
    await verify_regional_round(verifier, first.record, keys=KEYS)  # type: ignore[arg-type]
    assert not verifier.fetched & us_blocks


async def test_a_peer_absent_from_its_region_is_left_out_and_all_still_agree() -> None:
    present = [p for p in sorted(REGIONS) if p != "eu-3"]
    store, _, rounds = await run_peers(present, min_peers=2)
    first = same(rounds[0])
    eu = rounds[0]["eu-1"]
    assert eu.region_roster.peers == ("eu-1", "eu-2")
    assert eu.region_roster.absent == ("eu-3",)
    tagged = [(REGIONS[p], gradient(p)) for p in present]
    np.testing.assert_array_equal(first.aggregate, hierarchical_federated_average(tagged))
    await verify_regional_round(store, first.record, keys=KEYS)


async def test_a_tampered_region_aggregate_fails_verification() -> None:
    store, _, rounds = await run_peers(sorted(REGIONS))
    honest = same(rounds[0])
    top = RegionalRecord.from_block(await store.get(honest.record))
    eu_cid = dict(top.regions)["eu"]
    eu = await load_record(store, eu_cid)
    aggregate = await fetch_gradient(store, eu.result)
    forged_result = await put_gradient(store, aggregate + np.float32(1e-3))
    forged_eu = AgreedRecord(
        eu.session, eu.genesis, eu.round, eu.prev, eu.base, eu.roster, forged_result,
        eu.learning_rate, eu.rule, eu.state,
    )  # fmt: skip
    forged_eu_cid = await store.put(forged_eu.to_block())
    means = {
        "eu": await fetch_gradient(store, forged_result),
        "us": await fetch_gradient(
            store, (await load_record(store, dict(top.regions)["us"])).result
        ),
    }
    combined = region_mean([means["eu"], means["us"]])  # consistent at the top level
    forged_top = RegionalRecord(
        top.session, top.genesis, top.round, top.combine, top.allowed,
        (("eu", forged_eu_cid), ("us", dict(top.regions)["us"])),
        await put_gradient(store, combined), top.votes,
    )  # fmt: skip
    forged_cid = await store.put(forged_top.to_block())
    with pytest.raises(RoundVerificationFailed, match="re-aggregates"):
        await verify_regional_round(store, forged_cid, keys=KEYS)
    # A top record whose own result is off fails too.
    lying_top = RegionalRecord(
        top.session, top.genesis, top.round, top.combine, top.allowed, top.regions,
        forged_result, top.votes,
    )  # fmt: skip
    with pytest.raises(RoundVerificationFailed, match="combine to"):
        await verify_regional_round(store, await store.put(lying_top.to_block()), keys=KEYS)


async def test_a_junk_region_record_rejects_its_voters_not_the_round() -> None:
    async def vote_junk(store: MemoryBlockStore, bus: MemoryPubsubBus, genesis: CID) -> None:
        # A junk dag-cbor block whose CID sorts first, voted for by both us members (a
        # majority: it counts, and ties with the honest record go to the smallest CID), so
        # every peer tries it before the honest us record.
        junk = next(
            block
            for i in range(100_000)
            if (block := Block.new(dag_cbor.encode({"junk": i}), "dag-cbor")).cid.digest[2] == 0
        )
        await store.put(junk)
        for peer in ("us-1", "us-2"):
            body = RegionVote("reg", genesis, 0, "us", junk.cid)
            vote = await sign_vote(bus.signer(peer), bus.keys, body)
            await bus.endpoint(peer).publish(regional_topic("reg", genesis), vote.data)

    store, _, rounds = await run_peers(sorted(REGIONS), hostile=vote_junk)
    first = same(rounds[0])
    for peer in sorted(REGIONS):
        for voter in ("us-1", "us-2"):
            assert "not a" in rounds[0][peer].rejected[voter], rounds[0][peer].rejected
    await verify_regional_round(store, first.record, keys=KEYS)


async def test_a_vote_for_an_unvoted_record_is_not_fetched_and_names_its_voter() -> None:
    junk = Block.new(dag_cbor.encode({"junk": "minority"}), "dag-cbor")

    async def vote_junk(store: MemoryBlockStore, bus: MemoryPubsubBus, genesis: CID) -> None:
        await store.put(junk)
        vote = await sign_vote(
            bus.signer("eu-3"), bus.keys, RegionVote("reg", genesis, 0, "eu", junk.cid)
        )
        await bus.endpoint("eu-3").publish(regional_topic("reg", genesis), vote.data)

    store, views, rounds = await run_peers(sorted(REGIONS), min_peers=1, hostile=vote_junk)
    first = same(rounds[0])
    for peer, view in views.items():
        assert bytes(junk.cid) not in view.fetched, peer  # 1 of 3 votes: never even fetched
        assert "not counted" in rounds[0][peer].rejected["eu-3"]
    await verify_regional_round(store, first.record, keys=KEYS)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"regions": {}}, "regions"),
        ({"regions": {"a": "e/u"}}, "/"),
        ({"combine": "median"}, "combine"),
        ({"combine": "in-regions"}, "allowed"),
        ({"allowed": ("eu",)}, "allowed"),
        ({"combine": "in-regions", "allowed": ("ap",)}, "no peer"),
        ({"min_peers": 0}, "min_peers"),
    ],
)
def test_bad_settings_are_refused(settings: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RegionalConfig(**{"regions": REGIONS, **settings})  # type: ignore[arg-type]


def test_region_settings() -> None:
    config = RegionalConfig(REGIONS, combine="in-regions", allowed=("us", "eu", "us"), min_peers=3)
    assert config.allowed == ("eu", "us")
    assert config.region_names == ("eu", "us")
    assert config.agreed("us").quorum == 2  # capped at the region's size
    assert config.agreed("eu").members == ("eu-1", "eu-2", "eu-3")


async def test_a_silent_region_makes_the_combine_raise_quorum_not_reached() -> None:
    eu = [p for p in sorted(REGIONS) if REGIONS[p] == "eu"]
    with pytest.raises(QuorumNotReached, match=r"round 0: no record of region\(s\) us had enough"):
        await run_peers(eu, round_timeout=1.0)
    # Without us in the combine (in-regions eu), the same peers finish.
    _, _, rounds = await run_peers(eu, combine="in-regions", allowed=("eu",))
    same(rounds[0])
