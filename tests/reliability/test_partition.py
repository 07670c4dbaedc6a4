"""Issue 8, scenario 2: a partition longer than the round deadline, on real Kubo daemons.

Three daemons of our own (A, B, P). P is cut off (``swarm/disconnect`` from both; with
``Routing.Type=none`` and no mDNS nothing dials it again) for all of round 1. A and B close
round 1 at the deadline without P and report it missing. P reconnects, replays its round-1
announcement (stale), and round 2 includes P's round-2 gradient on every node; the stale
announcement is dropped as ``other_round``.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest

from gradfed_ipfs import put_gradient
from gradfed_ipfs.errors import InsufficientPeers
from gradfed_ipfs.federated.besteffort import GossipModelSync, RoundConfig, RoundResult, RoundRunner
from gradfed_ipfs.kubo import KuboDaemon, KuboPubsub, KuboSwarm
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore
from tests.polling import apoll_until, poll_until

pytestmark = pytest.mark.kubo

D = 1000
DEADLINE = 3.0  # seconds of collection per round
CONFIG = RoundConfig(  # one peer is enough; the expected ones are waited for until the deadline
    min_peers=1,
    collect_timeout=DEADLINE,
    fetch_timeout=5.0,
    subscriber_timeout=2.0,
    republish_interval=0.2,
)


def partition(node: KuboDaemon, others: list[KuboDaemon]) -> None:
    for other in others:
        other.disconnect(node)
        node.disconnect(other)
    poll_until(
        lambda: not node.connected_peers() & {o.peer_id for o in others},
        timeout=10,
        what="the partition",
    )


async def test_partitioned_peer_missing_then_back_and_stale_announcement_ignored(
    kubo_binary: Path,
) -> None:
    rng = np.random.default_rng(2)
    session = f"partition-{random.Random(2).randrange(1 << 30)}"
    swarm = KuboSwarm(3, binary=kubo_binary)
    stores: list[KuboBlockStore] = []
    transports: list[KuboPubsub] = []
    gossips: list[GossipModelSync] = []
    runners: list[RoundRunner] = []
    try:
        swarm.start()
        node_a, node_b, node_p = swarm
        ids = [n.peer_id for n in swarm]
        stores = [KuboBlockStore(n.api_url, timeout=10.0) for n in swarm]
        transports = [KuboPubsub(n.api_url) for n in swarm]
        gossips = [
            GossipModelSync(n.peer_id, t, session_id=session)
            for n, t in zip(swarm, transports, strict=True)
        ]
        runners = [RoundRunner(s, g, CONFIG) for s, g in zip(stores, gossips, strict=True)]

        async def run(round_id: int, grads: list[np.ndarray]) -> list[RoundResult | BaseException]:
            return list(
                await asyncio.gather(
                    *(
                        runner.run_round(
                            round_id,
                            grad,
                            num_samples=1,
                            expected_peers=[i for i in ids if i != me],
                        )
                        for runner, grad, me in zip(runners, grads, ids, strict=True)
                    ),
                    return_exceptions=True,
                )
            )

        # Round 1: P is partitioned for longer than the deadline.
        partition(node_p, [node_a, node_b])
        grads1 = [rng.standard_normal(D).astype(np.float32) for _ in range(3)]
        round1 = await run(1, grads1)
        assert not node_p.connected_peers() & {node_a.peer_id, node_b.peer_id}
        for result, me in zip(round1[:2], ids[:2], strict=True):
            assert isinstance(result, RoundResult), result
            assert result.missing == [node_p.peer_id], result.failures
            assert len(result.participants) == 2
            assert set(result.contributors) == set(ids[:2]) - {me}
            assert result.duration_ms >= DEADLINE * 1000
            np.testing.assert_allclose(result.aggregate, (grads1[0] + grads1[1]) / 2, atol=1e-6)
        # P has no peer by the deadline: a typed error naming the absent peers, not a result.
        lonely = round1[2]
        assert isinstance(lonely, InsufficientPeers), lonely
        assert (lonely.got, lonely.needed) == (0, 1)
        assert lonely.absent == sorted(ids[:2])
        p_cid = await put_gradient(MemoryBlockStore(), grads1[2])  # what P committed (same CID)

        # P comes back and replays its round-1 announcement: stale, it must be ignored. (P's
        # runner also keeps re-publishing it until P's next round; whichever copy arrives
        # first is the one A and B accept, so count from before the reconnection.)
        accepted_before = [g.filter.accepted for g in gossips[:2]]
        node_p.connect(node_a)
        node_p.connect(node_b)
        peers_p = await gossips[2].wait_for_peers(2, timeout=30)
        assert set(peers_p) >= set(ids[:2])
        stale = gossips[2].make_announcement(p_cid, 1, num_samples=1, length=D)
        await transports[2].publish(gossips[2].topic, stale.encode())

        async def stale_arrived() -> bool:
            return all(
                g.filter.accepted > before
                for g, before in zip(gossips[:2], accepted_before, strict=True)
            )

        await apoll_until(stale_arrived, timeout=30, what="P's stale announcement at A and B")
        other_round_before = [g.drops["other_round"] for g in gossips[:2]]

        # Round 2: everyone is in.
        grads2 = [rng.standard_normal(D).astype(np.float32) for _ in range(3)]
        round2 = await run(2, grads2)
        mean = (grads2[0] + grads2[1] + grads2[2]) / 3
        for result, me in zip(round2, ids, strict=True):
            assert isinstance(result, RoundResult), result
            assert result.missing == [], result.failures
            assert len(result.participants) == 3
            assert set(result.contributors) == set(ids) - {me}
            np.testing.assert_allclose(result.aggregate, mean, atol=1e-6)
        for result, before in zip(round2[:2], other_round_before, strict=True):
            assert isinstance(result, RoundResult)
            assert isinstance(round2[2], RoundResult)
            assert result.contributors[node_p.peer_id] == round2[2].local_cid
            assert result.contributors[node_p.peer_id] != p_cid
            assert result.drops["other_round"] > before  # the stale one, dropped
    finally:
        for runner in runners:
            await runner.aclose()
        for gossip in gossips:
            await gossip.aclose()
        for closable in [*stores, *transports]:
            await closable.aclose()
        swarm.stop()
