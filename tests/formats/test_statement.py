"""Signed statements: Ed25519 peer IDs as keys, offline verification, hostile envelopes."""

from __future__ import annotations

import asyncio

import pytest

from gradfed_ipfs.block import Block
from gradfed_ipfs.errors import BadSignature, MalformedManifest
from gradfed_ipfs.formats import (
    LocalSigner,
    decode_statement,
    encode_record,
    sign_statement,
)
from gradfed_ipfs.formats.statement import MAX_STATEMENT_BYTES, ed25519_key_of, peer_id_of

SEED = bytes(range(32))


def _signed(kind: str = "agreed/roster", body: bytes = b"\xa1aa\x01") -> tuple[LocalSigner, Block]:
    signer = LocalSigner.from_seed(SEED)
    statement = asyncio.run(sign_statement(signer, kind, body))
    return signer, statement.block


def _forged(**changes: object) -> Block:
    _, block = _signed()
    statement = decode_statement(block)
    fields = {
        "type": "statement",
        "version": 1,
        "author": statement.author,
        "kind": statement.kind,
        "body": statement.body,
        "signature": statement.signature,
        **changes,
    }
    return encode_record(fields)


def test_a_signed_statement_verifies_offline_and_names_its_author() -> None:
    signer, block = _signed()
    statement = decode_statement(block, kind="agreed/roster")
    assert statement.author == signer.peer_id
    assert statement.author.startswith("12D3KooW")
    assert statement.body == b"\xa1aa\x01"
    assert statement.block.cid == block.cid


def test_a_seeded_signer_has_a_fixed_peer_id_that_round_trips() -> None:
    first, second = LocalSigner.from_seed(SEED), LocalSigner.from_seed(SEED)
    assert first.peer_id == second.peer_id
    assert peer_id_of(ed25519_key_of(first.peer_id)) == first.peer_id
    assert LocalSigner().peer_id != first.peer_id


@pytest.mark.parametrize(
    "changes",
    [
        {"body": b"\xa1aa\x02"},  # another body under the same signature
        {"kind": "agreed/done"},  # the same body relabelled
        {"author": LocalSigner.from_seed(bytes(32)).peer_id},  # claimed by another peer
        {"signature": bytes(64)},
    ],
    ids=["body", "kind", "author", "signature"],
)
def test_any_changed_field_breaks_the_signature(changes: dict[str, object]) -> None:
    with pytest.raises(BadSignature):
        decode_statement(_forged(**changes))


@pytest.mark.parametrize(
    "author",
    [
        "peer-a",  # a memory-bus name: no key in it
        "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N",  # an RSA peer ID (sha256 multihash)
        "12D3KooW" + "1" * 44,  # base58 of the wrong shape
        "12D3KooW0OIl" + "a" * 40,  # not base58 at all
    ],
)
def test_an_author_whose_key_is_not_in_its_peer_id_is_refused(author: str) -> None:
    with pytest.raises(BadSignature):
        decode_statement(_forged(author=author))


def test_malformed_envelopes_are_typed_errors() -> None:
    _, block = _signed()
    with pytest.raises(MalformedManifest, match="not 'agreed/done'"):
        decode_statement(block, kind="agreed/done")
    with pytest.raises(BadSignature, match="not 64"):
        decode_statement(_forged(signature=bytes(63)))
    with pytest.raises(MalformedManifest):
        decode_statement(_forged(body="text, not bytes"))
    with pytest.raises(MalformedManifest):
        decode_statement(_forged(kind=""))
    with pytest.raises(MalformedManifest):
        decode_statement(Block.new(b"\xff\x00 not cbor", "dag-cbor"))
    big = Block.new(b"\x00" * (MAX_STATEMENT_BYTES + 1), "dag-cbor")
    with pytest.raises(MalformedManifest, match="bytes >"):
        decode_statement(big)
