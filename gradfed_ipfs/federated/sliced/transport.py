"""Reduce-scatter I/O helpers: slice boards, a download-counting store, ranged fetches.

* :class:`MemorySliceBoard`: one in-process board shared by peers simulated in one process;
  :class:`PubsubSliceBoard`: one peer's board over pubsub (``from`` names the sender). Both
  keep messages from the session's members only, at most :func:`member_cap` from each, and
  count what they refuse by reason in ``dropped`` (as the agreed topic's
  :class:`~gradfed_ipfs.federated.agreed.round.coordinator.RoundBoard` does).
* :class:`CountingStore`: counts the bytes ``get`` returns (a peer's downloads).
* :func:`fetch_range`: values ``offset … offset+length`` of a gradient, fetching only the chunks
  of its DAG that cover them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Hashable
from typing import Final, cast

import numpy as np
from multiformats import CID

from ..._types import CIDLike, FloatArray
from ...block import Block
from ...cid import RAW, parse_cid
from ...errors import (
    BlockStoreError,
    DecodeError,
    DimensionMismatch,
    GradientError,
)
from ...formats.pubsub import PubsubMessage
from ...formats.sliced.slices import SliceMessage
from ...formats.statement import Signer
from ...kubo.pubsub import PubsubTransport
from ...storage.base import UNSET, BlockStore, StoreWrapper, Unset
from ...storage.dag import (
    DEFAULT_CONCURRENCY,
    ChunkRef,
    fetch_chunks,
    fetch_gradient,
    fetch_manifest,
)
from ...tensor.packing import PackSpec
from ..exchange.announcer import Reannouncer

__all__ = [
    "CountingStore",
    "MemorySliceBoard",
    "PubsubSliceBoard",
    "SLICE_ROSTERS_HELD",
    "fetch_range",
    "fetch_whole",
    "member_cap",
]

logger = logging.getLogger("gradfed_ipfs.federated.reduce_scatter")

SLICE_ROSTERS_HELD: Final = 2
"""Rosters whose messages one member has on a board at once: this round's, and the next one's
heard early from a faster peer (an honest member posts about one roster a round, and
:meth:`MemorySliceBoard.forget` drops the others at each round's start)."""


def member_cap(members: int) -> int:
    """Return how many messages a board keeps from one member of a ``members``-peer session.

    It is what an honest member posts about :data:`SLICE_ROSTERS_HELD` rosters of ``N <=
    members`` peers, each at most once (a re-publication is a duplicate, not kept again):

    * per phase, one ``slice`` (or ``partial``) message per step it reduces, every step at
      worst (a backup takes over any it is ranked for, and every peer is ranked for every
      one): ``N`` slices one-level, ``S·G < N + G <= 2·N`` steps chained (``S = ⌈N/G⌉``);
    * at most ``N`` phases (each after the first excludes one more of the ``N`` senders);
    * per slice one phase ``-1`` re-announcement and one ``fraud``; one ``proj``.

    That is ``2·N² + 2·N + 1`` per roster: 41 for 4 peers, 82 kept (at most 64 KiB each).
    """
    per_roster = members * 2 * members + 2 * members + 1
    return SLICE_ROSTERS_HELD * per_roster


def _key(cid: CID) -> tuple[int, bytes]:
    """Return a cheap dictionary key of a CID (``bytes(cid)`` re-validates varints: ~3 µs)."""
    return cid.codec.code, cid.digest


def _identity(m: SliceMessage) -> tuple[object, ...]:
    """Return what makes two messages the same (CIDs as keys: encoding them as text is slow)."""
    cid = None if m.cid is None else _key(m.cid)
    return (m.sender, m.kind, _key(m.roster), m.phase, m.k, cid, m.values, m.checked)


class MemorySliceBoard:
    """In-process board: every message reaches every peer, in publication order.

    A message heard again (a re-publication) is dropped; :meth:`forget` drops other rounds'.
    A message is kept only from a member, and at most :func:`member_cap` from each; a refused
    one is counted in :attr:`dropped` (``stranger``, ``flood``) and not remembered as heard,
    so a re-publication of it is taken once :meth:`forget` has made room.

    Parameters
    ----------
    members
        The session's peers (a round's roster is among them).
    """

    def __init__(self, *, members: Collection[str]) -> None:
        self.members = frozenset(members)
        self.cap = member_cap(len(self.members))
        self.dropped: Counter[str] = Counter()
        self.messages: list[SliceMessage] = []
        self._kept: Counter[str] = Counter()
        self._seen: set[tuple[object, ...]] = set()
        self._slices: dict[tuple[tuple[int, bytes], int, int, str], list[SliceMessage]] = {}
        self._filled: dict[tuple[tuple[int, bytes], int], int] = {}
        # Set (and replaced) at each kept message. Not a Condition: its lock made every woken
        # waiter queue for it again, each acquire scanning the lock's queue (O(N²) a message
        # for a peer's ~N waiting steps).
        self._changed = asyncio.Event()
        # Waiters woken by one key only (wait_for(on=...)): a step waits for its own and its
        # input's record and its level's count, not for every message (N waiting steps a peer).
        self._keyed: dict[Hashable, list[asyncio.Event]] = {}
        # Chained rosters whose levels are counted: roster key -> (groups, slices, peers);
        # (roster key, phase, level) -> the steps of that level with a record.
        self._chains: dict[tuple[int, bytes], tuple[int, int, frozenset[str]]] = {}
        self._levels: dict[tuple[tuple[int, bytes], int, int], set[int]] = {}

    @staticmethod
    def record_key(roster: CID, phase: int, k: int, kind: str = "slice") -> Hashable:
        """Return the wake key of slice (or ``partial``) ``k``'s records in ``phase``."""
        return (_key(roster), phase, k, kind)

    @staticmethod
    def level_key(roster: CID, phase: int, j: int, count: int) -> Hashable:
        """Return the wake key of level ``j`` of a chained roster reaching ``count`` steps."""
        return ("level", _key(roster), phase, j, count)

    def count_levels(self, roster: CID, groups: int, slices: int, peers: Collection[str]) -> None:
        """Count, for a chained roster, the steps of each level with a record from ``peers``.

        Step ``j < groups − 1`` of slice ``k`` is a ``partial`` of index ``k·groups + j``; the
        last is slice ``k``'s ``slice`` record. Each new step counted wakes
        :meth:`level_key` ``(roster, phase, j, count)``.
        """
        key = _key(roster)
        self._chains[key] = (groups, slices, frozenset(peers))
        for (rk, *_), heard in list(self._slices.items()):  # those heard before: counted too
            if rk == key:
                for message in heard:
                    self._count_level(message, key)

    def _count_level(self, message: SliceMessage, key: tuple[int, bytes]) -> None:
        chain = self._chains.get(key)
        if chain is None or message.cid is None or message.sender not in chain[2]:
            return
        groups, slices, _ = chain
        if message.kind == "slice":
            j, step = groups - 1, message.k
            if not 0 <= message.k < slices:
                return
        else:
            j, step = message.k % groups, message.k
            if j == groups - 1 or not 0 <= message.k < slices * groups:
                return
        done = self._levels.setdefault((key, message.phase, j), set())
        if step not in done:
            done.add(step)
            self._wake(("level", key, message.phase, j, len(done)))

    def _wake(self, key: Hashable) -> None:
        for event in self._keyed.pop(key, ()):
            event.set()

    def poke(self, key: Hashable) -> None:
        """Wake the waiters on ``key`` (a local change their condition reads)."""
        self._wake(key)

    def records(self, roster: CID, phase: int, k: int, kind: str = "slice") -> list[SliceMessage]:
        """Return the ``slice`` (or ``partial``) messages of ``k`` in ``phase`` of a roster."""
        return self._slices.get((_key(roster), phase, k, kind), [])

    def filled(self, roster: CID, phase: int) -> int:
        """Return how many slices of ``phase`` of a roster have at least one record."""
        return self._filled.get((_key(roster), phase), 0)

    async def publish(self, message: SliceMessage) -> None:
        """Post ``message`` to every peer."""
        await self._add(message)

    def forget(self, keep: CID) -> None:
        """Drop every message that is not about roster ``keep`` (earlier rounds')."""
        self.messages = [m for m in self.messages if m.roster == keep]
        self._kept = Counter(m.sender for m in self.messages)
        self._seen = {_identity(m) for m in self.messages}
        self._slices = {key: v for key, v in self._slices.items() if key[0] == _key(keep)}
        self._filled = {key: v for key, v in self._filled.items() if key[0] == _key(keep)}
        self._chains = {key: v for key, v in self._chains.items() if key == _key(keep)}
        self._levels = {key: v for key, v in self._levels.items() if key[0] == _key(keep)}
        self._keyed = {  # other rounds' keys never fire again: their waiters time out
            key: v for key, v in self._keyed.items() if _key(keep) in cast(tuple[object, ...], key)
        }

    def _refuse(self, reason: str, sender: str) -> None:
        """Count a refused message; log the 1st, 2nd, 4th, 8th... of a reason."""
        self.dropped[reason] += 1
        count = self.dropped[reason]
        if count & (count - 1) == 0:
            logger.warning(
                "slice board: %d message(s) refused (%s), last from %s", count, reason, sender
            )

    async def _add(self, message: SliceMessage) -> bool:
        """Keep ``message``; return whether it was kept now (not heard before, not refused)."""
        sender = message.sender
        if sender not in self.members:
            self._refuse("stranger", sender)
            return False
        heard = _identity(message)
        if heard in self._seen:
            return False
        if self._kept[sender] >= self.cap:
            self._refuse("flood", sender)
            return False
        self._seen.add(heard)
        self._kept[sender] += 1
        self.messages.append(message)
        if message.kind in ("slice", "partial"):
            key = (_key(message.roster), message.phase, message.k, message.kind)
            if key not in self._slices and message.kind == "slice":
                self._filled[key[:2]] = self._filled.get(key[:2], 0) + 1
            self._slices.setdefault(key, []).append(message)
            self._wake(key)
            self._count_level(message, key[0])
        self._changed.set()  # wakes the waiters not woken yet (a burst wakes each once)
        self._changed = asyncio.Event()
        return True

    async def wait_for(
        self, ready: Callable[[], bool], timeout: float, *, on: Collection[Hashable] | None = None
    ) -> bool:
        """Wait until ``ready()`` holds (re-checked on each message); ``False`` on timeout.

        ``on``: re-checked only when one of these keys is woken (:meth:`record_key`,
        :meth:`level_key`, :meth:`poke`), for a condition that reads nothing else.
        """
        try:
            async with asyncio.timeout(timeout):
                while True:
                    if on is None:
                        changed = self._changed  # taken before the check: none is missed
                    else:
                        changed = asyncio.Event()
                        for key in on:
                            self._keyed.setdefault(key, []).append(changed)
                    if ready():
                        return True
                    await changed.wait()
        except TimeoutError:
            return ready()


class PubsubSliceBoard(MemorySliceBoard):
    """One peer's board over pubsub: what it publishes, plus what it hears from others.

    Messages carry no sender; pubsub's authenticated ``from`` is used, so a peer cannot speak
    for another. A non-member's messages are dropped before they are decoded, and malformed
    ones are dropped. Each message this peer publishes is signed once
    (:meth:`~gradfed_ipfs.formats.sliced.slices.SliceMessage.sign`, with the transport's
    :meth:`~gradfed_ipfs.kubo.PubsubTransport.signer`; re-publications repeat its bytes), and
    a member's message whose statement is missing or does not verify against the
    transport's :attr:`~gradfed_ipfs.kubo.PubsubTransport.keys` is dropped (``dropped``
    ``unsigned``, ``malformed``): what a member claims on the board (a record with its ``missing``
    senders, check values) is a signed statement a proof can name. Use as ``async with``:
    it listens meanwhile.
    Without an ``announcer`` lost messages are not re-published (a lost ``slice`` costs a
    takeover, a lost ``proj`` leaves slices unverified); with one (a running
    :class:`~.announcer.Reannouncer` on ``topic``) each message is re-published until
    :meth:`forget` drops its round.
    """

    def __init__(
        self,
        transport: PubsubTransport,
        topic: str,
        peer: str,
        *,
        members: Collection[str],
        announcer: Reannouncer | None = None,
    ) -> None:
        super().__init__(members=members)
        self.transport = transport
        self.topic = topic
        self.peer = peer
        self.announcer = announcer
        self._posted: dict[str, bytes] = {}  # re-announcement key -> roster CID bytes
        # (from, bytes) of messages kept -> their roster: a re-publication is not decoded
        # again. One per kept message (member_cap); forget() drops other rosters'.
        self._repeats: dict[tuple[str, bytes], CID] = {}
        self._count = 0
        self._listener: asyncio.Task[None] | None = None
        self._signer: Signer | None = None

    async def __aenter__(self) -> PubsubSliceBoard:
        self._signer = await self.transport.signer()
        messages = self.transport.subscribe(self.topic)
        self._listener = asyncio.create_task(self._listen(messages))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)

    async def _listen(self, messages: AsyncIterator[PubsubMessage]) -> None:
        async for message in messages:
            if message.from_peer == self.peer:
                continue  # our own, already added when published
            if message.from_peer not in self.members:
                self._refuse("stranger", message.from_peer)  # not worth decoding
                continue
            repeat = (message.from_peer, message.data)
            if repeat in self._repeats:
                continue
            try:
                decoded = SliceMessage.decode(message.data, message.from_peer, self.transport.keys)
            except DecodeError:  # malformed, or a signature that does not verify
                self._refuse("malformed", message.from_peer)
                continue  # a hostile or broken peer's bytes: dropped, the round goes on
            if decoded.signed is None:
                self._refuse("unsigned", message.from_peer)
                continue
            if await self._add(decoded):
                self._repeats[repeat] = decoded.roster

    async def publish(self, message: SliceMessage) -> None:
        """Sign ``message``, publish it on the topic and add it to this peer's view.

        Signed once: the announcer re-publishes the same bytes.
        """
        if self._signer is None:
            raise RuntimeError("PubsubSliceBoard is used outside its async with")
        message = await message.sign(self._signer, self.transport.keys)
        await self._add(message)
        if self.announcer is None:
            await self.transport.publish(self.topic, message.encode())
            return
        self._count += 1
        key = f"slice-board/{self._count}"
        self._posted[key] = bytes(message.roster)
        await self.announcer.post(key, message.encode())

    def forget(self, keep: CID) -> None:
        """Drop other rounds' messages and stop re-publishing this peer's about them."""
        super().forget(keep)
        self._repeats = {k: r for k, r in self._repeats.items() if r == keep}
        if self.announcer is not None:
            for key, roster in list(self._posted.items()):
                if roster != bytes(keep):
                    self.announcer.withdraw(key)
                    del self._posted[key]


