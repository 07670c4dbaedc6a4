"""Issue 32's property tests: agreed rounds with a random hostile minority, over many seeds.

Five members on the in-memory bus share one block store; one or two of them (chosen by the
seed) are hostile. A hostile member runs a session of its own through :class:`Unreliable`
(its messages dropped, duplicated, delayed and so reordered at random) and, every round, a
:class:`Forger` sends a random batch of attacks signed with its own key: statements with a
bad signature or another member's name as author, its name on another member's message,
conflicting contributions sent to different honest peers (:class:`Reach` delivers a message
only to some), rosters out of the coordinator schedule or naming another coordinator,
weights above ``max_weight`` or NaN, NaN and huge gradients, garbage blocks, forged heads,
and, as the round's rank-0 coordinator, two valid rosters sent to different honest peers
(equivocation: the split must heal, the proof excluding it; ``GRADFED_PROPERTY_EQUIVOCATE=0``
leaves that strategy out).

Every honest peer must finish every round (a ``RoundMismatch`` or ``QuorumNotReached`` is
followed by a resync, as a training peer does), its chain must verify
(``verify_agreed_history`` with the bus's keys) and re-aggregate, here independently of the
library, to the model it holds from exactly the contributions the roster entries' owners signed
(an honest owner's entry is its own gradient), and honest peers must hold one record in every
round whose rank-0 coordinator is honest, unless they rewound in it to re-run an equivocated
round (and one head after every round).

Seeds are pytest parameters (deterministic in CI); ``GRADFED_PROPERTY_SEEDS`` runs more.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs.block import Block
from gradfed_ipfs.cid import parse_cid
from gradfed_ipfs.errors import GradfedError, QuorumNotReached, RoundMismatch
from gradfed_ipfs.federated.agreed import (
    AgreedConfig,
    AgreedRoundResult,
    AgreedSession,
    verify_agreed_history,
)
from gradfed_ipfs.federated.agreed.round.coordinator import coordinator_ranking
from gradfed_ipfs.formats import PubsubMessage
from gradfed_ipfs.formats.agreed.roster import (
    AgreedMessage,
    AgreedRecord,
    Roster,
    message_kind,
    open_message,
    sign_message,
    verify_roster_entries,
)
from gradfed_ipfs.formats.records import encode_record
from gradfed_ipfs.formats.statement import sign_statement
from gradfed_ipfs.kubo import MemoryPubsubBus, PubsubTransport, PubsubWrapper
from gradfed_ipfs.storage import MemoryBlockStore, fetch_gradient, put_gradient
from gradfed_ipfs.tensor.deterministic import deterministic_update
from tests.polling import apoll_until

from .hostile import forged_head

PEERS = ("peer-a", "peer-b", "peer-c", "peer-d", "peer-e")
SESSION = "prop"
D = 256
ROUNDS = 3
MAX_WEIGHT = 1 << 10
SEEDS = int(os.environ.get("GRADFED_PROPERTY_SEEDS", "12"))
EQUIVOCATE = os.environ.get("GRADFED_PROPERTY_EQUIVOCATE", "1") == "1"
FAST = {
    "collect_timeout": 0.4,
    "takeover_timeout": 0.8,
    "round_timeout": 10.0,
    "done_timeout": 0.5,
    "announce_interval": 0.02,
    "max_announce_interval": 0.2,
    "fetch_timeout": 1.0,
}
ROUND_BOUND = 60.0
"""Seconds a round (every peer's, resyncs included) may take before it counts as a hang."""


def initial_model() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(D).astype(np.float32)


def gradient(peer: str, round_number: int) -> np.ndarray:
    """What honest ``peer`` contributes in a round (its signed entry must be this)."""
    rng = np.random.default_rng([PEERS.index(peer), round_number])
    return (0.01 * rng.standard_normal(D)).astype(np.float32)


def weight_of(peer: str) -> int:
    return 1 + PEERS.index(peer)


class Reach:
    """Which honest peers a hostile message reaches (default: all): a partition, a router."""

    def __init__(self) -> None:
        self.only: dict[bytes, frozenset[str]] = {}

    def send_to(self, data: bytes, peers: Sequence[str]) -> None:
        self.only[bytes(data)] = frozenset(peers)

    def reaches(self, data: bytes, peer: str) -> bool:
        targets = self.only.get(bytes(data))
        return targets is None or peer in targets


class Receiving(PubsubWrapper):
    """An honest peer's transport: it misses the hostile messages not sent its way."""

    def __init__(self, inner: PubsubTransport, peer: str, reach: Reach) -> None:
        super().__init__(inner)
        self.peer, self.reach = peer, reach

    def subscribe(self, topic: str) -> AsyncIterator[PubsubMessage]:
        return self._reached(self.inner.subscribe(topic))

    async def _reached(self, heard: AsyncIterator[PubsubMessage]) -> AsyncIterator[PubsubMessage]:
        async for message in heard:
            if self.reach.reaches(message.data, self.peer):
                yield message


class Unreliable(PubsubWrapper):
    """A hostile member's transport: drops, duplicates and delays (reorders) what it sends."""

    def __init__(self, inner: PubsubTransport, rng: random.Random) -> None:
        super().__init__(inner)
        self.rng = rng
        self.drop, self.duplicate, self.delay = rng.random() * 0.5, rng.random(), rng.random()
        self.pending: set[asyncio.Task[None]] = set()

    async def publish(self, topic: str, data: bytes) -> None:
        if self.rng.random() < self.drop:
            return
        copies = 2 if self.rng.random() < self.duplicate else 1
        for _ in range(copies):
            if self.rng.random() < self.delay:
                task = asyncio.ensure_future(self._later(topic, data, self.rng.uniform(0, 1.5)))
                self.pending.add(task)
                task.add_done_callback(self.pending.discard)
            else:
                await self.inner.publish(topic, data)

    async def _later(self, topic: str, data: bytes, seconds: float) -> None:
        await asyncio.sleep(seconds)  # network delay, not synchronisation
        await self.inner.publish(topic, data)

    async def aclose(self) -> None:
        for task in list(self.pending):
            task.cancel()
        await super().aclose()


@dataclasses.dataclass
class RoundView:
    """What the forger knows of the round it attacks (from an honest peer's state)."""

    number: int
    base: CID
    head: CID | None
    honest: tuple[str, ...]


class Forger:
    """One hostile member's extra attacks: a random batch each round, signed with its own key."""

    def __init__(
        self,
        name: str,
        bus: MemoryPubsubBus,
        store: MemoryBlockStore,
        genesis: CID,
        topic: str,
        reach: Reach,
        rng: random.Random,
    ) -> None:
        self.name, self.bus, self.store, self.genesis = name, bus, store, genesis
        self.topic, self.reach, self.rng = topic, reach, rng
        self.endpoint = bus.endpoint(name)
        self.signer = bus.signer(name)
        self.heard: dict[tuple[int, str], tuple[CID, int, bytes]] = {}
        self._news = asyncio.Event()  # a contribution was heard
        self._listening = self.endpoint.subscribe(topic)
        self._listener = asyncio.ensure_future(self._listen())

    async def _listen(self) -> None:
        async for message in self._listening:
            try:
                decoded, signature = open_message(message.data, self.bus.keys)
            except GradfedError:
                continue
            if decoded.kind == "contrib" and decoded.weight is not None:
                key = (decoded.round, decoded.peer)
                self.heard.setdefault(key, (decoded.cid, decoded.weight, signature))
                self._news.set()

    async def aclose(self) -> None:
        self._listener.cancel()
        await asyncio.gather(self._listener, return_exceptions=True)

    def attacks(self) -> list[Callable[[RoundView], Awaitable[None]]]:
        return [
            *((self.equivocating_roster,) if EQUIVOCATE else ()),
            self.bad_signature,
            self.impersonation,
            self.misattributed,
            self.conflicting_contribs,
            self.early_roster,
            self.roster_naming_another,
            self.heavy_weight,
            self.nan_weight,
            self.bad_values,
            self.garbage_block,
            self.forged_head,
            self.missing_head,
        ]

    async def attack(self, view: RoundView) -> list[str]:
        """Run a random batch of attacks on ``view``'s round; return their names."""
        chosen = self.rng.sample(self.attacks(), self.rng.randint(1, 4))
        for attack in chosen:
            await attack(view)
        return [attack.__name__ for attack in chosen]

    async def _send(self, data: bytes, view: RoundView | None = None) -> None:
        if view is not None and self.rng.random() < 0.5:  # reaches only some honest peers
            self.reach.send_to(data, self.rng.sample(view.honest, self.rng.randint(1, 2)))
        await self.endpoint.publish(self.topic, data)

    async def _signed(self, message: AgreedMessage) -> bytes:
        return (await sign_message(message, self.signer, self.bus.keys)).block.data

    async def _contrib(self, view: RoundView, values: np.ndarray, weight: int = 1) -> bytes:
        cid = await put_gradient(self.store, values)
        message = AgreedMessage(
            "contrib", SESSION, self.genesis, view.number, self.name, cid, view.base, weight
        )
        return await self._signed(message)

    async def bad_signature(self, view: RoundView) -> None:
        """Its own contribution with a signature that does not verify."""
        cid = await put_gradient(self.store, np.zeros(D, np.float32))
        body = AgreedMessage(
            "contrib", SESSION, self.genesis, view.number, self.name, cid, view.base, 1
        ).encode()
        statement = {
            "type": "statement", "version": 1, "author": self.name,
            "kind": message_kind("contrib"), "body": body, "signature": bytes(64),
        }  # fmt: skip
        await self._send(encode_record(statement).data, view)

    async def impersonation(self, view: RoundView) -> None:
        """An honest peer's contribution (made up) signed with its own key as that peer."""
        victim = self.rng.choice(view.honest)
        cid = await put_gradient(self.store, np.full(D, 50.0, np.float32))
        body = AgreedMessage(
            "contrib", SESSION, self.genesis, view.number, victim, cid, view.base, MAX_WEIGHT
        ).encode()
        signature = await self.signer.sign(body)  # its key, the victim's name
        statement = {
            "type": "statement", "version": 1, "author": victim,
            "kind": message_kind("contrib"), "body": body, "signature": signature,
        }  # fmt: skip
        await self._send(encode_record(statement).data, view)

    async def misattributed(self, view: RoundView) -> None:
        """Its own statement carrying a message that names an honest peer as sender."""
        victim = self.rng.choice(view.honest)
        cid = await put_gradient(self.store, np.full(D, -50.0, np.float32))
        message = AgreedMessage(
            "contrib", SESSION, self.genesis, view.number, victim, cid, view.base, 1
        )
        body = message.encode()
        statement = await sign_statement(
            self.signer, message_kind("contrib"), body, keys=self.bus.keys
        )
        await self._send(statement.block.data, view)

    async def conflicting_contribs(self, view: RoundView) -> None:
        """Two signed contributions of its own for one round, each to different honest peers."""
        first, second = view.honest[: len(view.honest) // 2], view.honest[len(view.honest) // 2 :]
        for targets, fill in ((first, 0.02), (second, -0.02)):
            data = await self._contrib(view, np.full(D, fill, np.float32), self.rng.randint(1, 3))
            self.reach.send_to(data, targets)
            await self.endpoint.publish(self.topic, data)

    def _heard(self, view: RoundView) -> dict[str, tuple[CID, int, bytes]]:
        return {peer: heard for (r, peer), heard in self.heard.items() if r == view.number}

    async def _roster(
        self,
        view: RoundView,
        coordinator: str,
        lines: dict[str, tuple[CID, int, bytes]] | None = None,
    ) -> bytes:
        if lines is None:
            lines = self._heard(view)
            if self.rng.random() < 0.5 or not lines:  # a made-up entry for an honest peer
                fake = await put_gradient(self.store, np.full(D, 99.0, np.float32))
                lines[self.rng.choice(view.honest)] = (fake, MAX_WEIGHT, bytes(64))
        roster = Roster.new(
            SESSION, self.genesis, view.number, view.base, coordinator, PEERS, lines
        ).to_block()
        await self.store.put(roster)
        return await self._signed(
            AgreedMessage(
                "roster", SESSION, self.genesis, view.number, self.name, roster.cid,
                inline=roster.data if len(roster.data) <= 3072 else None,
            )
        )  # fmt: skip

    async def early_roster(self, view: RoundView) -> None:
        """A roster naming itself, sent before its takeover time (entries heard or made up)."""
        await self._send(await self._roster(view, self.name), view)

    async def roster_naming_another(self, view: RoundView) -> None:
        """A roster it sends naming the round's rank-0 coordinator."""
        ranking = coordinator_ranking(SESSION, self.genesis, view.number, PEERS)
        await self._send(await self._roster(view, ranking[0]), view)

    async def equivocating_roster(self, view: RoundView) -> None:
        """As the round's rank-0 coordinator: two valid rosters of the contributions it heard,
        one to some honest peers and another (one honest entry fewer) to the rest (attack 2)."""
        ranking = coordinator_ranking(SESSION, self.genesis, view.number, PEERS)
        if ranking[0] != self.name:
            return
        with contextlib.suppress(TimeoutError):  # an attacker's patience, bounded
            async with asyncio.timeout(FAST["collect_timeout"]):
                while not set(view.honest) <= set(self._heard(view)):
                    await self._news.wait()
                    self._news.clear()
        lines = {p: line for p, line in self._heard(view).items() if p in view.honest}
        if len(lines) < 2:
            return
        fewer = dict(lines)
        del fewer[self.rng.choice(sorted(lines))]
        first, second = (
            await self._roster(view, self.name, lines),
            await self._roster(view, self.name, fewer),
        )
        split = self.rng.randint(1, len(view.honest) - 1)
        self.reach.send_to(first, view.honest[:split])
        self.reach.send_to(second, view.honest[split:])
        await asyncio.gather(
            self.endpoint.publish(self.topic, first), self.endpoint.publish(self.topic, second)
        )

    async def heavy_weight(self, view: RoundView) -> None:
        """Its contribution with a weight above the session's max_weight."""
        await self._send(await self._contrib(view, np.ones(D, np.float32), MAX_WEIGHT + 1), view)

    async def nan_weight(self, view: RoundView) -> None:
        """A contrib whose weight is NaN (JSON ``NaN``), properly signed."""
        cid = await put_gradient(self.store, np.ones(D, np.float32))
        body = {
            "v": 1, "kind": "contrib", "session": SESSION, "genesis": str(self.genesis),
            "round": view.number, "peer": self.name, "cid": str(cid), "base": str(view.base),
            "weight": float("nan"),
        }  # fmt: skip
        data = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        statement = await sign_statement(
            self.signer, message_kind("contrib"), data, keys=self.bus.keys
        )
        await self._send(statement.block.data, view)

    async def bad_values(self, view: RoundView) -> None:
        """Its contribution of NaN values, or of values that overflow float32 once averaged."""
        fill = self.rng.choice([float("nan"), float("inf"), 3.0e38])
        await self._send(await self._contrib(view, np.full(D, fill, np.float32)), view)

    async def garbage_block(self, view: RoundView) -> None:
        """Its contribution naming a stored block of random bytes (raw or dag-cbor)."""
        junk = self.rng.randbytes(self.rng.randint(1, 4 * D))
        block = Block.new(junk, self.rng.choice(["raw", "dag-cbor"]))
        await self.store.put(block)
        message = AgreedMessage(
            "contrib", SESSION, self.genesis, view.number, self.name, block.cid, view.base, 1
        )
        await self._send(await self._signed(message), view)

    async def forged_head(self, view: RoundView) -> None:
        """A ``done`` for a record extending the head with a stored fake model."""
        if view.head is None:
            return
        fake, record = await forged_head(self.store, view.head, D)
        message = AgreedMessage(
            "done", SESSION, self.genesis, view.number, self.name, fake, record=record
        )
        await self._send(await self._signed(message), view)

    async def missing_head(self, view: RoundView) -> None:
        """A ``done`` far ahead naming a record nobody serves."""
        record = AgreedRecord(
            SESSION, self.genesis, 2**53 - 1, view.head, view.base, view.base, view.base, 1.0
        ).to_block()
        message = AgreedMessage(
            "done", SESSION, self.genesis, 2**53 - 1, self.name, view.base, record=record.cid
        )
        await self._send(await self._signed(message), view)


@dataclasses.dataclass
class Federation:
    """The sessions of one seed's run: honest ones first, then the hostile ones."""

    store: MemoryBlockStore
    bus: MemoryPubsubBus
    genesis: CID
    honest: list[AgreedSession]
    hostile: list[AgreedSession]
    forgers: list[Forger]
    transports: list[Unreliable]

    async def aclose(self) -> None:
        for forger in self.forgers:
            await forger.aclose()
        for session in [*self.honest, *self.hostile]:
            await session.aclose()


async def federation(seed: int, rng: random.Random) -> Federation:
    store, bus, reach = MemoryBlockStore(), MemoryPubsubBus(), Reach()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    evil = sorted(rng.sample(PEERS, rng.choice([1, 2])))
    honest = [p for p in PEERS if p not in evil]
    config = AgreedConfig(
        members=PEERS, min_peers=rng.choice([2, len(honest)]), max_weight=MAX_WEIGHT,
        max_value=1.0e3, **FAST,  # type: ignore[arg-type]
    )  # fmt: skip
    sessions = [
        AgreedSession(store, Receiving(bus.endpoint(p), p, reach), SESSION, genesis, config)
        for p in honest
    ]
    transports = [Unreliable(bus.endpoint(p), random.Random(f"{seed}/{p}")) for p in evil]
    hostile = [AgreedSession(store, t, SESSION, genesis, config) for t in transports]
    for session in [*sessions, *hostile]:
        await session.start(initial_model())
    forgers = [
        Forger(p, bus, store, genesis, sessions[0].topic, reach, random.Random(f"{seed}+{p}"))
        for p in evil
    ]
    return Federation(store, bus, genesis, sessions, hostile, forgers, transports)


async def honest_round(
    session: AgreedSession, rewound: set[str] | None = None
) -> AgreedRoundResult | None:
    """One honest peer's round; after a ``RoundMismatch`` or ``QuorumNotReached`` it resyncs,
    as a training peer does (``None``: no result). A peer the resync rewound (its chain took
    a proven equivocator's roster) is added to ``rewound``."""
    try:
        return await session.run_round(
            gradient(session.peer_id, session.round), weight=weight_of(session.peer_id)
        )
    except (RoundMismatch, QuorumNotReached):
        before = session.round
        synced = await session.resync(timeout=5.0)
        if rewound is not None and synced.round < before:
            rewound.add(session.peer_id)
        return None


async def hostile_round(session: AgreedSession, rng: random.Random) -> None:
    """A hostile member's own round: an honest-looking update (or none), errors shrugged off."""
    if rng.random() < 0.3:
        return  # withholds its contribution this round
    try:
        await session.run_round(0.01 * np.ones(D, np.float32), weight=rng.randint(1, MAX_WEIGHT))
    except GradfedError:
        await session.resync(timeout=2.0)


async def play_round(
    fed: Federation, rng: random.Random
) -> tuple[list[AgreedRoundResult | None], set[str]]:
    """Run one round on every member, the forgers attacking; honest peers' results, and the
    honest peers that rewound instead (to re-run an equivocated round)."""
    lead = fed.honest[0]
    view = RoundView(lead.round, lead.model_cid, lead.head, tuple(s.peer_id for s in fed.honest))
    attacks = [forger.attack(view) for forger in fed.forgers]
    rewound: set[str] = set()
    honest = [honest_round(s, rewound) for s in fed.honest]
    hostile = [hostile_round(s, rng) for s in fed.hostile]
    gathered = await asyncio.wait_for(asyncio.gather(*honest, *hostile, *attacks), ROUND_BOUND)
    return list(gathered[: len(fed.honest)]), rewound


async def recompute(fed: Federation, session: AgreedSession) -> None:
    """Re-aggregate ``session``'s chain from the genesis, independently of the library."""
    if session.head is None:  # every round rewound (equivocations): still at the genesis
        np.testing.assert_array_equal(session.model, initial_model())
        return
    records = await verify_agreed_history(
        fed.store, session.head, session=SESSION, genesis=fed.genesis, keys=fed.bus.keys
    )  # type: ignore[arg-type]
    model = initial_model()
    for record in records:
        assert bytes(record.base) == bytes(await put_gradient(MemoryBlockStore(), model))
        roster = Roster.from_block(await fed.store.get(record.roster))
        verify_roster_entries(roster, fed.bus.keys)  # each entry signed by its owner
        honest = {s.peer_id for s in fed.honest}
        gradients = []
        for entry in roster.entries:
            values = await fetch_gradient(fed.store, entry.contribution)
            if entry.peer in honest:  # its owner's own update and weight, nothing else
                np.testing.assert_array_equal(values, gradient(entry.peer, record.round))
                assert entry.weight == weight_of(entry.peer)
            gradients.append(np.asarray(values, np.float32).reshape(-1))
        weights = [entry.weight for entry in roster.entries]
        model = deterministic_update(model, gradients, weights, record.learning_rate)
        assert np.isfinite(model).all()
        assert bytes(record.result) == bytes(await put_gradient(MemoryBlockStore(), model))
    np.testing.assert_array_equal(model, session.model)


@pytest.mark.parametrize("seed", range(SEEDS))
async def test_a_random_hostile_minority_cannot_split_or_poison_honest_peers(seed: int) -> None:
    rng = random.Random(seed)
    fed = await federation(seed, rng)
    try:
        for _ in range(ROUNDS):
            r = fed.honest[0].round
            results, rewound = await play_round(fed, rng)
            ranking = coordinator_ranking(SESSION, fed.genesis, r, PEERS)
            # An honest coordinator's round, unless the proof of an earlier round's
            # equivocation reached the peers after they agreed on one of its rosters: every
            # chain that took one is rewound and the round re-run (a round lost by design).
            if ranking[0] in {s.peer_id for s in fed.honest} and not rewound:
                done = [res for res in results if res is not None]
                assert len(done) == len(results), f"round {r}: an honest peer had to resync"
                assert len({bytes(res.record) for res in done}) == 1, f"round {r} split"
            await converge(fed)
        for session in fed.honest:
            await recompute(fed, session)
    finally:
        await fed.aclose()


async def converge(fed: Federation) -> None:
    """Honest peers on different heads resync (as a training peer does); then they agree."""
    for _ in range(3):
        if len({bytes(s.head or b"") for s in fed.honest}) == 1:
            return
        for session in fed.honest:
            await session.resync(timeout=5.0)
    heads = {s.peer_id: str(s.head) for s in fed.honest}
    raise AssertionError(f"honest peers stay split after resyncs: {heads}")


# ----------------------------------------------------------------- what the properties found


async def _members_of_round_0(evil_rank: int) -> tuple[MemoryBlockStore, CID, str, list[str]]:
    """A store with the genesis, the member ranked ``evil_rank`` in round 0 and the others."""
    store = MemoryBlockStore()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    ranking = coordinator_ranking(SESSION, genesis, 0, PEERS)
    evil = ranking[evil_rank]
    return store, genesis, evil, [p for p in PEERS if p != evil]


async def test_a_refused_first_roster_does_not_hide_the_roster_the_round_settled_on() -> None:
    """Rank 0 sends one honest peer a roster it must refuse (an entry's weight changed), the
    others a valid one. The board keeps one roster a member and round, so that peer never
    sees the valid one; the others finish on it. Before, it neither walked their ``done``
    records back to that roster (a refused roster was still "due") nor published its own
    (the round was over elsewhere), and failed with ``QuorumNotReached``."""
    store, genesis, evil, honest = await _members_of_round_0(0)
    bus, reach = MemoryPubsubBus(), Reach()
    config = AgreedConfig(members=PEERS, min_peers=len(honest), **FAST)  # type: ignore[arg-type]
    sessions = [
        AgreedSession(store, Receiving(bus.endpoint(p), p, reach), SESSION, genesis, config)
        for p in honest
    ]
    endpoint, signer = bus.endpoint(evil), bus.signer(evil)
    heard = endpoint.subscribe(sessions[0].topic)

    async def two_rosters() -> None:
        lines: dict[str, tuple[CID, int, bytes | None]] = {}
        async for message in heard:
            decoded, signature = open_message(message.data, bus.keys)
            if decoded.kind == "contrib" and decoded.weight is not None:
                lines[decoded.peer] = (decoded.cid, decoded.weight, signature)
            if len(lines) == len(honest):
                break
        victim = honest[0]
        cid, weight, signature = lines[victim]
        bad = {**lines, victim: (cid, weight + 1, signature)}  # not what its owner signed
        for entries, targets in ((bad, honest[:1]), (lines, honest[1:])):
            block = Roster.new(SESSION, genesis, 0, genesis, evil, PEERS, entries).to_block()
            message = AgreedMessage(
                "roster", SESSION, genesis, 0, evil, block.cid, inline=block.data
            )
            data = (await sign_message(message, signer, bus.keys)).block.data
            reach.send_to(data, targets)
            await endpoint.publish(sessions[0].topic, data)

    for session in sessions:
        await session.start(initial_model())
    task = asyncio.create_task(two_rosters())
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(honest_round(s) for s in sessions)), ROUND_BOUND
        )
        await asyncio.wait_for(task, 5.0)
    finally:
        task.cancel()
        await close_all(sessions)
    assert all(res is not None for res in results)
    assert len({bytes(res.record) for res in results if res is not None}) == 1
    first = results[0]
    assert first is not None
    assert first.roster.coordinator == evil
    assert "not its signed contribution" in first.rejected[evil]


