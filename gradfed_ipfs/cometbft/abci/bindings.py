"""Validators bound to members: each genesis validator's key named by a member's signed statement.

A CometBFT validator signs blocks with its own Ed25519 key (``priv_validator_key.json``); a
member's identity is its Kubo peer ID. The round chain's genesis carries, for every member, a
``comet/validator`` statement signed with the member's peer key that names its validator's
public key, the chain and round 0 (:func:`~.txs.validator_binding`). At ``InitChain`` the app
checks them against the genesis validators: one binding per member, each verifying and naming
this chain, session and round 0, and the bound keys exactly the validators' keys. A chain whose
validators are not the members' own does not start (the app refuses ``InitChain``), so a vote
of a validator is a vote of the member that bound it, and 2/3 of the voting power is 2/3 of the
members.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...block import Block
from ...errors import GradfedError, MalformedManifest
from ...formats.statement import PEER_ID_KEYS, KeyBook, decode_statement
from .rounds import RoundsGenesis
from .txs import VALIDATOR, decode_binding

__all__ = ["check_bindings"]


def check_bindings(
    genesis: RoundsGenesis,
    chain_id: str,
    validators: Sequence[tuple[str, bytes]],
    *,
    keys: KeyBook = PEER_ID_KEYS,
) -> dict[str, bytes]:
    """Check a round chain's bindings against its validators; return member → validator key.

    Parameters
    ----------
    genesis
        The chain's genesis (members, session, bindings).
    chain_id
        The chain's ID (``InitChain``'s).
    validators
        ``(pub_key_type, pub_key_bytes)`` of each genesis validator.

    Raises
    ------
    MalformedManifest
        If a binding does not verify, is not a member's, names another chain or session or a
        round other than 0, a member has none or two, or the bound keys are not exactly the
        validators' keys.
    """
    bound: dict[str, bytes] = {}
    for raw in genesis.bindings:
        try:
            statement = decode_statement(Block.new(raw, "dag-cbor"), kind=VALIDATOR, keys=keys)
        except GradfedError as exc:
            raise MalformedManifest(f"validator binding: {exc}") from exc
        binding = decode_binding(statement.body)
        if (binding.session, binding.chain_id) != (genesis.session, chain_id):
            raise MalformedManifest(f"binding of {statement.author:.60} names another chain")
        if binding.round != 0:
            raise MalformedManifest(
                f"binding of {statement.author:.60} names round {binding.round}, not 0 (genesis)"
            )
        if statement.author not in genesis.members or statement.author in bound:
            raise MalformedManifest(f"binding of {statement.author:.60}: not one per member")
        bound[statement.author] = binding.pub_key
    if set(bound) != set(genesis.members):
        raise MalformedManifest(f"{len(genesis.members) - len(bound)} member(s) bound no key")
    if any(kind != "ed25519" for kind, _ in validators):
        raise MalformedManifest("every validator key must be Ed25519")
    keys_of_validators = sorted(bytes(key) for _, key in validators)
    if sorted(bound.values()) != keys_of_validators:
        raise MalformedManifest("the bound keys are not the genesis validators' keys")
    return bound
