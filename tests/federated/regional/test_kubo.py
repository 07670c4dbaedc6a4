"""Regional rounds over three real Kubo daemons: eu = two daemons, us = one (pubsub, bitswap)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs.errors import RoundVerificationFailed
from gradfed_ipfs.federated.agreed import AgreedSession
from gradfed_ipfs.federated.regional import sign_vote, vote_set
from gradfed_ipfs.federated.regional.config import regional_topic
from gradfed_ipfs.federated.regional.session import (
    RegionalConfig,
    RegionalRoundResult,
    RegionalSession,
    verify_regional_round,
)
from gradfed_ipfs.formats.regional import RegionalRecord, RegionVote, region_session
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore, put_gradient
from gradfed_ipfs.tensor import federated_average_in_regions, hierarchical_federated_average
from tests.cli.test_cli import run_cli
from tests.federated.regional.test_votes import self_made_record

pytestmark = pytest.mark.kubo

D = 5000
TIMING = {
    "collect_timeout": 5.0,
    "takeover_timeout": 2.0,
    "round_timeout": 30.0,
    "announce_interval": 0.1,
    "fetch_timeout": 10.0,
}


@dataclass
class Peers:
    ids: list[str]
    stores: list[KuboBlockStore]
    transports: list[KuboPubsub]


@pytest.fixture
async def peers(kubo_swarm3) -> AsyncIterator[Peers]:  # type: ignore[no-untyped-def]
    stores = [KuboBlockStore(n.api_url, timeout=10.0) for n in kubo_swarm3]
    transports = [KuboPubsub(n.api_url) for n in kubo_swarm3]
    try:
        yield Peers([n.peer_id for n in kubo_swarm3], stores, transports)
    finally:
        for closable in [*stores, *transports]:
            await closable.aclose()


def gradient(session: str, seed: int) -> np.ndarray:
    # Seeded by the session too: the swarm is shared, so no block of another test may match.
    salt = list(session.encode())
    return np.random.default_rng([15, seed, *salt]).standard_normal(D).astype(np.float32)


async def run_round(
    peers: Peers, session: str, **settings: object
) -> tuple[dict[str, str], dict[str, np.ndarray], list[RegionalRoundResult]]:
    regions = dict(zip(peers.ids, ["eu", "eu", "us"], strict=True))
    grads = {p: gradient(session, i) for i, p in enumerate(peers.ids)}
    genesis = await put_gradient(peers.stores[0], gradient(session, 99))
    config = RegionalConfig(regions, **{**TIMING, **settings})  # type: ignore[arg-type]
    sessions = [
        RegionalSession(s, t, session, genesis, config)
        for s, t in zip(peers.stores, peers.transports, strict=True)
    ]
    try:
        for s in sessions:
            await s.start()
        results = await asyncio.gather(
            *(s.run_round(grads[p]) for s, p in zip(sessions, peers.ids, strict=True))
        )
    finally:
        for s in sessions:
            await s.aclose()
    return regions, grads, list(results)


async def test_hierarchical_round_agrees_on_every_daemon_and_verifies(peers: Peers) -> None:
    regions, grads, results = await run_round(peers, "regional-kubo")
    assert len({bytes(r.record) for r in results}) == 1
    assert len({bytes(r.result) for r in results}) == 1
    tagged = [(regions[p], grads[p]) for p in sorted(peers.ids)]  # roster order
    np.testing.assert_array_equal(results[0].aggregate, hierarchical_federated_average(tagged))
    assert results[0].region_roster.peers == tuple(sorted(peers.ids[:2]))
    assert results[2].region_roster.peers == (peers.ids[2],)
    for store in peers.stores:  # every daemon re-verifies from the CID alone
        await verify_regional_round(store, results[0].record)


async def test_in_regions_keeps_the_other_regions_blocks_off_its_daemons(peers: Peers) -> None:
    regions, grads, results = await run_round(
        peers, "regional-kubo-residency", combine="in-regions", allowed=("eu",)
    )
    assert len({bytes(r.record) for r in results}) == 1
    tagged = [(regions[p], grads[p]) for p in sorted(peers.ids)]
    np.testing.assert_allclose(
        results[0].aggregate, federated_average_in_regions(tagged, ["eu"]), rtol=0, atol=1e-6
    )
    us, eu_stores = results[2], peers.stores[:2]
    for cid in (us.region_record, us.region_result, us.region_roster.entries[0].contribution):
        for store in eu_stores:
            assert not await store.has(cid)  # never fetched by an eu daemon
    for entry in results[0].region_roster.entries:
        assert not await peers.stores[2].has(entry.contribution)  # eu data stays in eu
    assert await peers.stores[2].has(results[0].result)


async def test_the_cli_verifies_a_regional_record_and_refuses_a_forged_one(
    peers: Peers, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, results = await run_round(peers, "regional-kubo-cli")
    record = str(results[0].record)
    store = peers.stores[2]
    forged_record = dataclasses.replace(
        RegionalRecord.from_block(await store.get(record)), combine="weighted"
    )
    forged = str(await store.put(forged_record.to_block()))
    api = ("--api", store.api_url)
    for command in ("verify-round", "history"):
        code, out, _ = await asyncio.to_thread(run_cli, capsys, *api, command, record)
        assert code == 0, command
        assert f"regional round 0 ({record}): verified" in out
        code, _, err = await asyncio.to_thread(run_cli, capsys, *api, command, forged)
        assert code == 1, command
        assert "combine to" in err


async def test_attack_11_a_self_made_region_record_is_not_combined(peers: Peers) -> None:
    # eu = daemons 0 and 1, us = daemon 2. Daemon 1 (evil) runs its eu round as a member, then
    # announces a record of its own (a roster of itself, its value as the result) with its
    # daemon's signed vote for it, and signs a vote for the real eu record too.
    session = "regional-kubo-attack"
    regions = dict(zip(peers.ids, ["eu", "eu", "us"], strict=True))
    genesis = await put_gradient(peers.stores[0], gradient(session, 99))
    config = RegionalConfig(regions, **TIMING)  # type: ignore[arg-type]
    evil_id, evil_store, evil_pubsub = peers.ids[1], peers.stores[1], peers.transports[1]
    honest = [
        RegionalSession(peers.stores[i], peers.transports[i], session, genesis, config)
        for i in (0, 2)
    ]
    evil = AgreedSession(
        evil_store, evil_pubsub, region_session(session, "eu"), genesis, config.agreed("eu")
    )

    async def evil_round() -> tuple[CID, CID]:
        real = (await evil.run_round(gradient(session, 1))).record
        forged = await self_made_record(
            evil_store, real, gradient(session, 1) + 100,
            author=evil_id, expected=tuple(sorted(peers.ids[:2])),
        )  # fmt: skip
        signer = await evil_pubsub.signer()
        for record in (forged, real):
            body = RegionVote(session, genesis, 0, "eu", record)
            vote = await sign_vote(signer, evil_pubsub.keys, body)
            for _ in range(3):  # pubsub is lossy; honest peers re-announce, evil repeats
                await evil_pubsub.publish(regional_topic(session, genesis), vote.data)
        return real, forged

    try:
        for s in honest:
            await s.start()
        await evil.start()
        attack = asyncio.create_task(evil_round())
        results = await asyncio.gather(
            *(s.run_round(gradient(session, i)) for s, i in zip(honest, (0, 2), strict=True))
        )
        real, forged = await attack
    finally:
        for s in honest:
            await s.aclose()
        await evil.aclose()
    assert len({bytes(r.record) for r in results}) == 1
    assert dict(results[0].regions)["eu"] == real != forged
    assert "not counted" in results[1].rejected[evil_id]
    for store in (peers.stores[0], peers.stores[2]):
        await verify_regional_round(store, results[0].record, config=config)
    # The same top-level record with the self-made eu record and evil's lone vote is refused.
    top = RegionalRecord.from_block(await peers.stores[0].get(results[0].record))
    body = RegionVote(session, genesis, 0, "eu", forged)
    lone = await sign_vote(await evil_pubsub.signer(), evil_pubsub.keys, body)
    evidence = await peers.stores[0].put(vote_set([lone]).to_block())
    lie = dataclasses.replace(
        top, regions=(("eu", forged), top.regions[1]), votes=(evidence, top.votes[1])
    )
    with pytest.raises(RoundVerificationFailed, match="1 votes, 2 needed"):
        await verify_regional_round(peers.stores[0], await peers.stores[0].put(lie.to_block()))
