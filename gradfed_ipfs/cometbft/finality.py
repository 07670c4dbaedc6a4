"""Offline proof that a round chain decided a record final: a commit bundle and its check.

A :class:`FinalityBundle` holds what a third party needs, and nothing it has to trust:

- the chain's genesis: its ID, validators (Ed25519 key, power) and the round machine's
  ``app_state`` (members, session, and each member's ``comet/validator`` statement binding its
  validator's key to its peer ID);
- one **hop** per change of the validator set (members joined or left: the app's validator
  updates) before the header: the signed header at a height ``k`` whose
  ``next_validators_hash`` differs from its ``validators_hash``, and the set of height ``k + 1``;
- a **signed header** (CometBFT's ``SignedHeader``: a block header and the commit for it) at
  height ``h + 1``, whose ``app_hash`` is the app's state after block ``h``;
- the app's ``/final`` answer at height ``h``: the state summary that hashes to that app hash
  and a Merkle proof of the round's ``[round, record, model]`` leaf in its ``finals`` root.

:func:`verify_finality` checks it the way a CometBFT light client checks a header against a
trusted validator set: the bindings (the genesis validators are the members'), then each hop and
finally the header, each against the set trusted so far (the genesis set first): its
``validators_hash``, the header hash (a Merkle root of its fields, as ``types.Header.Hash``
computes it), the commit's block ID against that hash, each precommit's Ed25519 signature over
its canonical vote sign bytes (``types.VoteSignBytes``: a length-delimited ``CanonicalVote``),
more than 2/3 of the trusted set's voting power. A hop's verified header commits the next set
(its ``next_validators_hash``), which is trusted from then on: the light client's sequential
verification, skipping the headers between changes (the set is the same there). Last come the
app hash and the inclusion proof. Every encoding is the generated protobuf code of CometBFT's
own ``.proto`` files (``abci/pb``); nothing is hand-encoded.

:func:`export_finality` makes a bundle from a validator's RPC.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import dag_cbor
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from google.protobuf import wrappers_pb2
from google.protobuf.message import DecodeError as ProtobufDecodeError
from google.protobuf.timestamp_pb2 import Timestamp

from ..errors import (
    AppHashMismatch,
    BadCommitSignature,
    CometRpcError,
    GradfedError,
    InsufficientVotingPower,
    NotFinal,
)
from ..errors import FinalityNotProven as _NotProven
from .abci.bindings import check_bindings
from .abci.pb.cometbft.crypto.v1 import keys_pb2
from .abci.pb.cometbft.types.v1 import canonical_pb2, types_pb2, validator_pb2
from .abci.rounds import APP_HASH_VERSION, RoundsGenesis, final_leaf, genesis_digest
from .abci.server import encode_frame
from .merkle import MAX_PROOF_DEPTH, merkle_root, root_from_aunts
from .rpc import CometRpc

__all__ = [
    "BUNDLE_KIND",
    "MAX_BUNDLE_BYTES",
    "Finality",
    "FinalityBundle",
    "export_finality",
    "header_hash",
    "validator_set_hash",
    "verify_finality",
    "vote_sign_bytes",
]

BUNDLE_KIND: Final = "gradfed/comet-finality"
"""``kind`` of an encoded bundle."""
MAX_BUNDLE_BYTES: Final = 1 << 20
"""Largest encoded bundle read, in bytes (genesis of 1024 members with bindings fits)."""
_MAX_VALIDATORS: Final = 1024
_MAX_HOPS: Final = 256
_MAX_STATE_BYTES: Final = 4096
_PRECOMMIT: Final = types_pb2.SIGNED_MSG_TYPE_PRECOMMIT
_COMMIT_FLAG: Final = validator_pb2.BLOCK_ID_FLAG_COMMIT


@dataclass(frozen=True)
class Finality:
    """What a verified bundle proves: ``record`` (with ``model``) is round ``round``'s final.

    ``height`` is the signed header's height (its app hash is the state after ``height − 1``);
    ``members`` the chain's genesis members, ``power`` the signing and total voting power of
    the header's validator set, ``hops`` the validator-set changes followed from the genesis
    set to it; ``chain`` the genesis ``app_state`` (its admission policy judges member sets).
    """

    chain_id: str
    session: str
    genesis: str
    members: tuple[str, ...]
    height: int
    round: int
    record: str
    model: str
    power: tuple[int, int]
    hops: int = 0
    chain: RoundsGenesis | None = None


Validators = tuple[tuple[bytes, int], ...]
"""A validator set: ``(Ed25519 public key, voting power)`` per validator."""


@dataclass(frozen=True)
class FinalityBundle:
    """A chain's genesis, one signed header and the app's proof of one final round.

    Attributes
    ----------
    chain_id
        The chain's ID (every vote signs it).
    validators
        The genesis validators: ``(Ed25519 public key, voting power)``.
    app_state
        The genesis ``app_state`` as JSON (a :class:`~.abci.RoundsGenesis`).
    signed_header
        An encoded ``cometbft.types.v1.SignedHeader``.
    proof
        The app's ``/final`` answer (dag-cbor) at the height before the header's.
    hops
        The validator-set changes before the header, oldest first: an encoded
        ``SignedHeader`` at a height ``k`` where the set changes, and the set of ``k + 1``.
    """

    chain_id: str
    validators: Validators
    app_state: bytes
    signed_header: bytes
    proof: bytes
    hops: tuple[tuple[bytes, Validators], ...] = ()

    def encode(self) -> bytes:
        """Return the bundle as dag-cbor (what ``gradfed-ipfs comet-export`` writes)."""
        return dag_cbor.encode(
            {
                "kind": BUNDLE_KIND,
                "version": 2,
                "chain_id": self.chain_id,
                "validators": [[key, power] for key, power in self.validators],
                "app_state": self.app_state,
                "signed_header": self.signed_header,
                "proof": self.proof,
                "hops": [[raw, [[k, p] for k, p in vs]] for raw, vs in self.hops],
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> FinalityBundle:
        """Decode an encoded bundle (size checked before decoding).

        Raises
        ------
        FinalityNotProven
            If it is too large or not such a map.
        """
        if len(raw) > MAX_BUNDLE_BYTES:
            raise _NotProven(f"bundle of {len(raw)} bytes > {MAX_BUNDLE_BYTES}")
        try:
            value = dag_cbor.decode(raw)
        except ValueError as exc:
            raise _NotProven(f"not a finality bundle: {exc!r:.200}") from exc
        if not isinstance(value, dict) or value.get("kind") != BUNDLE_KIND:
            raise _NotProven("not a finality bundle")
        hops = value.get("hops", [])  # version 1: no hops
        if not isinstance(hops, list) or len(hops) > _MAX_HOPS:
            raise _NotProven(f"a bundle has a list of at most {_MAX_HOPS} hops")
        return cls(
            _text(value.get("chain_id")), _validators(value.get("validators")),
            _bytes(value.get("app_state")), _bytes(value.get("signed_header")),
            _bytes(value.get("proof")), tuple(_hop(hop) for hop in hops),
        )  # fmt: skip


def _bytes(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise _NotProven(f"expected bytes, got {type(value).__name__}")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise _NotProven(f"expected text, got {type(value).__name__}")
    return value


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise _NotProven(f"expected a non-negative int64, got {type(value).__name__}")
    return value


def _pair(entry: object) -> tuple[bytes, int]:
    if not isinstance(entry, list) or len(entry) != 2:  # [key, power]
        raise _NotProven("a validator is [key, power]")
    return _bytes(entry[0]), _int(entry[1])


def _validators(value: object) -> Validators:
    if not isinstance(value, list) or len(value) > _MAX_VALIDATORS:
        raise _NotProven(f"a validator set is a list of at most {_MAX_VALIDATORS} validators")
    return tuple(_pair(entry) for entry in value)


def _hop(value: object) -> tuple[bytes, Validators]:
    if not isinstance(value, list) or len(value) != 2:  # [signed header, next validators]
        raise _NotProven("a hop is [signed header, validators]")
    return _bytes(value[0]), _validators(value[1])


# ---------------------------------------------------------------------------- CometBFT hashing


def _sorted_validators(validators: Sequence[tuple[bytes, int]]) -> list[tuple[bytes, int, bytes]]:
    """``(key, power, address)`` in CometBFT's order: power descending, then address."""
    entries = [(key, power, hashlib.sha256(key).digest()[:20]) for key, power in validators]
    return sorted(entries, key=lambda e: (-e[1], e[2]))


