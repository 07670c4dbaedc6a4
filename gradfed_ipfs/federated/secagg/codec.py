"""The SecAgg message blocks as canonical JSON (the wire is :mod:`.wire`).

Byte strings travel as lowercase hex; Shamir shares as ``[x, "0x<hex y>"]`` pairs. JSON blocks
are canonical: sorted keys, no whitespace. The ``masked`` and ``unmask-response`` plaintexts
are sealed to the aggregator's X25519 key (``server-key``) before they are posted, so their
IPFS blocks are ciphertext to everyone else; a ``masked`` plaintext is :func:`pack_masked`'s
framing of the Arrow block. Every decoder treats its input as untrusted and raises
:class:`~gradfed_ipfs.errors.DecodeError` on anything malformed.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, Final

from ...errors import DecodeError
from ...formats import limits
from .messages import AdvertisedKeys, EncryptedShare, SignedView, UnmaskingShares
from .shamir import Share

__all__ = [
    "answer_from_json",
    "answer_to_json",
    "bundle_from_json",
    "bundle_to_json",
    "from_hex",
    "json_block",
    "keys_from_json",
    "keys_to_json",
    "load_json",
    "pack_masked",
    "release_from_json",
    "release_to_json",
    "request_from_json",
    "server_key_from_json",
    "shares_from_json",
    "shares_to_json",
    "str_list",
    "to_hex",
    "unpack_masked",
    "view_from_json",
    "view_to_json",
]

_MAX_MASKED_HEADER: Final = 65_536


def to_hex(data: bytes) -> str:
    """Encode bytes as a lowercase hex string (two characters per byte)."""
    return data.hex()


def from_hex(value: object, what: str) -> bytes:
    """Decode a hex string from a JSON message; ``what`` names the field in errors.

    Raises
    ------
    DecodeError
        If ``value`` is not a string of hex digit pairs.
    """
    if not isinstance(value, str):
        raise DecodeError(f"{what} is not a hex string")
    try:
        return bytes.fromhex(value)
    except ValueError as exc:
        raise DecodeError(f"{what} is not hex") from exc


def json_block(payload: Mapping[str, Any]) -> bytes:
    """Encode a message as canonical JSON bytes (sorted keys, no whitespace)."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def load_json(data: bytes, what: str) -> dict[str, Any]:
    """Decode an untrusted JSON object; ``what`` names the message in errors.

    Raises
    ------
    DecodeError
        If ``data`` is not JSON (or nests too deeply) or is not a JSON object.
    """
    value = limits.load_json(data, what)
    if not isinstance(value, dict):
        raise DecodeError(f"{what} is not a JSON object")
    return value


def shares_to_json(shares: Mapping[str, Share]) -> dict[str, list[object]]:
    """Encode client ID → Shamir share as ``{client: [x, "0x<hex y>"]}``, sorted by client."""
    return {u: [s.x, hex(s.y)] for u, s in sorted(shares.items())}


def shares_from_json(value: object, what: str) -> dict[str, Share]:
    """Decode :func:`shares_to_json` output; ``what`` names the field in errors.

    Raises
    ------
    DecodeError
        If ``value`` is not an object of ``[int x, hex y]`` pairs.
    """
    if not isinstance(value, dict):
        raise DecodeError(f"{what} is not an object")
    out = {}
    for u, pair in value.items():
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int)):
            raise DecodeError(f"{what}[{u!r:.40}] is not [x, y]")
        try:
            out[str(u)] = Share(pair[0], int(str(pair[1]), 16))
        except ValueError as exc:
            raise DecodeError(f"{what}[{u!r:.40}] has a bad y") from exc
    return out


def str_list(value: object, what: str) -> list[str]:
    """Return ``value`` as a list of strings; ``what`` names the field in errors.

    Raises
    ------
    DecodeError
        If ``value`` is not a JSON list of strings.
    """
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise DecodeError(f"{what} is not a list of strings")
    return list(value)


def _key32(value: object, what: str) -> bytes:
    key = from_hex(value, what)
    if len(key) != 32:
        raise DecodeError(f"{what} is not 32 bytes")
    return key


def keys_to_json(keys: AdvertisedKeys) -> bytes:
    """Encode a ``keys`` message (three raw public keys as hex)."""
    return json_block(
        {
            "client_id": keys.client_id,
            "cipher": to_hex(keys.cipher_public_key),
            "mask": to_hex(keys.mask_public_key),
            "sign": to_hex(keys.signing_public_key),
        }
    )


def keys_from_json(data: bytes, sender: str) -> AdvertisedKeys:
    """Decode ``sender``'s ``keys`` message.

    Raises
    ------
    DecodeError
        If it is malformed, names another client or holds keys that are not 32 bytes.
    """
    body = load_json(data, "keys")
    if body.get("client_id") != sender:
        raise DecodeError("keys name another client")
    return AdvertisedKeys(
        sender,
        _key32(body.get("cipher"), "cipher"),
        _key32(body.get("mask"), "mask"),
        _key32(body.get("sign"), "sign"),
    )


def server_key_from_json(data: bytes) -> bytes:
    """Decode the aggregator's ``server-key`` message ``{"key": hex}`` to 32 raw bytes.

    Raises
    ------
    DecodeError
        If it is malformed.
    """
    return _key32(load_json(data, "server key").get("key"), "server key")


