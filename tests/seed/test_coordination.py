from __future__ import annotations

import struct
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradfed_ipfs import MemoryBlockStore
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import (
    ArrowBlockError,
    ArrowBlockShapeMismatch,
    CoordinationError,
    EmptyInput,
    InvalidMagic,
    PassAlreadyTerminal,
    PassNotFound,
    TruncatedData,
)
from gradfed_ipfs.seed import (
    BackwardPassCoordinator,
    BackwardPassId,
    CoordinationStatus,
    GradientArrowBlock,
    GradientContribution,
    PassCoordinator,
)
from gradfed_ipfs.seed.garw import fnv1a_64
from tests.helpers import FakeClock


def contribution(pass_id: BackwardPassId, peer: str, cid: str = "grad-x", n: int = 10):
    return GradientContribution(pass_id, peer, cid, "layer1", n, 1_700_000_000_000)


# ----------------------------------------------------------------------- seed §11 cases


def test_start_pass() -> None:
    coord = PassCoordinator(2, 5000)
    pid = BackwardPassId.new(1, "peer-a")
    assert coord.start_pass(pid)
    assert coord.status(pid) == CoordinationStatus.Pending()
    assert coord.active_count() == 1


def test_start_pass_duplicate_returns_false() -> None:
    coord = PassCoordinator(2, 5000)
    pid = BackwardPassId(1, "peer-a")
    assert coord.start_pass(pid)
    assert not coord.start_pass(BackwardPassId(1, "peer-a"))


def test_submit_contribution_updates_status() -> None:
    coord = PassCoordinator(2, 5000)
    pid = BackwardPassId(1, "a")
    coord.start_pass(pid)
    status = coord.submit_contribution(contribution(pid, "p1"))
    assert status == CoordinationStatus.CollectingGradients(received=1, expected=2)
    assert coord.status(pid) == status
    assert status.name == "CollectingGradients"


def test_is_ready_to_aggregate_after_all_peers() -> None:
    coord = PassCoordinator(2, 5000)
    pid = BackwardPassId(1, "a")
    coord.start_pass(pid)
    coord.submit_contribution(contribution(pid, "p1"))
    assert not coord.is_ready_to_aggregate(pid)
    coord.submit_contribution(contribution(pid, "p2"))
    assert coord.is_ready_to_aggregate(pid)
    assert not coord.is_ready_to_aggregate(BackwardPassId(9, "nobody"))


def test_mark_complete() -> None:
    coord = PassCoordinator(1, 5000)
    pid = BackwardPassId(1, "a")
    coord.start_pass(pid)
    assert coord.mark_complete(pid, "bafkqaaa")
    status = coord.status(pid)
    assert status == CoordinationStatus.Complete("bafkqaaa")
    assert status is not None
    assert status.is_terminal
    assert not coord.mark_complete(BackwardPassId(2, "a"), "x")


def test_mark_failed() -> None:
    coord = PassCoordinator(1, 5000)
    pid = BackwardPassId(1, "a")
    coord.start_pass(pid)
    assert coord.mark_failed(pid, "boom")
    assert coord.status(pid) == CoordinationStatus.Failed("boom")
    assert not coord.mark_failed(BackwardPassId(2, "a"), "x")


def test_terminal_is_final() -> None:
    coord = PassCoordinator(1, 5000)
    pid = BackwardPassId(1, "a")
    coord.start_pass(pid)
    coord.mark_failed(pid, "boom")
    assert not coord.mark_complete(pid, "cid")
    assert coord.status(pid) == CoordinationStatus.Failed("boom")


def test_submit_to_terminal_pass_returns_error() -> None:
    coord = PassCoordinator(1, 5000)
    pid = BackwardPassId(1, "a")
    coord.start_pass(pid)
    coord.mark_complete(pid, "cid")
    with pytest.raises(PassAlreadyTerminal, match=r"already terminal \(status: Complete\)"):
        coord.submit_contribution(contribution(pid, "p1"))
    with pytest.raises(PassNotFound, match="Backward pass not found: 7-z"):
        coord.submit_contribution(contribution(BackwardPassId(7, "z"), "p1"))
    with pytest.raises(CoordinationError):
        coord.submit_contribution(contribution(BackwardPassId(7, "z"), "p1"))


