"""Region votes (#32 item 10, attack 11): a region record counts only with a majority's signed
votes; honest peers write one top-level record; verify_regional_round checks the votes."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs.block import Block
from gradfed_ipfs.errors import QuorumNotReached, RoundVerificationFailed
from gradfed_ipfs.federated.agreed import AgreedSession
from gradfed_ipfs.federated.agreed.history import load_record
from gradfed_ipfs.federated.regional import (
    RegionalConfig,
    RegionalRoundResult,
    RegionalSession,
    VoteBoard,
    decode_vote,
    sign_vote,
    verify_regional_round,
    vote_quorum,
    vote_set,
    votes_needed,
)
from gradfed_ipfs.federated.regional.config import regional_topic
from gradfed_ipfs.formats.agreed.roster import AgreedMessage, Roster
from gradfed_ipfs.formats.pubsub import PubsubMessage
from gradfed_ipfs.formats.regional import RegionalRecord, RegionVote, RegionVotes, region_session
from gradfed_ipfs.kubo import MemoryPubsubBus, PubsubWrapper
from gradfed_ipfs.kubo.pubsub import PubsubTransport
from gradfed_ipfs.storage import BlockStore, MemoryBlockStore, fetch_gradient, put_gradient
from gradfed_ipfs.tensor import region_mean
from tests.polling import apoll_until

D = 64
REGIONS = {"eu-1": "eu", "eu-2": "eu", "us-1": "us", "evil": "us"}
HONEST = ("eu-1", "eu-2", "us-1")
FAST = {
    "collect_timeout": 1.0,
    "takeover_timeout": 0.5,
    "round_timeout": 10.0,
    "announce_interval": 0.02,
    "fetch_timeout": 2.0,
}


def gradient(peer: str, round_number: int) -> np.ndarray:
    rng = np.random.default_rng([sorted(REGIONS).index(peer), round_number, 11])
    return rng.standard_normal(D).astype(np.float32)


async def self_made_record(
    store: BlockStore,
    honest: CID,
    value: np.ndarray,
    *,
    author: str = "evil",
    expected: tuple[str, ...] = ("evil", "us-1"),
) -> CID:
    """Evil's own us record of the round: a roster of itself, its value as the result.

    Ground until its CID sorts before the honest record's (on main, a tie of one announcer
    each went to the smallest CID: the other region combined this one).
    """
    await apoll_until(lambda: store.has(honest), timeout=5.0, what="the honest us record")
    record = await load_record(store, honest)
    for i in range(200):
        mine = value + np.float32(i * 1e-3)
        contribution = await put_gradient(store, mine)
        roster = Roster.new(
            record.session, record.genesis, record.round, record.base, author, expected,
            {author: (contribution, 1)},
        )  # fmt: skip
        roster_cid = await store.put(roster.to_block())
        result = await put_gradient(store, region_mean([mine]))
        forged = dataclasses.replace(record, roster=roster_cid, result=result)
        block = forged.to_block()
        if bytes(block.cid) < bytes(honest):
            return await store.put(block)
    raise AssertionError("no self-made record sorts first")


class HeldTopic(PubsubWrapper):
    """us-1's slow link: its top-level messages wait while ``gate`` is clear."""

    def __init__(self, inner: PubsubTransport, topic: str, gate: asyncio.Event) -> None:
        super().__init__(inner)
        self.topic, self.gate = topic, gate

    async def publish(self, topic: str, data: bytes) -> None:
        if topic == self.topic:
            await self.gate.wait()
        await self.inner.publish(topic, data)


