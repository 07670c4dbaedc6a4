"""Four CometBFT validators on loopback, each with its own Python ABCI app process.

Signed statements submitted through the RPC end in the same order on every validator (one app
hash everywhere, the one a local ledger computes from that order); a bad signature is refused
by CheckTx; one crashed validator of four does not stop blocks, two stall the chain without
divergence until they return.
"""

from __future__ import annotations

import asyncio
import base64
import time

import dag_cbor
import pytest

from gradfed_ipfs.cometbft import CometNetwork, CometRpc, Validator
from gradfed_ipfs.cometbft.abci import StatementLedger, TxCode
from gradfed_ipfs.errors import CometRpcError
from gradfed_ipfs.formats.statement import LocalSigner, sign_statement

pytestmark = [pytest.mark.cometbft, pytest.mark.slow]

MEMBERS = [LocalSigner.from_seed(bytes([i + 1]) * 32) for i in range(4)]


async def _statements(count: int, kind: str = "agreed/contribution") -> list[bytes]:
    return [
        (
            await sign_statement(
                MEMBERS[i % 4], kind, dag_cbor.encode({"round": i, "cid": f"c{i}"})
            )
        ).block.data
        for i in range(count)
    ]


def _app_hash_after(validator: Validator, height: int) -> str:
    """The app hash of the state after block ``height``: it is in block ``height + 1``'s header."""
    block = validator.rpc("block", height=str(height + 1))
    return str(block["block"]["header"]["app_hash"])


def _expected_hash(txs_by_block: list[list[bytes]]) -> str:
    ledger = StatementLedger()
    for height, txs in enumerate(txs_by_block, 1):
        ledger.finalize(height, txs)
        ledger.commit()
    return ledger.app_hash.hex().upper()


def _assert_same_state(network: CometNetwork, validators: list[Validator], height: int) -> str:
    network.wait_for_height(height + 1, among=validators)
    hashes = {v.moniker: _app_hash_after(v, height) for v in validators}
    assert len(set(hashes.values())) == 1, hashes
    return next(iter(hashes.values()))


def _block_txs(validator: Validator, height: int) -> list[bytes]:
    block = validator.rpc("block", height=str(height))
    return [base64.b64decode(tx) for tx in block["block"]["data"]["txs"] or []]


async def _submit(network: CometNetwork, txs: list[bytes], via: list[Validator]) -> int:
    """Commit each tx through a validator of ``via`` in turn; return the last tx's height."""
    height = 0
    for i, tx in enumerate(txs):
        result = await CometRpc(via[i % len(via)].rpc_url).broadcast_tx_commit(tx)
        assert result.code == TxCode.OK, result
        height = max(height, result.height)
    return height


async def test_statements_end_in_one_order_and_one_app_hash(network: CometNetwork) -> None:
    txs = await _statements(8)
    last = await _submit(network, txs, list(network))
    agreed = _assert_same_state(network, list(network), last)
    # The chain's order, replayed into a local ledger, gives the validators' hash.
    blocks = [_block_txs(network[0], h) for h in range(1, last + 1)]
    assert sorted(tx for block in blocks for tx in block) == sorted(txs)
    assert agreed == _expected_hash(blocks)
    for validator in network:
        rpc = CometRpc(validator.rpc_url)
        size = await rpc.abci_query("/size", b"agreed/contribution")
        assert (size.code, size.value) == (0, b"8")
        first = await rpc.abci_query("/entry", b"agreed/contribution/0")
        assert first.value == next(tx for block in blocks for tx in block)


async def test_check_tx_refuses_a_forged_signature(network: CometNetwork) -> None:
    (good,) = await _statements(1)
    record = dag_cbor.decode(good)
    assert isinstance(record, dict)
    record["author"] = MEMBERS[1].peer_id  # member 0's signature under member 1's name
    forged = dag_cbor.encode(record)
    rpc = CometRpc(network[0].rpc_url)
    checked = await rpc.check_tx(forged)
    assert checked.code == TxCode.BAD_SIGNATURE
    assert "does not verify" in checked.log
    with pytest.raises(CometRpcError, match="code=2"):
        await rpc.broadcast_tx_sync(forged)
    # The good statement commits after it; the forged one never reaches any app.
    height = (await rpc.broadcast_tx_commit(good)).height
    _assert_same_state(network, list(network), height)
    for validator in network:
        size = await CometRpc(validator.rpc_url).abci_query("/size", b"agreed/contribution")
        assert size.value == b"1"


async def test_one_crashed_validator_of_four_does_not_stop_blocks(network: CometNetwork) -> None:
    crashed, *alive = list(network)
    crashed.kill()  # node and app: a member's machine gone
    txs = await _statements(3)
    last = await _submit(network, txs, alive)
    _assert_same_state(network, alive, last)
    # Back with an empty app: CometBFT replays its stored blocks into it, then block-syncs the
    # rest from its peers, and ends in the same state.
    crashed.start()
    agreed = _assert_same_state(network, list(network), last)
    assert agreed == _app_hash_after(crashed, last)
    size = await CometRpc(crashed.rpc_url).abci_query("/size", b"agreed/contribution")
    assert size.value == b"3"


async def test_two_crashed_validators_stall_the_chain_until_they_return(
    network: CometNetwork,
) -> None:
    (before,) = await _statements(1, kind="agreed/result")
    await _submit(network, [before], list(network))
    down, alive = list(network)[:2], list(network)[2:]
    for validator in down:
        validator.kill()
    stalled_at = max(v.latest()[0] for v in alive)
    # Half the voting power is gone, short of the 2/3 a commit needs: no block may come. This
    # is a check of absence, so it watches for a while: three idle block intervals (a live
    # network makes an empty block each) plus the timeouts.
    timing = network.timing
    watch = 3 * timing.idle_block_interval + timing.timeout_propose + timing.timeout_precommit
    deadline = time.monotonic() + watch
    while time.monotonic() < deadline:
        heights = [(await CometRpc(v.rpc_url).latest())[0] for v in alive]
        assert max(heights) <= stalled_at + 1, heights  # one in flight may still commit
        await asyncio.sleep(timing.idle_block_interval / 3)  # paces the watch; waits for no event
    # A statement sent meanwhile waits in the mempool and commits once they are back.
    (during,) = await _statements(1, kind="agreed/evidence")
    assert (await CometRpc(alive[0].rpc_url).broadcast_tx_sync(during)).code == TxCode.OK
    for validator in down:
        validator.start()
    network.wait_for_height(stalled_at + 3, timeout=60)
    resumed = max(v.latest()[0] for v in network)
    _assert_same_state(network, list(network), resumed)
    for validator in network:
        size = await CometRpc(validator.rpc_url).abci_query("/size", b"agreed/evidence")
        assert size.value == b"1"
