from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import stats  # type: ignore[import-untyped]

from gradfed_ipfs.errors import (
    FederatedDimensionMismatch,
    SecAggPeerRejected,
    SecureAggregationError,
    UnmaskRefused,
)
from gradfed_ipfs.federated.secagg import FixedPoint
from gradfed_ipfs.federated.secagg.protocol import EncryptedShare, SecAggClient, SecAggServer
from gradfed_ipfs.federated.secagg.simulation import SecureAggregation, run_secure_aggregation


def rb(seed: int) -> Callable[[int], bytes]:
    return np.random.default_rng(seed).bytes


def make_inputs(n: int, d: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"client-{i}": rng.normal(0.0, 1.0, d).astype(np.float32) for i in range(n)}


def byte_chi_square_p(vector: np.ndarray) -> float:
    counts = np.bincount(np.frombuffer(vector.tobytes(), dtype=np.uint8), minlength=256)
    return float(stats.chisquare(counts).pvalue)


def tolerance(codec: FixedPoint, n: int, exact: np.ndarray) -> np.ndarray:
    # n rounding errors of half a fixed-point step, plus the final float32 rounding.
    return np.asarray(n * 0.5 / codec.scale + np.abs(exact) * 2.0**-23 + 1e-12, np.float64)


# ---------------------------------------------------------------- seed API


# Seed §11 test_secure_aggregation
def test_seed_secure_aggregation_example() -> None:
    agg = SecureAggregation(3, randbytes=rb(0))
    agg.add_participant()
    agg.add_participant()
    assert not agg.can_aggregate()
    agg.add_participant()
    assert agg.can_aggregate()
    assert agg.participant_count() == 3
    mean = agg.aggregate_secure([[1.0, 2.0, 3.0], [2.0, 3.0, 4.0], [3.0, 4.0, 5.0]])
    np.testing.assert_allclose(mean, [2.0, 3.0, 4.0], atol=1e-6)
    assert agg.last_result is not None
    assert agg.last_result.dropped == []
    agg.reset()
    assert agg.participant_count() == 0


# Seed §11 test_secure_aggregation_insufficient_participants (SecureAggregationError, not
# InvalidGradient: the failure belongs to the protocol).
def test_seed_insufficient_participants() -> None:
    agg = SecureAggregation(5, randbytes=rb(1))
    with pytest.raises(SecureAggregationError, match="Not enough participants: need 5, have 0"):
        agg.aggregate_secure([[1.0], [2.0]])


def test_participant_count_is_tied_to_the_gradients() -> None:
    # Deviation from the seed: registered participants alone do not suffice.
    agg = SecureAggregation(3, randbytes=rb(2))
    for _ in range(3):
        agg.add_participant()
    with pytest.raises(SecureAggregationError, match="need 3, have 2"):
        agg.aggregate_secure([[1.0], [2.0]])
    with pytest.raises(FederatedDimensionMismatch):
        agg.aggregate_secure([[1.0], [2.0], [3.0, 4.0]])


# ---------------------------------------------------------------- correctness


@pytest.mark.parametrize("ring_bits", [32, 64])
def test_sum_is_exact_to_fixed_point_precision(ring_bits: int) -> None:
    inputs = make_inputs(5, 4096, seed=3)
    result = run_secure_aggregation(inputs, 3, ring_bits=ring_bits, randbytes=rb(3))
    exact = np.sum([v.astype(np.float64) for v in inputs.values()], axis=0)
    codec = FixedPoint(5, 8.0, ring_bits)
    assert np.all(np.abs(result.total - exact) <= tolerance(codec, 5, exact))
    assert result.survivors == sorted(inputs)
    assert result.total.dtype == np.float32


def test_values_outside_the_range_are_clipped() -> None:
    inputs = {"a": np.array([100.0, -100.0, 1.0]), "b": np.array([1.0, 1.0, 1.0])}
    result = run_secure_aggregation(inputs, 2, clip_range=4.0, randbytes=rb(4))
    np.testing.assert_allclose(result.total, [5.0, -3.0, 2.0], atol=1e-6)


