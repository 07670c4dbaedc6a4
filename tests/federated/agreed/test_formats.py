"""Agreed-round wire forms, the message board, coordinator ranking and deterministic update."""

from __future__ import annotations

import contextlib

import dag_cbor
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from multiformats import CID

from gradfed_ipfs import AgreedConfig, Block
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import (
    EmptyGradientSet,
    InvalidGradient,
    MalformedAnnouncement,
    MalformedManifest,
    ShapeMismatch,
)
from gradfed_ipfs.federated.agreed.round.coordinator import (
    MAX_ROUNDS_AHEAD,
    Head,
    RoundBoard,
    best_head,
    coordinator_ranking,
    roster_problem,
)
from gradfed_ipfs.federated.exchange.encoded import encode_gradient
from gradfed_ipfs.formats import PubsubMessage
from gradfed_ipfs.formats.agreed.roster import (
    MAX_MESSAGE_BYTES,
    MAX_RECORD_BYTES,
    AgreedMessage,
    AgreedRecord,
    Roster,
)
from gradfed_ipfs.storage import MemoryBlockStore, fetch_gradient, put_gradient
from gradfed_ipfs.tensor.deterministic import DETERMINISTIC_BLOCK, deterministic_update

GENESIS = make_cid(b"genesis")
BASE = make_cid(b"base")
C1, C2 = make_cid(b"one"), make_cid(b"two")
PEERS = ("peer-a", "peer-b", "peer-c")


def roster(**changes: object) -> Roster:
    entries = {"peer-b": (C2, 3), "peer-a": (C1, 1)}
    fields = {"expected": PEERS, "entries": entries, **changes}
    return Roster.new("s", GENESIS, 4, BASE, "peer-b", fields["expected"], fields["entries"])  # type: ignore[arg-type]


def raw_roster(entries: list[object], **extra: object) -> Block:
    record = {
        "type": "gradfed.roster", "version": 1, "session": "s", "genesis": GENESIS, "round": 4,
        "base": BASE, "coordinator": "peer-b", "expected": list(PEERS), "entries": entries,
        **extra,
    }  # fmt: skip
    return Block.new(dag_cbor.encode(record), "dag-cbor")


# ------------------------------------------------------------------ roster and record


def test_roster_round_trips_sorted_with_absent_peers() -> None:
    original = roster()
    decoded = Roster.from_block(original.to_block())
    assert decoded == original
    assert decoded.peers == ("peer-a", "peer-b")
    assert decoded.absent == ("peer-c",)
    assert original.to_block().cid == roster().to_block().cid  # deterministic bytes


@pytest.mark.parametrize(
    ("entries", "match"),
    [
        ([["peer-b", C2, 3], ["peer-a", C1, 1]], "sorted"),
        ([["peer-a", C1, 1], ["peer-a", C2, 1]], "sorted"),
        ([["peer-a", C1, 0]], "out of range"),
        ([["peer-a", C1, True]], "not an integer"),
        ([["peer-a", C1, 1.5]], "not an integer"),
        ([["peer-a", "bafy", 1]], "CID link"),
        ([["peer-a", C1]], r"\[peer, cid, weight\]"),
        ([["", C1, 1]], "peer ID"),
        ([["x" * 200, C1, 1]], "peer ID"),
    ],
)
def test_roster_decoder_refuses_bad_entries(entries: list[object], match: str) -> None:
    with pytest.raises(MalformedManifest, match=match):
        Roster.from_block(raw_roster(entries))


def test_roster_decoder_refuses_oversized_and_foreign_blocks() -> None:
    with pytest.raises(MalformedManifest, match="more than"):
        Roster.from_block(raw_roster([[f"p{i:05d}", C1, 1] for i in range(1025)]))
    with pytest.raises(MalformedManifest, match="too large"):
        Roster.from_block(Block.new(b"\x00" * (MAX_RECORD_BYTES + 1), "dag-cbor"))
    with pytest.raises(MalformedManifest):
        Roster.from_block(Block.new(dag_cbor.encode({"type": "other", "version": 1}), "dag-cbor"))


