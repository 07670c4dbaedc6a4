"""Sanity rules every peer applies alike to agreed rosters: weight cap and value bound."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedSession, verify_agreed_history
from gradfed_ipfs.errors import InvalidGradient
from gradfed_ipfs.federated.agreed.round.coordinator import coordinator_ranking, roster_problem
from gradfed_ipfs.formats.agreed.roster import Roster
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore
from tests.federated.agreed.test_rounds import FAST, PEERS, delta, initial_model


def test_max_weight_and_max_value_are_validated() -> None:
    assert AgreedConfig(PEERS).max_weight == 2**20
    assert AgreedConfig(PEERS).max_value == 2.0**64
    for wrong in ({"max_weight": 0}, {"max_weight": 1.5}, {"max_value": 0.0},
                  {"max_value": float("inf")}, {"max_value": 1e39}):  # fmt: skip
        with pytest.raises(InvalidGradient, match="max_"):
            AgreedConfig(PEERS, **wrong)  # type: ignore[arg-type]


async def test_a_roster_listing_weight_2_40_is_refused() -> None:
    async with MemoryBlockStore() as store:
        genesis = await AgreedSession.commit_genesis(store, initial_model())
        ready = {p: (genesis, 1) for p in PEERS} | {PEERS[2]: (genesis, 2**40)}
        roster = Roster.new("s1", genesis, 0, genesis, PEERS[0], PEERS, ready)
        config = AgreedConfig(PEERS)
        problem = roster_problem(roster, "s1", genesis, 0, genesis, config)
        assert problem == f"lists {PEERS[2]} with weight {2**40} > max_weight {2**20}"
        assert not roster_problem(
            roster, "s1", genesis, 0, genesis, AgreedConfig(PEERS, max_weight=2**40)
        )


async def test_a_hostile_coordinator_with_weight_2_40_does_not_decide_the_model() -> None:
    # The hostile member allows itself 2**40 and is the round's first coordinator: it lists its
    # own contribution at 2**40. The honest peers refuse its roster (and its contribution), the
    # next coordinator's roster of the two honest peers is adopted.
    async with MemoryBlockStore() as store:
        bus = MemoryPubsubBus()
        genesis = await AgreedSession.commit_genesis(store, initial_model())
        hostile = coordinator_ranking("s1", genesis, 0, PEERS)[0]
        honest = [p for p in PEERS if p != hostile]
        common = {**FAST, "min_peers": 2}
        configs = {p: AgreedConfig(PEERS, **common) for p in honest}  # type: ignore[arg-type]
        configs[hostile] = AgreedConfig(PEERS, **common, max_weight=2**41)  # type: ignore[arg-type]
        sessions = {
            p: AgreedSession(store, bus.endpoint(p), "s1", genesis, configs[p]) for p in PEERS
        }
        for session in sessions.values():
            await session.start(initial_model())
        bad = asyncio.ensure_future(sessions[hostile].run_round(delta(9, 0), weight=2**40))
        try:
            results = await asyncio.gather(
                *(sessions[p].run_round(delta(i, 0), weight=1 + i) for i, p in enumerate(honest))
            )
            await asyncio.wait({bad}, timeout=5.0)
        finally:
            bad.cancel()
            await asyncio.gather(bad, return_exceptions=True)
            for session in sessions.values():
                await session.aclose()
        own = bad.result()  # the hostile adopted its own roster: it lists 2**40
        assert [e.weight for e in own.roster.entries if e.peer == hostile] == [2**40]
        assert results[0].record == results[1].record != own.record
        for res in results:
            assert res.roster.peers == tuple(sorted(honest))
            assert all(e.weight <= 2**20 for e in res.roster.entries)
            assert "max_weight" in res.rejected[hostile]  # its roster (and its record)
        await verify_agreed_history(
            store, results[0].record, keys=bus.keys, session="s1", genesis=genesis
        )


async def test_a_contribution_above_max_value_is_refused_and_not_listed() -> None:
    async with MemoryBlockStore() as store:
        bus = MemoryPubsubBus()
        genesis = await AgreedSession.commit_genesis(store, initial_model())
        common = {**FAST, "min_peers": 2}
        configs = {p: AgreedConfig(PEERS, **common) for p in PEERS[:2]}  # type: ignore[arg-type]
        configs[PEERS[2]] = AgreedConfig(PEERS, **common, max_value=None)  # type: ignore[arg-type]
        sessions = [AgreedSession(store, bus.endpoint(p), "s1", genesis, configs[p]) for p in PEERS]
        for session in sessions:
            await session.start(initial_model())
        with pytest.raises(InvalidGradient, match="max_value"):
            await sessions[0].run_round(np.full(initial_model().size, 3.0e38, np.float32))
        huge = np.full(initial_model().size, 3.0e38, np.float32)
        bad = asyncio.ensure_future(sessions[2].run_round(huge, weight=2**20))
        try:
            results = await asyncio.gather(
                *(s.run_round(delta(i, 0), weight=1 + i) for i, s in enumerate(sessions[:2]))
            )
        finally:
            bad.cancel()
            await asyncio.gather(bad, return_exceptions=True)
            for session in sessions:
                await session.aclose()
        assert results[0].model == results[1].model
        for res in results:
            assert res.roster.peers == PEERS[:2]
            assert "max_value" in res.rejected[PEERS[2]]
        assert np.isfinite(sessions[0].model).all()
