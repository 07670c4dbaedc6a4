"""Member sets on the CometBFT control plane, issue 36's schedule, each peer its own process.

Four members (f = 1) start the chain, each a process beside its own Kubo daemon and validator;
admission ``two-thirds``, the fifth peer on the allow-list. Ten rounds: the fifth joins on its
signed join alone at round 4's close (its node block-syncs as a full node, then the chain makes
it a validator) and contributes from round 5; the sixth is admitted by the votes of round 5's
members and contributes from round 6; a founder leaves after round 7. Every round ends on one
record on every member that ran it. A third party then proves round 9's record final from a
joiner's node's commits, across the three validator-set changes, and re-verifies its chain.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gradfed_ipfs.cid import parse_cid
from gradfed_ipfs.cli.children import ONE_BLAS_THREAD, JsonLinesChild
from gradfed_ipfs.cometbft import (
    CometNetwork,
    CometRpc,
    FinalityBundle,
    Validator,
    export_finality,
    launch_session_chain,
    verify_finality,
)
from gradfed_ipfs.errors import FinalityNotProven, RoundVerificationFailed
from gradfed_ipfs.federated.agreed import AgreedSession, rounds_genesis, verify_final_record
from gradfed_ipfs.federated.agreed.control import check_chain_member_sets
from gradfed_ipfs.federated.agreed.history import load_chain
from gradfed_ipfs.formats.agreed.membership import MemberSet
from gradfed_ipfs.formats.agreed.roster import AgreedRecord
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore
from tests.cli.test_cli import run_cli
from tests.cometbft.comet_peer import DIM, peer_config
from tests.multiprocess.peer import initial_model
from tests.polling import poll_until

pytestmark = [pytest.mark.cometbft, pytest.mark.kubo, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 10


class Peer(JsonLinesChild):
    """A running ``tests.cometbft.comet_peer``."""

    def __init__(self, args: list[str], log: Path) -> None:
        argv = [sys.executable, "-m", "tests.cometbft.comet_peer", *args]
        env = {**os.environ, **ONE_BLAS_THREAD, "PYTHONPATH": str(ROOT)}
        super().__init__(argv, stderr=log, cwd=ROOT, env=env)

    def rounds(self) -> dict[int, dict[str, Any]]:
        return {e["round"]: e for e in self.of("round")}


def _wait_final(peers: list[Peer], timeout: float) -> None:
    def finished() -> bool:
        for peer in peers:
            if peer.proc.poll() not in (None, 0):
                raise AssertionError(f"a peer exited {peer.proc.returncode}: {peer.stderr_tail()}")
        return all(peer.final() is not None for peer in peers)

    try:
        poll_until(finished, timeout=timeout, what="every peer's last round")
    except TimeoutError as exc:
        progress = [[(e["event"], e.get("round")) for e in p.events] for p in peers]
        raise AssertionError(f"{exc}; peers' events: {progress}") from None


def _validator_keys(node: Validator) -> set[bytes]:
    answer = node.rpc("validators", per_page="100")
    return {base64.b64decode(v["pub_key"]["value"]) for v in answer["validators"]}


def _own_key(node: Validator) -> bytes:
    return base64.b64decode(node.rpc("status")["validator_info"]["pub_key"]["value"])


async def _member_sets(store: KuboBlockStore, records: list[str]) -> list[tuple[Any, MemberSet]]:
    sets = []
    for cid in records:
        record = AgreedRecord.from_block(await store.get(cid, timeout=20.0))
        assert record.members is not None
        sets.append((record.members, MemberSet.from_block(await store.get(record.members))))
    return sets


async def _third_party_verifies(node: Validator, store: KuboBlockStore, record: str) -> None:
    """Round 9's record is proven final across the three set changes, then re-verified."""
    exported = await export_finality(CometRpc(node.rpc_url), ROUNDS - 1)
    bundle = FinalityBundle.decode(exported.encode())
    finality, records = await verify_final_record(store, record, bundle)
    assert (finality.round, finality.record) == (ROUNDS - 1, record)
    assert finality.hops == len(bundle.hops) == 3  # join, join, leave
    assert finality.power[1] == 5
    assert 3 * finality.power[0] > 2 * 5
    assert len(records) == ROUNDS
    # The chain's rules decide the sets: under others, the same records fail.
    assert finality.chain is not None
    chain = await load_chain(
        store, parse_cid(record), session=finality.session, genesis=parse_cid(finality.genesis)
    )
    for rules, why in [
        (replace(finality.chain, allow=()), "0 approvals < 3"),  # the fifth came by the list
        (replace(finality.chain, admission="allow-list"), "not on the allow-list"),  # the sixth
    ]:
        with pytest.raises(RoundVerificationFailed, match=why):
            await check_chain_member_sets(store, chain, rules)
    hops, genesis_set = bundle.hops, bundle.validators
    for broken, why in [
        (replace(bundle, hops=()), "not the trusted one"),  # the set changed: a hop is needed
        (replace(bundle, hops=hops[:1] + hops[2:]), "not the trusted one"),  # one left out
        (replace(bundle, hops=(hops[1], hops[0], hops[2])), "not the trusted one"),
        (replace(bundle, hops=((hops[0][0], genesis_set), *hops[1:])), "not the one it commits"),
        (replace(bundle, hops=(*hops, hops[2])), "not the trusted one"),  # a hop replayed
    ]:
        with pytest.raises(FinalityNotProven, match=why):
            verify_finality(broken)


