"""Regional rounds over three real Kubo daemons: eu = two daemons, us = one (pubsub, bitswap)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
import pytest

from gradfed_ipfs.federated.regional.session import (
    RegionalConfig,
    RegionalRoundResult,
    RegionalSession,
    verify_regional_round,
)
from gradfed_ipfs.formats.regional import RegionalRecord
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore, put_gradient
from gradfed_ipfs.tensor import federated_average_in_regions, hierarchical_federated_average
from tests.cli.test_cli import run_cli

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