def validator_set_hash(validators: Sequence[tuple[bytes, int]]) -> bytes:
    """Return ``ValidatorSet.Hash()``: the Merkle root of each ``SimpleValidator``, sorted."""
    items = [
        validator_pb2.SimpleValidator(
            pub_key=keys_pb2.PublicKey(ed25519=key), voting_power=power
        ).SerializeToString()
        for key, power, _ in _sorted_validators(validators)
    ]
    return merkle_root(items)


def _block_id(block_id: types_pb2.BlockID) -> bytes:
    copy = types_pb2.BlockID()
    copy.CopyFrom(block_id)
    copy.part_set_header.SetInParent()  # non-nullable in gogoproto: always encoded
    return copy.SerializeToString()


def _wrapped(value: str | int | bytes) -> bytes:
    """``cdcEncode``: a protobuf wrapper of the value, empty bytes for an empty value."""
    if not value:
        return b""
    if isinstance(value, str):
        return wrappers_pb2.StringValue(value=value).SerializeToString()
    if isinstance(value, int):
        return wrappers_pb2.Int64Value(value=value).SerializeToString()
    return wrappers_pb2.BytesValue(value=value).SerializeToString()


def header_hash(header: types_pb2.Header) -> bytes:
    """Return ``Header.Hash()``: the Merkle root of its 14 encoded fields, in order."""
    h = header
    return merkle_root(
        [
            h.version.SerializeToString(),
            _wrapped(h.chain_id),
            _wrapped(h.height),
            h.time.SerializeToString(),
            _block_id(h.last_block_id),
            *(
                _wrapped(value)
                for value in (
                    h.last_commit_hash,
                    h.data_hash,
                    h.validators_hash,
                    h.next_validators_hash,
                    h.consensus_hash,
                    h.app_hash,
                    h.last_results_hash,
                    h.evidence_hash,
                    h.proposer_address,
                )
            ),
        ]
    )