async def test_a_done_naming_a_roster_nobody_serves_does_not_stall_the_round() -> None:
    """A member that withholds its roster as rank 0 also announces ``done`` for a round-0
    record naming a roster nobody serves. Before, every honest peer learned that roster from
    the record, waited for it and so never published its own: ``QuorumNotReached`` at
    ``round_timeout``. Now rank 1 publishes when its time comes and the round ends on it."""
    store, genesis, evil, honest = await _members_of_round_0(0)
    bus = MemoryPubsubBus()
    config = AgreedConfig(members=PEERS, min_peers=len(honest), **FAST)  # type: ignore[arg-type]
    sessions = [AgreedSession(store, bus.endpoint(p), SESSION, genesis, config) for p in honest]
    for session in sessions:
        await session.start(initial_model())
    unserved = Block.new(b"a roster nobody serves", "dag-cbor").cid
    record = AgreedRecord(SESSION, genesis, 0, None, genesis, unserved, genesis, 1.0).to_block()
    await store.put(record)
    done = AgreedMessage("done", SESSION, genesis, 0, evil, genesis, record=record.cid)
    data = (await sign_message(done, bus.signer(evil), bus.keys)).block.data
    await bus.endpoint(evil).publish(sessions[0].topic, data)
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(honest_round(s) for s in sessions)), ROUND_BOUND
        )
    finally:
        await close_all(sessions)
    assert all(res is not None for res in results)
    assert len({bytes(res.record) for res in results if res is not None}) == 1
    ranking = coordinator_ranking(SESSION, genesis, 0, PEERS)
    assert results[0] is not None
    assert results[0].roster.coordinator == ranking[1]