def test_masked_vectors_look_uniform_and_unrelated_to_inputs() -> None:
    inputs = make_inputs(5, 50_000, seed=5)
    result = run_secure_aggregation(inputs, 3, randbytes=rb(5))
    codec = FixedPoint(5)
    for cid, masked in result.masked.items():
        assert masked.dtype == np.uint32
        assert byte_chi_square_p(masked) > 0.01
        signed = masked.view(np.int32).astype(np.float64)
        assert abs(np.corrcoef(signed, inputs[cid])[0, 1]) < 0.02
        # The chi-square can fail: the unmasked encoding of the same input is far from uniform.
        assert byte_chi_square_p(codec.encode(inputs[cid])) < 1e-6


def test_same_randomness_same_transcript() -> None:
    inputs = make_inputs(3, 16, seed=6)
    first = run_secure_aggregation(inputs, 2, randbytes=rb(6))
    second = run_secure_aggregation(inputs, 2, randbytes=rb(6))
    for cid in inputs:
        np.testing.assert_array_equal(first.masked[cid], second.masked[cid])
    third = run_secure_aggregation(inputs, 2, randbytes=rb(7))
    assert not np.array_equal(first.masked["client-0"], third.masked["client-0"])
    np.testing.assert_allclose(first.total, third.total, atol=1e-6)


# ---------------------------------------------------------------- dropouts


@pytest.mark.parametrize("ring_bits", [32, 64])
def test_two_dropouts_after_key_sharing_recover_survivor_sum(ring_bits: int) -> None:
    inputs = make_inputs(5, 1000, seed=8)
    gone = {"client-1", "client-3"}
    result = run_secure_aggregation(
        inputs, 3, ring_bits=ring_bits, drop_before_masking=gone, randbytes=rb(8)
    )
    assert result.dropped == sorted(gone)
    assert result.survivors == ["client-0", "client-2", "client-4"]
    exact = np.sum([inputs[c].astype(np.float64) for c in result.survivors], axis=0)
    assert np.all(
        np.abs(result.total - exact) <= tolerance(FixedPoint(5, 8.0, ring_bits), 3, exact)
    )


def test_survivor_silent_during_unmasking_still_counts() -> None:
    inputs = make_inputs(5, 100, seed=9)
    result = run_secure_aggregation(
        inputs,
        3,
        drop_before_masking={"client-4"},
        silent_in_unmasking={"client-0"},
        randbytes=rb(9),
    )
    exact = np.sum([inputs[c].astype(np.float64) for c in result.survivors], axis=0)
    assert "client-0" in result.survivors
    np.testing.assert_allclose(result.total, exact, atol=1e-5)


def test_more_than_n_minus_t_dropouts_fail_without_a_sum() -> None:
    inputs = make_inputs(5, 10, seed=10)
    with pytest.raises(SecureAggregationError, match="only 2 clients survived masking"):
        run_secure_aggregation(
            inputs, 3, drop_before_masking={"client-0", "client-1", "client-2"}, randbytes=rb(10)
        )
    with pytest.raises(SecureAggregationError, match="only 2 unmasking responses"):
        run_secure_aggregation(
            inputs,
            3,
            drop_before_masking={"client-0"},
            silent_in_unmasking={"client-1", "client-2"},
            randbytes=rb(10),
        )


# ---------------------------------------------------------------- protocol guards


def setup_round(
    n: int = 3, t: int = 2
) -> tuple[dict[str, SecAggClient], SecAggServer, dict[str, list[EncryptedShare]]]:
    rand = rb(11)
    clients = {f"c{i}": SecAggClient(f"c{i}", t, randbytes=rand) for i in range(n)}
    server = SecAggServer(t)
    roster = server.register(c.advertise_keys() for c in clients.values())
    routed = server.route_shares(m for c in clients.values() for m in c.share_keys(roster))
    return clients, server, routed


