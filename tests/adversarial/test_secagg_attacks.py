"""Issue 15 (items 3 and 7): a hostile SecAgg party cannot unmask a client or abort the round.

Memory bus and stores (each peer its own store, misses served from the others like bitswap);
the same attacks over real Kubo daemons are in ``test_secagg_kubo_attacks.py``.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from gradfed_ipfs.errors import SecAggPeerRejected, SecureAggregationError, UnmaskRefused
from gradfed_ipfs.federated import SecAggClient, SecAggServer, SecureAggregation
from gradfed_ipfs.federated.secagg import FixedPoint
from gradfed_ipfs.federated.secagg.messages import EncryptedShare
from gradfed_ipfs.federated.secagg_round import SecAggSettings
from gradfed_ipfs.federated.secagg_round import peer as round_secagg
from gradfed_ipfs.federated.secagg_round.peer import SecureRoundConfig, SecureRoundResult
from tests.federated.secagg.test_secure_aggregation import rb, tolerance
from tests.federated.secagg_round.test_round import AGG, inputs_for, make_peers

# Attacks where the aggregator ends up waiting out its timeouts use FAST; rounds that complete use
# SLACK, which costs nothing when every party answers (waits end on the last message).
FAST = SecAggSettings(mask_timeout=0.5, view_timeout=0.5, response_timeout=0.5)
SLACK = SecAggSettings(mask_timeout=5.0, view_timeout=5.0, response_timeout=5.0)


async def run_round(
    n: int, threshold: int, inputs: dict[str, np.ndarray], *, seed: int, settings: SecAggSettings
) -> tuple[dict[str, object], dict[str, object]]:
    """Run every client and the aggregator; return (outcome by peer, peers)."""
    _, peers, _ = make_peers(n, threshold, seed=seed, settings=settings)
    await asyncio.gather(*(p.start() for p in peers.values()))
    names = [AGG, *sorted(inputs)]
    jobs = [peers[AGG].aggregate(), *(peers[c].run_client(inputs[c]) for c in sorted(inputs))]
    try:
        outcomes = await asyncio.gather(*jobs, return_exceptions=True)
    finally:
        await asyncio.gather(*(p.aclose() for p in peers.values()))
    return dict(zip(names, outcomes, strict=True)), dict(peers)


def exact_sum(inputs: dict[str, np.ndarray], who: list[str]) -> np.ndarray:
    return np.sum([inputs[c].astype(np.float64) for c in who], axis=0)


# ---------------------------------------------------------------- threshold


@pytest.mark.parametrize(("n", "t"), [(3, 1), (2, 1), (4, 2), (5, 2), (6, 3), (3, 4)])
def test_threshold_below_two_or_at_most_half_is_refused_at_configuration(n: int, t: int) -> None:
    clients = tuple(f"peer-{i}" for i in range(n))
    with pytest.raises(SecureAggregationError, match="threshold"):
        SecureRoundConfig("s", 0, clients, clients[0], t, 10)
    parties = {c: SecAggClient(c, max(t, 2), randbytes=rb(i)) for i, c in enumerate(clients)}
    keys = [p.advertise_keys() for p in parties.values()]
    if t >= 2:
        with pytest.raises(SecureAggregationError, match="threshold"):
            SecAggServer(t).register(keys)
        with pytest.raises(SecureAggregationError, match="threshold"):
            parties[clients[0]].share_keys({k.client_id: k for k in keys})
    else:
        with pytest.raises(SecureAggregationError, match="threshold must be >= 2"):
            SecAggServer(t)
        with pytest.raises(SecureAggregationError, match="threshold must be >= 2"):
            SecAggClient("x", t)


def test_smallest_allowed_thresholds_are_accepted() -> None:
    for n, t in [(2, 2), (3, 2), (4, 3), (5, 3)]:
        clients = tuple(f"peer-{i}" for i in range(n))
        assert SecureRoundConfig("s", 0, clients, clients[0], t, 10).threshold == t


def test_seed_api_refuses_a_secure_sum_of_one_gradient() -> None:
    agg = SecureAggregation(1, randbytes=rb(1))
    agg.add_participant()
    with pytest.raises(SecureAggregationError, match="threshold"):
        agg.aggregate_secure([[1.0, 2.0]])


# ---------------------------------------------------------------- both secrets of one peer


async def test_request_for_both_secrets_of_one_peer_is_refused_by_every_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs = inputs_for([f"peer-{i}" for i in range(4)], seed=11)
    honest = SecAggServer.unmask_request

    def greedy(self: SecAggServer) -> tuple[list[str], list[str]]:
        survivors, dropped = honest(self)
        return survivors, [*dropped, "peer-1"]  # peer-1's seed share *and* its key share

    monkeypatch.setattr(SecAggServer, "unmask_request", greedy)
    outcomes, _ = await run_round(4, 3, inputs, seed=110, settings=FAST)
    for c in inputs:
        assert isinstance(outcomes[c], UnmaskRefused), c
        assert "['peer-1'] are in both" in str(outcomes[c])
    assert isinstance(outcomes[AGG], SecureAggregationError)
    assert "only 0 unmasking responses" in str(outcomes[AGG])


async def test_client_signs_one_view_only() -> None:
    clients = {f"c{i}": SecAggClient(f"c{i}", 2, randbytes=rb(20 + i)) for i in range(3)}
    server = SecAggServer(2)
    roster = server.register(c.advertise_keys() for c in clients.values())
    routed = server.route_shares(m for c in clients.values() for m in c.share_keys(roster))
    for cid, client in clients.items():
        client.receive_shares(routed[cid])
    clients["c0"].confirm(["c0", "c1", "c2"], [])
    with pytest.raises(UnmaskRefused, match="already signed a different survivor set"):
        clients["c0"].confirm(["c0", "c2"], ["c1"])


# ---------------------------------------------------------------- inconsistent views


def test_server_showing_different_views_is_detected_in_process() -> None:
    ids = [f"c{i}" for i in range(3)]
    clients = {c: SecAggClient(c, 2, randbytes=rb(30 + i)) for i, c in enumerate(ids)}
    server = SecAggServer(2)
    roster = server.register(c.advertise_keys() for c in clients.values())
    routed = server.route_shares(m for c in clients.values() for m in c.share_keys(roster))
    for cid, client in clients.items():
        client.receive_shares(routed[cid])
    view_a, view_b = (ids, []), (["c0", "c2"], ["c1"])  # c1's seed to some, its key to others
    views = [
        clients["c0"].confirm(*view_a),
        clients["c1"].confirm(*view_a),
        clients["c2"].confirm(*view_b),
    ]
    for c, view in (("c0", view_a), ("c1", view_a), ("c2", view_b)):
        with pytest.raises(UnmaskRefused, match="different survivor set"):
            clients[c].unmask(*view, views)
    # Control: with consistent views the same clients answer.
    honest = [clients[c].confirm(*view_a) for c in ("c0", "c1")]
    assert clients["c0"].unmask(*view_a, honest).client_id == "c0"


def test_forged_or_too_few_view_signatures_are_not_enough() -> None:
    ids = [f"c{i}" for i in range(3)]
    clients = {c: SecAggClient(c, 2, randbytes=rb(40 + i)) for i, c in enumerate(ids)}
    server = SecAggServer(2)
    roster = server.register(c.advertise_keys() for c in clients.values())
    routed = server.route_shares(m for c in clients.values() for m in c.share_keys(roster))
    for cid, client in clients.items():
        client.receive_shares(routed[cid])
    mine = clients["c0"].confirm(ids, [])
    other = clients["c1"].confirm(ids, [])
    forged = type(other)("c1", other.survivors, other.dropped, bytes(64))
    with pytest.raises(UnmaskRefused, match="only 1 survivors signed"):
        clients["c0"].unmask(ids, [], [mine, forged])
    assert clients["c0"].unmask(ids, [], [mine, other]).client_id == "c0"


# ---------------------------------------------------------------- malformed share bundles


async def test_malformed_share_names_its_sender_and_the_round_completes_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs = inputs_for([f"peer-{i}" for i in range(5)], seed=12)
    honest = SecAggClient._seal_share

    def hostile(self: SecAggClient, recipient: str, body: bytes) -> EncryptedShare:
        if self.client_id == "peer-1" and recipient == "peer-0":
            body = json.dumps({"x": "zz"}).encode()  # correctly encrypted, malformed inside
        return honest(self, recipient, body)

    monkeypatch.setattr(SecAggClient, "_seal_share", hostile)
    outcomes, peers = await run_round(5, 3, inputs, seed=120, settings=SLACK)
    error = peers["peer-0"].rejected["peer-1"]  # type: ignore[attr-defined]
    assert isinstance(error, SecAggPeerRejected)
    assert error.peer == "peer-1"
    assert "peer-1" in str(error)
    assert set(peers["peer-0"].rejected) == {"peer-1"}  # type: ignore[attr-defined]
    result = outcomes[AGG]
    assert isinstance(result, SecureRoundResult), result
    survivors = ["peer-0", "peer-2", "peer-3", "peer-4"]
    assert result.survivors == survivors
    assert result.dropped == ["peer-1"]
    assert "peer-0" in result.rejected["peer-1"]
    exact = exact_sum(inputs, survivors)
    assert np.all(np.abs(result.total - exact) <= tolerance(FixedPoint(5, 8.0, 32), 4, exact))
    assert outcomes["peer-1"] is False  # it masked, but was not summed
    assert all(outcomes[c] is True for c in survivors)


async def test_publicly_malformed_bundle_leaves_its_sender_out_everywhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs = inputs_for([f"peer-{i}" for i in range(4)], seed=13)
    honest = round_secagg.bundle_to_json

    def broken(sender: str, shares: list[EncryptedShare]) -> bytes:
        return b'{"sender": 7}' if sender == "peer-2" else honest(sender, shares)

    monkeypatch.setattr(round_secagg, "bundle_to_json", broken)
    outcomes, peers = await run_round(4, 3, inputs, seed=130, settings=SLACK)
    result = outcomes[AGG]
    assert isinstance(result, SecureRoundResult), result
    assert result.survivors == ["peer-0", "peer-1", "peer-3"]
    assert result.dropped == []  # not a sharer at all: nobody masked with it
    assert "share bundle malformed" in result.rejected["peer-2"]
    for c in ("peer-0", "peer-1", "peer-3"):
        assert isinstance(peers[c].rejected["peer-2"], SecAggPeerRejected)  # type: ignore[attr-defined]
    exact = exact_sum(inputs, result.survivors)
    assert np.all(np.abs(result.total - exact) <= tolerance(FixedPoint(4, 8.0, 32), 3, exact))


async def test_off_roster_recipient_in_a_bundle_does_not_abort_the_aggregator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs = inputs_for([f"peer-{i}" for i in range(3)], seed=14)
    honest = SecAggClient.share_keys

    def padded(self: SecAggClient, roster: object) -> list[EncryptedShare]:
        out = honest(self, roster)  # type: ignore[arg-type]
        if self.client_id == "peer-2":
            out.append(EncryptedShare("peer-2", "intruder", b"\x00" * 40))
        return out

    monkeypatch.setattr(SecAggClient, "share_keys", padded)
    outcomes, _ = await run_round(3, 2, inputs, seed=140, settings=SLACK)
    result = outcomes[AGG]
    assert isinstance(result, SecureRoundResult), result
    assert result.survivors == sorted(inputs)
    assert "off the roster" in result.rejected["peer-2"]
    exact = exact_sum(inputs, result.survivors)
    assert np.all(np.abs(result.total - exact) <= tolerance(FixedPoint(3, 8.0, 32), 3, exact))


def test_server_ignores_an_unmasking_answer_with_foreign_share_points() -> None:
    ids = [f"c{i}" for i in range(3)]
    clients = {c: SecAggClient(c, 2, randbytes=rb(50 + i)) for i, c in enumerate(ids)}
    server = SecAggServer(2)
    roster = server.register(c.advertise_keys() for c in clients.values())
    routed = server.route_shares(m for c in clients.values() for m in c.share_keys(roster))
    vectors = {c: np.full(4, float(i)) for i, c in enumerate(ids)}
    for c in ids:
        clients[c].receive_shares(routed[c])
        server.receive_masked(c, clients[c].masked_input(vectors[c]))
    survivors, dropped = server.unmask_request()
    answers = [clients[c].unmask(survivors, dropped) for c in ids]
    stolen = type(answers[0])("c2", answers[0].self_mask_shares, {})  # c0's points, not c2's
    total = server.finalize([answers[0], answers[1], stolen])
    assert server.rejected == {"c2": "answered a different request"}
    np.testing.assert_allclose(total, np.full(4, 3.0), atol=1e-6)


# ---------------------------------------------------------------- issue 32, attack 12


@pytest.mark.parametrize("bundle", ["undecryptable", "undecryptable-by-one", "incomplete"])
async def test_attack12_unusable_share_bundle_drops_its_sender_and_the_round_goes_on(
    monkeypatch: pytest.MonkeyPatch, bundle: str
) -> None:
    # peer-3 of 4 (threshold 3) hands out shares that cannot be used: ciphertexts that do not
    # decrypt (only each recipient can tell) for every other client or for peer-0 only (then
    # just 2 < t survivors hold its key), or no share at all (anyone can tell).
    inputs = inputs_for([f"peer-{i}" for i in range(4)], seed=15)
    honest_seal, honest_bundle = SecAggClient._seal_share, round_secagg.bundle_to_json
    victims = {"peer-0"} if bundle == "undecryptable-by-one" else {"peer-0", "peer-1", "peer-2"}

    def garbage(self: SecAggClient, recipient: str, body: bytes) -> EncryptedShare:
        sealed = honest_seal(self, recipient, body)
        if self.client_id != "peer-3" or recipient not in victims:
            return sealed
        return EncryptedShare(sealed.sender, sealed.recipient, bytes(len(sealed.ciphertext)))

    def empty(sender: str, shares: list[EncryptedShare]) -> bytes:
        return honest_bundle(sender, [] if sender == "peer-3" else shares)

    if bundle.startswith("undecryptable"):
        monkeypatch.setattr(SecAggClient, "_seal_share", garbage)
    else:
        monkeypatch.setattr(round_secagg, "bundle_to_json", empty)
    outcomes, peers = await run_round(4, 3, inputs, seed=150, settings=SLACK)
    result = outcomes[AGG]
    assert isinstance(result, SecureRoundResult), result  # was: only 0 shares of peer-3's key
    survivors = ["peer-0", "peer-1", "peer-2"]
    assert result.survivors == survivors
    assert result.dropped == ([] if bundle == "incomplete" else ["peer-3"])
    assert "peer-3" in result.rejected
    for c in survivors:
        assert outcomes[c] is True
        rejected = {"peer-3"} if c in victims else set()
        assert set(peers[c].rejected) == rejected  # type: ignore[attr-defined]
    exact = exact_sum(inputs, survivors)
    assert np.all(np.abs(result.total - exact) <= tolerance(FixedPoint(4, 8.0, 32), 3, exact))


# ---------------------------------------------------------------- issue 32, attack 8 (release)


@pytest.mark.parametrize("release", ["honest", "wrong-key", "not-verifiable"])
async def test_every_survivor_recomputes_a_verifiable_release(
    monkeypatch: pytest.MonkeyPatch, release: str
) -> None:
    # A verifiable round of 4 (threshold 3) where peer-3 vanishes after its keys, so the
    # release needs the dropped client's key shares too.
    inputs = inputs_for([f"peer-{i}" for i in range(3)], seed=16)
    honest_release = round_secagg.release_to_json

    def wrong_key(survivors: list[str], dropped: list[str], key: object, used: list[str]) -> bytes:
        return honest_release(survivors, dropped, bytes(range(32)), used)

    if release == "wrong-key":
        monkeypatch.setattr(round_secagg, "release_to_json", wrong_key)
    _, peers, _ = make_peers(4, 3, seed=160, settings=FAST, verifiable=release != "not-verifiable")
    await asyncio.gather(*(p.start() for p in peers.values()))

    async def vanish() -> bool:
        await peers["peer-3"].share_keys()
        return False

    jobs = [peers[AGG].aggregate(), vanish(), *(peers[c].run_client(inputs[c]) for c in inputs)]
    try:
        outcomes = await asyncio.gather(*jobs)
    finally:
        await asyncio.gather(*(p.aclose() for p in peers.values()))
    result = outcomes[0]
    assert isinstance(result, SecureRoundResult)
    assert (result.survivors, result.dropped) == (sorted(inputs), ["peer-3"])
    for c in inputs:
        released = peers[c].released  # type: ignore[attr-defined]
        if release == "honest":  # the very bytes the aggregator decoded
            assert released is not None
            assert released.tobytes() == result.total.tobytes()
        else:
            assert released is None
