"""Pubsub: wire encodings, announcement checks, the Kubo client (mocked and real)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import DecodeError, PubsubRequestError, PubsubUnavailable
from gradfed_ipfs.formats import MAX_MESSAGE_BYTES, Announcement, AnnouncementFilter
from gradfed_ipfs.kubo.pubsub import (
    PUBLISH_ATTEMPTS,
    KuboPubsub,
    MemoryPubsubBus,
    PubsubMessage,
    decode_multibase,
    decode_topic,
    encode_topic,
    parse_sub_line,
    session_topic,
)
from tests.polling import apoll_until

CID_A = make_cid(b"gradient a")


def test_topic_wire_form_matches_kubo() -> None:
    assert encode_topic("gradfed/v1/test") == "uZ3JhZGZlZC92MS90ZXN0"  # seen from Kubo 0.43.1
    assert decode_topic("uZ3JhZGZlZC92MS90ZXN0") == "gradfed/v1/test"
    assert session_topic("s1") == "gradfed/v1/s1"
    with pytest.raises(DecodeError):
        decode_multibase("mAAAA")
    with pytest.raises(DecodeError):
        decode_multibase("u!!!")


def test_parse_sub_line_from_kubo() -> None:
    line = {
        "from": "12D3KooWKQx98K5foXMFp8foKMubm695WBosE4bYc35GPTC9LSph",
        "data": "ueyJ4IjoxfQ",
        "seqno": "uGOyOybItL4k",
        "topicIDs": ["uZ3JhZGZlZC92MS90ZXN0"],
    }
    message = parse_sub_line(line)
    assert message.from_peer.startswith("12D3KooW")
    assert message.data == b'{"x":1}'
    assert message.topics == ("gradfed/v1/test",)
    with pytest.raises(DecodeError):
        parse_sub_line({"data": "u"})


def announce(peer: str = "peer-a", **overrides: object) -> bytes:
    record = json.loads(Announcement.new("s1", 3, peer, CID_A, num_samples=5, length=7).encode())
    record.update(overrides)
    return json.dumps(record).encode()


def test_announcement_round_trip() -> None:
    original = Announcement.new("s1", 3, "peer-a", str(CID_A), num_samples=None, length=10)
    decoded = Announcement.decode(original.encode())
    assert decoded == original
    assert decoded.cid == CID_A


def test_filter_drops_and_counts_every_bad_message() -> None:
    checks = AnnouncementFilter("s1", "me")
    messages = [
        PubsubMessage("peer-a", announce()),  # accepted
        PubsubMessage("peer-a", announce()),  # duplicate (peer, round)
        PubsubMessage("peer-a", announce(cid=str(make_cid(b"other")))),  # duplicate too
        PubsubMessage("peer-b", b"{not json"),  # malformed
        PubsubMessage("peer-b", json.dumps([1]).encode()),  # malformed
        PubsubMessage("peer-b", announce("peer-b", round=-1)),  # malformed
        PubsubMessage("peer-b", announce("peer-b", num_samples="7")),  # malformed
        PubsubMessage("peer-b", announce("peer-b", version=2)),  # malformed
        PubsubMessage("peer-b", b" " * (MAX_MESSAGE_BYTES + 1)),  # oversized
        PubsubMessage("peer-b", announce("peer-b", session="s2")),  # wrong session
        PubsubMessage("peer-b", announce("peer-b", cid="not-a-cid")),  # bad CID
        PubsubMessage("peer-b", announce("peer-a", round=9)),  # forged: claims peer-a
        PubsubMessage("me", announce("me")),  # own
        PubsubMessage("peer-b", b"\xff\xfe"),  # malformed (not UTF-8)
        PubsubMessage("peer-b", announce("peer-b", round=4)),  # accepted
    ]
    accepted = [a for m in messages if (a := checks.accept(m)) is not None]
    assert [(a.peer_id, a.round) for a in accepted] == [("peer-a", 3), ("peer-b", 4)]
    assert accepted[0].num_samples == 5
    assert dict(checks.drops) == {
        "duplicate": 2,
        "malformed": 6,
        "oversized": 1,
        "wrong_session": 1,
        "bad_cid": 1,
        "forged_sender": 1,
        "own": 1,
    }
    assert checks.accepted == 2


def test_dedup_state_is_bounded() -> None:
    checks = AnnouncementFilter("s1", "me", max_seen=2)
    for round_id in range(5):
        assert checks.accept(PubsubMessage("p", announce("p", round=round_id))) is not None
    assert len(checks._seen) == 2
    assert checks.accept(PubsubMessage("p", announce("p", round=4))) is None  # remembered
    assert checks.accept(PubsubMessage("p", announce("p", round=0))) is not None  # forgotten


@given(st.binary(max_size=2000), st.text(max_size=20))
def test_filter_never_raises(data: bytes, sender: str) -> None:
    AnnouncementFilter("s1", "me").accept(PubsubMessage(sender, data))


# ---------------------------------------------------------------------------- mocked Kubo


async def test_http_failures_map_to_pubsub_errors() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    def error(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"Message": "pubsub not enabled", "Type": "error"})

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    for handler, kind in [(refuse, PubsubUnavailable), (error, PubsubRequestError)]:
        client = KuboPubsub("http://127.0.0.1:1", transport=httpx.MockTransport(handler))
        with pytest.raises(kind):
            await client.publish("t", b"x")
        with pytest.raises(kind):
            await client.peers("t")
        await client.aclose()
    client = KuboPubsub("http://127.0.0.1:1", transport=httpx.MockTransport(slow))
    with pytest.raises(PubsubUnavailable):
        await client.topics()
    await client.aclose()


async def test_publish_sends_multibase_topic_and_multipart_data() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text="")

    client = KuboPubsub("http://127.0.0.1:1", transport=httpx.MockTransport(handler))
    await client.publish("gradfed/v1/test", b"payload-bytes")
    await client.aclose()
    request = seen[0]
    assert request.method == "POST"
    assert request.url.path == "/api/v0/pubsub/pub"
    assert request.url.params["arg"] == "uZ3JhZGZlZC92MS90ZXN0"
    assert b"multipart/form-data" in request.headers["content-type"].encode()
    assert b"payload-bytes" in request.read()


@pytest.mark.parametrize("ignored_answers", [1, PUBLISH_ATTEMPTS - 1, PUBLISH_ATTEMPTS])
async def test_publish_retries_a_seqno_race_then_gives_up(ignored_answers: int) -> None:
    # Kubo answers "validation ignored" when two local publishes race past its seqno validator.
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) <= ignored_answers:
            return httpx.Response(500, json={"Message": "validation ignored", "Type": "error"})
        return httpx.Response(200, text="")

    client = KuboPubsub("http://127.0.0.1:1", transport=httpx.MockTransport(handler))
    if ignored_answers < PUBLISH_ATTEMPTS:
        await client.publish("t", b"x")
        assert len(calls) == ignored_answers + 1
    else:
        with pytest.raises(PubsubRequestError, match="validation ignored"):
            await client.publish("t", b"x")
        assert len(calls) == PUBLISH_ATTEMPTS
    await client.aclose()


async def test_publishes_through_one_transport_go_one_at_a_time() -> None:
    # Two publishes of one daemon in flight at once can race past its seqno validator (one of
    # them is then "ignored"), so a transport never has two in flight.
    in_flight: list[bytes] = []
    overlaps = 0
    served: list[bytes] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal overlaps
        body = request.read()
        overlaps += bool(in_flight)
        in_flight.append(body)
        for _ in range(5):  # hand the loop to the other publishers
            await asyncio.sleep(0)
        in_flight.remove(body)
        served.append(body)
        return httpx.Response(200, text="")

    client = KuboPubsub("http://127.0.0.1:1", transport=httpx.MockTransport(handler))
    await asyncio.gather(*(client.publish("t", f"message {i}".encode()) for i in range(4)))
    await client.aclose()
    assert len(served) == 4
    assert overlaps == 0


async def test_publish_does_not_retry_other_refusals() -> None:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(500, json={"Message": "pubsub not enabled", "Type": "error"})

    client = KuboPubsub("http://127.0.0.1:1", transport=httpx.MockTransport(handler))
    with pytest.raises(PubsubRequestError, match="not enabled"):
        await client.publish("t", b"x")
    assert len(calls) == 1
    await client.aclose()


async def test_subscription_reconnects_when_the_stream_breaks() -> None:
    opened = 0

    def line(n: int) -> bytes:
        payload = {"from": "peer", "data": "uMQ", "seqno": f"u{'AA' * n}", "topicIDs": []}
        return json.dumps(payload).encode() + b"\n"

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal opened
        opened += 1
        if opened == 2:
            raise httpx.ConnectError("daemon restarting", request=request)
        garbage = b"garbage line\n" + b"[" * 100_000 + b"\n"  # not JSON; too deep for json
        body = garbage + line(opened) if opened == 1 else line(opened)
        return httpx.Response(200, content=body)

    client = KuboPubsub(
        "http://127.0.0.1:1", transport=httpx.MockTransport(handler), reconnect_delay=0.001
    )
    stream = client.subscribe("t")
    first = await anext(stream)
    second = await anext(stream)  # the first stream ended, the second open failed, third works
    assert first.from_peer == second.from_peer == "peer"
    assert client.reconnects == 2
    assert client.bad_lines == 2
    await stream.aclose()  # type: ignore[attr-defined]
    await client.aclose()


async def test_memory_bus_delivers_after_subscribe_only() -> None:
    bus = MemoryPubsubBus()
    a, b = bus.endpoint("a"), bus.endpoint("b")
    await a.publish("t", b"before")
    stream = b.subscribe("t")
    assert await a.peers("t") == ["b"]
    await a.publish("t", b"after")
    message = await anext(stream)
    assert (message.from_peer, message.data) == ("a", b"after")


# ---------------------------------------------------------------------------- real Kubo


async def _collect(
    stream: AsyncIterator[PubsubMessage], checks: AnnouncementFilter, out: list[Announcement]
) -> None:
    async for message in stream:
        announcement = checks.accept(message)
        if announcement is not None:
            out.append(announcement)


@pytest.mark.kubo
@pytest.mark.docker
async def test_kubo_pubsub_end_to_end_with_hostile_messages(kubo_swarm3) -> None:  # type: ignore[no-untyped-def]
    a, b = kubo_swarm3[0], kubo_swarm3[1]
    topic = session_topic("pubsub-e2e")
    sender, receiver = KuboPubsub(a.api_url), KuboPubsub(b.api_url)
    try:
        assert await sender.local_peer_id() == a.peer_id
        checks = AnnouncementFilter("pubsub-e2e", b.peer_id)
        received: list[Announcement] = []
        task = asyncio.create_task(_collect(receiver.subscribe(topic), checks, received))

        async def ready() -> bool:
            return b.peer_id in await sender.peers(topic) and topic in await receiver.topics()

        await apoll_until(ready, timeout=30, what="gossipsub to see the subscriber")
        good = Announcement.new("pubsub-e2e", 1, a.peer_id, CID_A, num_samples=3, length=9)
        cases = [
            (b"{malformed", "malformed"),
            (b"x" * (MAX_MESSAGE_BYTES + 10), "oversized"),
            (Announcement.new("other-session", 1, a.peer_id, CID_A).encode(), "wrong_session"),
            # forged: the claimed peer is b, but the signed `from` is a
            (Announcement.new("pubsub-e2e", 1, b.peer_id, CID_A).encode(), "forged_sender"),
            (announce(a.peer_id, session="pubsub-e2e", cid="bafy-not-a-cid"), "bad_cid"),
            (good.encode(), "accepted"),
            (good.encode(), "duplicate"),
        ]

        def outcome(reason: str) -> int:
            return checks.accepted if reason == "accepted" else checks.drops[reason]

        # Gossipsub may drop a message now and then (more so on a loaded machine), so each one
        # is re-published until its outcome is seen, a bounded number of times.
        for data, reason in cases:
            for _attempt in range(5):
                await sender.publish(topic, data)

                async def seen(reason: str = reason) -> bool:
                    return outcome(reason) >= 1

                try:
                    await apoll_until(seen, timeout=6, what=f"a {reason} message to arrive")
                    break
                except TimeoutError:
                    continue
            assert outcome(reason) >= 1, f"{reason} message never arrived"
        assert not task.done()  # the subscriber loop survived every message
        assert received == [good]  # accepted once, however often it was re-published
        assert set(checks.drops) == {r for _, r in cases if r != "accepted"}
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        await sender.aclose()
        await receiver.aclose()
