"""Regional rounds with each region's rounds decided on its own CometBFT chain.

Five members on loopback, each a real Kubo daemon: ``eu`` is four of them (a chain of four
validators, f = 1), ``us`` the fifth (a chain of one). The votes and the combine stay on the
top-level pubsub topic. Two rounds end on one top-level record everywhere, each region's record
final on its chain; in the first, an ``eu`` member announces a self-made ``eu`` record with its
own vote (the hostile-members issue's forged region record): it is not combined.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dag_cbor
import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs.cometbft import CometNetwork, CometRpc, launch_session_chain
from gradfed_ipfs.cometbft.abci import RoundView
from gradfed_ipfs.federated.agreed import AgreedSession
from gradfed_ipfs.federated.regional import sign_vote
from gradfed_ipfs.federated.regional.config import regional_topic
from gradfed_ipfs.federated.regional.session import (
    RegionalConfig,
    RegionalRoundResult,
    RegionalSession,
    verify_regional_round,
)
from gradfed_ipfs.formats.regional import RegionVote, region_session
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore, put_gradient
from gradfed_ipfs.tensor import hierarchical_federated_average
from tests.federated.regional.test_votes import self_made_record
from tests.polling import apoll_until

pytestmark = [pytest.mark.cometbft, pytest.mark.kubo, pytest.mark.slow]

D = 5000
SESSION = "comet-regional"
EU, US = "eu", "us"
EVIL = 1  # an eu member
SETTINGS = {
    "control": "cometbft",
    "min_peers": 3,  # eu: three votes of four (the hostile one withholds its vote); us: one
    "collect_timeout": 3.0,
    "round_timeout": 60.0,
    "announce_interval": 0.1,
    "fetch_timeout": 20.0,
}


@dataclass
class Lab:
    ids: list[str]
    stores: list[KuboBlockStore]
    pubsubs: list[KuboPubsub]
    config: RegionalConfig
    genesis: CID
    rpcs: list[str]  # each member's own validator of its region's chain


def _regions(ids: Sequence[str]) -> dict[str, str]:
    return {p: EU if i < 4 else US for i, p in enumerate(ids)}


async def _chain(
    lab_ids: list[str], pubsubs: list[KuboPubsub], config: RegionalConfig, genesis: CID,
    region: str, binary: Path,
) -> tuple[CometNetwork, dict[str, str]]:  # fmt: skip
    """Start ``region``'s chain, each validator bound to its member; return member -> RPC."""
    members = config.members(region)
    network = CometNetwork(len(members), binary=binary)
    signers = [await pubsubs[lab_ids.index(p)].signer() for p in members]
    await launch_session_chain(network, config.chain_genesis(SESSION, genesis, region), signers)
    return network, {p: v.rpc_url for p, v in zip(members, network, strict=True)}


@pytest.fixture
async def lab(kubo_provider: str, kubo_pool: Any, cometbft_binary: Path) -> AsyncIterator[Lab]:
    nodes = kubo_pool.get(kubo_provider, 5)
    ids = [n.peer_id for n in nodes]
    stores = [KuboBlockStore(n.api_url, timeout=30.0) for n in nodes]
    pubsubs = [KuboPubsub(n.api_url) for n in nodes]
    config = RegionalConfig(_regions(ids), **SETTINGS)  # type: ignore[arg-type]
    genesis = await put_gradient(stores[0], _gradient(99, 0))
    networks: list[CometNetwork] = []
    try:
        rpcs: dict[str, str] = {}
        for region in config.region_names:
            network, urls = await _chain(ids, pubsubs, config, genesis, region, cometbft_binary)
            networks.append(network)
            rpcs.update(urls)
        yield Lab(ids, stores, pubsubs, config, genesis, [rpcs[p] for p in ids])
    finally:
        for network in networks:
            await asyncio.to_thread(network.stop)
        for closable in [*stores, *pubsubs]:
            await closable.aclose()


