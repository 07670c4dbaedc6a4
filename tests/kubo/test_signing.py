"""A Kubo node signs statements with its identity key; anyone verifies them offline."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gradfed_ipfs import ConfigError, Node
from gradfed_ipfs.errors import BadSignature
from gradfed_ipfs.formats import DelegatedSigner, LocalSigner, decode_statement, sign_statement
from gradfed_ipfs.formats.pubsub import encode_multibase
from gradfed_ipfs.formats.statement import (
    DELEGATED_SIGNATURE_BYTES,
    LIBP2P_KEY_PREFIX,
    binding_bytes,
    signed_bytes,
)
from gradfed_ipfs.kubo import KuboPubsub, KuboSigner, MemoryPubsubBus
from tests.conftest import KuboNode


async def test_a_statement_signed_by_kubo_verifies_offline(kubo_node: KuboNode) -> None:
    async with Node(kubo_node.api_url) as node:
        signer = await node.signer()
        assert signer.peer_id == await node.peer_id()
        statement = await sign_statement(signer, "agreed/done", b"\xa1around\x03")
    checked = decode_statement(statement.block, kind="agreed/done")
    assert checked.author == kubo_node.peer_id
    assert checked.body == b"\xa1around\x03"


async def test_a_kubo_transport_signs_in_process_with_a_key_its_daemon_bound(
    kubo_node: KuboNode,
) -> None:
    """The default signer is a delegate: its binding is the daemon's own ``key/sign`` output
    (the daemon's ``key/verify`` accepts it), statements verify offline against the peer ID,
    and a new transport (a restart) signs the same statement to the same bytes."""
    pubsub, again, direct = (
        KuboPubsub(kubo_node.api_url),
        KuboPubsub(kubo_node.api_url),
        KuboPubsub(kubo_node.api_url, delegated=False),
    )
    try:
        signer = await pubsub.signer()
        assert isinstance(signer, DelegatedSigner)
        assert signer.peer_id == kubo_node.peer_id
        statement = await sign_statement(signer, "agreed/done", b"\xa1around\x03")
        assert len(statement.signature) == DELEGATED_SIGNATURE_BYTES
        assert decode_statement(statement.block).author == kubo_node.peer_id
        restarted = await sign_statement(await again.signer(), "agreed/done", b"\xa1around\x03")
        assert restarted.block == statement.block
        binding = binding_bytes(kubo_node.peer_id, signer.public_key.public_bytes_raw())
        answer = await pubsub.rpc.post_json(
            "key/verify",
            {"key": kubo_node.peer_id, "signature": encode_multibase(statement.signature[34:98])},
            files={"file": ("data", binding, "application/octet-stream")},
        )
        assert answer["SignatureValid"] is True
        identity = await direct.signer()
        assert isinstance(identity, KuboSigner)
        plain = await sign_statement(identity, "agreed/done", b"\xa1around\x03")
        assert len(plain.signature) == 64
        assert decode_statement(plain.block).body == statement.body
    finally:
        for transport in (pubsub, again, direct):
            await transport.aclose()


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


async def test_a_named_memory_node_signs_with_a_key_its_bus_binds() -> None:
    bus = MemoryPubsubBus()
    node = Node.memory("peer-a", bus=bus)
    signer = await node.signer()
    assert signer.peer_id == "peer-a"
    statement = await sign_statement(signer, "agreed/done", b"x", keys=bus.keys)
    assert decode_statement(statement.block, keys=bus.keys).author == "peer-a"
    with pytest.raises(BadSignature):  # a name is not a peer ID: its key is in the bus only
        decode_statement(statement.block)
    other = MemoryPubsubBus()  # another bus binds the same name to the same derived key
    assert (await other.endpoint("peer-a").signer()).public_key == signer.public_key
    with pytest.raises(BadSignature):  # a second key for the name is refused
        bus.keys.add("peer-a", LocalSigner().public_key)


async def test_a_memory_endpoint_cannot_sign_as_someone_else() -> None:
    bus = MemoryPubsubBus()
    with pytest.raises(ConfigError, match="not the signer's"):
        Node.memory("peer-a", signer=LocalSigner())
    with pytest.raises(ConfigError, match="cannot sign as"):
        bus.endpoint("peer-a", signer=LocalSigner())
    with pytest.raises(ConfigError, match="give its signer"):
        await bus.endpoint(LocalSigner().peer_id).signer()
    hostile = LocalSigner(name="peer-b")  # signs as peer-b with a key the bus never bound
    bus.signer("peer-b")
    forged = await sign_statement(hostile, "agreed/done", b"x", keys=_Only(hostile))
    with pytest.raises(BadSignature, match="does not verify"):
        decode_statement(forged.block, keys=bus.keys)


class _Only:
    """A key book that knows one signer (the forger's own view)."""

    def __init__(self, signer: LocalSigner) -> None:
        self.signer = signer

    def key_of(self, author: str) -> Ed25519PublicKey:
        return self.signer.public_key
