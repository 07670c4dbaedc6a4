"""Secure aggregation with dropout recovery (Bonawitz et al. 2017; Flower SecAgg+ style).

Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017,
https://eprint.iacr.org/2017/281. The server learns the sum of the surviving clients' vectors and
nothing else, against a server that may lie about who survived, as long as fewer than
``threshold`` clients collude with it; nobody outside the round learns anything.

Protocol, per round (one :class:`SecAggClient` per client, one :class:`SecAggServer`):

0. **Advertise keys.** Each client makes two X25519 key pairs, ``c`` (encrypts shares and its
   messages to the server) and ``s`` (pairwise masks), and an Ed25519 signing key, and sends the
   three public keys. The server has its own X25519 key (:attr:`SecAggServer.public_key`).
   ``threshold`` t must satisfy ``2 <= t``, ``t > n/2`` and ``t <= n`` (:func:`check_threshold`).
1. **Share keys.** Each client draws a 32-byte self-mask seed ``b_u`` and Shamir-shares ``b_u`` and
   its ``s`` private key (:mod:`.shamir`). The shares for client ``v`` are encrypted with AES-GCM
   under HKDF(X25519(c_u, c_v)) and relayed by the server, which cannot read them. A share that
   does not decrypt or decode rejects its sender (:class:`~gradfed_ipfs.errors.SecAggPeerRejected`)
   and the recipient reports it to the server with its masked vector and applies no pairwise
   mask with it; the server then treats the sender as dropped, removing only the masks that
   survivors applied.
2. **Masked input.** Each client encodes its vector in a fixed-point ring Z/2^b (see
   :class:`FixedPoint`) and adds ``PRG(b_u) + Σ_{v>u} PRG(s_uv) - Σ_{v<u} PRG(s_uv)``, where
   ``s_uv`` = HKDF(X25519(s_u, s_v)) and PRG is the ChaCha20 keystream. Pairwise masks cancel in
   the sum; the self-mask protects a client whose pairwise masks are later revealed. Over a
   network the masked vector is sealed to the server (:meth:`SecAggClient.seal_for_server`).
3. **Consistency check.** The server names the survivors (sent a masked vector and were not
   reported) and the dropped (shared keys, not summed). Each survivor signs that view
   (:meth:`SecAggClient.confirm`); the signed views are exchanged, and a client refuses to unmask
   (:class:`~gradfed_ipfs.errors.UnmaskRefused`) unless at least ``t`` survivors signed exactly
   its view and nobody signed another one (Bonawitz et al.'s active-adversary round).
4. **Unmasking.** Each survivor returns its share of ``b_u`` for every survivor and of ``s_u`` for
   every dropped client, never both for one client and only once, and for every dropped client
   it masked with the seed of that pairwise mask (what ``s_u`` would reveal of it anyway). With
   >= ``t`` answers the server rebuilds the seeds, strips the self-masks and the dropped
   clients' dangling pairwise masks (from the answered seeds, and from ``s_u`` rebuilt from
   ``t`` key shares only for a survivor that did not answer), and decodes the sum. Too few
   survivors, answers or shares raise :class:`~gradfed_ipfs.errors.SecureAggregationError`:
   there is no partial or wrong sum.

Randomness is ``os.urandom`` unless a ``randbytes`` callable is injected (tests inject a seeded
one to be reproducible; never do that in production). The in-process driver and the seed's
``SecureAggregation`` live in :mod:`.simulation`.
"""

from __future__ import annotations

from .client import SecAggClient
from .messages import (
    AdvertisedKeys,
    EncryptedShare,
    RandBytes,
    SignedView,
    UnmaskingShares,
    check_public_keys,
    check_threshold,
)
from .server import SecAggServer

__all__ = [
    "AdvertisedKeys",
    "EncryptedShare",
    "RandBytes",
    "SecAggClient",
    "SecAggServer",
    "SignedView",
    "UnmaskingShares",
    "check_public_keys",
    "check_threshold",
]
