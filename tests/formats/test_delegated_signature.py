"""Delegated signatures: an in-process key bound once by the peer's own key, checked offline.

Every verifier takes them through ``verify_signed`` (statements, roster entries, chain
contribution lines); hostile forms are ``BadSignature`` (or ``MalformedManifest`` where a
roster entry's shape is checked before any key).
"""

from __future__ import annotations

import asyncio

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from multiformats import CID

from gradfed_ipfs.block import Block
from gradfed_ipfs.errors import BadSignature, MalformedManifest
from gradfed_ipfs.formats import (
    DelegatedSigner,
    KeyDirectory,
    LocalSigner,
    decode_statement,
    encode_record,
    sign_statement,
)
from gradfed_ipfs.formats.agreed.roster import (
    COMET_CONTRIBUTION,
    MAX_RECORD_BYTES,
    MAX_ROSTER_ENTRIES,
    MAX_WEIGHT,
    AgreedMessage,
    Roster,
    comet_contribution_body,
    sign_message,
    verify_roster_entries,
)
from gradfed_ipfs.formats.statement import (
    DELEGATED_SIGNATURE_BYTES,
    LIBP2P_KEY_PREFIX,
    binding_bytes,
    signed_bytes,
    verify_signed,
)

ALICE, BOB = LocalSigner.from_seed(bytes(range(32))), LocalSigner.from_seed(bytes(32))
KIND, BODY = "agreed/done", b"\xa1around\x03"
GENESIS = Block.new(b"genesis", "raw").cid


def _delegate(identity: LocalSigner = ALICE) -> DelegatedSigner:
    return asyncio.run(DelegatedSigner.open(identity))


def _signature(identity: LocalSigner = ALICE, body: bytes = BODY) -> bytes:
    signer = _delegate(identity)
    return asyncio.run(signer.sign(signed_bytes(identity.peer_id, KIND, body)))


def _statement(author: str, signature: bytes, body: bytes = BODY) -> Block:
    return encode_record(
        {"type": "statement", "version": 1, "author": author, "kind": KIND, "body": body,
         "signature": signature}
    )  # fmt: skip


def test_a_delegated_statement_verifies_offline_against_the_peer_id() -> None:
    statement = asyncio.run(sign_statement(_delegate(), KIND, BODY))
    assert len(statement.signature) == DELEGATED_SIGNATURE_BYTES
    checked = decode_statement(statement.block, kind=KIND)
    assert checked.author == ALICE.peer_id
    assert checked.body == BODY


def test_the_derived_delegate_is_stable_and_not_the_peer_key() -> None:
    first, again = _delegate(), _delegate()
    assert first.public_key == again.public_key  # a restart signs to the same bytes
    assert first.public_key != ALICE.public_key
    assert first.public_key != _delegate(BOB).public_key
    assert _signature() == _signature()
    chosen = asyncio.run(DelegatedSigner.open(ALICE, Ed25519PrivateKey.generate()))
    assert chosen.public_key != first.public_key
    statement = asyncio.run(sign_statement(chosen, KIND, BODY))
    assert decode_statement(statement.block).author == ALICE.peer_id


def _tampered(offset: int) -> bytes:
    signature = bytearray(_signature())
    signature[offset] ^= 1
    return bytes(signature)


@pytest.mark.parametrize(
    ("name", "offset"),
    [("tag", 0), ("delegate key", 2), ("binding signature", 40), ("statement signature", 120)],
)
def test_a_delegated_signature_with_any_byte_changed_is_refused(name: str, offset: int) -> None:
    with pytest.raises(BadSignature):
        decode_statement(_statement(ALICE.peer_id, _tampered(offset)))


@pytest.mark.parametrize("length", [0, 63, 65, 161, 163, 1000])
def test_a_truncated_or_padded_signature_is_refused(length: int) -> None:
    signature = (_signature() * 7)[:length]
    with pytest.raises(BadSignature, match="bytes"):
        decode_statement(_statement(ALICE.peer_id, signature))
    with pytest.raises(BadSignature):
        verify_signed(ALICE.peer_id, KIND, BODY, signature, KeyDirectory())


def test_a_binding_of_another_peer_does_not_sign_for_this_one() -> None:
    """Bob reuses Alice's delegated signature (her binding, her delegate's signature) as his."""
    alice = _signature()
    with pytest.raises(BadSignature, match="binding"):
        decode_statement(_statement(BOB.peer_id, alice))


def test_a_peer_cannot_bind_a_key_for_another_peer() -> None:
    """Bob binds his own delegate key, but for Alice's peer ID: his key signed the binding."""
    key = Ed25519PrivateKey.generate()
    raw = key.public_key().public_bytes_raw()
    proof = asyncio.run(BOB.sign(binding_bytes(ALICE.peer_id, raw)))
    forger = DelegatedSigner(ALICE.peer_id, key, proof)
    signature = asyncio.run(forger.sign(signed_bytes(ALICE.peer_id, KIND, BODY)))
    with pytest.raises(BadSignature, match="binding"):
        decode_statement(_statement(ALICE.peer_id, signature))
    with pytest.raises(BadSignature, match="binding"):  # also through sign_statement's check
        asyncio.run(sign_statement(forger, KIND, BODY))


