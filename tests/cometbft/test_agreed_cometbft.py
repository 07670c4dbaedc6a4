"""Agreed sessions on the CometBFT control plane: 4 members, each a real Kubo daemon, a real
validator and its Python round machine, all on loopback.

Three all-to-all rounds end on one record everywhere (and re-verify from the head); a member
running every attack of the hostile-members issue that exists on this plane is left out by the
chain's roster and moves no honest member's record or head, and with its validator crashed the
other three go on. With two validators of four down a round stalls (no block, no
decision) and resumes to one record on all four once they are back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import dag_cbor
import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs.block import Block
from gradfed_ipfs.cometbft import (
    DEFAULT_TIMING,
    BlockTiming,
    CometNetwork,
    CometRpc,
    FinalityBundle,
    export_finality,
    launch_session_chain,
    verify_finality,
)
from gradfed_ipfs.cometbft.abci import (
    RoundView,
    attestation_tx,
    contribution_tx,
    result_tx,
)
from gradfed_ipfs.cometbft.abci.pb.cometbft.types.v1 import types_pb2, validator_pb2
from gradfed_ipfs.errors import (
    AppHashMismatch,
    BadCommitSignature,
    CometRpcError,
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
from gradfed_ipfs.formats.agreed.roster import AgreedMessage, Roster, sign_message
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore, put_gradient
from gradfed_ipfs.tensor.deterministic import deterministic_update
from tests.adversarial.hostile import forged_head
from tests.cli.test_cli import run_cli
from tests.federated.sliced.hostile import Censor
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


def _config(members: tuple[str, ...], **settings: Any) -> AgreedConfig:
    return AgreedConfig(
        members=members,
        min_peers=3,
        control="cometbft",
        collect_timeout=3.0,  # block time: a member missing for 3 s is left out
        round_timeout=60.0,
        fetch_timeout=20.0,
        announce_interval=0.1,
        learning_rate=0.5,
        **settings,
    )


SLICED = {"aggregation": "reduce-scatter", "chunk_bytes": 65_536, "reducer_timeout": 15.0}
"""Reduce-scatter settings: D_SLICED values make 4 chunks of 64 KiB (a slice each)."""
D_SLICED = 65_536


@pytest.fixture
async def federation(
    request: pytest.FixtureRequest, kubo_swarm4: list[Any], cometbft_binary: Path
) -> AsyncIterator[Federation]:
    """Four members; the test's parameter, if any: the chain's block timing, or settings."""
    param = getattr(request, "param", DEFAULT_TIMING)
    timing = param if isinstance(param, BlockTiming) else DEFAULT_TIMING
    settings: dict[str, Any] = {} if isinstance(param, BlockTiming) else dict(param)
    faults = settings.pop("faults", lambda members: {})  # members -> {index: SliceFaults}
    nodes = kubo_swarm4
    members = tuple(n.peer_id for n in nodes)
    config = _config(members, **settings)
    stores = [KuboBlockStore(n.api_url, timeout=30.0) for n in nodes]
    pubsubs = [KuboPubsub(n.api_url) for n in nodes]
    d = D_SLICED if settings.get("aggregation") == "reduce-scatter" else D
    model = np.random.default_rng(7).standard_normal(d).astype(np.float32)
    genesis = await AgreedSession.commit_genesis(stores[0], model)
    network = CometNetwork(4, binary=cometbft_binary, timing=timing)
    sessions: list[AgreedSession] = []
    try:
        # Each member binds its validator's key to its peer ID: a statement its daemon signs.
        signers = [await pubsub.signer() for pubsub in pubsubs]
        await launch_session_chain(network, rounds_genesis(SESSION, genesis, config), signers)
        for store, pubsub, validator in zip(stores, pubsubs, network, strict=True):
            session = AgreedSession(
                store, pubsub, SESSION, genesis, config, validator_rpc=validator.rpc_url,
                faults=faults(members).get(len(sessions)),
            )  # fmt: skip
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


def _gradient(peer: int, r: int, d: int = D) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.random.default_rng([peer, r]).standard_normal(d).astype(np.float32)


async def _round(fed: Federation, r: int, who: list[int]) -> list[AgreedRoundResult]:
    d = fed.sessions[0].model.size
    return list(
        await asyncio.gather(
            *(fed.sessions[i].run_round(_gradient(i, r, d), weight=1 + i) for i in who)
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


@pytest.mark.parametrize("federation", [SLICED], indirect=True)
async def test_reduce_scatter_rounds_on_the_chain_equal_the_all_to_all_update(
    federation: Federation,
) -> None:
    """The chain decides the roster from attested roots; the reducers' slices make the model.

    Each round's model is the all-to-all update of its roster (recomputed here), every
    validator's app finalizes the record, which names one slice record per member, and the
    chain of records re-verifies (slices re-aggregated) from the head.
    """
    fed = federation
    base = fed.sessions[0].model.copy()
    for r in range(2):
        result = _one_record(await _round(fed, r, [0, 1, 2, 3]))
        assert result.aggregation == "reduce-scatter"
        assert len(result.slices) == 4
        assert not result.missing
        entries = result.roster.entries
        grads = [_gradient(fed.members.index(e.peer), r, D_SLICED) for e in entries]
        want = deterministic_update(base, grads, [e.weight for e in entries], 0.5)
        assert np.array_equal(fed.sessions[3].model, want)
        base = want
        views = [await _app_view(fed, i, r) for i in range(4)]
        assert {(v.status, v.record) for v in views} == {("final", str(result.record))}
    records = await verify_agreed_history(
        fed.stores[2], result.record, session=SESSION, genesis=fed.genesis
    )
    assert [rec.round for rec in records] == [0, 1]
    assert all(rec.slices is not None and len(rec.slices) == 4 for rec in records)


@pytest.mark.parametrize(
    "federation", [{**SLICED, "faults": lambda members: {1: Censor(members[2])}}], indirect=True
)
async def test_a_false_missing_claim_on_the_chain_drops_nobody_and_names_the_claimant(
    federation: Federation,
) -> None:
    """Issue 32, attack 6, on the chain: member 1 claims in every slice it reduces that it could
    not fetch member 2's. Member 2 stays in every roster and slice; the claimant is rejected;
    the honest three finalize one record per round (the claimant's result is not theirs)."""
    fed, censor, victim = federation, 1, federation.members[2]
    base = fed.sessions[0].model.copy()
    for r in range(2):
        d = D_SLICED
        outcomes = await asyncio.gather(
            *(s.run_round(_gradient(i, r, d), weight=1 + i) for i, s in enumerate(fed.sessions)),
            return_exceptions=True,  # the claimant's own view of the round is its business
        )
        honest = [o for i, o in enumerate(outcomes) if i != censor]
        assert all(isinstance(o, AgreedRoundResult) for o in honest), outcomes
        results = [o for o in honest if isinstance(o, AgreedRoundResult)]
        result = _one_record(results)
        assert victim in result.roster.peers
        assert result.missing == ()
        assert all("false missing claim" in o.rejected[fed.members[censor]] for o in results)
        entries = result.roster.entries
        grads = [_gradient(fed.members.index(e.peer), r, d) for e in entries]
        base = deterministic_update(base, grads, [e.weight for e in entries], 0.5)
        assert np.array_equal(fed.sessions[0].model, base)
        views = [await _app_view(fed, i, r) for i in range(4)]
        assert {(v.status, v.record) for v in views} == {("final", str(result.record))}


async def _hijack_roster(fed: Federation, r: int, base: CID) -> bytes:
    """Member 3's round-``r`` roster on pubsub: made-up entries for all, its own at 2**20."""
    signer, me = await fed.pubsubs[3].signer(), fed.members[3]
    lines: dict[str, tuple[CID, int, bytes | None]] = {}
    for i, peer in enumerate(fed.members):
        fake = await put_gradient(fed.stores[3], np.full(D, 1234.5 + i, np.float32))
        contrib = AgreedMessage("contrib", SESSION, fed.genesis, r, me, fake, base, 2**20)
        lines[peer] = (
            fake,
            2**20,
            (await sign_message(contrib, signer, fed.pubsubs[3].keys)).signature,
        )
    roster = Roster.new(SESSION, fed.genesis, r, base, me, fed.members, lines)
    block = roster.to_block()
    message = AgreedMessage("roster", SESSION, fed.genesis, r, me, block.cid, inline=block.data)
    return (await sign_message(message, signer, fed.pubsubs[3].keys)).block.data


async def _forge_result_once_closed(fed: Federation, r: int, record: CID, model: CID) -> int:
    """Member 3 sends its forged result the moment round ``r``'s roster is decided."""
    tx = await result_tx(await fed.pubsubs[3].signer(), SESSION, r, record, model)

    async def closed() -> bool:
        return (await _app_view(fed, 0, r)).roster is not None

    await apoll_until(closed, timeout=60.0, what=f"round {r}'s roster")
    try:
        return (await CometRpc(fed.network[0].rpc_url).broadcast_tx_sync(tx)).code
    except CometRpcError:  # refused: the honest results came first
        return -1


async def test_a_byzantine_member_running_every_attack_then_crashing_is_left_out(
    federation: Federation,
) -> None:
    """Issue 36: one Byzantine member of four runs the pubsub-mode attacks of the hostile-members
    issue that exist on this plane, all in round 1; the honest three finalize one record.

    It equivocates (two signed contributions, through two validators: evidence), each of them
    a block nobody can verify (so never attested); publishes a hijacked roster on pubsub
    (made-up entries at weight 2**20, signed by itself); attests a made-up contribution of
    member 0 (a false claim about what member 0 sent: it holds nothing, member 0's own is the
    one its honest peers attest); announces a forged head of round 1 on pubsub; and sends the
    chain a result for that forged record the moment the roster is decided. The roster comes
    from the chain, the record is final only with 2f + 1 equal results, and a resync reads the
    chain, so none of it moves an honest member. (Reduce-scatter's ``missing`` claims and
    regional records do not exist on this plane: it runs all-to-all rounds only.) Then its
    machine crashes and the other three go on.
    """
    fed = federation
    everyone = _one_record(await _round(fed, 0, [0, 1, 2, 3]))
    assert len(everyone.roster.entries) == 4
    hostile = fed.sessions[3]
    signer = await fed.pubsubs[3].signer()
    for i, junk in enumerate([Block.new(b"not a gradient", "raw"), Block.new(b"nor this", "raw")]):
        await fed.stores[3].put(junk)
        tx = await contribution_tx(signer, SESSION, 1, junk.cid, 1, everyone.model)
        await CometRpc(fed.network[3 - i].rpc_url).broadcast_tx_sync(tx)
    claim = await attestation_tx(signer, SESSION, 1, fed.members[0], junk.cid)
    await CometRpc(fed.network[3].rpc_url).broadcast_tx_sync(claim)
    hijack = await _hijack_roster(fed, 1, everyone.model)
    await fed.pubsubs[3].publish(hostile.topic, hijack)
    forged_model, forged_record = await forged_head(fed.stores[3], everyone.record, D)
    await hostile._parts.messages.done(1, forged_model, forged_record)  # announced, re-announced
    forging = asyncio.ensure_future(_forge_result_once_closed(fed, 1, forged_record, forged_model))
    honest = _one_record(await _round(fed, 1, [0, 1, 2]))
    await forging  # usually taken into the mempool before the honest results (CheckTx code 0)
    assert honest.record != forged_record
    assert honest.roster.peers == tuple(sorted(fed.members[:3]))
    weights = [1 + fed.members.index(p) for p in honest.roster.peers]
    assert [e.weight for e in honest.roster.entries] == weights  # no hijacked weight
    view = await _app_view(fed, 0, 1)
    assert (view.status, view.record) == ("final", str(honest.record))
    assert view.evidence == (fed.members[3],)
    assert [line.peer for line in view.roster or ()] == list(honest.roster.peers)
    for session in fed.sessions[:3]:  # the forged head heard on pubsub moves nobody
        synced = await session.resync(timeout=30.0)
        assert (synced.changed, synced.head, session.head) == (False, honest.record, honest.record)
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


class _Phases(logging.Handler):
    """Sets ``seen`` once a session logs the round phase ``phase``."""

    def __init__(self, phase: str) -> None:
        super().__init__(logging.DEBUG)
        self.phase, self.seen = phase, asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "phase", None) == self.phase:
            self.seen.set()


