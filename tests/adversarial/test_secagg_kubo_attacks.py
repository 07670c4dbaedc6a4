"""Issue 15 (item 3): SecAgg attacks that travel over real Kubo daemons (3-node swarm).

- An eavesdropper daemon, not on the roster, subscribed to ``gradfed/v1/<s>/secagg``, fetches
  every announced block over bitswap and tries the server's side itself: every masked vector and
  unmasking answer fails to decrypt for it, while the real aggregator's key opens them.
- An aggregator that shows different survivor sets to different clients is caught by the
  signed views: every client refuses to unmask, and no sum is produced.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradfed_ipfs.errors import DecodeError, SecAggPeerRejected, UnmaskRefused
from gradfed_ipfs.federated import SecAggServer
from gradfed_ipfs.federated.secagg import FixedPoint
from gradfed_ipfs.federated.secagg.blocks import decode_masked_block
from gradfed_ipfs.federated.secagg.codec import (
    answer_from_json,
    json_block,
    keys_from_json,
    unpack_masked,
)
from gradfed_ipfs.federated.secagg.crypto import SEALED_MAGIC
from gradfed_ipfs.federated.secagg.wire import SecAggChannel
from gradfed_ipfs.federated.secagg_round import SecAggSettings
from gradfed_ipfs.federated.secagg_round.peer import (
    SecureRoundConfig,
    SecureRoundPeer,
    SecureRoundResult,
)
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import Block, KuboBlockStore
from tests.federated.secagg.test_secure_aggregation import rb, tolerance

pytestmark = pytest.mark.kubo

D = 2_000


@dataclass
class Swarm:
    ids: list[str]
    stores: list[KuboBlockStore]
    transports: list[KuboPubsub]


@pytest.fixture
async def swarm(kubo_swarm3: list[Any]) -> AsyncIterator[Swarm]:
    stores = [KuboBlockStore(n.api_url, timeout=15.0) for n in kubo_swarm3]
    transports = [KuboPubsub(n.api_url) for n in kubo_swarm3]
    try:
        yield Swarm([n.peer_id for n in kubo_swarm3], stores, transports)
    finally:
        for t in transports:
            await t.aclose()
        for s in stores:
            await s.aclose()


def config(session: str, clients: list[str], aggregator: str, **timing: float) -> SecureRoundConfig:
    return SecureRoundConfig(
        session_id=session,
        round_id=0,
        clients=tuple(sorted(clients)),
        aggregator=aggregator,
        threshold=2,
        length=D,
        settings=SecAggSettings(phase_timeout=15.0, **timing),  # type: ignore[arg-type]
        republish_interval=0.3,
    )


async def test_eavesdropper_daemon_on_the_topic_cannot_recover_the_sum(
    swarm: Swarm, tmp_path: Path
) -> None:
    # Two clients (the second is also the aggregator); the third daemon only listens.
    clients, aggregator, spy = swarm.ids[:2], swarm.ids[1], swarm.ids[2]
    cfg = config(f"spy-{tmp_path.name}", clients, aggregator)
    rng = np.random.default_rng(5)
    inputs = {p: rng.normal(0.0, 1.0, D).astype(np.float32) for p in clients}
    peers = [
        SecureRoundPeer(swarm.stores[i], swarm.transports[i], cfg, randbytes=rb(500 + i))
        for i in range(2)
    ]
    ear = SecAggChannel(swarm.stores[2], swarm.transports[2], spy, cfg)
    try:
        await asyncio.gather(ear.start(), *(p.start() for p in peers))
        results = await asyncio.wait_for(
            asyncio.gather(*(p.run(inputs[p.peer_id]) for p in peers)), 30.0
        )
        result = results[1]
        assert isinstance(result, SecureRoundResult)
        exact = np.sum([v.astype(np.float64) for v in inputs.values()], axis=0)
        assert np.all(np.abs(result.total - exact) <= tolerance(FixedPoint(2, 8.0, 32), 2, exact))

        # The eavesdropper saw every announcement and fetches every block over bitswap.
        wanted = {
            (k, c) for k in ("keys", "shares", "masked", "view", "unmask-response") for c in clients
        }
        wanted |= {("server-key", aggregator), ("unmask-request", aggregator)}
        assert await ear.wait(lambda: wanted <= set(ear.inbox), 15.0), wanted - set(ear.inbox)
        blocks = {key: await ear.fetch(*key) for key in sorted(wanted)}
        roster = [keys_from_json(blocks[("keys", c)], c) for c in clients]

        # It plays the server with its own key: nothing it holds decrypts.
        fake = SecAggServer(2, context=cfg.context, randbytes=rb(999))
        fake.register(roster)
        real = peers[1]._server
        assert real is not None
        for c in clients:
            for kind in ("masked", "unmask-response"):
                data = blocks[(kind, c)]
                assert data.startswith(SEALED_MAGIC)
                with pytest.raises(SecAggPeerRejected, match="does not decrypt"):
                    fake.open_from(c, kind, data)
                assert real.open_from(c, kind, data)  # control: the aggregator's key opens it
            with pytest.raises(DecodeError):  # not a masked Arrow block in the clear
                decode_masked_block(blocks[("masked", c)], ring_bits=32, expected_length=D)
            with pytest.raises(DecodeError):  # not a JSON unmasking answer in the clear
                answer_from_json(blocks[("unmask-response", c)], c)
            # No window of the client's vector or of its fixed-point encoding is in any block.
            codec = FixedPoint(2, 8.0, 32)
            for raw in (inputs[c].astype("<f4").tobytes(), codec.encode(inputs[c]).tobytes()):
                for data in blocks.values():
                    assert raw[:32] not in data
                    assert raw[-32:] not in data
        # Control: what the eavesdropper fetched is what the aggregator unsealed.
        _, arrow = unpack_masked(
            real.open_from(clients[0], "masked", blocks[("masked", clients[0])])
        )
        assert decode_masked_block(arrow, ring_bits=32, expected_length=D).shape == (D,)
    finally:
        await ear.aclose()
        await asyncio.gather(*(p.aclose() for p in peers))


async def test_aggregator_showing_different_survivor_sets_is_refused_over_kubo(
    swarm: Swarm, tmp_path: Path
) -> None:
    ids = sorted(swarm.ids)
    by_id = {n: i for i, n in enumerate(swarm.ids)}
    aggregator = ids[0]
    cfg = config(f"views-{tmp_path.name}", ids, aggregator, view_timeout=10.0, response_timeout=1.0)
    rng = np.random.default_rng(6)
    inputs = {p: rng.normal(0.0, 1.0, D).astype(np.float32) for p in ids}
    peers = {
        p: SecureRoundPeer(
            swarm.stores[by_id[p]], swarm.transports[by_id[p]], cfg, randbytes=rb(600 + by_id[p])
        )
        for p in ids
    }
    victim, liar_target = ids[1], ids[2]
    try:
        await asyncio.gather(*(p.start() for p in peers.values()))
        # The aggregator's daemon serves a second request naming the victim as dropped; the
        # third client is shown that one (first CID kept), the others the honest one.
        other = json_block({"survivors": [ids[0], ids[2]], "dropped": [victim]})
        other_cid = await swarm.stores[by_id[aggregator]].put(Block.new(other, "raw"))
        peers[liar_target]._ch.inbox[("unmask-request", aggregator)] = other_cid
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(peers[p].run(inputs[p]) for p in ids), return_exceptions=True),
            40.0,
        )
        # Every client refuses (the aggregator's own client role included, which ends its run
        # before its aggregator role could time out without answers).
        for p, outcome in zip(ids, outcomes, strict=True):
            assert isinstance(outcome, UnmaskRefused), (p, outcome)
            assert "different survivor set" in str(outcome)
        # Nobody answered: no unmasking share left any client, so there is no sum.
        for peer in peers.values():
            assert not peer._ch.senders("unmask-response")
    finally:
        await asyncio.gather(*(p.aclose() for p in peers.values()))
