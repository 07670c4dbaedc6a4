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
from gradfed_ipfs.cometbft import (
    CometNetwork,
    CometRpc,
    FinalityBundle,
    export_finality,
    verify_finality,
)
from gradfed_ipfs.cometbft.abci import RoundView, contribution_tx, validator_binding
from gradfed_ipfs.cometbft.abci.pb.cometbft.types.v1 import types_pb2, validator_pb2
from gradfed_ipfs.errors import (
    AppHashMismatch,
    BadCommitSignature,
    FinalityNotProven,
    InsufficientVotingPower,
    NotFinal,
)
from gradfed_ipfs.federated.agreed import (
    AgreedConfig,
    AgreedRoundResult,
    AgreedSession,
    rounds_genesis,
    verify_agreed_history,
    verify_final_record,
)
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore
from tests.cli.test_cli import run_cli
from tests.polling import apoll_until

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


def _with_header(bundle: FinalityBundle, signed: types_pb2.SignedHeader) -> FinalityBundle:
    return replace(bundle, signed_header=signed.SerializeToString())


def _signed(bundle: FinalityBundle) -> types_pb2.SignedHeader:
    return types_pb2.SignedHeader.FromString(bundle.signed_header)


def _with_proof(bundle: FinalityBundle, **fields: Any) -> FinalityBundle:
    proof = dag_cbor.decode(bundle.proof)
    assert isinstance(proof, dict)
    return replace(bundle, proof=dag_cbor.encode({**proof, **fields}))


async def test_a_third_party_verifies_a_final_record_from_the_commits(
    federation: Federation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fed = federation
    first = _one_record(await _round(fed, 0, [0, 1, 2, 3]))
    final = _one_record(await _round(fed, 1, [0, 1, 2, 3]))
    # Any validator exports the bundle; the verifier needs only it and IPFS.
    bundle = FinalityBundle.decode(
        (await export_finality(CometRpc(fed.network[2].rpc_url), 1)).encode()
    )
    finality, records = await verify_final_record(fed.stores[1], final.record, bundle)
    assert (finality.round, finality.record, finality.model) == (
        1,
        str(final.record),
        str(final.model),
    )
    assert finality.members == tuple(sorted(fed.members))
    assert 3 * finality.power[0] > 2 * finality.power[1] == 8
    assert [rec.round for rec in records] == [0, 1]
    # The proof is small: the state summary and a log-size Merkle path.
    assert len(bundle.proof) < 600
    # The bundle proves round 1's record, not round 0's.
    with pytest.raises(NotFinal):
        await verify_final_record(fed.stores[1], first.record, bundle)

    signed = _signed(bundle)
    voted = [i for i, sig in enumerate(signed.commit.signatures) if sig.signature]
    assert len(voted) >= 3
    # A tampered precommit signature.
    forged = _signed(bundle)
    sig = forged.commit.signatures[voted[0]]
    sig.signature = bytes([sig.signature[0] ^ 1]) + sig.signature[1:]
    with pytest.raises(BadCommitSignature):
        verify_finality(_with_header(bundle, forged))
    # A commit with 2 of 4 validators' precommits: not more than 2/3 of the power.
    weak = _signed(bundle)
    for i in voted[: len(voted) - 2]:
        weak.commit.signatures[i].block_id_flag = validator_pb2.BLOCK_ID_FLAG_ABSENT
    with pytest.raises(InsufficientVotingPower):
        verify_finality(_with_header(bundle, weak))
    # Another app hash in the header: the commit is not for that header any more.
    moved = _signed(bundle)
    moved.header.app_hash = bytes(32)
    with pytest.raises(FinalityNotProven):
        verify_finality(_with_header(bundle, moved))
    # A state summary that is not the signed app hash.
    proof = dag_cbor.decode(bundle.proof)
    assert isinstance(proof, dict)
    assert isinstance(proof["state"], bytes)
    with pytest.raises(AppHashMismatch):
        verify_finality(_with_proof(bundle, state=proof["state"][:-1] + b"\x00"))
    # A record the chain did not finalize, claimed in the proof.
    with pytest.raises(NotFinal):
        verify_finality(_with_proof(bundle, record=str(first.record)))
    # A round that is not final cannot be exported.
    with pytest.raises(NotFinal):
        await export_finality(CometRpc(fed.network[0].rpc_url), 2)
    # The CLI: export from one validator, verify with nothing but the file and IPFS.
    path = tmp_path / "round1.cbor"
    api = ("--api", fed.stores[3].api_url)
    rpc = fed.network[1].rpc_url
    code, out, err = await asyncio.to_thread(
        run_cli, capsys, "comet-export", "--rpc", rpc, "--round", "1", "-o", str(path)
    )
    assert code == 0, err
    code, out, err = await asyncio.to_thread(
        run_cli, capsys, *api, "verify-round", str(final.record), "--commits", str(path)
    )
    assert code == 0, err
    assert "final: round 1" in out
    bad = tmp_path / "bad.cbor"
    bad.write_bytes(_with_header(bundle, forged).encode())
    code, out, err = await asyncio.to_thread(
        run_cli, capsys, *api, "verify-round", str(final.record), "--commits", str(bad)
    )
    assert code == 1
    assert "BadCommitSignature" in err


async def test_a_restarted_member_catches_up_by_block_sync_and_resyncs_from_the_chain(
    federation: Federation,
) -> None:
    fed = federation
    _one_record(await _round(fed, 0, [0, 1, 2, 3]))
    # Member 3's machine goes down: its validator, its app and its peer.
    fed.network[3].kill()
    await fed.sessions[3].aclose()
    for r in (1, 2):
        last = _one_record(await _round(fed, r, [0, 1, 2]))
    height = max(v.latest()[0] for v in fed.network.validators[:3])
    # Back: the validator replays its own blocks, then block-syncs the rest from the others.
    await asyncio.to_thread(fed.network[3].start)

    async def caught_up() -> bool:
        return (await CometRpc(fed.network[3].rpc_url).latest())[0] >= height

    await apoll_until(caught_up, timeout=60, what="validator 3 to block-sync")
    view = await _app_view(fed, 3, 2)
    assert (view.status, view.record) == ("final", str(last.record))
    # Its peer starts again from the genesis and resyncs from the chain's final record.
    config = _config(fed.members)
    again = AgreedSession(
        fed.stores[3], fed.pubsubs[3], SESSION, fed.genesis, config,
        validator_rpc=fed.network[3].rpc_url,
    )  # fmt: skip
    fed.sessions[3] = again
    await again.start()
    resync = await again.resync(timeout=60)
    assert resync.changed
    assert (resync.round, resync.head, resync.model) == (3, last.record, last.model)
    assert again.model.tobytes() == fed.sessions[0].model.tobytes()
    # And it takes part in the next round: one record on all four.
    after = _one_record(await _round(fed, 3, [0, 1, 2, 3]))
    assert len(after.roster.entries) >= 3
    assert after.base == last.model