@pytest.mark.parametrize("federation", [replace(DEFAULT_TIMING, timeout_commit=2.0)], indirect=True)
async def test_a_wrong_roster_guess_is_dropped_and_the_chain_roster_aggregated(
    federation: Federation, caplog: pytest.LogCaptureFixture
) -> None:
    """The honest members guess round 0's roster (every member's contribution, verified) and
    send their results naming it; member 3 then equivocates, in the block that closes the
    round (2 s between blocks leave it the time), so the chain decides the three others. The
    guessed results do not count; each honest member adopts the chain's roster, aggregates it
    and sends its result again: one record of the three, with member 3's proven equivocation.

    Member 3 sends its first contribution to the chain only (not on pubsub), so the others
    attest it once the chain lists it, a block after their own: the close waits for that.
    """
    fed = federation
    signer, rpc = await fed.pubsubs[3].signer(), CometRpc(fed.network[3].rpc_url)
    guessed = _Phases("roster guessed")
    logger = logging.getLogger("gradfed_ipfs.federated.agreed")
    logger.addHandler(guessed)
    caplog.set_level(logging.DEBUG, "gradfed_ipfs.federated.agreed")

    async def equivocate() -> None:
        first = await put_gradient(fed.stores[3], _gradient(3, 0))
        tx = await contribution_tx(signer, SESSION, 0, first, 4, fed.genesis)
        assert (await rpc.broadcast_tx_sync(tx)).code == 0
        await asyncio.wait_for(guessed.seen.wait(), timeout=60.0)
        second = await put_gradient(fed.stores[3], 2 * _gradient(3, 0))
        tx = await contribution_tx(signer, SESSION, 0, second, 4, fed.genesis)
        assert (await rpc.broadcast_tx_sync(tx)).code == 0

    try:
        hostile = asyncio.ensure_future(equivocate())
        honest = _one_record(await _round(fed, 0, [0, 1, 2]))
        await hostile
    finally:
        logger.removeHandler(guessed)
    assert honest.roster.peers == tuple(sorted(fed.members[:3]))
    view = await _app_view(fed, 0, 0)
    assert (view.status, view.record, view.evidence) == (
        "final",
        str(honest.record),
        (fed.members[3],),
    )
    wrong = [r for r in caplog.records if "another roster than guessed" in r.getMessage()]
    assert wrong, "no honest member found its guess wrong"
    records = await verify_agreed_history(
        fed.stores[1], honest.record, session=SESSION, genesis=fed.genesis
    )
    assert [rec.round for rec in records] == [0]


