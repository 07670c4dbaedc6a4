"""Validators bound to members by signed statements, checked at InitChain."""

from __future__ import annotations

import json
from dataclasses import replace

import dag_cbor
import pytest

from gradfed_ipfs.block import Block
from gradfed_ipfs.cometbft.abci import (
    LedgerApp,
    RoundMachine,
    RoundsGenesis,
    check_bindings,
    validator_binding,
)
from gradfed_ipfs.cometbft.abci.pb.cometbft.abci.v1 import types_pb2 as abci
from gradfed_ipfs.cometbft.abci.txs import MAX_ROUND, decode_binding
from gradfed_ipfs.errors import MalformedManifest
from gradfed_ipfs.formats.statement import LocalSigner

SIGNERS = [LocalSigner.from_seed(bytes([i + 1]) * 32) for i in range(4)]
OUTSIDER = LocalSigner.from_seed(bytes([9]) * 32)
KEYS = [bytes([0x40 + i]) * 32 for i in range(4)]  # the validators' (public) keys
CHAIN = "chain-a"
M0 = str(Block.new(b"m0", "raw").cid)
VALIDATORS = [("ed25519", key) for key in KEYS]


def _genesis(bindings: list[bytes]) -> RoundsGenesis:
    members = tuple(s.peer_id for s in SIGNERS)
    return RoundsGenesis("s", M0, members, 3, 1000, bindings=tuple(bindings))


async def _bindings(chain: str = CHAIN, session: str = "s") -> list[bytes]:
    return [
        await validator_binding(s, session, chain, key, 0)
        for s, key in zip(SIGNERS, KEYS, strict=True)
    ]


async def test_each_member_binds_one_genesis_validator() -> None:
    bound = check_bindings(_genesis(await _bindings()), CHAIN, VALIDATORS[::-1])
    assert bound == {s.peer_id: key for s, key in zip(SIGNERS, KEYS, strict=True)}


async def _outsider() -> list[bytes]:
    return [*(await _bindings())[:3], await validator_binding(OUTSIDER, "s", CHAIN, KEYS[3], 0)]


async def _twice() -> list[bytes]:
    good = await _bindings()
    return [*good, await validator_binding(SIGNERS[0], "s", CHAIN, bytes(32), 0)]


async def _late() -> list[bytes]:
    good = await _bindings()
    return [await validator_binding(SIGNERS[0], "s", CHAIN, KEYS[0], 1), *good[1:]]


async def _tampered() -> list[bytes]:
    good = await _bindings()
    return [good[0][:-1] + bytes([good[0][-1] ^ 1]), *good[1:]]


@pytest.mark.parametrize(
    ("make", "validators", "why"),
    [
        (lambda: _bindings(chain="other"), VALIDATORS, "another chain"),
        (lambda: _bindings(session="other"), VALIDATORS, "another chain"),
        (_outsider, VALIDATORS, "not one per member"),
        (_twice, VALIDATORS, "not one per member"),
        (_tampered, VALIDATORS, "validator binding"),
        (_late, VALIDATORS, "names round 1, not 0"),
        (lambda: _bindings(), [*VALIDATORS[:3], ("ed25519", bytes(32))], "not the genesis"),
        (lambda: _bindings(), [*VALIDATORS[:3], ("secp256k1", KEYS[3])], "Ed25519"),
    ],
)
async def test_bad_bindings_are_refused(make, validators, why) -> None:  # type: ignore[no-untyped-def]
    genesis = _genesis(await make())
    with pytest.raises(MalformedManifest, match=why):
        check_bindings(genesis, CHAIN, validators)


async def test_a_member_without_a_binding_is_refused() -> None:
    with pytest.raises(MalformedManifest, match="bound no key"):
        check_bindings(_genesis((await _bindings())[:3]), CHAIN, VALIDATORS)


async def test_init_chain_checks_the_bindings_and_commits_them() -> None:
    genesis = _genesis(await _bindings())
    validators = [
        abci.ValidatorUpdate(power=1, pub_key_bytes=k, pub_key_type="ed25519") for k in KEYS
    ]
    state = json.dumps(genesis.to_dict()).encode()
    app = LedgerApp()
    init = abci.InitChainRequest(chain_id=CHAIN, app_state_bytes=state, validators=validators)
    app.handle(abci.Request(init_chain=init))
    assert isinstance(app.ledger, RoundMachine)
    assert app.ledger.app_hash != RoundMachine(replace(genesis, bindings=())).app_hash
    foreign = abci.InitChainRequest(chain_id="other", app_state_bytes=state, validators=validators)
    with pytest.raises(MalformedManifest, match="another chain"):
        LedgerApp().handle(abci.Request(init_chain=foreign))


@pytest.mark.parametrize("bad", [-1, MAX_ROUND + 1, True, "0", None])
def test_a_binding_round_is_a_bounded_integer(bad: object) -> None:
    body = {"session": "s", "chain_id": CHAIN, "pub_key": KEYS[0], "round": bad}
    with pytest.raises(MalformedManifest, match="round"):
        decode_binding(dag_cbor.encode(body))  # type: ignore[arg-type]
    body["round"] = 7
    assert decode_binding(dag_cbor.encode(body)).round == 7  # type: ignore[arg-type]