def vote_sign_bytes(chain_id: str, commit: types_pb2.Commit, sig: types_pb2.CommitSig) -> bytes:
    """Return what a commit's precommit signs (``VoteSignBytes`` of ``Commit.GetVote``)."""
    vote = canonical_pb2.CanonicalVote(
        type=_PRECOMMIT, height=commit.height, round=commit.round, chain_id=chain_id
    )
    vote.block_id.hash = commit.block_id.hash
    vote.block_id.part_set_header.total = commit.block_id.part_set_header.total
    vote.block_id.part_set_header.hash = commit.block_id.part_set_header.hash
    vote.block_id.part_set_header.SetInParent()
    vote.timestamp.CopyFrom(sig.timestamp)
    vote.timestamp.SetInParent()  # non-nullable: encoded even at the zero time
    # protoio.MarshalDelimited: a uvarint length, then the message (the ABCI socket's frame)
    return encode_frame(vote.SerializeToString())


# ---------------------------------------------------------------------------- verification


def _check_set(validators: Validators, what: str) -> None:
    if not validators:
        raise _NotProven(f"{what} has no validators")
    if any(len(key) != 32 or power <= 0 for key, power in validators):
        raise _NotProven(f"a validator of {what} has no Ed25519 key or no power")
    if len({key for key, _ in validators}) != len(validators):
        raise _NotProven(f"a validator key of {what} is listed twice (CometBFT refuses that)")


def _genesis_of(bundle: FinalityBundle) -> RoundsGenesis:
    _check_set(bundle.validators, "the genesis")
    try:
        rounds = RoundsGenesis.from_app_state(bundle.app_state)
        if rounds is None:
            raise _NotProven("the genesis app_state is not a round chain's")
        keys = [("ed25519", key) for key, _ in bundle.validators]
        check_bindings(rounds, bundle.chain_id, keys)
    except _NotProven:
        raise
    except GradfedError as exc:  # MalformedManifest: bad app_state or bindings
        raise _NotProven(f"genesis: {exc}") from exc
    return rounds