async def test_with_two_validators_down_a_round_stalls_and_resumes(federation: Federation) -> None:
    fed = federation
    first = _one_record(await _round(fed, 0, [0, 1, 2, 3]))
    down = [fed.network[2], fed.network[3]]
    for validator in down:
        validator.kill()  # half the voting power: no block can commit
    alive = [fed.network[0], fed.network[1]]
    stalled_at = max(v.latest()[0] for v in alive)
    running = asyncio.ensure_future(_round(fed, 1, [0, 1, 2, 3]))
    # A check of absence: the live members' contributions wait in the mempool, so a network
    # that could commit would at once; watched for three idle block intervals plus the timeouts.
    timing = fed.network.timing
    watch = 3 * timing.idle_block_interval + timing.timeout_propose + timing.timeout_precommit
    deadline = asyncio.get_running_loop().time() + watch
    while asyncio.get_running_loop().time() < deadline:
        assert not running.done()
        heights = [(await CometRpc(v.rpc_url).latest())[0] for v in alive]
        assert max(heights) <= stalled_at + 1, heights  # one in flight may still commit
        await asyncio.sleep(timing.idle_block_interval / 3)  # paces the watch; waits for no event
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
    assert (finality.hops, bundle.hops) == (0, ())  # the genesis set signed it
    # A version-1 bundle (before hops) still decodes; a list of hops is bounded.
    plain = dag_cbor.decode(bundle.encode())
    assert isinstance(plain, dict)
    v1 = {k: v for k, v in plain.items() if k != "hops"} | {"version": 1}
    assert verify_finality(FinalityBundle.decode(dag_cbor.encode(v1))) == finality
    with pytest.raises(FinalityNotProven, match="at most 256 hops"):
        FinalityBundle.decode(dag_cbor.encode(plain | {"hops": [[b"", []]] * 257}))
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
        # The block store's height can run one block ahead of what its app executed (a block
        # is saved before it is applied): wait for the app's answer as well.
        if (await CometRpc(fed.network[3].rpc_url).latest())[0] < height:
            return False
        return (await _app_view(fed, 3, 2)).status == "final"

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