def test_round_record_round_trips_and_checks_links() -> None:
    rec = AgreedRecord("s", GENESIS, 2, None, BASE, roster().to_block().cid, C1, 0.5)
    assert AgreedRecord.from_block(rec.to_block()) == rec
    block = rec.to_block()
    bad = dag_cbor.decode(block.data)
    bad["prev"] = C1  # a raw CID where a record link belongs
    with pytest.raises(MalformedManifest, match="dag-cbor CID"):
        AgreedRecord.from_block(Block.new(dag_cbor.encode(bad), "dag-cbor"))


# ------------------------------------------------------------------ messages


def contrib(**changes: object) -> AgreedMessage:
    fields = {"peer": "peer-a", "round": 4, "cid": C1, "base": BASE, "weight": 2, **changes}
    return AgreedMessage("contrib", "s", GENESIS, **fields)  # type: ignore[arg-type]


def test_messages_round_trip_with_inline_roster() -> None:
    block = roster().to_block()
    message = AgreedMessage("roster", "s", GENESIS, 4, "peer-b", block.cid, inline=block.data)
    assert AgreedMessage.decode(message.encode()) == message
    assert AgreedMessage.decode(contrib().encode()) == contrib()


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"v": 2}',
        b"x" * (MAX_MESSAGE_BYTES + 1),
        contrib(weight=None).encode(),
        contrib(weight=0).encode(),
        AgreedMessage("done", "s", GENESIS, 1, "p", C1).encode(),  # done without its record
        AgreedMessage("roster", "s", GENESIS, 1, "p", C1, inline=b"\xa0").encode(),  # wrong CID
        contrib().encode().replace(b'"round":4', b'"round":-1'),
        contrib().encode().replace(str(C1).encode(), b"bafynotacid"),
    ],
)
def test_message_decoder_refuses_malformed(data: bytes) -> None:
    with pytest.raises(MalformedAnnouncement):
        AgreedMessage.decode(data)


@given(st.integers(0, 400), st.binary(max_size=8))
def test_message_decoder_raises_only_typed_errors(cut: int, noise: bytes) -> None:
    data = contrib().encode()
    with contextlib.suppress(MalformedAnnouncement):  # anything else fails the test
        AgreedMessage.decode(data[:cut] + noise + data[cut + len(noise) :])


# ------------------------------------------------------------------ board and ranking


def test_board_drops_and_counts_by_reason() -> None:
    board = RoundBoard("s", GENESIS, "peer-c", PEERS)
    good = contrib().encode()
    assert board.accept(PubsubMessage("peer-a", good)) is not None
    assert board.accept(PubsubMessage("peer-b", good)) is None  # claims peer-a
    assert board.accept(PubsubMessage("peer-a", contrib(cid=C2).encode())) is None
    assert board.accept(PubsubMessage("peer-c", contrib(peer="peer-c").encode())) is None
    assert board.accept(PubsubMessage("mallory", contrib(peer="mallory").encode())) is None
    assert board.accept(PubsubMessage("peer-a", contrib(round=99).encode())) is None
    assert board.accept(PubsubMessage("peer-a", b"{")) is None
    other = AgreedMessage("contrib", "s", C2, 4, "peer-a", C1, BASE, 1).encode()
    assert board.accept(PubsubMessage("peer-a", other)) is None
    assert dict(board.dropped) == {
        "forged": 1, "equivocation": 1, "own": 1, "stranger": 1, "window": 1, "malformed": 1,
        "foreign": 1,
    }  # fmt: skip
    assert board.state(4).contributions["peer-a"].cid == C1  # the first claim stands


def test_board_keeps_latest_head_per_peer() -> None:
    board = RoundBoard("s", GENESIS, "peer-c", PEERS)
    for r in (3, 5, 4):
        done = AgreedMessage(
            "done", "s", GENESIS, r, "peer-a", C1, record=make_cid(b"%d" % r, "dag-cbor")
        )
        board.accept(PubsubMessage("peer-a", done.encode()))
    assert board.heads["peer-a"].round == 5


