"""Member sets on the CometBFT control plane: real Kubo daemons, real validators, real apps.

Four members start the chain (admission ``two-thirds``, the fifth peer on the allow-list). The
fifth joins on its signed join alone: its node block-syncs as a full node, the chain admits it at
round 0's close and makes it a validator; it fetches round 0's model by CID and contributes from
round 1. The sixth is admitted by the votes of four of round 1's five members, and a member
leaves after round 2. Fewer rounds than issue #36's (joins at rounds 1 and 2, a leave after round
2, instead of 5 and 8): the same transitions, at a fraction of the CI time. A third party then
proves round 3's record final from a joiner's node's commits: three validator-set changes, each
a hop signed by more than 2/3 of the set before it.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import replace
from pathlib import Path
from typing import Any

import dag_cbor
import numpy as np
import pytest

from gradfed_ipfs.cometbft import (
    CometNetwork,
    CometRpc,
    FinalityBundle,
    Validator,
    export_finality,
    verify_finality,
)
from gradfed_ipfs.cometbft.abci import validator_binding
from gradfed_ipfs.errors import FinalityNotProven
from gradfed_ipfs.federated.agreed import (
    Admission,
    AgreedConfig,
    AgreedRoundResult,
    AgreedSession,
    rounds_genesis,
    verify_final_record,
)
from gradfed_ipfs.formats.agreed.membership import MemberSet
from gradfed_ipfs.formats.agreed.roster import AgreedRecord
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore
from tests.polling import apoll_until

pytestmark = [pytest.mark.cometbft, pytest.mark.kubo, pytest.mark.slow]

D = 2_000
SESSION = "comet-members"


def _gradient(peer: str, r: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    seed = int.from_bytes(peer.encode()[-8:], "big")
    return np.random.default_rng([seed, r]).standard_normal(D).astype(np.float32)


async def _round(sessions: list[AgreedSession], r: int) -> AgreedRoundResult:
    results = await asyncio.gather(*(s.run_round(_gradient(s.peer_id, r)) for s in sessions))
    assert len({res.record for res in results}) == 1, [res.record for res in results]
    assert {res.round for res in results} == {r}
    return results[0]


def _validator_keys(node: Validator) -> set[bytes]:
    answer = node.rpc("validators", per_page="100")
    return {base64.b64decode(v["pub_key"]["value"]) for v in answer["validators"]}


def _own_key(node: Validator) -> bytes:
    return base64.b64decode(node.rpc("status")["validator_info"]["pub_key"]["value"])


def _pending(node: Validator, peer: str) -> Any:
    async def held() -> bool:  # the chain holds the peer's join (its validator key bound)
        answer = await CometRpc(node.rpc_url).abci_query("/members", b"")
        info = dag_cbor.decode(answer.value)
        assert isinstance(info, dict)
        return peer in dict(info["pending"])

    return held


def _keys_say(node: Validator, key: bytes, present: bool) -> Any:
    async def check() -> bool:
        return (key in await asyncio.to_thread(_validator_keys, node)) == present

    return check


async def _third_party_verifies(
    node: Validator, store: KuboBlockStore, final: AgreedRoundResult, founders: tuple[str, ...]
) -> None:
    """Round 3's record is proven final across the three set changes, then re-verified."""
    exported = await export_finality(CometRpc(node.rpc_url), 3)
    bundle = FinalityBundle.decode(exported.encode())
    finality, records = await verify_final_record(store, final.record, bundle)
    assert (finality.round, finality.record) == (3, str(final.record))
    assert finality.hops == len(bundle.hops) == 3  # join, join, leave
    assert finality.members == founders  # the genesis set; the records name the later ones
    assert finality.power[1] == 5
    assert 3 * finality.power[0] > 2 * 5
    assert len(records) == 4
    hops = bundle.hops
    genesis_set = bundle.validators
    for broken, why in [
        (replace(bundle, hops=()), "not the trusted one"),  # the set changed: a hop is needed
        (replace(bundle, hops=hops[:1] + hops[2:]), "not the trusted one"),  # one left out
        (replace(bundle, hops=(hops[1], hops[0], hops[2])), "not the trusted one"),
        (replace(bundle, hops=((hops[0][0], genesis_set), *hops[1:])), "not the one it commits"),
        (replace(bundle, hops=(*hops, hops[2])), "not the trusted one"),  # a hop replayed
    ]:
        with pytest.raises(FinalityNotProven, match=why):
            verify_finality(broken)


