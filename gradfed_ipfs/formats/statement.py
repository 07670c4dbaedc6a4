"""Signed statements: what a peer says, bound to its peer ID, checkable offline by anyone.

A statement is a dag-cbor map ``{"type": "statement", "version": 1, "author", "kind",
"body", "signature"}``. ``body`` is the statement's own dag-cbor bytes (a roster, a vote, a
claim: whatever ``kind`` names); ``signature`` is the author's Ed25519 signature of
:func:`signed_bytes`, which binds the author, the kind and the body together.

The key is the peer's libp2p identity: an Ed25519 peer ID (``12D3KooW…``) is the identity
multihash of the protobuf-encoded public key, so the peer ID *is* the verification key and no
key directory is needed. Kubo signs with it through its ``key/sign`` RPC, which prefixes the
data with ``libp2p-key signed message:`` (:data:`LIBP2P_KEY_PREFIX`); :class:`LocalSigner` signs
the same bytes in process (the in-memory bus and tests), so a statement signed either way
verifies the same way. RSA and secp256k1 peer IDs are refused: their keys are not in the ID.

A signature is either that plain 64-byte Ed25519 signature or a *delegated* one
(:data:`DELEGATED_SIGNATURE_BYTES`): a binding of an in-process Ed25519 key to the author,
signed once by the author's own key, followed by that key's signature of the statement
(:class:`DelegatedSigner`: one ``key/sign`` call at start instead of one per statement).
:func:`verify_signed` takes either form, so every verifier checks both offline; verified
bindings are remembered, so a delegated signature costs one Ed25519 check. Signatures are
not unique per statement (a peer may sign the same bytes both ways, or with two delegate
keys): compare statements by author, kind and body, never by signature or CID.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from hashlib import sha256
from typing import Any, Final, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from multiformats import multibase

from ..block import Block
from ..cid import cid_to_str
from ..errors import BadSignature, MalformedManifest
from .memo import DecodeMemo
from .records import decode_record, encode_record, require

__all__ = [
    "DELEGATED_SIGNATURE_BYTES",
    "LIBP2P_KEY_PREFIX",
    "MAX_STATEMENT_BYTES",
    "SIGNATURE_LENGTHS",
    "PEER_ID_KEYS",
    "KeyBook",
    "DelegatedSigner",
    "KeyDirectory",
    "LocalSigner",
    "Signer",
    "Statement",
    "binding_bytes",
    "decode_statement",
    "ed25519_key_of",
    "peer_id_of",
    "sign_statement",
    "signed_bytes",
    "verify_signed",
]

LIBP2P_KEY_PREFIX: Final = b"libp2p-key signed message:"
"""What Kubo's ``key/sign`` and ``key/verify`` put before the data they sign."""
MAX_STATEMENT_BYTES: Final = 256 * 1024
"""Largest encoded statement accepted (a roster of a thousand entries fits)."""
_DOMAIN: Final = b"gradfed/v1/statement\x00"
_BINDING_DOMAIN: Final = b"gradfed/v1/delegate-key/statements\x00"
"""What the author's own key signs to delegate: this purpose, the author and the key."""
_SEED_DOMAIN: Final = b"gradfed/v1/delegate-key/seed\x00"
"""What the author's own key signs (never published) to derive its delegate key."""
_DELEGATED_TAG: Final = b"\xde\x01"
_PLAIN_BYTES: Final = 64
DELEGATED_SIGNATURE_BYTES: Final = len(_DELEGATED_TAG) + 32 + 64 + 64
"""Length of a delegated signature: tag (2), delegate key (32), binding and statement
signatures (64 each)."""
SIGNATURE_LENGTHS: Final = (_PLAIN_BYTES, DELEGATED_SIGNATURE_BYTES)
"""The only lengths a statement signature may have (plain, delegated)."""
_KIND_CHARS: Final = 64
# Identity multihash (0x00), length 36, protobuf PublicKey {Type: Ed25519 (1), Data: 32 bytes}.
_ED25519_ID_PREFIX: Final = bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20])
_BASE58BTC: Final = multibase.get("base58btc")
_VERIFIED: Final[DecodeMemo[tuple[object, bytes, bytes], bool]] = DecodeMemo()
"""Signatures that verified, by key book and (signed bytes, signature): a re-announced or
re-read statement is not verified again (only successes are kept)."""
_BINDINGS: Final[DecodeMemo[tuple[object, str, bytes], Ed25519PublicKey]] = DecodeMemo()
"""Delegate keys whose binding verified, by key book, author and binding bytes."""


