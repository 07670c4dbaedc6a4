"""A Kubo node signs statements with its identity key; anyone verifies them offline."""

from __future__ import annotations

import pytest

from gradfed_ipfs import ConfigError, Node
from gradfed_ipfs.formats import LocalSigner, decode_statement, sign_statement
from gradfed_ipfs.formats.pubsub import encode_multibase
from gradfed_ipfs.formats.statement import LIBP2P_KEY_PREFIX, signed_bytes
from tests.conftest import KuboNode


async def test_a_statement_signed_by_kubo_verifies_offline(kubo_node: KuboNode) -> None:
    async with Node(kubo_node.api_url) as node:
        signer = await node.signer()
        assert signer.peer_id == await node.peer_id()
        statement = await sign_statement(signer, "agreed/done", b"\xa1around\x03")
    checked = decode_statement(statement.block, kind="agreed/done")
    assert checked.author == kubo_node.peer_id
    assert checked.body == b"\xa1around\x03"


async def test_kubo_verifies_what_a_local_signer_signed(kubo_node: KuboNode) -> None:
    local = LocalSigner.from_seed(bytes(range(32)))
    data = signed_bytes(local.peer_id, "agreed/roster", b"body")
    signature = await local.sign(data)
    assert signature != await local.sign(data + b"x")
    async with Node(kubo_node.api_url) as node:
        assert node.rpc is not None
        answer = await node.rpc.post_json(
            "key/verify",
            {"key": local.peer_id, "signature": encode_multibase(signature)},
            files={"file": ("data", data, "application/octet-stream")},
        )
        forged = await node.rpc.post_json(
            "key/verify",
            {"key": local.peer_id, "signature": encode_multibase(signature)},
            files={"file": ("data", data + b"x", "application/octet-stream")},
        )
    assert answer["SignatureValid"] is True
    assert forged["SignatureValid"] is False
    assert LIBP2P_KEY_PREFIX == b"libp2p-key signed message:"


async def test_a_memory_node_signs_with_its_local_key() -> None:
    signer = LocalSigner.from_seed(bytes(32))
    node = Node.memory(signer=signer)
    assert await node.peer_id() == signer.peer_id
    assert await node.signer() is signer
    statement = await sign_statement(await node.signer(), "agreed/done", b"x")
    assert decode_statement(statement.block).author == signer.peer_id


async def test_a_memory_node_without_a_key_cannot_sign() -> None:
    with pytest.raises(ConfigError, match="no signer"):
        await Node.memory("peer-a").signer()
    with pytest.raises(ConfigError, match="not the signer's"):
        Node.memory("peer-a", signer=LocalSigner())