def test_gc_before_round() -> None:
    coord = PassCoordinator(1, 5000)
    p1, p5, p10 = BackwardPassId(1, "a"), BackwardPassId(5, "a"), BackwardPassId(10, "a")
    for pid in (p1, p5, p10):
        coord.start_pass(pid)
    coord.mark_complete(p1, "c1")
    coord.mark_complete(p5, "c5")
    assert coord.gc_before_round(5) == 1
    assert coord.status(p1) is None
    assert coord.status(p5) is not None
    assert coord.status(p10) == CoordinationStatus.Pending()
    assert coord.gc_before_round(100) == 1  # p5 only; p10 is active


def test_active_count() -> None:
    coord = PassCoordinator(1, 5000)
    ids = [BackwardPassId(r, "a") for r in range(3)]
    for pid in ids:
        coord.start_pass(pid)
    assert coord.active_count() == 3
    coord.mark_complete(ids[0], "c")
    assert coord.active_count() == 2
    coord.mark_failed(ids[1], "f")
    assert coord.active_count() == 1


def test_alias_and_key() -> None:
    assert BackwardPassCoordinator is PassCoordinator
    assert BackwardPassId(3, "peer").as_key() == "3-peer"
    assert str(BackwardPassId(3, "peer")) == "3-peer"
    assert PassCoordinator(2, 1234).timeout_ms == 1234


# ----------------------------------------------------------------------- fixes


def test_one_peer_counts_once_resubmission_replaces() -> None:
    coord = PassCoordinator(2, 5000)
    pid = BackwardPassId(1, "a")
    coord.start_pass(pid)
    coord.submit_contribution(contribution(pid, "p1", cid="old"))
    status = coord.submit_contribution(contribution(pid, "p1", cid="new"))
    assert status == CoordinationStatus.CollectingGradients(1, 2)
    assert not coord.is_ready_to_aggregate(pid)
    assert [c.gradient_cid for c in coord.contributions(pid)] == ["new"]


def test_pass_times_out_into_failed() -> None:
    clock = FakeClock()
    coord = PassCoordinator(2, 1500, clock=clock)
    pid = BackwardPassId(1, "a")
    coord.start_pass(pid)
    coord.submit_contribution(contribution(pid, "p1"))
    clock.advance(1.499)
    assert coord.status(pid) == CoordinationStatus.CollectingGradients(1, 2)
    clock.advance(0.001)
    status = coord.status(pid)
    assert isinstance(status, CoordinationStatus.Failed)
    assert "timed out" in status.reason
    assert "1 of 2" in status.reason
    with pytest.raises(PassAlreadyTerminal):
        coord.submit_contribution(contribution(pid, "p2"))
    assert not coord.mark_complete(pid, "late")
    assert coord.active_count() == 0


def test_expire_timed_out_and_ready_pass_times_out() -> None:
    clock = FakeClock()
    coord = PassCoordinator(1, 1000, clock=clock)
    old, new = BackwardPassId(1, "a"), BackwardPassId(2, "a")
    coord.start_pass(old)
    coord.submit_contribution(contribution(old, "p1"))
    assert coord.is_ready_to_aggregate(old)
    clock.advance(0.6)
    coord.start_pass(new)
    assert coord.deadline(new) == pytest.approx(clock.now + 1.0)
    clock.advance(0.5)
    assert coord.expire_timed_out() == [old]
    assert not coord.is_ready_to_aggregate(old)
    assert coord.expire_timed_out() == []
    assert coord.gc_before_round(2) == 1


def test_thread_safe_concurrent_submissions() -> None:
    coord = PassCoordinator(400, 60_000)
    pid = BackwardPassId(1, "a")
    coord.start_pass(pid)
    barrier = threading.Barrier(8)

    def worker(t: int) -> None:
        barrier.wait()
        for i in range(50):
            coord.submit_contribution(contribution(pid, f"peer-{t}-{i}"))
            coord.submit_contribution(contribution(pid, f"peer-{t}-{i}"))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(coord.contributions(pid)) == 400
    assert coord.is_ready_to_aggregate(pid)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="expected_peers"):
        PassCoordinator(0, 10)
    with pytest.raises(ValueError, match="timeout_ms"):
        PassCoordinator(1, 0)


def test_contribution_dict_round_trip() -> None:
    c = contribution(BackwardPassId(4, "init"), "p9", n=33)
    assert GradientContribution.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="GradientContribution"):
        GradientContribution.from_dict({"pass_id": {"round": 1, "initiator_peer": "x"}})