def _trusted_header(
    chain_id: str, raw: bytes, trusted: Validators
) -> tuple[types_pb2.SignedHeader, tuple[int, int]]:
    """Decode a signed header; check it is signed by > 2/3 of the ``trusted`` set."""
    try:
        signed = types_pb2.SignedHeader.FromString(raw)
    except ProtobufDecodeError as exc:
        raise _NotProven(f"signed header: {exc}") from exc
    header, commit = signed.header, signed.commit
    if header.chain_id != chain_id:
        raise _NotProven(f"header of chain {header.chain_id!r:.60}, not {chain_id!r}")
    if header.validators_hash != validator_set_hash(trusted):
        raise _NotProven(
            f"the validator set of height {header.height} is not the trusted one (a change "
            "of the set without its hop)"
        )
    if commit.height != header.height or commit.block_id.hash != header_hash(header):
        raise _NotProven("the commit is not for this header")
    return signed, _check_commit(chain_id, trusted, commit)


def _follow_hops(bundle: FinalityBundle) -> tuple[Validators, int]:
    """Follow the set's changes from genesis; return the set trusted after, and its height."""
    trusted, height = bundle.validators, 0
    for raw, after in bundle.hops:
        signed, _ = _trusted_header(bundle.chain_id, raw, trusted)
        header = signed.header
        if header.height <= height:
            raise _NotProven(f"hop at height {header.height} after one at {height}")
        _check_set(after, f"the set after height {header.height}")
        if header.next_validators_hash != validator_set_hash(after):
            raise _NotProven(f"the set after height {header.height} is not the one it commits")
        trusted, height = after, header.height
    return trusted, height


def _check_commit(chain_id: str, trusted: Validators, commit: types_pb2.Commit) -> tuple[int, int]:
    """Verify every precommit for the block; return ``(signing power, total power)``."""
    validators = _sorted_validators(trusted)
    if len(commit.signatures) != len(validators):
        raise _NotProven(f"{len(commit.signatures)} signatures for {len(validators)} validators")
    total = sum(power for _, power, _ in validators)
    signed = 0
    for index, (sig, (key, power, address)) in enumerate(
        zip(commit.signatures, validators, strict=True)
    ):
        if sig.block_id_flag != _COMMIT_FLAG:
            continue  # absent, or a vote for nil: no power for this block
        if sig.validator_address != address:
            raise BadCommitSignature(f"signature {index} names another validator")
        try:
            Ed25519PublicKey.from_public_bytes(key).verify(
                sig.signature, vote_sign_bytes(chain_id, commit, sig)
            )
        except (InvalidSignature, ValueError) as exc:
            raise BadCommitSignature(f"precommit {index} (power {power}) does not verify") from exc
        signed += power
    if 3 * signed <= 2 * total:
        raise InsufficientVotingPower(f"precommits of power {signed} of {total}: not > 2/3")
    return signed, total


def _proof_fields(raw: bytes) -> dict[str, Any]:
    if len(raw) > _MAX_STATE_BYTES + 64 * (MAX_PROOF_DEPTH + 8):
        raise _NotProven(f"a /final proof of {len(raw)} bytes")
    try:
        proof = dag_cbor.decode(raw)
    except ValueError as exc:
        raise _NotProven(f"not a /final proof: {exc!r:.200}") from exc
    if not isinstance(proof, dict):
        raise _NotProven("not a /final proof")
    aunts = proof.get("aunts")
    if not isinstance(aunts, list) or len(aunts) > MAX_PROOF_DEPTH:
        raise _NotProven(f"a /final proof has a list of at most {MAX_PROOF_DEPTH} aunts")
    return {
        "round": _int(proof.get("round")), "record": _text(proof.get("record")),
        "model": _text(proof.get("model")), "index": _int(proof.get("index")),
        "total": _int(proof.get("total")), "aunts": [_bytes(a) for a in aunts],
        "state": _bytes(proof.get("state")),
    }  # fmt: skip


