"""Issue 15, attack 1 over real daemons: a 13 KB nested-shape block in a 3-node round.

Before the fix the block made every honest receiver's ``run_round`` raise ``RecursionError``;
now the decoder raises ``MalformedArrow``, the attacker is rejected and the honest round
completes on both honest nodes.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gradfed_ipfs.federated.besteffort import GossipModelSync, RoundConfig, RoundRunner
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import Block, KuboBlockStore

from .hostile import nested_shape_block

D = 100


@pytest.mark.kubo
async def test_nested_shape_block_rejects_the_attacker_not_the_round(kubo_swarm3) -> None:  # type: ignore[no-untyped-def]
    session = "nested-shape-attack"
    transports = [KuboPubsub(n.api_url) for n in kubo_swarm3]
    stores = [KuboBlockStore(n.api_url, timeout=10.0) for n in kubo_swarm3]
    gossips = [
        GossipModelSync(n.peer_id, t, session_id=session)
        for n, t in zip(kubo_swarm3, transports, strict=True)
    ]
    attacker, attacker_id = gossips[2], kubo_swarm3[2].peer_id
    # min_peers counts the other peers' contributions: the one other honest peer. Every node is
    # expected, so the round also waits for the attacker's block to be fetched and rejected.
    config = RoundConfig(min_peers=1, collect_timeout=8.0, fetch_timeout=5.0)
    everyone = [n.peer_id for n in kubo_swarm3]
    closed = asyncio.Event()
    try:
        block = nested_shape_block(2000, count=D)
        assert len(block) < 14_000
        bomb = await stores[2].put(Block.new(block))
        await attacker.start()
        attacking = asyncio.create_task(
            attacker.announce_until(
                attacker.make_announcement(bomb, 0, num_samples=1, length=D),
                closed,
                interval=0.2,
            )
        )
        grads = [np.full(D, v, dtype=np.float32) for v in (1.0, 2.0)]
        results = await asyncio.gather(
            *(
                RoundRunner(store, gossip, config).run_round(
                    0, grad, num_samples=1, expected_peers=[p for p in everyone if p != me]
                )
                for store, gossip, grad, me in zip(
                    stores[:2], gossips[:2], grads, everyone[:2], strict=True
                )
            )
        )
        closed.set()
        await attacking
        for result in results:
            np.testing.assert_allclose(result.aggregate, np.full(D, 1.5))
            assert attacker_id in result.failures, (result.failures, result.contributors)
            assert "MalformedArrow" in result.failures[attacker_id]
            assert "nested 2000 deep" in result.failures[attacker_id]
            assert attacker_id not in result.contributors
            assert result.stats.participants == 2
    finally:
        closed.set()
        for gossip in gossips:
            await gossip.aclose()
        for closable in [*stores, *transports]:
            await closable.aclose()