async def test_joins_by_allow_list_and_by_vote_and_a_leave_change_the_members_and_validators(
    kubo_swarm4: list[Any], kubo_provider: str, kubo_pool: Any, cometbft_binary: Path
) -> None:
    founders, (fifth, sixth) = kubo_swarm4, kubo_pool.get(kubo_provider, 2)
    for joiner in (fifth, sixth):  # the joiners' daemons reach the founders' (as a joiner would)
        for founder in founders:
            await asyncio.to_thread(joiner.connect, founder)
    nodes = [*founders, fifth, sixth]
    members = tuple(n.peer_id for n in founders)
    admission = Admission("two-thirds", allow=(fifth.peer_id,))
    config = AgreedConfig(
        # A round closes once every member's contribution is held; the deadline (block time)
        # only matters for a member that is missing, and none is here: room for a loaded CI.
        members=members, min_peers=3, control="cometbft", collect_timeout=20.0,
        round_timeout=60.0, fetch_timeout=20.0, announce_interval=0.1, learning_rate=0.5,
        model_every=1, admission=admission,
    )  # fmt: skip
    stores = [KuboBlockStore(n.api_url, timeout=30.0) for n in nodes]
    pubsubs = [KuboPubsub(n.api_url) for n in nodes]
    model = np.random.default_rng(11).standard_normal(D).astype(np.float32)
    genesis = await AgreedSession.commit_genesis(stores[0], model)
    network = CometNetwork(4, binary=cometbft_binary)
    sessions: list[AgreedSession] = []
    try:
        entries = await asyncio.to_thread(network.prepare)
        bindings = [
            await validator_binding(await p.signer(), SESSION, network.chain_id, e.key_bytes)
            for p, e in zip(pubsubs[:4], entries, strict=True)
        ]
        chain = replace(rounds_genesis(SESSION, genesis, config), bindings=tuple(bindings))
        await asyncio.to_thread(network.launch, chain.to_dict())
        await asyncio.to_thread(network.wait_for_height, 1, timeout=30)
        joiners = [await asyncio.to_thread(network.add_node) for _ in range(2)]  # full nodes
        for store, pubsub, validator in zip(stores, pubsubs, list(network), strict=True):
            session = AgreedSession(
                store, pubsub, SESSION, genesis, config, validator_rpc=validator.rpc_url
            )
            sessions.append(session)
        for session in sessions[:4]:
            await session.start(model)
        founding, e, f = sessions[:4], sessions[4], sessions[5]
        height = (await CometRpc(network[0].rpc_url).latest())[0]
        await asyncio.to_thread(network.wait_for_height, height, timeout=60, among=joiners)

        # The fifth: a full node first (its key is no validator's), on the allow-list.
        fifth_key, sixth_key = _own_key(joiners[0]), _own_key(joiners[1])
        assert fifth_key not in _validator_keys(network[0])
        joining = asyncio.ensure_future(e.join(timeout=90.0))
        await apoll_until(_pending(network[0], fifth.peer_id), timeout=60.0, what="5th's join")
        r0 = await _round(founding, 0)
        assert r0.roster.members is not None  # round 0's close admitted the fifth
        resynced = await joining
        assert (resynced.round, resynced.model) == (1, r0.model)
        assert e.members == tuple(sorted([*members, fifth.peer_id]))
        assert np.array_equal(e.model, founding[0].model)
        await apoll_until(_keys_say(network[0], fifth_key, True), timeout=30.0, what="5th key")

        # The sixth: not on the allow-list; four of round 1's five members vote for it.
        voting = asyncio.ensure_future(f.join(timeout=120.0))
        await apoll_until(_pending(network[0], sixth.peer_id), timeout=60.0, what="6th's join")
        for voter in [*founding[:3], e]:
            assert await voter.approve(sixth.peer_id), voter.peer_id
        five = [*founding, e]
        r1 = await _round(five, 1)
        assert set(r1.roster.peers) == {s.peer_id for s in five}  # the fifth contributed
        assert r1.roster.members is not None
        assert (await voting).round == 2
        await apoll_until(_keys_say(network[0], sixth_key, True), timeout=30.0, what="6th key")

        # A member leaves after round 2: round 3 is the other five's.
        leaver = founding[3]
        await leaver.leave(after=2)
        r2 = await _round([*five, f], 2)
        assert len(r2.roster.entries) == 6
        assert leaver.left
        stayed = [*founding[:3], e, f]
        r3 = await _round(stayed, 3)
        assert r3.roster.expected == tuple(sorted(s.peer_id for s in stayed))
        assert {s.members for s in stayed} == {r3.roster.expected}
        leaver_key = _own_key(network[3])
        await apoll_until(_keys_say(network[0], leaver_key, False), timeout=30.0, what="leave")
        assert len(_validator_keys(network[0])) == 5

        # Records name each changed set; the sets link up, each the chain's decision.
        sets, cids = [], []
        for result in (r0, r1, r2):
            record = AgreedRecord.from_block(await stores[5].get(result.record, timeout=20.0))
            assert record.members is not None
            assert record.members == result.roster.members
            cids.append(record.members)
            sets.append(MemberSet.from_block(await stores[5].get(record.members, timeout=20.0)))
        assert [s.prev for s in sets[1:]] == cids[:2]
        assert [s.round for s in sets] == [1, 2, 3]
        assert [len(s.members) for s in sets] == [5, 6, 5]
        assert [[(c.op, c.peer) for c in s.changes] for s in sets] == [
            [("join", fifth.peer_id)],
            [("join", sixth.peer_id)],
            [("leave", leaver.peer_id)],
        ]
        assert len(sets[1].changes[0].statements) == 1 + 4  # the join and four approvals
        # One chain state everywhere (the joiners' nodes included).
        height = min(v.latest()[0] for v in network)
        headers = [v.rpc("block", height=str(height))["block"]["header"] for v in network]
        hashes = {header["app_hash"] for header in headers}
        assert len(hashes) == 1
        await _third_party_verifies(network[5], stores[0], r3, tuple(sorted(members)))
    finally:
        for session in sessions:
            await session.aclose()
        await asyncio.to_thread(network.stop)
        for pubsub in pubsubs:
            await pubsub.aclose()
        for store in stores:
            await store.aclose()