def test_swapped_delegate_keys_are_refused() -> None:
    """Alice's binding with another delegate key put in (the statement signed by that key)."""
    other = Ed25519PrivateKey.generate()
    genuine = _signature()
    inner = other.sign(LIBP2P_KEY_PREFIX + signed_bytes(ALICE.peer_id, KIND, BODY))
    swapped = genuine[:2] + other.public_key().public_bytes_raw() + genuine[34:98] + inner
    with pytest.raises(BadSignature, match="binding"):
        decode_statement(_statement(ALICE.peer_id, swapped))
    # Alice's genuine binding with a statement signature by her own key instead of the delegate
    own = asyncio.run(ALICE.sign(signed_bytes(ALICE.peer_id, KIND, BODY)))
    with pytest.raises(BadSignature, match="does not verify"):
        decode_statement(_statement(ALICE.peer_id, genuine[:98] + own))


def test_a_delegate_key_that_is_not_a_curve_point_is_refused() -> None:
    genuine = _signature()
    with pytest.raises(BadSignature, match="binding"):
        decode_statement(_statement(ALICE.peer_id, genuine[:2] + b"\xff" * 32 + genuine[34:]))


def test_a_remembered_binding_does_not_vouch_for_another_body() -> None:
    genuine = _signature()
    decode_statement(_statement(ALICE.peer_id, genuine))  # the binding is now remembered
    with pytest.raises(BadSignature, match="does not verify"):
        decode_statement(_statement(ALICE.peer_id, genuine, body=b"\xa1around\x04"))


def test_a_remembered_binding_is_per_key_book() -> None:
    """A name bound to Alice's key in one directory and to Bob's in another: the binding
    checked in the first does not verify in the second."""
    named = LocalSigner.from_seed(bytes(range(32)), name="peer-a")  # Alice's key, named
    first, second = KeyDirectory(), KeyDirectory()
    first.add("peer-a", ALICE.public_key)
    second.add("peer-a", BOB.public_key)
    statement = asyncio.run(sign_statement(_delegate(named), KIND, BODY, keys=first))
    assert decode_statement(statement.block, keys=first).author == "peer-a"
    with pytest.raises(BadSignature, match="binding"):
        decode_statement(statement.block, keys=second)


def _contrib(peer: str, cid: CID, weight: int) -> AgreedMessage:
    return AgreedMessage("contrib", "s", GENESIS, 0, peer, cid, GENESIS, weight)


async def _delegated_roster() -> Roster:
    cid = Block.new(b"update", "raw").cid
    lines: dict[str, tuple[CID, int, bytes | None]] = {}
    for identity in (ALICE, BOB):
        signed = await sign_message(
            _contrib(identity.peer_id, cid, 2), await DelegatedSigner.open(identity)
        )
        lines[identity.peer_id] = (cid, 2, signed.signature)
    return Roster.new("s", GENESIS, 0, GENESIS, ALICE.peer_id, sorted(lines), lines)


def test_roster_entries_with_delegated_signatures_verify_and_round_trip() -> None:
    roster = asyncio.run(_delegated_roster())
    decoded = Roster.from_block(roster.to_block())
    assert decoded == roster
    verify_roster_entries(decoded)
    first, second = decoded.entries
    swapped = Roster.new(
        "s", GENESIS, 0, GENESIS, ALICE.peer_id, decoded.expected,
        {first.peer: (first.contribution, 2, second.signature),
         second.peer: (second.contribution, 2, first.signature)},
    )  # fmt: skip
    with pytest.raises(BadSignature, match="not its signed contribution"):
        verify_roster_entries(swapped)


def test_a_roster_entry_signature_of_another_length_is_malformed() -> None:
    roster = asyncio.run(_delegated_roster())
    entry = roster.entries[0]
    assert entry.signature is not None
    bad = Roster.new(
        "s", GENESIS, 0, GENESIS, ALICE.peer_id, roster.expected,
        {entry.peer: (entry.contribution, 2, entry.signature[:-1])},
    )  # fmt: skip
    with pytest.raises(MalformedManifest, match="signature"):
        Roster.from_block(bad.to_block())


def test_a_chain_contribution_line_with_a_delegated_signature_verifies() -> None:
    cid = Block.new(b"update", "raw").cid
    body = comet_contribution_body("s", 0, cid, 3, GENESIS)
    statement = asyncio.run(sign_statement(_delegate(), COMET_CONTRIBUTION, body))
    lines = {ALICE.peer_id: (cid, 3, statement.signature)}
    verify_roster_entries(
        Roster.new("s", GENESIS, 0, GENESIS, ALICE.peer_id, [ALICE.peer_id], lines)
    )
    lines = {ALICE.peer_id: (cid, 4, statement.signature)}  # another weight than signed
    with pytest.raises(BadSignature):
        verify_roster_entries(
            Roster.new("s", GENESIS, 0, GENESIS, ALICE.peer_id, [ALICE.peer_id], lines)
        )


def test_a_full_roster_of_delegated_entries_fits_the_record_bound() -> None:
    """MAX_ROSTER_ENTRIES entries and expected peers, longest weights, delegated signatures."""
    signature = _signature()
    cid = Block.new(b"update", "raw").cid
    peers = [
        LocalSigner.from_seed(i.to_bytes(32, "big")).peer_id for i in range(MAX_ROSTER_ENTRIES)
    ]
    lines = {p: (cid, MAX_WEIGHT, signature) for p in peers}
    block = Roster.new("s" * 256, GENESIS, 2**53 - 1, GENESIS, peers[0], peers, lines).to_block()
    assert len(block.data) <= MAX_RECORD_BYTES
    assert len(Roster.from_block(block).entries) == MAX_ROSTER_ENTRIES