def _gradient(peer: int, r: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    salt = list(SESSION.encode())  # the swarm is shared: no block of another test may match
    return np.random.default_rng([peer, r, *salt]).standard_normal(D).astype(np.float32)


async def _forge(lab: Lab, evil: AgreedSession, r: int) -> tuple[CID, CID]:
    """Run evil's eu round, then announce a self-made eu record with its own vote."""
    real = (await evil.run_round(_gradient(EVIL, r))).record
    forged = await self_made_record(
        lab.stores[EVIL], real, _gradient(EVIL, r) + 100,
        author=lab.ids[EVIL], expected=lab.config.members(EU),
    )  # fmt: skip
    pubsub = lab.pubsubs[EVIL]
    body = RegionVote(SESSION, lab.genesis, r, EU, forged)
    vote = await sign_vote(await pubsub.signer(), pubsub.keys, body)
    for _ in range(3):  # pubsub is lossy; honest peers re-announce, evil repeats
        await pubsub.publish(regional_topic(SESSION, lab.genesis), vote.data)
    return real, forged


async def _all_heard(sessions: Sequence[RegionalSession], r: int, record: CID) -> bool:
    """Whether every session's vote board holds a vote for ``record`` in round ``r``."""
    return all(
        bytes(record) in s._require_board().votes(r, EU)  # what it heard
        for s in sessions
    )


async def _final(rpc: str, r: int) -> RoundView:
    answer = await CometRpc(rpc).abci_query("/round", str(r).encode())
    assert answer.code == 0, answer
    return RoundView.from_dict(dag_cbor.decode(answer.value))


async def test_regions_on_their_own_chains_combine_one_record_and_ignore_a_forged_one(
    lab: Lab,
) -> None:
    honest_at = [i for i in range(5) if i != EVIL]
    sessions = [
        RegionalSession(
            lab.stores[i], lab.pubsubs[i], SESSION, lab.genesis, lab.config,
            validator_rpc=lab.rpcs[i],
        )
        for i in honest_at
    ]  # fmt: skip
    evil = AgreedSession(
        lab.stores[EVIL], lab.pubsubs[EVIL], region_session(SESSION, EU), lab.genesis,
        lab.config.agreed(EU), validator_rpc=lab.rpcs[EVIL],
    )  # fmt: skip
    rounds: list[list[RegionalRoundResult]] = []
    try:
        for s in sessions:
            await s.start()
        await evil.start()
        for r in range(2):
            attack = asyncio.create_task(_forge(lab, evil, r))
            steps = (s.run_round(_gradient(i, r)) for s, i in zip(sessions, honest_at, strict=True))
            rounds.append(list(await asyncio.gather(*steps)))
            real, forged = await attack
            results = rounds[-1]
            # The forged vote reached every honest member (it may come after their combine,
            # which is why the record below, not a rejection note, is what shows it ignored).
            await apoll_until(
                functools.partial(_all_heard, sessions, r, forged),
                timeout=30.0,
                what="the forged vote",
            )
            assert len({bytes(res.record) for res in results}) == 1
            assert dict(results[0].regions)[EU] == real != forged
            by_peer = sorted(range(5), key=lambda i: lab.ids[i])  # roster order
            want = hierarchical_federated_average(
                [(lab.config.regions[lab.ids[i]], _gradient(i, r)) for i in by_peer]
            )
            np.testing.assert_array_equal(results[0].aggregate, want)
            for i in range(5):  # each validator's app finalized its region's record
                region = lab.config.regions[lab.ids[i]]
                view = await _final(lab.rpcs[i], r)
                expected = real if region == EU else dict(results[0].regions)[US]
                assert (view.status, view.record) == ("final", str(expected))
    finally:
        for s in sessions:
            await s.aclose()
        await evil.aclose()
    for store in lab.stores:  # every daemon re-verifies the last record from its CID
        await verify_regional_round(store, rounds[-1][0].record, config=lab.config)