def test_board_knows_whether_every_done_names_one_record() -> None:
    board = RoundBoard("s", GENESIS, "peer-c", PEERS)
    mine, other = make_cid(b"mine", "dag-cbor"), make_cid(b"other", "dag-cbor")
    assert board.state(0).all_done_name(bytes(mine))  # none heard yet

    def done(peer: str, record: CID) -> None:
        message = AgreedMessage("done", "s", GENESIS, 0, peer, C1, record=record)
        board.accept(PubsubMessage(peer, message.encode()))

    done("peer-a", mine)
    assert board.state(0).all_done_name(bytes(mine))
    done("peer-b", other)
    assert not board.state(0).all_done_name(bytes(mine))
    done("peer-b", mine)  # a later done of the same round replaces its earlier one
    assert board.state(0).all_done_name(bytes(mine))
    done("peer-b", other)
    board.exclude("peer-b")  # a proven equivocator's done is forgotten
    assert board.state(0).all_done_name(bytes(mine))
    assert not board.state(0).all_done_name(bytes(other))


def test_ranking_is_a_deterministic_permutation_that_varies_by_round() -> None:
    first = [coordinator_ranking("s", GENESIS, r, PEERS)[0] for r in range(30)]
    assert all(sorted(coordinator_ranking("s", GENESIS, r, PEERS)) == list(PEERS) for r in range(5))
    assert coordinator_ranking("s", GENESIS, 7, PEERS) == coordinator_ranking(
        "s", GENESIS, 7, PEERS[::-1]
    )
    assert len(set(first)) == 3


def test_best_head_prefers_round_then_votes_then_smallest_cid() -> None:
    x, y = make_cid(b"x", "dag-cbor"), make_cid(b"y", "dag-cbor")
    assert best_head([Head(3, C1, x), Head(4, C1, y)]) == Head(4, C1, y)
    assert best_head([Head(4, C1, x), Head(4, C1, y), Head(4, C1, y)]).record == y  # type: ignore[union-attr]
    low = min(x, y, key=bytes)
    assert best_head([Head(4, C1, x), Head(4, C1, y)]).record == low  # type: ignore[union-attr]
    assert best_head([]) is None


def test_roster_problem_names_each_defect() -> None:
    config = AgreedConfig(PEERS, min_peers=2)
    assert roster_problem(roster(), "s", GENESIS, 4, BASE, config) == ""
    assert "another session" in roster_problem(roster(), "t", GENESIS, 4, BASE, config)
    assert "round 4" in roster_problem(roster(), "s", GENESIS, 5, BASE, config)
    assert "non-member" in roster_problem(
        roster(entries={"mallory": (C1, 1), "peer-a": (C1, 1)}), "s", GENESIS, 4, BASE, config
    )
    assert "min_peers" in roster_problem(roster(), "s", GENESIS, 4, BASE, AgreedConfig(PEERS))


# ------------------------------------------------------------------ deterministic update


def test_update_is_exact_float64_rule_in_roster_order() -> None:
    rng = np.random.default_rng(0)
    d = DETERMINISTIC_BLOCK + 17  # crosses a block boundary
    model = rng.standard_normal(d).astype(np.float32)
    grads = [rng.standard_normal(d).astype(np.float32) for _ in range(3)]
    out = deterministic_update(model, grads, [1, 2, 3], 0.5)
    acc = np.zeros(d)
    for w, g in zip([1 / 6, 2 / 6, 3 / 6], grads, strict=True):
        acc = acc + w * g.astype(np.float64)
    np.testing.assert_array_equal(out, (model.astype(np.float64) + 0.5 * acc).astype(np.float32))
    assert out.dtype == np.float32


