"""Spot checks of median and trimmed-mean slices (issue 14): lies caught, honest rounds quiet."""

from __future__ import annotations

import asyncio
from typing import TypeVar

import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs.federated.agreed.slicing import RobustRule
from gradfed_ipfs.federated.sliced import Lying, SliceFaults
from gradfed_ipfs.federated.sliced.peer import (
    MemorySliceBoard,
    ReduceScatterConfig,
    ReduceScatterPeer,
    ReduceScatterResult,
    SliceMessage,
)
from gradfed_ipfs.federated.sliced.plan import reduce_values
from gradfed_ipfs.federated.sliced.spot import spot_count, spot_indices
from gradfed_ipfs.formats.sliced.slices import FraudRecord
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore, put_gradient
from gradfed_ipfs.tensor.aggregation import Median
from tests.federated.agreed.test_sliced import Peers, gradient, initial_model
from tests.federated.sliced.test_peer import CHUNK, LR, Round, make_round

A = TypeVar("A", bound=np.ndarray)


class PartialLiar(SliceFaults):
    """A reducer that, when it serves a slice, alters ``altered`` of its values."""

    def __init__(self, altered: int) -> None:
        self.altered = altered

    def alter(self, k: int, values: A) -> A:
        wrong = values.copy()
        where = np.random.default_rng(k).choice(wrong.size, self.altered, replace=False)
        wrong[where] += wrong.dtype.type(1.0)
        return wrong


async def run(
    r: Round, rule: str, *, liar: str = "", altered: int = 0, board: MemorySliceBoard | None = None
) -> dict[str, ReduceScatterResult]:
    board = board or MemorySliceBoard(members=r.roster.peers)
    config = ReduceScatterConfig(chunk_bytes=CHUNK, learning_rate=LR, rule=rule, phase_timeout=20)
    peers = {}
    for p in r.roster.peers:
        faults = PartialLiar(altered) if p == liar else None
        peers[p] = ReduceScatterPeer(p, r.store, board, config, faults=faults)
    results = await asyncio.gather(
        *(peer.run(r.roster, r.roster_cid, r.base, r.grads[p]) for p, peer in peers.items())
    )
    return dict(zip(peers, results, strict=True))


async def reference(r: Round, rule: str) -> CID:
    peers = r.roster.peers
    model = reduce_values(rule, r.base, [r.grads[p] for p in peers], [1] * len(peers), LR)
    return await put_gradient(MemoryBlockStore(), model)


def test_spot_coordinates_are_distinct_seeded_and_rules_agree_on_them_bit_for_bit() -> None:
    assert spot_count(4) == 64
    assert spot_count(64) == 16
    assert spot_count(5000) == 1
    ix = spot_indices(b"seed", 3, 32_768, 64)
    assert len(set(ix.tolist())) == 64
    assert list(ix) == sorted(ix)
    assert 0 <= ix[0] <= ix[-1] < 32_768
    assert np.array_equal(ix, spot_indices(b"seed", 3, 32_768, 64))
    assert not np.array_equal(ix, spot_indices(b"seed", 4, 32_768, 64))
    assert list(spot_indices(b"seed", 0, 5, 64)) == [0, 1, 2, 3, 4]  # a short slice: every value
    rng = np.random.default_rng(5)
    for n in (4, 5):
        base = rng.standard_normal(10_000).astype(np.float32)
        rows = [rng.standard_normal(10_000).astype(np.float32) for _ in range(n)]
        for rule in ("median", "trimmed_mean:0.25"):
            whole = reduce_values(rule, base, rows, [1] * n, 0.3)
            some = ix[:40] % 10_000
            at = reduce_values(rule, base[some], [row[some] for row in rows], [1] * n, 0.3)
            assert at.tobytes() == whole[some].tobytes()


@pytest.mark.parametrize("rule", ["median", "trimmed_mean:0.25"])
async def test_honest_robust_rounds_raise_no_alarm(rule: str) -> None:
    r = await make_round(4)
    results = await run(r, rule)
    assert {res.model_cid for res in results.values()} == {await reference(r, rule)}
    assert all(not res.recomputed and not res.liars for res in results.values())
    assert all(not res.false_values for res in results.values())


async def test_a_median_reducer_altering_a_quarter_of_its_slice_is_caught() -> None:
    r = await make_round(4)
    liar = r.roster.peers[1]
    results = await run(r, "median", liar=liar, altered=(r.base.size // 4) // 4)
    honest = {p: res for p, res in results.items() if p != liar}
    assert {res.model_cid for res in honest.values()} == {await reference(r, "median")}
    assert all(res.liars == {liar} for res in honest.values())
    (fraud,) = {c for res in honest.values() for c in res.frauds}
    assert FraudRecord.from_block(await r.store.get(fraud)).reducer == liar


async def test_detection_is_deterministic_and_one_altered_value_can_escape() -> None:
    # Escaping 64 samples of a 32,768-value slice with one altered value: 1 - 64/32768 ≈ 99.8 %.
    outcomes = []
    for _ in range(2):
        r = await make_round(4)
        liar = r.roster.peers[1]
        results = await run(r, "median", liar=liar, altered=1)
        outcomes.append(
            [
                (p, res.model_cid, tuple(res.recomputed), sorted(res.liars))
                for p, res in results.items()
            ]
        )
    assert outcomes[0] == outcomes[1]  # the same seeds, the same coordinates, the same verdict
    assert all(not liars for *_, liars in outcomes[0])
    assert {cid for _, cid, *_ in outcomes[0]} != {await reference(r, "median")}


async def test_false_spot_values_cost_a_recompute_but_convict_no_one() -> None:
    r = await make_round(4)
    board = MemorySliceBoard(members=r.roster.peers)
    first = r.roster.peers[0]
    # Published before the round: the board keeps a sender's first values.
    await board.publish(SliceMessage("proj", first, r.roster_cid, values=(0.0,) * (4 * 64)))
    results = await run(r, "median", board=board)
    assert {res.model_cid for res in results.values()} == {await reference(r, "median")}
    assert all(not res.liars and not res.frauds and res.recomputed for res in results.values())
    assert all(res.false_values == {first} for res in results.values())


async def test_an_agreed_median_round_catches_and_excludes_a_lying_reducer() -> None:
    peers = Peers(MemoryBlockStore(), MemoryPubsubBus())
    await peers.start(
        peers=("peer-a", "peer-b", "peer-c", "peer-d"),
        aggregation="reduce-scatter",
        rule=RobustRule(Median()),
        faults={3: Lying(1e-3)},
    )
    liar = peers.sessions[3]
    try:
        results = await peers.round(0)
    finally:
        await peers.close()
    honest = [res for s, res in zip(peers.sessions, results, strict=True) if s is not liar]
    grads = [gradient(i, 0) for i in range(4)]
    want = reduce_values("median", initial_model(), grads, [1] * 4, LR)
    assert {res.model for res in honest} == {await put_gradient(MemoryBlockStore(), want)}
    assert all(res.liars == (liar.peer_id,) for res in honest)
    assert all(s.excluded == {liar.peer_id} for s in peers.sessions)
