"""Secure aggregation over real Kubo daemons (issue 5 acceptance).

Five clients each commit their masked vector as an Arrow ``secagg-u32``/``secagg-u64`` block,
sealed to the aggregator's X25519 key, to their *own* daemon; the aggregator runs on a sixth
daemon that holds none of those blocks, fetches each one by CID over bitswap and unseals it. Key
advertisement, share relaying and the signed views stay in-process (they are small messages the
server routes); only the masked vectors travel through IPFS.

Deviation from "a 5-node swarm": the swarm has 5 client daemons + 1 aggregator daemon, so that
every masked vector, not 4 of 5, is fetched over bitswap by a daemon that did not store it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from gradfed_ipfs.errors import SecureAggregationError
from gradfed_ipfs.federated import SecAggClient, SecAggServer
from gradfed_ipfs.federated.secagg import FixedPoint, RingArray
from gradfed_ipfs.federated.secagg.blocks import decode_masked_block, encode_masked_block
from gradfed_ipfs.federated.secagg.codec import pack_masked, unpack_masked
from gradfed_ipfs.federated.secagg.crypto import SEALED_MAGIC
from gradfed_ipfs.kubo import KuboDaemon, KuboSwarm
from gradfed_ipfs.storage import Block, KuboBlockStore
from tests.federated.secagg.test_secure_aggregation import (
    byte_chi_square_p,
    make_inputs,
    rb,
    tolerance,
)

pytestmark = pytest.mark.kubo

N_CLIENTS = 5
D = 20_000
CONTEXT = b"secagg-kubo/round-0"


@pytest.fixture(scope="module")
def swarm6(kubo_binary: Path) -> Iterator[list[KuboDaemon]]:
    swarm = KuboSwarm(N_CLIENTS + 1, binary=kubo_binary)
    swarm.start()  # stops every daemon it started if any fails
    try:
        yield list(swarm)
    finally:
        swarm.stop()


@pytest.fixture
async def stores(swarm6: list[KuboDaemon]) -> AsyncIterator[list[KuboBlockStore]]:
    opened = [KuboBlockStore(daemon.api_url, timeout=15.0) for daemon in swarm6]
    try:
        yield opened
    finally:
        for store in opened:
            await store.aclose()


@dataclass
class KuboRound:
    server: SecAggServer
    clients: dict[str, SecAggClient]
    fetched: dict[str, bytes] = field(default_factory=dict)  # client -> sealed block, as fetched
    masked: dict[str, RingArray] = field(default_factory=dict)  # client -> decoded ring vector


async def masked_round_over_kubo(
    stores: list[KuboBlockStore],
    inputs: dict[str, np.ndarray],
    threshold: int,
    *,
    drop_after_masking: Collection[str] = (),
    ring_bits: int = 32,
    seed: int = 0,
) -> KuboRound:
    """Run rounds 0-2: keys and shares in-process, masked vectors through Kubo.

    Clients in ``drop_after_masking`` mask and commit their block to their own daemon, then
    vanish without announcing its CID: the aggregator never receives it.
    """
    rand = rb(seed)
    ids = sorted(inputs)
    clients = {
        cid: SecAggClient(cid, threshold, ring_bits=ring_bits, context=CONTEXT, randbytes=rand)
        for cid in ids
    }
    server = SecAggServer(threshold, ring_bits=ring_bits, context=CONTEXT, randbytes=rand)
    roster = server.register(c.advertise_keys() for c in clients.values())
    routed = server.route_shares(m for c in clients.values() for m in c.share_keys(roster))
    for cid, client in clients.items():
        client.receive_shares(routed.get(cid, []))

    aggregator, own = stores[0], dict(zip(ids, stores[1:], strict=True))
    announced = {}
    for cid in ids:
        payload = pack_masked([], encode_masked_block(clients[cid].masked_input(inputs[cid])))
        sealed = clients[cid].seal_for_server(server.public_key, "masked", payload)
        block = Block.new(sealed, "raw")
        assert await own[cid].put(block) == block.cid
        if cid not in drop_after_masking:
            announced[cid] = block.cid

    result = KuboRound(server, clients)
    d = len(next(iter(inputs.values())))
    for cid, block_cid in announced.items():
        assert not await aggregator.has(block_cid)  # so the get below goes over bitswap
        data = (await aggregator.get(block_cid)).data
        rejected, arrow = unpack_masked(server.open_from(cid, "masked", data))
        assert rejected == []
        vector = decode_masked_block(arrow, ring_bits=ring_bits, expected_length=d)
        server.receive_masked(cid, vector)
        result.fetched[cid], result.masked[cid] = data, vector
    return result


def finish(rnd: KuboRound) -> tuple[np.ndarray, list[str], list[str]]:
    survivors, dropped = rnd.server.unmask_request()
    views = [rnd.clients[v].confirm(survivors, dropped) for v in survivors]
    total = rnd.server.finalize(rnd.clients[v].unmask(survivors, dropped, views) for v in survivors)
    return total, survivors, dropped


@pytest.mark.parametrize("ring_bits", [32, 64])
async def test_unmasked_sum_over_kubo_equals_plain_sum(
    stores: list[KuboBlockStore], ring_bits: int
) -> None:
    inputs = make_inputs(N_CLIENTS, D, seed=50 + ring_bits)
    rnd = await masked_round_over_kubo(stores, inputs, 3, ring_bits=ring_bits, seed=ring_bits)
    total, survivors, dropped = finish(rnd)
    assert survivors == sorted(inputs)
    assert dropped == []
    assert total.dtype == np.float32
    assert total.shape == (D,)
    exact = np.sum([inputs[c].astype(np.float64) for c in survivors], axis=0)
    codec = FixedPoint(N_CLIENTS, 8.0, ring_bits)
    assert np.all(np.abs(total - exact) <= tolerance(codec, N_CLIENTS, exact))


async def test_stored_masked_blocks_are_uniform_bytes(stores: list[KuboBlockStore]) -> None:
    inputs = make_inputs(N_CLIENTS, D, seed=61)
    rnd = await masked_round_over_kubo(stores, inputs, 3, seed=61)
    codec = FixedPoint(N_CLIENTS, 8.0, 32)
    assert len(rnd.fetched) == N_CLIENTS
    for cid, data in rnd.fetched.items():
        words = rnd.masked[cid].tobytes()
        assert data.startswith(SEALED_MAGIC)
        assert words[:64] not in data  # sealed: not even the masked words are in the clear
        ciphertext = np.frombuffer(data[len(SEALED_MAGIC) :], dtype=np.uint8)
        assert byte_chi_square_p(ciphertext) > 0.01, cid
        assert byte_chi_square_p(rnd.masked[cid]) > 0.01, cid
        # Control: the same test rejects the unmasked fixed-point encoding of the input.
        assert byte_chi_square_p(codec.encode(inputs[cid])) < 1e-6, cid
        # And the block holds no window of the client's unmasked encodings.
        for raw in (inputs[cid].astype("<f4").tobytes(), codec.encode(inputs[cid]).tobytes()):
            assert raw[:32] not in data
            assert raw[len(raw) // 2 : len(raw) // 2 + 32] not in data
    finish(rnd)  # the round still unmasks


async def test_two_dropouts_after_masking_recover_survivor_sum(
    stores: list[KuboBlockStore],
) -> None:
    inputs = make_inputs(N_CLIENTS, D, seed=72)
    gone = {"client-1", "client-3"}
    rnd = await masked_round_over_kubo(stores, inputs, 3, drop_after_masking=gone, seed=72)
    total, survivors, dropped = finish(rnd)
    assert dropped == sorted(gone)
    assert survivors == ["client-0", "client-2", "client-4"]
    exact = np.sum([inputs[c].astype(np.float64) for c in survivors], axis=0)
    codec = FixedPoint(N_CLIENTS, 8.0, 32)
    assert np.all(np.abs(total - exact) <= tolerance(codec, len(survivors), exact))
    # Not the sum of all five: the dropped clients' inputs are really excluded.
    everyone = np.sum([v.astype(np.float64) for v in inputs.values()], axis=0)
    assert np.max(np.abs(total - everyone)) > 1.0


async def test_more_than_n_minus_t_dropouts_fail_clearly(stores: list[KuboBlockStore]) -> None:
    inputs = make_inputs(N_CLIENTS, D, seed=83)
    gone = {"client-0", "client-2", "client-4"}  # 3 > n - t = 2
    rnd = await masked_round_over_kubo(stores, inputs, 3, drop_after_masking=gone, seed=83)
    assert sorted(rnd.fetched) == ["client-1", "client-3"]
    with pytest.raises(SecureAggregationError, match="only 2 clients survived masking"):
        rnd.server.unmask_request()
    # No sum can be produced afterwards either, whatever the survivors answer.
    with pytest.raises(SecureAggregationError, match="finalize called before unmask_request"):
        rnd.server.finalize([])
