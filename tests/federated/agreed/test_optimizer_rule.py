"""OptimizerRule: a server optimizer (DiLoCo's Nesterov step) as a plain agreed session's rule."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedSession, verify_agreed_history
from gradfed_ipfs.errors import RoundVerificationFailed
from gradfed_ipfs.federated.agreed import OptimizerRule
from gradfed_ipfs.federated.agreed.history import load_record, load_result
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore, fetch_gradient
from gradfed_ipfs.tensor import ServerNesterov
from gradfed_ipfs.tensor.fedopt import decode_optimizer_state
from tests.federated.agreed.test_model_holders import KUBO_SETTINGS, kubo_clients
from tests.federated.agreed.test_rounds import (
    PEERS,
    close,
    delta,
    initial_model,
    make_sessions,
    run_all,
)
from tests.helpers import MEMORY_KEYS

ROUNDS = 4


async def test_three_peers_agree_on_nesterov_rounds_and_the_history_verifies() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    rule = OptimizerRule(ServerNesterov())
    sessions = await make_sessions(
        store, [bus.endpoint(p) for p in PEERS], genesis, rule=rule, model_every=2
    )
    # What every peer must compute: Nesterov on the weighted mean (weights 1, 2, 3).
    optimizer = ServerNesterov()
    expected, state = initial_model(), None
    try:
        for r in range(ROUNDS):
            results = await run_all(sessions, [0, 1, 2])
            assert len({bytes(res.model) for res in results}) == 1, r
            assert len({bytes(res.record) for res in results}) == 1, r
            mean = sum(w / 6 * delta(i, r).astype(np.float64) for i, w in enumerate((1, 2, 3)))
            expected, state = optimizer.step(expected, mean.astype(np.float32), state)
            np.testing.assert_allclose(sessions[0].model, expected, rtol=0, atol=1e-6)
    finally:
        await close(sessions)
    head = sessions[0].head
    assert head is not None
    record = await load_record(store, head)
    assert record.rule == "ServerNesterov(learning_rate=0.7, momentum=0.9)"
    assert record.state is not None
    stored = decode_optimizer_state(optimizer, await fetch_gradient(store, record.state), 1000)
    assert stored is not None
    assert stored.step == ROUNDS
    assert state is not None
    np.testing.assert_allclose(stored.arrays["v"], state.arrays["v"], rtol=0, atol=1e-6)
    chain = await verify_agreed_history(
        store, head, keys=bus.keys, session="s1", genesis=genesis, rule=rule
    )
    assert [rec.round for rec in chain] == list(range(ROUNDS))
    # The last model is rebuilt bit for bit from the rounds (model_every=2 stored round 3's).
    model, _ = await load_result(store, record, rule)
    assert model.tobytes() == sessions[0].model.tobytes()


async def test_a_verifier_with_other_hyperparameters_or_no_rule_refuses_the_history() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model())
    rule = OptimizerRule(ServerNesterov())
    sessions = await make_sessions(store, [bus.endpoint(p) for p in PEERS], genesis, rule=rule)
    try:
        for _ in range(2):
            await run_all(sessions, [0, 1, 2])
    finally:
        await close(sessions)
    head = sessions[0].head
    assert head is not None
    other = OptimizerRule(ServerNesterov(momentum=0.5))
    with pytest.raises(RoundVerificationFailed, match=r"used rule .*momentum=0\.9.*, not .*0\.5"):
        await verify_agreed_history(
            store, head, keys=bus.keys, session="s1", genesis=genesis, rule=other
        )
    with pytest.raises(RoundVerificationFailed, match="pass it"):
        await verify_agreed_history(store, head, keys=bus.keys, session="s1", genesis=genesis)


@pytest.mark.kubo
async def test_on_kubo_a_restarted_peer_resumes_the_nesterov_state_and_agrees(
    kubo_swarm3,  # type: ignore[no-untyped-def]
) -> None:
    # Three daemons: two rounds with every peer, then peer 2 restarts (a fresh session object:
    # no model, no optimizer state), resyncs from the others' head and the third round agrees.
    d = 2_000
    members, stores, pubsubs = kubo_clients(kubo_swarm3)
    rule = OptimizerRule(ServerNesterov())
    config = AgreedConfig(members=members, rule=rule, model_every=1, **KUBO_SETTINGS)  # type: ignore[arg-type]
    model = np.random.default_rng(5).standard_normal(d).astype(np.float32)
    sessions: list[AgreedSession] = []

    def grads(r: int) -> list[np.ndarray]:
        return [
            (0.1 * np.random.default_rng([i, r]).standard_normal(d)).astype(np.float32)
            for i in range(3)
        ]

    try:
        genesis = await AgreedSession.commit_genesis(stores[0], model)
        for store, pubsub in zip(stores, pubsubs, strict=True):
            sessions.append(AgreedSession(store, pubsub, "nesterov", genesis, config))
            await sessions[-1].start(model)
        for r in range(2):
            results = await asyncio.gather(
                *(s.run_round(g) for s, g in zip(sessions, grads(r), strict=True))
            )
            assert len({bytes(res.model) for res in results}) == 1, r
        await sessions[2].aclose()
        sessions[2] = AgreedSession(stores[2], pubsubs[2], "nesterov", genesis, config)
        await sessions[2].start(model)
        assert sessions[2].rule_state is None
        await sessions[2].resync(timeout=20.0)
        assert sessions[2].round == 2
        assert sessions[2].rule_state is not None
        assert sessions[2].rule_state.tobytes() == sessions[0].rule_state.tobytes()  # type: ignore[union-attr]
        results = await asyncio.gather(
            *(s.run_round(g) for s, g in zip(sessions, grads(2), strict=True))
        )
        assert len({bytes(res.model) for res in results}) == 1
        head = results[0].record
        chain = await verify_agreed_history(
            stores[1], head, keys=MEMORY_KEYS, session="nesterov", genesis=genesis, rule=rule
        )
        assert [rec.round for rec in chain] == [0, 1, 2]
    finally:
        for session in sessions:
            await session.aclose()
        for closable in (*pubsubs, *stores):
            await closable.aclose()