async def attack(*, evil_votes_honestly: bool, rounds: int, **settings: object) -> tuple[
    MemoryBlockStore, MemoryPubsubBus, RegionalConfig, list[dict[str, RegionalRoundResult]],
    list[tuple[CID, CID]],
]:  # fmt: skip
    """Run the honest peers against evil, a us member that announces its own us record.

    Evil runs its region round as a member would; then, on the top-level topic, it announces
    its self-made record the way main's peers did (a ``done``), signs a vote for it and, when
    ``evil_votes_honestly``, a vote for the region's real record too.
    """
    store = MemoryBlockStore()
    genesis = await put_gradient(store, np.zeros(D, np.float32))
    config = RegionalConfig(REGIONS, **{**FAST, **settings})  # type: ignore[arg-type]
    bus = MemoryPubsubBus()
    topic, pub, gate = regional_topic("reg", genesis), bus.endpoint("evil"), asyncio.Event()
    links: dict[str, PubsubTransport] = {p: bus.endpoint(p) for p in HONEST}
    links["us-1"] = HeldTopic(links["us-1"], topic, gate)  # evil's word arrives first
    sessions = {p: RegionalSession(store, links[p], "reg", genesis, config) for p in HONEST}
    evil = AgreedSession(
        store, bus.endpoint("evil"), region_session("reg", "us"), genesis, config.agreed("us")
    )

    async def evil_round(r: int) -> tuple[CID, CID]:
        gate.clear()
        honest = (await evil.run_round(gradient("evil", r))).record
        forged = await self_made_record(store, honest, gradient("evil", r) + 100)
        result = (await load_record(store, forged)).result
        done = AgreedMessage("done", "reg/regional", genesis, r, "evil", result, record=forged)
        await pub.publish(topic, done.encode())
        for record in (forged, honest) if evil_votes_honestly else (forged,):
            vote = await sign_vote(
                bus.signer("evil"), bus.keys, RegionVote("reg", genesis, r, "us", record)
            )
            await pub.publish(topic, vote.data)
        gate.set()
        return honest, forged

    for session in sessions.values():
        await session.start()
    await evil.start()
    results: list[dict[str, RegionalRoundResult]] = []
    records: list[tuple[CID, CID]] = []
    try:
        for r in range(rounds):
            outcome, *mine = await asyncio.gather(
                evil_round(r), *(s.run_round(gradient(p, r)) for p, s in sessions.items())
            )
            records.append(outcome)  # type: ignore[arg-type]
            results.append(dict(zip(sessions, mine, strict=True)))  # type: ignore[arg-type]
    finally:
        for session in sessions.values():
            await session.aclose()
        await evil.aclose()
    return store, bus, config, results, records


async def test_attack_11_a_self_made_region_record_is_not_combined() -> None:
    store, bus, config, rounds, records = await attack(evil_votes_honestly=True, rounds=3)
    for results, (honest, forged) in zip(rounds, records, strict=True):
        tops = {bytes(res.record) for res in results.values()}
        assert len(tops) == 1, "the honest peers wrote different top-level records"
        first = results["eu-1"]
        assert dict(first.regions)["us"] == honest != forged
        for peer, res in results.items():
            assert "not counted" in res.rejected["evil"], (peer, res.rejected)
        top = await verify_regional_round(store, first.record, config=config, keys=bus.keys)
        assert dict(top.regions)["us"] == honest

        # A top-level record that combines the self-made record, with evil's vote for it,
        # consistent in its combine, is refused: 1 vote of the region's 2.
        vote = await sign_vote(
            bus.signer("evil"), bus.keys, RegionVote("reg", top.genesis, top.round, "us", forged)
        )
        evidence = await store.put(vote_set([vote]).to_block())
        eu = dict(top.regions)["eu"]
        means = [
            await fetch_gradient(store, (await load_record(store, cid)).result)
            for cid in (eu, forged)
        ]
        lie = RegionalRecord(
            top.session, top.genesis, top.round, top.combine, top.allowed,
            (("eu", eu), ("us", forged)), await put_gradient(store, region_mean(means)),
            (top.votes[0], evidence),
        )  # fmt: skip
        lie_cid = await store.put(lie.to_block())
        for options in ({"config": config}, {"regions": REGIONS}, {}):
            with pytest.raises(RoundVerificationFailed, match="1 votes, 2 needed"):
                await verify_regional_round(store, lie_cid, keys=bus.keys, **options)


async def test_a_region_whose_majority_does_not_vote_is_not_combined_by_anyone() -> None:
    # In a 2-member region a majority is both: evil, voting only for its own record, leaves
    # the us region without a record that counts. Every honest peer waits, then gives up alike.
    with pytest.raises(QuorumNotReached, match=r"round 0: no record of region\(s\) us had enough"):
        await attack(evil_votes_honestly=False, rounds=1, round_timeout=1.5)


class LosesFirst(PubsubWrapper):
    """A receiver's lossy link: the first ``count`` top-level messages from ``sender`` are lost."""

    def __init__(self, inner: PubsubTransport, sender: str, count: int) -> None:
        super().__init__(inner)
        self.sender, self.count = sender, count

    def subscribe(self, topic: str) -> AsyncIterator[PubsubMessage]:
        messages = self.inner.subscribe(topic)

        async def lossy() -> AsyncIterator[PubsubMessage]:
            async for message in messages:
                if "/regional/" in topic and message.from_peer == self.sender and self.count > 0:
                    self.count -= 1
                    continue
                yield message

        return lossy()


