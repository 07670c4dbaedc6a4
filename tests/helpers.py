"""Helpers shared by the tests: one fake clock, the memory bus's name keys, closing, one home."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from multiformats import CID

from gradfed_ipfs import MemoryPubsubBus
from gradfed_ipfs.errors import ConfigError
from gradfed_ipfs.formats.agreed.roster import MAX_INLINE_BYTES, AgreedMessage, Roster, sign_message
from gradfed_ipfs.formats.statement import PEER_ID_KEYS


class FakeClock:
    """A monotonic clock the test moves by hand: ``clock.now += 5`` (seconds)."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self.now += seconds


class _MemoryNameKeys:
    """The keys a :class:`~gradfed_ipfs.MemoryPubsubBus` derives from endpoint names.

    Any bus derives the same key for a name, so histories written over one bus verify
    with these where that bus is out of reach; real peer IDs are their own keys.
    """

    def __init__(self) -> None:
        self._bus = MemoryPubsubBus()

    def key_of(self, author: str) -> Ed25519PublicKey:
        try:
            return self._bus.signer(author).public_key
        except ConfigError:  # an Ed25519 peer ID: its key is in it
            return PEER_ID_KEYS.key_of(author)


MEMORY_KEYS = _MemoryNameKeys()
"""Keys of memory-bus names (pass as ``keys=`` to offline verifiers)."""


async def signed(message: AgreedMessage, bus: MemoryPubsubBus) -> bytes:
    """Return ``message`` as its sender publishes it on ``bus``: its signed statement's bytes."""
    return (await sign_message(message, bus.signer(message.peer), bus.keys)).block.data


async def roster_signature(roster: Roster) -> bytes:
    """Return memory-bus coordinator ``roster.coordinator``'s signature of its roster message.

    What a record of a roster that leaves a member out carries (``roster_signature``).
    """
    block = roster.to_block()
    inline = block.data if len(block.data) <= MAX_INLINE_BYTES else None
    message = AgreedMessage(
        "roster", roster.session, roster.genesis, roster.round, roster.coordinator, block.cid,
        inline=inline,
    )  # fmt: skip
    signer = MemoryPubsubBus().signer(roster.coordinator)
    return (await sign_message(message, signer, MEMORY_KEYS)).signature


async def signed_entry(
    session: str, genesis: CID, round_number: int, base: CID, peer: str, cid: CID, weight: int = 1
) -> tuple[CID, int, bytes]:
    """Return a roster entry ``(cid, weight, signature)`` signed by memory-bus peer ``peer``."""
    message = AgreedMessage("contrib", session, genesis, round_number, peer, cid, base, weight)
    statement = await sign_message(message, MemoryPubsubBus().signer(peer), MEMORY_KEYS)
    return cid, weight, statement.signature


class _Closable(Protocol):
    async def aclose(self) -> None: ...


async def aclose_all(*groups: Iterable[_Closable]) -> None:
    """Close every session, pubsub and store of ``groups``, in order (a test's ``finally``)."""
    for group in groups:
        for item in group:
            await item.aclose()