def test_garw_fedavg_by_coordinator_sorted_by_peer() -> None:
    coord = PassCoordinator(2, 5000)
    pid = BackwardPassId(1, "a")
    coord.start_pass(pid)
    with pytest.raises(CoordinationError, match="not ready"):
        coord.garw_fedavg(pid, {})
    a = GradientArrowBlock.new("l", [0.0, 0.0], 100)
    b = GradientArrowBlock.new("l", [2.0, 4.0], 300)
    coord.submit_contribution(contribution(pid, "zed", a.cid))
    coord.submit_contribution(contribution(pid, "amy", b.cid))
    with pytest.raises(CoordinationError, match="contributors"):
        coord.garw_fedavg(pid, {"zed": a})
    result = coord.garw_fedavg(pid, {"zed": a, "amy": b})
    np.testing.assert_allclose(result.values, [1.5, 3.0])
    assert result.num_samples == 400
    assert result.verify_cid()


# ----------------------------------------------------------------------- GARW


def test_compute_cid_vectors() -> None:
    assert GradientArrowBlock.compute_cid("layer1", [1, 2, 3, 4], 50) == "grad-596605b772920b54"
    assert GradientArrowBlock.compute_cid("layer2", [0.5, 1.0, 1.5], 64) == "grad-c5fcd2ac716b1dc6"


def test_compute_cid_deterministic() -> None:
    a = GradientArrowBlock.compute_cid("x", [1.0, 2.0], 3)
    assert a == GradientArrowBlock.compute_cid("other-layer", [1.0, 2.0], 3)
    assert a.startswith("grad-")
    assert len(a) == 21
    assert a != GradientArrowBlock.compute_cid("x", [1.0, 2.0], 4)


def test_fnv1a_64_reference_values() -> None:
    # Published FNV-1a 64 test vectors.
    assert fnv1a_64(b"") == 0xCBF29CE484222325
    assert fnv1a_64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a_64(b"foobar") == 0x85944171F73967E8


def test_gradient_arrow_block_roundtrip() -> None:
    block = GradientArrowBlock.new("layer1", [1.0, -2.5, 3.0, 4.0, 5.0, 6.0], 77, shape=[2, 3])
    data = block.to_arrow_bytes()
    back = GradientArrowBlock.from_arrow_bytes(block.cid, "layer1", data)
    assert back == block
    assert back.shape == [2, 3]
    assert back.num_samples == 77
    assert back.cid == block.cid
    np.testing.assert_array_equal(back.values, block.values)


def test_exact_byte_layout() -> None:
    block = GradientArrowBlock("c", "l", [2, 1], np.array([1.0, -0.5], np.float32), 9)
    expected = (
        b"GARW"
        + struct.pack("<I", 2)
        + struct.pack("<II", 2, 1)
        + struct.pack("<I", 2)
        + struct.pack("<ff", 1.0, -0.5)
        + struct.pack("<I", 9)
    )
    assert block.to_arrow_bytes() == expected
    # Trailing bytes are ignored, as in the seed.
    assert GradientArrowBlock.from_arrow_bytes("c", "l", expected + b"junk") == block


def test_real_cid_is_raw_cid_of_bytes() -> None:
    block = GradientArrowBlock.new("l", [1.0, 2.0], 5)
    assert block.real_cid() == make_cid(block.to_arrow_bytes(), "raw")
    assert str(block.real_cid()).startswith("bafkrei")
    assert block.to_block().cid == block.real_cid()


async def test_real_cid_round_trips_through_store() -> None:
    store = MemoryBlockStore()
    block = GradientArrowBlock.new("l", [1.0, 2.0, 3.0], 5)
    cid = await store.put(block.to_block())
    fetched = await store.get(cid)
    assert GradientArrowBlock.from_arrow_bytes(block.cid, "l", fetched.data) == block


def test_fedavg_weighted() -> None:
    a = GradientArrowBlock.new("l", [0.0, 0.0], 100)
    b = GradientArrowBlock.new("l", [2.0, 4.0], 300)
    np.testing.assert_allclose(GradientArrowBlock.fedavg([a, b]), [1.5, 3.0])


def test_fedavg_zero_samples_is_uniform_mean() -> None:
    a = GradientArrowBlock.new("l", [0.0, 2.0], 0)
    b = GradientArrowBlock.new("l", [2.0, 4.0], 0)
    np.testing.assert_allclose(GradientArrowBlock.fedavg([a, b]), [1.0, 3.0])


