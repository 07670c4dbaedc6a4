"""Agreed rounds whose members sign with delegated keys (issue 32's in-process signing).

Each member's transport hands out a :class:`DelegatedSigner` bound by its own key (as a Kubo
transport does by default); every statement, roster entry and slice message then carries a
delegated signature, and the history still verifies offline against the members' keys.
"""

from __future__ import annotations

import asyncio

from multiformats import CID

from gradfed_ipfs import AgreedSession, verify_agreed_history
from gradfed_ipfs.federated.agreed.config import AgreedConfig
from gradfed_ipfs.formats import DelegatedSigner, Signer
from gradfed_ipfs.formats.agreed.roster import AgreedRecord, Roster
from gradfed_ipfs.formats.statement import DELEGATED_SIGNATURE_BYTES
from gradfed_ipfs.kubo import MemoryPubsubBus, PubsubTransport, PubsubWrapper
from gradfed_ipfs.storage import MemoryBlockStore
from tests.federated.agreed import test_rounds, test_sliced


class DelegatedPubsub(PubsubWrapper):
    """The inner transport with its identity's statements signed by a delegate key."""

    def __init__(self, inner: PubsubTransport) -> None:
        super().__init__(inner)
        self._signer: DelegatedSigner | None = None

    async def signer(self) -> Signer:
        if self._signer is None:
            self._signer = await DelegatedSigner.open(await self.inner.signer())
        return self._signer


async def _sessions(
    store: MemoryBlockStore,
    bus: MemoryPubsubBus,
    peers: tuple[str, ...],
    d: int,
    **settings: object,
) -> tuple[list[AgreedSession], CID]:
    model = test_sliced.initial_model(d)
    genesis = await AgreedSession.commit_genesis(store, model)
    config = AgreedConfig(members=peers, **settings)  # type: ignore[arg-type]
    sessions = [
        AgreedSession(store, DelegatedPubsub(bus.endpoint(p)), "ds", genesis, config) for p in peers
    ]
    for session in sessions:
        await session.start(model)
    return sessions, genesis


async def _run(aggregation: str, peers: tuple[str, ...], d: int, fast: dict[str, object]) -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    sessions, genesis = await _sessions(store, bus, peers, d, aggregation=aggregation, **fast)
    try:
        for r in range(2):
            results = await asyncio.gather(
                *(
                    s.run_round(test_sliced.gradient(i, r, d), weight=1 + i)
                    for i, s in enumerate(sessions)
                )
            )
            assert len({bytes(x.model) for x in results}) == 1
            assert all(x.included for x in results)
    finally:
        for session in sessions:
            await session.aclose()
    head = results[0].record
    roster = Roster.from_block(
        await store.get(AgreedRecord.from_block(await store.get(head)).roster)
    )
    assert roster.peers == peers
    assert {len(e.signature or b"") for e in roster.entries} == {DELEGATED_SIGNATURE_BYTES}
    records = await verify_agreed_history(store, head, session="ds", genesis=genesis, keys=bus.keys)
    assert [record.round for record in records] == [0, 1]


async def test_all_to_all_rounds_with_delegated_signatures_verify_offline() -> None:
    await _run("all-to-all", test_rounds.PEERS, 1000, test_rounds.FAST)


async def test_reduce_scatter_rounds_with_delegated_signatures_verify_offline() -> None:
    await _run("reduce-scatter", test_sliced.PEERS, test_sliced.D, test_sliced.FAST)