async def test_ten_rounds_with_a_join_by_list_a_join_by_vote_and_a_leave_end_on_one_record(
    kubo_swarm4: list[Any],
    kubo_provider: str,
    kubo_pool: Any,
    cometbft_binary: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    founders, joining = kubo_swarm4, kubo_pool.get(kubo_provider, 2)
    for joiner in joining:  # the joiners' daemons reach the founders' (as a joiner would)
        for founder in founders:
            await asyncio.to_thread(joiner.connect, founder)
    nodes = [*founders, *joining]
    ids = [n.peer_id for n in nodes]
    members = tuple(ids[:4])
    config = peer_config(members, (ids[4],))
    session = f"comet-members-{os.getpid()}"
    store = KuboBlockStore(nodes[5].api_url, timeout=30.0)
    pubsubs = [KuboPubsub(n.api_url) for n in founders]
    network = CometNetwork(4, binary=cometbft_binary)
    peers: list[Peer] = []
    try:
        genesis = await AgreedSession.commit_genesis(store, initial_model(DIM))
        signers = [await p.signer() for p in pubsubs]  # each founder's daemon binds its key
        await launch_session_chain(network, rounds_genesis(session, genesis, config), signers)
        full_nodes = [await asyncio.to_thread(network.add_node) for _ in range(2)]
        joiner_keys = [_own_key(node) for node in full_nodes]
        assert not set(joiner_keys) & _validator_keys(network[0])  # full nodes first
        common = [
            "--members", ",".join(members), "--allow", ids[4], "--session", session,
            "--genesis", str(genesis), "--rounds", str(ROUNDS),
        ]  # fmt: skip
        votes = ["--approve", ids[5], "5"]  # round 5's five members vote for the sixth
        extras = [["--await-join", ids[4], "4", *votes] for _ in range(4)]
        extras[3] += ["--leave-after", "7"]
        extras += [["--join", "--join-from", "4", *votes], ["--join", "--join-from", "4"]]
        for i, extra in enumerate(extras):
            args = ["--api", nodes[i].api_url, "--rpc", network[i].rpc_url, "--index", str(i)]
            peers.append(Peer([*args, *common, *extra], tmp_path / f"peer{i}.log"))
        await asyncio.to_thread(_wait_final, peers, 420.0)

        # Who ran which round, and one record per round everywhere.
        assert [p.of("joined")[0]["round"] for p in peers[4:]] == [5, 6]
        assert peers[3].of("left")
        ran = [list(range(ROUNDS))] * 3 + [list(range(8)), list(range(5, 10)), list(range(6, 10))]
        assert [sorted(p.rounds()) for p in peers] == ran
        stayed = sorted([*ids[:3], *ids[4:]])
        for r in range(ROUNDS):
            events = [p.rounds()[r] for p in peers if r in p.rounds()]
            assert len({e["record"] for e in events}) == 1, (r, events)
            expected = (
                sorted(members) if r < 5 else sorted(ids[:5]) if r == 5 else
                sorted(ids) if r < 8 else stayed
            )  # fmt: skip
            assert {tuple(e["roster"]) for e in events} == {tuple(expected)}, r
        assert [p.of("approved")[0]["signed"] for p in peers[:5]] == [True] * 5  # the voters

        # Records name each changed set; the sets link up, each the chain's decision.
        changed = [peers[0].rounds()[r]["record"] for r in (4, 5, 7)]
        sets = await _member_sets(store, changed)
        assert [s.prev for _, s in sets[1:]] == [cid for cid, _ in sets[:2]]
        assert [(s.round, len(s.members)) for _, s in sets] == [(5, 5), (6, 6), (8, 5)]
        assert [[(c.op, c.peer) for c in s.changes] for _, s in sets] == [
            [("join", ids[4])],
            [("join", ids[5])],
            [("leave", ids[3])],
        ]
        assert len(sets[1][1].changes[0].statements) >= 1 + 4  # the join and >= 4 approvals

        # The validators followed the members; one chain state on all six nodes.
        final_keys = _validator_keys(network[0])
        assert len(final_keys) == 5
        assert set(joiner_keys) <= final_keys
        assert _own_key(network[3]) not in final_keys
        height = min(v.latest()[0] for v in network)
        headers = [v.rpc("block", height=str(height))["block"]["header"] for v in network]
        assert len({header["app_hash"] for header in headers}) == 1
        last = peers[0].rounds()[ROUNDS - 1]["record"]
        await _third_party_verifies(full_nodes[1], store, last)
        # The CLI: export from a joiner's node, verify with the file and IPFS only.
        path, api = tmp_path / "round9.cbor", ["--api", nodes[0].api_url]
        rpc = ["--rpc", full_nodes[0].rpc_url, "--round", str(ROUNDS - 1), "-o", str(path)]
        code, _, err = await asyncio.to_thread(run_cli, capsys, "comet-export", *rpc)
        assert code == 0, err
        verify = [*api, "verify-round", last, "--commits", str(path)]
        code, out, err = await asyncio.to_thread(run_cli, capsys, *verify)
        assert code == 0, err
        assert "3 validator-set changes" in out
    finally:
        for peer in peers:
            peer.stop()
        await asyncio.to_thread(network.stop)
        for pubsub in pubsubs:
            await pubsub.aclose()
        await store.aclose()