def _check_inclusion(rounds: RoundsGenesis, app_hash: bytes, proof: dict[str, Any]) -> None:
    state_bytes: bytes = proof["state"]
    if len(state_bytes) > _MAX_STATE_BYTES or hashlib.sha256(state_bytes).digest() != app_hash:
        raise AppHashMismatch("the state summary does not hash to the signed app hash")
    try:
        state = dag_cbor.decode(state_bytes)
    except ValueError as exc:
        raise AppHashMismatch(f"the state summary does not decode: {exc!r:.100}") from exc
    if not isinstance(state, dict):
        raise AppHashMismatch("the state summary is not a map")
    version, digest = state.get("version"), state.get("genesis")
    current, finals = state.get("current"), state.get("finals")
    if version != APP_HASH_VERSION or digest != genesis_digest(rounds):
        raise AppHashMismatch("the state summary is of another version or genesis")
    r = proof["round"]
    if not isinstance(current, int) or proof["index"] != r or proof["total"] != current:
        raise NotFinal(f"round {r} is not among the {current!r:.20} final rounds of that state")
    leaf = final_leaf(r, proof["record"], proof["model"])
    if root_from_aunts(leaf, r, current, proof["aunts"]) != finals:
        raise NotFinal(f"round {r}'s record {proof['record']:.80} is not in the finals root")


def verify_finality(bundle: FinalityBundle) -> Finality:
    """Check a bundle offline; return what it proves (see the module docstring).

    Raises
    ------
    BadCommitSignature
        If a precommit for the block does not verify (or names another validator).
    InsufficientVotingPower
        If the valid precommits hold at most 2/3 of the voting power.
    AppHashMismatch
        If the state summary is not the signed app hash, or of another genesis.
    NotFinal
        If the inclusion proof does not show the round's record in the finals root.
    FinalityNotProven
        For anything else: a malformed bundle, unbound validators, another chain, a commit
        of another header, a validator set that is not the genesis one or one a verified
        hop committed (a hop left out), hops out of order.
    """
    rounds = _genesis_of(bundle)
    trusted, changed_at = _follow_hops(bundle)
    signed, power = _trusted_header(bundle.chain_id, bundle.signed_header, trusted)
    if signed.header.height <= changed_at:
        raise _NotProven(f"the header {signed.header.height} is not after the last hop's")
    proof = _proof_fields(bundle.proof)
    _check_inclusion(rounds, signed.header.app_hash, proof)
    return Finality(
        bundle.chain_id, rounds.session, rounds.genesis, rounds.members, signed.header.height,
        proof["round"], proof["record"], proof["model"], power, len(bundle.hops), rounds,
    )  # fmt: skip


# ---------------------------------------------------------------------------- export (RPC)

_TIME: Final = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z$")


def _timestamp(text: str) -> Timestamp:
    """Parse an RFC 3339 UTC time with up to nanoseconds (CometBFT's JSON) as a ``Timestamp``."""
    match = _TIME.match(text)
    if match is None:
        raise CometRpcError(f"not an RFC 3339 UTC time: {text!r:.60}")
    base = datetime.datetime.strptime(match[1], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.UTC)
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    seconds = (base - epoch) // datetime.timedelta(seconds=1)
    return Timestamp(seconds=seconds, nanos=int((match[2] or "0").ljust(9, "0")))


def _hex(value: Any) -> bytes:
    return bytes.fromhex(str(value or ""))


def _json_block_id(value: dict[str, Any]) -> types_pb2.BlockID:
    parts = value.get("parts") or {}
    return types_pb2.BlockID(
        hash=_hex(value.get("hash")),
        part_set_header=types_pb2.PartSetHeader(
            total=int(parts.get("total", 0)), hash=_hex(parts.get("hash"))
        ),
    )


def signed_header_of_json(value: dict[str, Any]) -> types_pb2.SignedHeader:
    """Convert RPC ``/commit``'s ``signed_header`` (JSON) to the protobuf message."""
    h, c = value["header"], value["commit"]
    header = types_pb2.Header(
        chain_id=str(h["chain_id"]), height=int(h["height"]), time=_timestamp(h["time"]),
        last_block_id=_json_block_id(h["last_block_id"]),
    )  # fmt: skip
    for name in (
        "last_commit_hash", "data_hash", "validators_hash", "next_validators_hash",
        "consensus_hash", "app_hash", "last_results_hash", "evidence_hash", "proposer_address",
    ):  # fmt: skip
        setattr(header, name, _hex(h[name]))
    header.version.block = int(h["version"]["block"])
    header.version.app = int(h["version"].get("app", 0))
    commit = types_pb2.Commit(
        height=int(c["height"]), round=int(c["round"]), block_id=_json_block_id(c["block_id"])
    )
    for sig in c["signatures"]:
        commit.signatures.add(
            block_id_flag=int(sig["block_id_flag"]),
            validator_address=_hex(sig.get("validator_address")),
            timestamp=_timestamp(sig["timestamp"]),
            signature=base64.b64decode(sig.get("signature") or ""),
        )
    return types_pb2.SignedHeader(header=header, commit=commit)