def ed25519_key_of(peer_id: str) -> Ed25519PublicKey:
    """Return the Ed25519 public key that an Ed25519 peer ID (``12D3KooW…``) embeds.

    Raises
    ------
    BadSignature
        If ``peer_id`` is not a base58btc Ed25519 peer ID (RSA and secp256k1 IDs included).
    """
    if not isinstance(peer_id, str) or not 40 <= len(peer_id) <= 64:
        raise BadSignature(f"not an Ed25519 peer ID: {peer_id!r:.80}")
    try:
        raw = _BASE58BTC.decode("z" + peer_id)
    except (ValueError, KeyError) as exc:
        raise BadSignature(f"not an Ed25519 peer ID: {peer_id!r:.80}") from exc
    if len(raw) != len(_ED25519_ID_PREFIX) + 32 or not raw.startswith(_ED25519_ID_PREFIX):
        raise BadSignature(f"not an Ed25519 peer ID (its key is not in it): {peer_id:.80}")
    return Ed25519PublicKey.from_public_bytes(raw[len(_ED25519_ID_PREFIX) :])


class KeyBook(Protocol):
    """Where a verifier finds an author's public key."""

    def key_of(self, author: str) -> Ed25519PublicKey:
        """Return ``author``'s Ed25519 public key; raise :class:`BadSignature` if unknown."""
        ...


class _PeerIdKeys:
    """Keys embedded in Ed25519 peer IDs: nothing to look up (what real networks use)."""

    def key_of(self, author: str) -> Ed25519PublicKey:
        return ed25519_key_of(author)

    def __repr__(self) -> str:
        return "PEER_ID_KEYS"


PEER_ID_KEYS: Final[KeyBook] = _PeerIdKeys()
"""The default :class:`KeyBook`: an author's key is the one its Ed25519 peer ID embeds."""


class KeyDirectory:
    """Named authors bound to keys (the in-memory bus's peers are names like ``"peer-a"``).

    An author that was never added is looked up as an Ed25519 peer ID, so a directory also
    verifies statements of real identities.
    """

    def __init__(self) -> None:
        self._keys: dict[str, Ed25519PublicKey] = {}

    def add(self, author: str, key: Ed25519PublicKey) -> None:
        """Bind ``author`` to ``key``.

        Raises
        ------
        BadSignature
            If ``author`` is already bound to another key.
        """
        raw = key.public_bytes(Encoding.Raw, PublicFormat.Raw)
        known = self._keys.setdefault(author, key)
        if known.public_bytes(Encoding.Raw, PublicFormat.Raw) != raw:
            raise BadSignature(f"{author:.60} is already bound to another key")

    def key_of(self, author: str) -> Ed25519PublicKey:
        """Return the key bound to ``author``, else the one its peer ID embeds."""
        known = self._keys.get(author)
        return known if known is not None else ed25519_key_of(author)

    def __contains__(self, author: object) -> bool:
        return author in self._keys


def peer_id_of(key: Ed25519PublicKey) -> str:
    """Return the libp2p peer ID (``12D3KooW…``) of an Ed25519 public key."""
    raw = key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return str(_BASE58BTC.encode(_ED25519_ID_PREFIX + raw))[1:]


def signed_bytes(author: str, kind: str, body: bytes) -> bytes:
    """Return the bytes an author's key signs for a statement (without Kubo's prefix).

    Length-prefixed fields after a domain tag, so no two different statements share them.
    """
    fields = [author.encode("utf-8"), kind.encode("utf-8"), body]
    return _DOMAIN + b"".join(len(f).to_bytes(4, "big") + f for f in fields)


class Signer(Protocol):
    """Whatever signs this peer's statements: its Kubo node or a :class:`LocalSigner`."""

    @property
    def peer_id(self) -> str:
        """The signer's Ed25519 peer ID."""
        ...

    def sign(self, data: bytes) -> Awaitable[bytes]:
        """Return a signature of ``data`` that :func:`verify_signed` checks.

        The 64-byte Ed25519 signature of ``LIBP2P_KEY_PREFIX + data`` by the peer's own key,
        or a delegated one (:class:`DelegatedSigner`).
        """
        ...


class LocalSigner:
    """An Ed25519 identity held in process (in-memory sessions, tests, offline tools).

    Parameters
    ----------
    key
        The private key; default a new random one.
    name
        The author name it signs as (the in-memory bus's peer names; verifiers then need a
        :class:`KeyDirectory` that binds it); default the key's peer ID.
    """

    def __init__(self, key: Ed25519PrivateKey | None = None, *, name: str | None = None) -> None:
        self._key = key if key is not None else Ed25519PrivateKey.generate()
        self._peer_id = name if name is not None else peer_id_of(self._key.public_key())

    @classmethod
    def from_seed(cls, seed: bytes, *, name: str | None = None) -> LocalSigner:
        """Return the signer whose private key is the 32-byte ``seed`` (deterministic tests)."""
        return cls(Ed25519PrivateKey.from_private_bytes(seed), name=name)

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The signer's public key."""
        return self._key.public_key()

    def __repr__(self) -> str:
        return f"LocalSigner({self._peer_id})"

    @property
    def peer_id(self) -> str:
        """The author this identity signs as (its peer ID unless named)."""
        return self._peer_id

    async def sign(self, data: bytes) -> bytes:
        """Sign ``LIBP2P_KEY_PREFIX + data``, as Kubo's ``key/sign`` does."""
        return self._key.sign(LIBP2P_KEY_PREFIX + data)