async def honest_round(
    *, lossy: dict[str, tuple[str, int]] | None = None, **settings: object
) -> tuple[MemoryBlockStore, MemoryPubsubBus, RegionalConfig, RegionalRecord]:
    store = MemoryBlockStore()
    genesis = await put_gradient(store, np.zeros(D, np.float32))
    regions = {"eu-1": "eu", "eu-2": "eu", "eu-3": "eu", "us-1": "us"}
    config = RegionalConfig(regions, **{**FAST, **settings})  # type: ignore[arg-type]
    bus = MemoryPubsubBus()
    links: dict[str, PubsubTransport] = {p: bus.endpoint(p) for p in regions}
    for receiver, (sender, count) in (lossy or {}).items():
        links[receiver] = LosesFirst(links[receiver], sender, count)
    sessions = [RegionalSession(store, links[p], "reg", genesis, config) for p in regions]
    for session in sessions:
        await session.start()
    try:
        results = await asyncio.gather(*(s.run_round(np.ones(D, np.float32)) for s in sessions))
    finally:
        for session in sessions:
            await session.aclose()
    assert len({bytes(res.record) for res in results}) == 1
    top = RegionalRecord.from_block(await store.get(results[0].record))
    await verify_regional_round(store, results[0].record, config=config, keys=bus.keys)
    return store, bus, config, top


async def test_a_lost_vote_of_an_earlier_member_is_waited_for_so_the_vote_sets_agree() -> None:
    # eu needs 2 of 3 votes. us-1 loses eu-1's first top-level messages, so it holds eu-2's
    # and eu-3's votes first; taking them would name another vote set than the eu peers'
    # (eu-1, eu-2). It waits for eu-1's vote (re-announced, and relayed in vote sets).
    store, bus, _, top = await honest_round(lossy={"us-1": ("eu-1", 3)}, min_peers=1)
    voters = [
        decode_vote(v, bus.keys).author
        for v in RegionVotes.from_block(await store.get(top.votes[0])).votes
    ]
    assert voters == ["eu-1", "eu-2"]


async def test_a_vote_that_never_reaches_a_peer_comes_relayed_in_a_vote_set() -> None:
    # eu needs all 3 votes (the default); us-1 hears nothing from eu-1 on the top-level topic.
    # eu-2 and eu-3 relay the vote set they adopted, which carries eu-1's vote.
    store, bus, _, top = await honest_round(lossy={"us-1": ("eu-1", 10**9)}, round_timeout=5.0)
    votes = RegionVotes.from_block(await store.get(top.votes[0])).votes
    assert [decode_vote(v, bus.keys).author for v in votes] == ["eu-1", "eu-2", "eu-3"]


async def with_eu_votes(store: MemoryBlockStore, top: RegionalRecord, votes: list[bytes]) -> CID:
    """``top`` with eu's vote set replaced by ``votes`` (the record stays the honest one)."""
    eu = dict(top.regions)["eu"]
    evidence = await store.put(RegionVotes("eu", eu, tuple(votes)).to_block())
    forged = dataclasses.replace(top, votes=(evidence, *top.votes[1:]))
    return await store.put(forged.to_block())