def test_fedavg_empty_returns_error() -> None:
    with pytest.raises(EmptyInput, match="No gradient blocks"):
        GradientArrowBlock.fedavg([])


def test_fedavg_shape_mismatch() -> None:
    a = GradientArrowBlock.new("l", [0.0, 0.0], 1)
    b = GradientArrowBlock.new("l", [1.0, 2.0, 3.0], 1)
    with pytest.raises(ArrowBlockShapeMismatch):
        GradientArrowBlock.fedavg([a, b])


def test_from_arrow_bytes_bad_magic() -> None:
    with pytest.raises(InvalidMagic):
        GradientArrowBlock.from_arrow_bytes("c", "l", b"XXXX" + b"\0" * 12)


def test_from_arrow_bytes_short_input() -> None:
    with pytest.raises(TruncatedData):
        GradientArrowBlock.from_arrow_bytes("c", "l", b"")
    with pytest.raises(TruncatedData):
        GradientArrowBlock.from_arrow_bytes("c", "l", b"GAR")
    data = GradientArrowBlock.new("l", [1.0, 2.0], 5).to_arrow_bytes()
    for cut in range(4, len(data)):
        with pytest.raises(TruncatedData):
            GradientArrowBlock.from_arrow_bytes("c", "l", data[:cut])


def test_lying_length_fields_raise_truncated_without_allocating() -> None:
    huge_shape = b"GARW" + struct.pack("<I", 0xFFFFFFFF)
    with pytest.raises(TruncatedData):
        GradientArrowBlock.from_arrow_bytes("c", "l", huge_shape)
    huge_values = b"GARW" + struct.pack("<II", 1, 4) + struct.pack("<I", 0xFFFFFFF0)
    with pytest.raises(TruncatedData, match="values need"):
        GradientArrowBlock.from_arrow_bytes("c", "l", huge_values + b"\0" * 64)


def test_strict_shape_check() -> None:
    block = GradientArrowBlock("c", "l", [3], np.array([1.0, 2.0], np.float32), 1)
    data = block.to_arrow_bytes()
    assert GradientArrowBlock.from_arrow_bytes("c", "l", data).shape == [3]
    with pytest.raises(ArrowBlockShapeMismatch):
        GradientArrowBlock.from_arrow_bytes("c", "l", data, strict=True)
    with pytest.raises(ArrowBlockShapeMismatch):
        GradientArrowBlock.new("l", [1.0, 2.0], 1, shape=[3])


def test_encode_refuses_values_beyond_u32() -> None:
    block = GradientArrowBlock("c", "l", [2**32], np.zeros(0, np.float32), 1)
    with pytest.raises(ArrowBlockError, match="u32"):
        block.to_arrow_bytes()


_valid_blocks = st.builds(
    lambda values, shape_extra, n: GradientArrowBlock(
        "c", "l", [len(values), *shape_extra], np.array(values, np.float32), n
    ),
    st.lists(st.floats(width=32, allow_nan=False), max_size=8),
    st.lists(st.integers(0, 2**32 - 1), max_size=3),
    st.integers(0, 2**32 - 1),
)


@settings(max_examples=300, deadline=None)
@given(
    block=_valid_blocks,
    edits=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=6),
    cut=st.integers(0, 200),
    extra=st.binary(max_size=8),
)
def test_garw_decoder_fuzz(
    block: GradientArrowBlock, edits: list[tuple[int, int]], cut: int, extra: bytes
) -> None:
    data = bytearray(block.to_arrow_bytes())
    for pos, value in edits:
        if data:
            data[pos % len(data)] = value
    mutated = bytes(data[: max(0, len(data) - cut % (len(data) + 1))]) + extra
    try:
        decoded = GradientArrowBlock.from_arrow_bytes("c", "l", mutated)
    except ArrowBlockError:
        return
    # Whatever decodes re-encodes to a prefix of the input (trailing bytes are ignored).
    assert mutated.startswith(decoded.to_arrow_bytes())
    assert decoded.values.nbytes <= len(mutated)


@settings(max_examples=100, deadline=None)
@given(block=_valid_blocks)
def test_garw_round_trip_property(block: GradientArrowBlock) -> None:
    back = GradientArrowBlock.from_arrow_bytes("c", "l", block.to_arrow_bytes())
    assert back.shape == block.shape
    assert back.num_samples == block.num_samples
    np.testing.assert_array_equal(back.values, block.values)