_PAGE: Final = 20
"""Headers per ``/blockchain`` call (CometBFT's most)."""
_VALIDATORS_PAGE: Final = 100
"""Validators per ``/validators`` call (CometBFT's most)."""


async def _change_heights(rpc: CometRpc, below: int) -> list[int]:
    """Heights under ``below`` whose header names a next validator set other than its own."""
    heights: list[int] = []
    for low in range(1, below, _PAGE):
        high = min(below - 1, low + _PAGE - 1)
        answer = await rpc.call("blockchain", minHeight=str(low), maxHeight=str(high))
        for meta in answer["block_metas"]:
            header = meta["header"]
            if header["validators_hash"] != header["next_validators_hash"]:
                heights.append(int(header["height"]))
    return sorted(heights)


async def _validators_at(rpc: CometRpc, height: int) -> Validators:
    """Return the validator set of ``height`` (``/validators``, page by page)."""
    found: list[tuple[bytes, int]] = []
    page = 1
    while True:
        answer = await rpc.call(
            "validators", height=str(height), page=str(page), per_page=str(_VALIDATORS_PAGE)
        )
        found += [
            (base64.b64decode(v["pub_key"]["value"]), int(v["voting_power"]))
            for v in answer["validators"]
        ]
        if len(found) >= int(answer["total"]) or not answer["validators"]:
            return tuple(found)
        page += 1


async def _hops(rpc: CometRpc, below: int) -> tuple[tuple[bytes, Validators], ...]:
    """Return the hops: each set change under ``below``, its signed header and next set."""
    hops = []
    for k in await _change_heights(rpc, below):
        commit = await rpc.call("commit", height=str(k))
        signed = signed_header_of_json(commit["signed_header"])
        hops.append((signed.SerializeToString(), await _validators_at(rpc, k + 1)))
    return tuple(hops)


async def export_finality(rpc: CometRpc, r: int, *, timeout: float = 30.0) -> FinalityBundle:
    """Make the bundle that proves round ``r`` final, from one validator's RPC.

    The validator need not be trusted: the bundle is what :func:`verify_finality` checks. Its
    hops are found by reading every header up to the proof's (20 per call).

    Raises
    ------
    NotFinal
        If the validator's app says round ``r`` is not final.
    CometRpcError
        If the validator does not answer, or the next block is not committed in ``timeout``.
    """
    answer = await rpc.abci_query("/final", str(r).encode())
    if answer.code != 0:
        raise NotFinal(f"round {r} is not final on {rpc.rpc_url}: {answer.log:.200}")
    height = answer.height + 1  # the header that carries the app hash after answer.height
    deadline = time.monotonic() + timeout
    while (await rpc.latest())[0] < height:
        if time.monotonic() >= deadline:
            raise CometRpcError(f"block {height} not committed in {timeout} s", rpc_url=rpc.rpc_url)
        await asyncio.sleep(0.05)  # a block is not an event we can await over this RPC
    commit = await rpc.call("commit", height=str(height))
    genesis = (await rpc.call("genesis"))["genesis"]
    try:
        signed = signed_header_of_json(commit["signed_header"])
        validators = tuple(
            (base64.b64decode(v["pub_key"]["value"]), int(v["power"]))
            for v in genesis["validators"]
        )
        hops = await _hops(rpc, height)
    except (KeyError, TypeError, ValueError) as exc:
        raise CometRpcError(
            f"/commit, /genesis or /validators at {rpc.rpc_url}: {exc!r:.200}"
        ) from exc
    app_state = json.dumps(genesis.get("app_state"), sort_keys=True).encode()
    return FinalityBundle(
        str(genesis["chain_id"]),
        validators,
        app_state,
        signed.SerializeToString(),
        answer.value,
        hops,
    )