def test_client_never_reveals_both_secrets_of_one_client() -> None:
    clients, _, routed = setup_round()
    for cid, client in clients.items():
        client.receive_shares(routed[cid])
    with pytest.raises(UnmaskRefused, match="disjoint"):
        clients["c0"].unmask(["c0", "c1"], ["c1"])
    with pytest.raises(UnmaskRefused, match="disjoint"):
        clients["c0"].confirm(["c0", "c1"], ["c1"])
    clients["c0"].unmask(["c0", "c1"], ["c2"])
    with pytest.raises(SecureAggregationError, match="already sent"):
        clients["c0"].unmask(["c0", "c1", "c2"], [])


def test_client_round_order_is_enforced() -> None:
    client = SecAggClient("a", 2, randbytes=rb(12))
    with pytest.raises(SecureAggregationError, match="share_keys must run"):
        client.masked_input([1.0])
    other = SecAggClient("b", 2, randbytes=rb(13))
    roster = {"a": client.advertise_keys(), "b": other.advertise_keys()}
    assert len(client.share_keys(roster)) == 1
    with pytest.raises(SecureAggregationError, match="already shared"):
        client.share_keys(roster)
    stranger = SecAggClient("x", 2, randbytes=rb(14))
    with pytest.raises(SecureAggregationError, match="own keys"):
        stranger.share_keys(roster)


def test_tampered_share_rejects_its_sender_only() -> None:
    clients, _, routed = setup_round()
    msg = routed["c1"][0]
    flipped = bytes([msg.ciphertext[0] ^ 1]) + msg.ciphertext[1:]
    others = [m for m in routed["c1"] if m.sender != msg.sender]
    rejected = clients["c1"].receive_shares([dataclasses.replace(msg, ciphertext=flipped), *others])
    assert [(e.peer, type(e)) for e in rejected] == [(msg.sender, SecAggPeerRejected)]
    assert "failed to decrypt" in str(rejected[0])
    assert set(clients["c1"].rejected) == {msg.sender}
    with pytest.raises(SecureAggregationError, match="unexpected share"):
        clients["c2"].receive_shares([msg])  # addressed to c1


def test_server_rejects_bad_inputs() -> None:
    clients, server, routed = setup_round()
    for cid, client in clients.items():
        client.receive_shares(routed[cid])
    first = clients["c0"].masked_input([1.0, 2.0])
    server.receive_masked("c0", first)
    with pytest.raises(SecureAggregationError, match="unexpected masked input"):
        server.receive_masked("c0", first)
    with pytest.raises(SecureAggregationError, match="already sent"):
        clients["c0"].masked_input([5.0, 6.0])  # same masks twice would leak the difference
    with pytest.raises(FederatedDimensionMismatch):
        server.receive_masked("c1", clients["c1"].masked_input([1.0, 2.0, 3.0]))
    with pytest.raises(SecureAggregationError, match="before unmask_request"):
        server.finalize([])
    with pytest.raises(SecureAggregationError):
        SecAggServer(4).register(c.advertise_keys() for c in clients.values())
    with pytest.raises(SecureAggregationError):
        FixedPoint(3, ring_bits=16)


# ---------------------------------------------------------------- fixed point


@settings(derandomize=True, deadline=None, max_examples=60)
@given(
    st.integers(min_value=1, max_value=8),
    st.sampled_from([32, 64]),
    st.data(),
)
def test_fixed_point_sum_property(n: int, bits: int, data: st.DataObject) -> None:
    codec = FixedPoint(n, 4.0, bits)
    vectors = [
        data.draw(hnp.arrays(np.float64, 5, elements=st.floats(-4.0, 4.0))) for _ in range(n)
    ]
    total = codec.encode(vectors[0])
    for v in vectors[1:]:
        total = total + codec.encode(v)
    exact = np.sum(vectors, axis=0)
    assert np.all(np.abs(codec.decode_sum(total) - exact) <= tolerance(codec, n, exact))