class DelegatedSigner:
    """Signs in process with a delegate key that the peer's own key bound to it once.

    Each signature is :data:`DELEGATED_SIGNATURE_BYTES` long: the binding (the delegate's
    public key and the peer key's signature of :func:`binding_bytes`) and the delegate's
    signature of ``LIBP2P_KEY_PREFIX + data``. On Kubo that is two ``key/sign`` calls at
    :meth:`open` instead of one per statement; the binding gives the process no power it did
    not have (whoever reaches the RPC API can already call ``key/sign``). It has no expiry:
    a statement carries no trusted time, so an expiry could not be checked offline without
    making old histories unverifiable. Make one with :meth:`open`.
    """

    def __init__(self, peer_id: str, key: Ed25519PrivateKey, binding_signature: bytes) -> None:
        if len(binding_signature) != _PLAIN_BYTES:
            raise BadSignature(f"a binding signature of {len(binding_signature)} bytes")
        self._peer_id = peer_id
        self._key = key
        raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self._binding = _DELEGATED_TAG + raw + bytes(binding_signature)

    @classmethod
    async def open(cls, identity: Signer, key: Ed25519PrivateKey | None = None) -> DelegatedSigner:
        """Bind ``key`` to ``identity`` (one signature of ``identity``) and return the signer.

        By default the key is derived from ``identity``'s signature of a fixed, never
        published message (one more signature): Ed25519 signs deterministically, so a
        restarted peer gets the same key and binding and signs the same statements to the
        same bytes. (:func:`sign_statement` checks each signature it makes, so a binding that
        does not verify against the peer's key fails at the first statement.)
        """
        author = identity.peer_id
        if key is None:
            seed = await identity.sign(_SEED_DOMAIN + author.encode("utf-8"))
            key = Ed25519PrivateKey.from_private_bytes(sha256(_SEED_DOMAIN + seed).digest())
        raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return cls(author, key, await identity.sign(binding_bytes(author, raw)))

    def __repr__(self) -> str:
        return f"DelegatedSigner({self._peer_id})"

    @property
    def peer_id(self) -> str:
        """The author it signs as (the identity's peer ID)."""
        return self._peer_id

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The delegate's public key (not the peer ID's)."""
        return self._key.public_key()

    async def sign(self, data: bytes) -> bytes:
        """Return the delegated signature of ``data`` (no call to the identity)."""
        return self._binding + self._key.sign(LIBP2P_KEY_PREFIX + data)


@dataclass(frozen=True)
class Statement:
    """A signed statement whose signature has been checked.

    Only :func:`decode_statement` and :func:`sign_statement` make them.

    Attributes
    ----------
    author
        The signer's peer ID.
    kind
        What ``body`` is (1..64 characters, e.g. ``"agreed/roster"``).
    body
        The statement's own bytes (dag-cbor by convention).
    signature
        Ed25519 signature of :func:`signed_bytes` with Kubo's prefix: 64 bytes by the
        author's own key, or delegated (:data:`DELEGATED_SIGNATURE_BYTES`).
    block
        The encoded statement (its CID names it).
    """

    author: str
    kind: str
    body: bytes
    signature: bytes
    block: Block


def _check_kind(kind: str) -> None:
    if not isinstance(kind, str) or not 1 <= len(kind) <= _KIND_CHARS or not kind.isascii():
        raise MalformedManifest(f"statement kind must be 1..{_KIND_CHARS} ASCII characters")


def binding_bytes(author: str, delegate: bytes) -> bytes:
    """Return what ``author``'s own key signs to delegate its statements to ``delegate``.

    ``delegate`` is the raw 32-byte Ed25519 public key; the domain tag names the purpose
    (gradfed statements only), so a binding is never a statement and a statement never a
    binding.
    """
    name = author.encode("utf-8")
    return _BINDING_DOMAIN + len(name).to_bytes(4, "big") + name + bytes(delegate)


def _delegate_key(author: str, signature: bytes, keys: KeyBook) -> tuple[Ed25519PublicKey, bytes]:
    """Return a delegated signature's checked delegate key and its statement signature.

    Raises
    ------
    BadSignature
        If ``signature`` is neither form, or its binding is not ``author``'s own key's.
    """
    if len(signature) != DELEGATED_SIGNATURE_BYTES or not signature.startswith(_DELEGATED_TAG):
        raise BadSignature(
            f"a signature of {len(signature)} bytes is neither plain ({_PLAIN_BYTES}) nor "
            f"delegated ({DELEGATED_SIGNATURE_BYTES})"
        )
    start = len(_DELEGATED_TAG)
    binding, inner = signature[start : start + 96], signature[start + 96 :]
    known = _BINDINGS.get((keys, author, binding))
    if known is not None:
        return known, inner
    raw, proof = binding[:32], binding[32:]
    try:
        keys.key_of(author).verify(proof, LIBP2P_KEY_PREFIX + binding_bytes(author, raw))
        delegate = Ed25519PublicKey.from_public_bytes(raw)
    except (InvalidSignature, ValueError):
        raise BadSignature(f"delegate key binding of {author:.60} does not verify") from None
    return _BINDINGS.put((keys, author, binding), delegate, len(author) + len(binding)), inner


def verify_signed(author: str, kind: str, body: bytes, signature: bytes, keys: KeyBook) -> None:
    """Check ``signature`` is ``author``'s of a ``kind`` statement with ``body`` (remembered).

    For statements a verifier rebuilds from what it holds (a roster entry is its owner's
    contribution statement: only the signature is carried). ``signature`` is plain (64 bytes,
    the author's own key) or delegated (:data:`DELEGATED_SIGNATURE_BYTES`: a key the author's
    own key bound, then that key's signature).

    Raises
    ------
    BadSignature
        If the author's key is unknown, the signature is of neither length, a delegated one's
        binding is not the author's, or the signature does not verify.
    """
    data = signed_bytes(author, kind, body)
    if _VERIFIED.get((keys, data, signature)):
        return
    if len(signature) == _PLAIN_BYTES:
        key, inner = keys.key_of(author), signature
    else:
        key, inner = _delegate_key(author, signature, keys)
    try:
        key.verify(inner, LIBP2P_KEY_PREFIX + data)
    except InvalidSignature:
        raise BadSignature(f"{kind} statement: signature of {author:.60} does not verify") from None
    _VERIFIED.put((keys, data, signature), True, len(data) + len(signature))


def _fields(author: str, kind: str, body: bytes, signature: bytes) -> dict[str, Any]:
    return {
        "type": "statement",
        "version": 1,
        "author": author,
        "kind": kind,
        "body": body,
        "signature": signature,
    }


async def sign_statement(
    signer: Signer, kind: str, body: bytes, *, keys: KeyBook = PEER_ID_KEYS
) -> Statement:
    """Sign ``body`` as a ``kind`` statement of ``signer`` and return it, checked.

    ``keys`` is where verifiers find the signer's key (a named signer's directory).

    Raises
    ------
    BadSignature
        If the signer's signature does not verify against its own peer ID (a signer whose key
        is not the peer ID's, e.g. an RSA identity).
    """
    _check_kind(kind)
    author = signer.peer_id
    signature = await signer.sign(signed_bytes(author, kind, bytes(body)))
    verify_signed(author, kind, bytes(body), signature, keys)
    block = encode_record(_fields(author, kind, bytes(body), signature))
    return Statement(author, kind, bytes(body), signature, block)


def decode_statement(
    block: Block, *, kind: str | None = None, keys: KeyBook = PEER_ID_KEYS
) -> Statement:
    """Decode and verify a statement block (size bounded before decoding).

    Parameters
    ----------
    block
        The statement's block (re-hashed against its CID by whoever fetched it).
    kind
        The kind expected, if any.
    keys
        Where the author's key is found (default: in its Ed25519 peer ID).

    Raises
    ------
    MalformedManifest
        If it is too large, not a statement, or not of ``kind``.
    BadSignature
        If its author is not an Ed25519 peer ID or the signature does not verify.
    """
    if len(block.data) > MAX_STATEMENT_BYTES:
        raise MalformedManifest(f"statement of {len(block.data)} bytes > {MAX_STATEMENT_BYTES}")
    record = decode_record(block, "statement")
    where = f"statement {cid_to_str(block.cid)}"  # str(CID): ~1 ms, at every decode
    author = require(record, "author", str, where)
    found = require(record, "kind", str, where)
    body = require(record, "body", bytes, where)
    signature = require(record, "signature", bytes, where)
    _check_kind(found)
    if kind is not None and found != kind:
        raise MalformedManifest(f"{where} is a {found!r} statement, not {kind!r}")
    if len(signature) not in SIGNATURE_LENGTHS:
        raise BadSignature(
            f"{where}: a signature of {len(signature)} bytes, not {_PLAIN_BYTES} "
            f"or {DELEGATED_SIGNATURE_BYTES} (delegated)"
        )
    verify_signed(author, found, body, signature, keys)
    return Statement(author, found, body, signature, block)