class CountingStore(StoreWrapper):
    """A :class:`BlockStore` wrapper counting the bytes its ``get`` returns (downloads)."""

    def __init__(self, inner: BlockStore) -> None:
        super().__init__(inner)
        self.downloaded = 0

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        """Return the verified block and count its bytes."""
        block = await self.store.get(cid, timeout=timeout)
        self.downloaded += len(block.data)
        return block


async def fetch_range(
    store: BlockStore,
    cid: CIDLike,
    offset: int,
    length: int,
    d: int,
    *,
    timeout: float | Unset = UNSET,
    concurrency: int = DEFAULT_CONCURRENCY,
    packing: PackSpec | None = None,
) -> FloatArray:
    """Fetch values ``offset … offset+length`` of a d-value gradient: only the covering chunks.

    ``packing``: the gradient's blocks are packed blocks of that encoding (else dense).

    Raises
    ------
    DimensionMismatch
        If the gradient does not hold ``d`` values.
    BlockStoreError, DecodeError
        If a block is missing, corrupt or malformed (see :func:`fetch_gradient`).
    """
    parsed = parse_cid(cid)
    stop = offset + length
    if parsed.codec.code == RAW:
        whole = await fetch_gradient(
            store, parsed, timeout=timeout, expected_length=d, packing=packing
        )
        return np.ascontiguousarray(whole.reshape(-1)[offset:stop])
    # Only the covering chunks' links are decoded: a reducer reads N−1 manifests of N links.
    partial = await fetch_manifest(
        store, parsed, timeout=timeout, max_length=d, window=(offset, stop)
    )
    if partial.length != d:
        raise DimensionMismatch([d], [partial.length])
    out = np.empty(length, dtype=np.float32)

    def into(ref: ChunkRef, values: FloatArray) -> None:
        lo, hi = max(ref.offset, offset), min(ref.stop, stop)
        out[lo - offset : hi - offset] = values[lo - ref.offset : hi - ref.offset]

    await fetch_chunks(
        store, partial, into, concurrency=concurrency, timeout=timeout, manifest_cid=parsed,
        packing=packing,
    )  # fmt: skip
    return out


async def fetch_whole(
    store: BlockStore,
    contributions: dict[str, CID],
    d: int,
    timeout: float,
    packing: PackSpec | None = None,
) -> dict[str, FloatArray]:
    """Fetch whole d-value contributions by sender, concurrently; a failed one is left out.

    For the check of inputs that published no check values (:func:`~.slice_check.check_slices`):
    a failure is logged, not raised (those inputs' slices then stay unchecked).
    """

    async def one(name: str, cid: CID) -> tuple[str, FloatArray | None]:
        try:
            values = await fetch_gradient(
                store, cid, timeout=timeout, expected_length=d, packing=packing
            )
        except (BlockStoreError, DecodeError, GradientError, TimeoutError) as exc:
            logging.getLogger(__name__).warning("contribution of %s unavailable: %s", name, exc)
            return name, None
        return name, values.reshape(-1)

    fetched = await asyncio.gather(*(one(n, c) for n, c in sorted(contributions.items())))
    return {name: values for name, values in fetched if values is not None}
