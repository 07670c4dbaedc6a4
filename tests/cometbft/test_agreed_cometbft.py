"""Agreed sessions on the CometBFT control plane: 4 members, each a real Kubo daemon, a real
validator and its Python round machine, all on loopback.

Three all-to-all rounds end on one record everywhere (and re-verify from the head); a member
that sends a contribution nobody can verify is left out by the chain's roster (no honest member
attests it; it then equivocates, which the chain records as evidence), and with its validator
crashed the other three go on. With two validators of four down a round stalls (no block, no
decision) and resumes to one record on all four once they are back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import dag_cbor
import numpy as np
import pytest

from gradfed_ipfs.block import Block
from gradfed_ipfs.cometbft import CometNetwork, CometRpc
from gradfed_ipfs.cometbft.abci import RoundView, contribution_tx, validator_binding
from gradfed_ipfs.federated.agreed import (
    AgreedConfig,
    AgreedRoundResult,
    AgreedSession,
    rounds_genesis,
    verify_agreed_history,
)
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore

pytestmark = [pytest.mark.cometbft, pytest.mark.kubo, pytest.mark.slow]

D = 2_000
SESSION = "comet-agreed"


@dataclass
class Federation:
    sessions: list[AgreedSession]
    stores: list[KuboBlockStore]
    pubsubs: list[KuboPubsub]
    network: CometNetwork
    genesis: Any
    members: tuple[str, ...]


def _config(members: tuple[str, ...]) -> AgreedConfig:
    return AgreedConfig(
        members=members,
        min_peers=3,
        control="cometbft",
        collect_timeout=3.0,  # block time: a member missing for 3 s is left out
        round_timeout=60.0,
        fetch_timeout=20.0,
        announce_interval=0.1,
        learning_rate=0.5,
    )


@pytest.fixture
async def federation(kubo_swarm4: list[Any], cometbft_binary: Path) -> AsyncIterator[Federation]:
    nodes = kubo_swarm4
    members = tuple(n.peer_id for n in nodes)
    config = _config(members)
    stores = [KuboBlockStore(n.api_url, timeout=30.0) for n in nodes]
    pubsubs = [KuboPubsub(n.api_url) for n in nodes]
    model = np.random.default_rng(7).standard_normal(D).astype(np.float32)
    genesis = await AgreedSession.commit_genesis(stores[0], model)
    network = CometNetwork(4, binary=cometbft_binary)
    sessions: list[AgreedSession] = []
    try:
        # Each member binds its validator's key to its peer ID: a statement its daemon signs.
        entries = await asyncio.to_thread(network.prepare)
        bindings = [
            await validator_binding(
                await pubsub.signer(), SESSION, network.chain_id, entry.key_bytes
            )
            for pubsub, entry in zip(pubsubs, entries, strict=True)
        ]
        chain = replace(rounds_genesis(SESSION, genesis, config), bindings=tuple(bindings))
        await asyncio.to_thread(network.launch, chain.to_dict())
        await asyncio.to_thread(network.wait_for_height, 1, timeout=30)
        for store, pubsub, validator in zip(stores, pubsubs, network, strict=True):
            session = AgreedSession(
                store, pubsub, SESSION, genesis, config, validator_rpc=validator.rpc_url
            )
            await session.start(model)
            sessions.append(session)
        yield Federation(sessions, stores, pubsubs, network, genesis, members)
    finally:
        for session in sessions:
            await session.aclose()
        await asyncio.to_thread(network.stop)
        for pubsub in pubsubs:
            await pubsub.aclose()
        for store in stores:
            await store.aclose()


def _gradient(peer: int, r: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.random.default_rng([peer, r]).standard_normal(D).astype(np.float32)


async def _round(fed: Federation, r: int, who: list[int]) -> list[AgreedRoundResult]:
    return list(
        await asyncio.gather(
            *(fed.sessions[i].run_round(_gradient(i, r), weight=1 + i) for i in who)
        )
    )


def _one_record(results: list[AgreedRoundResult]) -> AgreedRoundResult:
    assert len({r.record for r in results}) == 1, [r.record for r in results]
    assert len({r.model for r in results}) == 1
    return results[0]


async def _app_view(fed: Federation, i: int, r: int) -> RoundView:
    answer = await CometRpc(fed.network[i].rpc_url).abci_query("/round", str(r).encode())
    assert answer.code == 0, answer
    return RoundView.from_dict(dag_cbor.decode(answer.value))


async def test_three_rounds_reach_one_record_on_every_member(federation: Federation) -> None:
    fed = federation
    for r in range(3):
        result = _one_record(await _round(fed, r, [0, 1, 2, 3]))
        assert result.roster.peers == tuple(sorted(fed.members))
        assert [e.weight for e in result.roster.entries] == [
            1 + fed.members.index(p) for p in result.roster.peers
        ]
        # Every validator's app says the round is final with this record.
        views = [await _app_view(fed, i, r) for i in range(4)]
        assert {(v.status, v.record) for v in views} == {("final", str(result.record))}
    assert len({s.model.tobytes() for s in fed.sessions}) == 1
    records = await verify_agreed_history(
        fed.stores[3], result.record, session=SESSION, genesis=fed.genesis
    )
    assert [rec.round for rec in records] == [0, 1, 2]
    # One chain state everywhere: the app hashes agree at a common height.
    height = min(v.latest()[0] for v in fed.network)
    headers = [v.rpc("block", height=str(height))["block"]["header"] for v in fed.network]
    hashes = {header["app_hash"] for header in headers}
    assert len(hashes) == 1


async def test_a_hostile_then_crashed_member_is_left_out_and_the_others_go_on(
    federation: Federation,
) -> None:
    fed = federation
    everyone = _one_record(await _round(fed, 0, [0, 1, 2, 3]))
    assert len(everyone.roster.entries) == 4
    # Round 1: member 3 signs a contribution whose block is no gradient (its own daemon
    # serves it): nobody can verify it, so no honest member attests it. Then it signs another
    # one and sends it through another validator: two contributions of one round, evidence.
    hostile = fed.sessions[3]
    signer = await fed.pubsubs[3].signer()
    for i, junk in enumerate([Block.new(b"not a gradient", "raw"), Block.new(b"nor this", "raw")]):
        await fed.stores[3].put(junk)
        tx = await contribution_tx(signer, SESSION, 1, junk.cid, 1, hostile.model_cid)
        await CometRpc(fed.network[3 - i].rpc_url).broadcast_tx_sync(tx)
    honest = _one_record(await _round(fed, 1, [0, 1, 2]))
    assert fed.members[3] not in honest.roster.peers
    assert len(honest.roster.entries) == 3
    view = await _app_view(fed, 0, 1)
    assert (view.status, view.record) == ("final", str(honest.record))
    assert view.evidence == (fed.members[3],)
    assert [line.peer for line in view.roster or ()] == list(honest.roster.peers)
    # Round 2: member 3's machine is gone (its validator and app killed); 3 of 4 validators
    # still commit blocks, the round closes at its deadline with the other three.
    fed.network[3].kill()
    after = _one_record(await _round(fed, 2, [0, 1, 2]))
    assert after.roster.peers == tuple(sorted(fed.members[:3]))
    assert after.round == 2
    records = await verify_agreed_history(
        fed.stores[0], after.record, session=SESSION, genesis=fed.genesis
    )
    assert [rec.round for rec in records] == [0, 1, 2]


async def test_with_two_validators_down_a_round_stalls_and_resumes(federation: Federation) -> None:
    fed = federation
    first = _one_record(await _round(fed, 0, [0, 1, 2, 3]))
    down = [fed.network[2], fed.network[3]]
    for validator in down:
        validator.kill()  # half the voting power: no block can commit
    alive = [fed.network[0], fed.network[1]]
    stalled_at = max(v.latest()[0] for v in alive)
    running = asyncio.ensure_future(_round(fed, 1, [0, 1, 2, 3]))
    # A check of absence: watched for ten block intervals plus the consensus timeouts.
    timing = fed.network.timing
    watch = 10 * timing.timeout_commit + timing.timeout_propose + timing.timeout_precommit
    deadline = asyncio.get_running_loop().time() + watch
    while asyncio.get_running_loop().time() < deadline:
        assert not running.done()
        heights = [(await CometRpc(v.rpc_url).latest())[0] for v in alive]
        assert max(heights) <= stalled_at + 1, heights  # one in flight may still commit
        await asyncio.sleep(timing.timeout_commit / 3)  # paces the watch; waits for no event
    views = [await _app_view(fed, i, 1) for i in (0, 1)]
    assert all(v.status in ("waiting", "open") for v in views)  # nothing decided meanwhile
    for validator in down:
        await asyncio.to_thread(validator.start)  # replayed from its blocks, then block sync
    resumed = _one_record(await running)  # all four: the same record
    # The restarted members' contributions may miss the round's block-time deadline (their
    # validators catch up first): the roster holds at least min_peers, the live two included.
    assert len(resumed.roster.entries) >= 3
    assert set(fed.members[:2]) <= set(resumed.roster.peers)
    assert resumed.base == first.model
    views = [await _app_view(fed, i, 1) for i in range(4)]
    assert {(v.status, v.record) for v in views} == {("final", str(resumed.record))}