async def test_verify_refuses_a_minority_a_stranger_and_another_rounds_vote() -> None:
    store, bus, config, top = await honest_round(min_peers=1)  # eu needs 2 of 3
    assert config.votes_needed("eu") == 2
    eu = dict(top.regions)["eu"]
    stored = RegionVotes.from_block(await store.get(top.votes[0])).votes
    assert len(stored) == 2  # the first two members: the same set on every peer

    async def vote(peer: str, round_number: int = 0, region: str = "eu") -> bytes:
        body = RegionVote("reg", top.genesis, round_number, region, eu)
        return (await sign_vote(bus.signer(peer), bus.keys, body)).data

    cases = [
        ([stored[0]], "1 votes, 2 needed"),
        ([stored[0], await vote("evil")], "evil is not a member"),
        ([stored[0], await vote("us-1")], "us-1 is not a member"),
        ([stored[0], await vote("eu-3", 1)], "another round"),
        ([stored[0], await vote("eu-3", region="us")], "another round"),
        ([stored[1], stored[0]], "sorted and unique"),
        ([stored[0], stored[0]], "sorted and unique"),
    ]
    for votes, match in cases:
        cid = await with_eu_votes(store, top, votes)
        with pytest.raises(RoundVerificationFailed, match=match):
            await verify_regional_round(store, cid, config=config, keys=bus.keys)
    # With min_peers 3, two votes are short even if they are a majority.
    strict = RegionalConfig(config.regions, min_peers=3)
    with pytest.raises(RoundVerificationFailed, match="2 votes, 3 needed"):
        await verify_regional_round(store, await with_eu_votes(store, top, list(stored)),
                                    config=strict, keys=bus.keys)  # fmt: skip
    # A vote whose signature is not its author's.
    other = bytearray(await vote("eu-3"))
    other[-3] ^= 1
    with pytest.raises(RoundVerificationFailed):
        await verify_regional_round(
            store, await with_eu_votes(store, top, [stored[0], bytes(other)]), keys=bus.keys
        )


def message(sender: str, data: bytes) -> PubsubMessage:
    return PubsubMessage(sender, data, b"\x00" * 8, ("t",))


async def test_the_board_keeps_members_votes_for_their_own_region_and_round_only() -> None:
    bus = MemoryPubsubBus()
    genesis = await put_gradient(MemoryBlockStore(), np.zeros(4, np.float32))
    record = Block.new(b"\xa0", "dag-cbor").cid
    board = VoteBoard("reg", genesis, REGIONS, bus.keys)

    async def vote(peer: str, **changes: Any) -> bytes:
        body = dataclasses.replace(
            RegionVote("reg", genesis, 0, REGIONS.get(peer, "us"), record), **changes
        )
        return (await sign_vote(bus.signer(peer), bus.keys, body)).data

    assert board.accept(message("us-1", await vote("us-1"))) == 1
    assert board.accept(message("us-1", await vote("us-1"))) == 0  # a repeat
    assert board.accept(message("stranger", await vote("stranger"))) == 0
    assert (
        board.accept(message("eu-1", await vote("stranger"))) == 0
    )  # a member's relay of a stranger's
    assert board.accept(message("evil", await vote("evil", region="eu"))) == 0  # not its region
    assert board.accept(message("evil", await vote("evil", round=17))) == 0  # beyond the window
    assert board.accept(message("evil", await vote("evil", session="other"))) == 0
    assert board.accept(message("evil", b"not cbor")) == 0
    assert set(board.votes(0, "us")[bytes(record)]) == {"us-1"}
    assert board.dropped == {"repeat": 1, "stranger": 3, "window": 1, "foreign": 1, "malformed": 1}
    # A relayed vote set carries its votes; one author's votes for many records are capped.
    relayed = vote_set([board.votes(0, "us")[bytes(record)]["us-1"]])
    evil_votes = [
        await vote("evil", record=Block.new(bytes([0xA1, 0x61, 0x61, i]), "dag-cbor").cid)
        for i in range(6)
    ]
    assert board.accept(message("eu-2", relayed.to_block().data)) == 0  # known already
    padded = RegionVotes("us", record, relayed.votes * 3)  # us has 2 members
    assert board.accept(message("eu-2", padded.to_block().data)) == 0
    assert sum(board.accept(message("evil", v)) for v in evil_votes) == 4
    assert board.dropped["flood"] == 2
    assert board.dropped["malformed"] == 2
    board.advance(2)
    assert board.votes(0, "us") == {}
    # The vote of round 17, dropped at round 0 (beyond the window), counts once it is near.
    assert board.accept(message("evil", await vote("evil", round=17))) == 1


def test_votes_needed_and_the_first_voters_rule() -> None:
    assert [votes_needed(n) for n in (1, 2, 3, 4)] == [1, 2, 3, 4]  # default: all members
    assert [votes_needed(n, 1) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]  # more than half
    assert votes_needed(5, 4) == 4
    assert votes_needed(3, 9) == 3
    members = ("a", "b", "c", "d", "e")
    assert vote_quorum(members, 3, {"a", "b", "c", "e"}) == (("a", "b", "c"), True)
    assert vote_quorum(members, 3, {"a", "c", "d", "e"}) == (("a", "c", "d"), False)  # b: wait
    assert vote_quorum(members, 3, {"d", "e"}) is None