def bundle_to_json(sender: str, shares: list[EncryptedShare]) -> bytes:
    """Encode a ``shares`` message: recipient → hex ciphertext."""
    return json_block(
        {"sender": sender, "shares": {m.recipient: to_hex(m.ciphertext) for m in shares}}
    )


def bundle_from_json(data: bytes, sender: str) -> list[EncryptedShare]:
    """Decode ``sender``'s ``shares`` message (recipients are not checked here).

    Raises
    ------
    DecodeError
        If it is malformed or names another sender.
    """
    body = load_json(data, "shares")
    cts = body.get("shares")
    if body.get("sender") != sender or not isinstance(cts, dict):
        raise DecodeError("share bundle names another sender or holds no shares")
    return [EncryptedShare(sender, str(r), from_hex(ct, "share")) for r, ct in cts.items()]


def request_from_json(data: bytes) -> tuple[list[str], list[str]]:
    """Decode an ``unmask-request`` (or ``done``) message: (survivors, dropped).

    Raises
    ------
    DecodeError
        If it is malformed.
    """
    body = load_json(data, "unmask request")
    return str_list(body.get("survivors"), "survivors"), str_list(body.get("dropped"), "dropped")


def release_to_json(
    survivors: list[str], dropped: list[str], private_key: bytes | None, answered: list[str]
) -> bytes:
    """Encode the aggregator's ``done``: the lists, and (verifiable round) its key and answers.

    ``private_key`` is the round's server private key and ``answered`` the survivors whose
    unmasking answers it used; ``private_key=None`` writes the lists only.
    """
    body: dict[str, Any] = {"survivors": survivors, "dropped": dropped}
    if private_key is not None:
        body |= {"key": to_hex(private_key), "answered": answered}
    return json_block(body)


def release_from_json(data: bytes) -> tuple[bytes, list[str]]:
    """Decode a verifiable round's ``done``: (server private key, 32 bytes; answered).

    Raises
    ------
    DecodeError
        If it is malformed or carries no key.
    """
    body = load_json(data, "release")
    return _key32(body.get("key"), "server private key"), str_list(body.get("answered"), "answered")


def view_to_json(view: SignedView) -> bytes:
    """Encode a ``view`` message: the survivor/dropped view a client signed, and the signature."""
    return json_block(
        {
            "client_id": view.client_id,
            "survivors": list(view.survivors),
            "dropped": list(view.dropped),
            "signature": to_hex(view.signature),
        }
    )


def view_from_json(data: bytes, sender: str) -> SignedView:
    """Decode ``sender``'s ``view`` message (the signature is checked by the client).

    Raises
    ------
    DecodeError
        If it is malformed or names another client.
    """
    body = load_json(data, "view")
    if body.get("client_id") != sender:
        raise DecodeError("view names another client")
    return SignedView(
        sender,
        tuple(str_list(body.get("survivors"), "survivors")),
        tuple(str_list(body.get("dropped"), "dropped")),
        from_hex(body.get("signature"), "signature"),
    )


def answer_to_json(answer: UnmaskingShares) -> bytes:
    """Encode an ``unmask-response`` plaintext (sealed to the aggregator before posting)."""
    return json_block(
        {
            "client_id": answer.client_id,
            "self_mask_shares": shares_to_json(answer.self_mask_shares),
            "key_shares": shares_to_json(answer.key_shares),
            "pair_seeds": {u: to_hex(seed) for u, seed in answer.pair_seeds.items()},
        }
    )


def answer_from_json(data: bytes, sender: str) -> UnmaskingShares:
    """Decode ``sender``'s unsealed ``unmask-response``.

    Raises
    ------
    DecodeError
        If it is malformed or names another client.
    """
    body = load_json(data, "unmask response")
    if body.get("client_id") != sender:
        raise DecodeError("unmasking answer names another client")
    seeds = body.get("pair_seeds", {})
    if not isinstance(seeds, dict):
        raise DecodeError("pair_seeds is not an object")
    return UnmaskingShares(
        sender,
        shares_from_json(body.get("self_mask_shares"), "self_mask_shares"),
        shares_from_json(body.get("key_shares"), "key_shares"),
        {str(u): _key32(seed, "pair seed") for u, seed in seeds.items()},
    )


def pack_masked(rejected: Collection[str], block: bytes) -> bytes:
    """Frame a ``masked`` plaintext: ``{"rejected": [...]}`` JSON, a newline, the Arrow block.

    ``rejected`` names the sharers whose shares the client could not use (the aggregator then
    leaves them out of the sum).
    """
    return json_block({"rejected": sorted(rejected)}) + b"\n" + block


def unpack_masked(data: bytes) -> tuple[list[str], bytes]:
    """Split a :func:`pack_masked` plaintext into (rejected senders, Arrow block bytes).

    Raises
    ------
    DecodeError
        If the JSON header is missing, too long or malformed.
    """
    end = data.find(b"\n", 0, _MAX_MASKED_HEADER)
    if end < 0:
        raise DecodeError("masked message has no header")
    header = load_json(data[:end], "masked header")
    return str_list(header.get("rejected"), "rejected"), data[end + 1 :]