async def close_all(sessions: Sequence[AgreedSession]) -> None:
    for session in sessions:
        await session.aclose()


class HookedStore(MemoryBlockStore):
    """A memory store that runs ``hook`` (once) when ``armed`` is first fetched."""

    def __init__(self) -> None:
        super().__init__()
        self.armed: bytes | None = None
        self.hook: Callable[[], Awaitable[None]] | None = None

    async def get(self, cid: object, **kwargs: object) -> Block:  # type: ignore[override]
        hook = self.hook
        if hook is not None and self.armed == bytes(parse_cid(cid)):  # type: ignore[arg-type]
            self.hook = None
            await hook()
        return await super().get(cid, **kwargs)  # type: ignore[arg-type]


async def test_a_done_heard_while_a_late_peer_counts_the_votes_is_no_crash() -> None:
    """A late peer (rank 0, so the round's roster is rank 1's, not yet due by its clock)
    counts the ``done`` votes behind it, loading their record; another member's ``done``
    comes in meanwhile. Before, the count iterated the live dict across the load and the
    peer's round died with ``RuntimeError: dictionary changed size during iteration``."""
    store = HookedStore()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    ranking = coordinator_ranking(SESSION, genesis, 0, PEERS)
    late, evil, others = ranking[0], ranking[-1], ranking[1:-1]
    bus = MemoryPubsubBus()
    config = AgreedConfig(members=PEERS, min_peers=len(others), **FAST)  # type: ignore[arg-type]
    sessions = {p: AgreedSession(store, bus.endpoint(p), SESSION, genesis, config) for p in PEERS}
    del sessions[evil]
    for session in sessions.values():
        await session.start(initial_model())
    try:
        first = await asyncio.wait_for(
            asyncio.gather(*(honest_round(sessions[p]) for p in others)), ROUND_BOUND
        )
        record = first[0].record if first[0] is not None else None
        assert record is not None
        assert {bytes(res.record) for res in first if res is not None} == {bytes(record)}
        board = sessions[late].board
        await until(lambda: set(others) <= set(board.state(0).done), "the others' done")

        async def evil_done() -> None:  # heard while the late peer loads the record
            done = AgreedMessage("done", SESSION, genesis, 0, evil, genesis, record=record)
            data = (await sign_message(done, bus.signer(evil), bus.keys)).block.data
            await bus.endpoint(evil).publish(sessions[late].topic, data)
            await until(lambda: evil in board.state(0).done, "the member's done")

        store.armed, store.hook = bytes(record), evil_done
        result = await asyncio.wait_for(honest_round(sessions[late]), ROUND_BOUND)
    finally:
        await close_all(list(sessions.values()))
    assert store.hook is None  # the done came in during the count
    assert result is not None
    assert bytes(result.record) == bytes(record)


async def until(condition: Callable[[], bool], what: str) -> None:
    async def check() -> bool:
        return condition()

    await apoll_until(check, timeout=10.0, what=what)
