"""A Kubo node's identity key as a statement signer (``key/sign`` over the RPC API).

The node signs with its own peer identity, so a statement it signs verifies offline against
its peer ID (:func:`gradfed_ipfs.formats.statement.decode_statement`); the private key never
leaves the daemon. Kubo marks ``key/sign`` experimental; its answer is
``{"Key": {"Name", "Id"}, "Signature": "<multibase>"}``.
"""

from __future__ import annotations

from typing import Final

from ..errors import KuboRpcError
from ..formats.pubsub import decode_multibase
from ..formats.statement import ed25519_key_of
from .rpc import KuboRpc

__all__ = ["KuboSigner"]

_SIGNATURE_BYTES: Final = 64


class KuboSigner:
    """Signs with a Kubo daemon's identity key (a :class:`~gradfed_ipfs.formats.statement.Signer`).

    Make one with :meth:`open`, which reads and checks the node's peer ID.
    """

    def __init__(self, rpc: KuboRpc, peer_id: str) -> None:
        ed25519_key_of(peer_id)  # refuses an identity whose key is not in its ID (RSA)
        self.rpc = rpc
        self._peer_id = peer_id

    @classmethod
    async def open(cls, rpc: KuboRpc) -> KuboSigner:
        """Return the signer of the daemon behind ``rpc`` (one ``id`` call).

        Raises
        ------
        KuboRpcError
            If the daemon gives no peer ID.
        BadSignature
            If its identity is not Ed25519 (Kubo's default since v0.13).
        """
        answer = await rpc.post_json("id")
        peer_id = str((answer or {}).get("ID", ""))
        if not peer_id:
            raise KuboRpcError(f"id: no peer ID in the answer {answer!r:.200}")
        return cls(rpc, peer_id)

    def __repr__(self) -> str:
        return f"KuboSigner({self._peer_id})"

    @property
    def peer_id(self) -> str:
        """The daemon's peer ID."""
        return self._peer_id

    async def sign(self, data: bytes) -> bytes:
        """Return the daemon's signature of ``b"libp2p-key signed message:" + data``.

        Raises
        ------
        KuboRpcError
            If the daemon refuses or answers without a 64-byte signature.
        """
        files = {"file": ("data", data, "application/octet-stream")}
        answer = await self.rpc.post_json("key/sign", {"key": "self"}, files=files)
        text = (answer or {}).get("Signature") if isinstance(answer, dict) else None
        try:
            signature = decode_multibase(text) if isinstance(text, str) else b""
        except ValueError:
            signature = b""
        if len(signature) != _SIGNATURE_BYTES:
            raise KuboRpcError(f"key/sign answered without a signature: {answer!r:.200}")
        return signature