@pytest.mark.parametrize("learning_rate", [1.0, 0.5, -2.0])
def test_update_is_bitwise_the_reference_formula_signed_zeros_included(
    learning_rate: float,
) -> None:
    rng = np.random.default_rng(7)
    d = DETERMINISTIC_BLOCK + 333
    model = rng.standard_normal(d).astype(np.float32)
    grads = [rng.standard_normal(d).astype(np.float32) for _ in range(3)]
    model[:4] = -0.0  # all products -0.0: the sum from +0.0 is +0.0, so -0.0 + lr·(+0.0)
    for g in grads:  # is +0.0 for lr > 0 and -0.0 for lr < 0 (a sum started at the first
        g[:4] = -0.0  # product would be -0.0 and give -0.0 for every lr)
    out = deterministic_update(model, grads, [1, 2, 3], learning_rate)
    acc = np.zeros(d)
    for w, g in zip([1 / 6, 2 / 6, 3 / 6], grads, strict=True):
        acc = acc + w * g.astype(np.float64)
    want = (model.astype(np.float64) + learning_rate * acc).astype(np.float32)
    assert out.tobytes() == want.tobytes()
    assert np.signbit(out[:4]).tolist() == [learning_rate < 0] * 4


def test_update_refuses_bad_input() -> None:
    x = np.zeros(4, np.float32)
    with pytest.raises(EmptyGradientSet):
        deterministic_update(x, [], [], 1.0)
    with pytest.raises(ShapeMismatch):
        deterministic_update(x, [np.zeros(5, np.float32)], [1], 1.0)
    with pytest.raises(InvalidGradient):
        deterministic_update(x, [x], [0], 1.0)
    with pytest.raises(InvalidGradient):
        deterministic_update(x, [x], [1], float("nan"))


async def test_encoded_gradient_has_put_gradients_cid_and_blocks() -> None:
    values = np.random.default_rng(1).standard_normal(600_000).astype(np.float32)  # chunked
    encoded = await encode_gradient(values)
    store = MemoryBlockStore()
    assert encoded.cid == await put_gradient(MemoryBlockStore(), values)
    assert await encoded.store(store) == encoded.cid
    assert len(encoded.blocks) > 2
    assert await store.is_pinned(encoded.cid)
    np.testing.assert_array_equal(await fetch_gradient(store, encoded.cid), values)


def test_board_keeps_an_early_heard_inline_roster_when_its_round_starts() -> None:
    # A slow peer (still in round 3) hears round 4's roster, carried inline.
    board = RoundBoard("s", GENESIS, "peer-c", PEERS)
    board.advance(3)
    cids = {}
    for r in (2, 4):
        roster = Roster.new("s", GENESIS, r, BASE, "peer-a", PEERS, {"peer-a": (C1, 1)}).to_block()
        message = AgreedMessage("roster", "s", GENESIS, r, "peer-a", roster.cid, inline=roster.data)
        assert board.accept(PubsubMessage("peer-a", message.encode())) is not None
        cids[r] = bytes(roster.cid)
    # Starting round 4 keeps round 4's bytes (its coordinator did not put them anywhere) and
    # forgets round 2's.
    board.advance(4)
    assert board.inline[cids[4]][0] == 4
    assert cids[2] not in board.inline


def test_a_member_flooding_inline_rosters_keeps_one_per_round_and_pushes_nobody_out() -> None:
    board = RoundBoard("s", GENESIS, "peer-c", PEERS)
    board.advance(3)

    def roster_message(peer: str, r: int, weight: int) -> tuple[bytes, bytes]:
        roster = Roster.new("s", GENESIS, r, BASE, peer, PEERS, {peer: (C1, weight)}).to_block()
        message = AgreedMessage("roster", "s", GENESIS, r, peer, roster.cid, inline=roster.data)
        return bytes(roster.cid), message.encode()

    for r in range(3, 3 + MAX_ROUNDS_AHEAD):
        for weight in range(1, 20):  # 19 different rosters per round from one member
            board.accept(PubsubMessage("peer-b", roster_message("peer-b", r, weight)[1]))
    assert len(board.inline) == MAX_ROUNDS_AHEAD  # the first of each round
    honest, data = roster_message("peer-a", 4, 1)
    assert board.accept(PubsubMessage("peer-a", data)) is not None
    assert board.inline[honest][0] == 4
