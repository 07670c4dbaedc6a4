"""A chain walk is bounded in time: ``load_chain(deadline=...)`` stops with a typed error."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from multiformats import CID

from gradfed_ipfs import put_gradient
from gradfed_ipfs._types import CIDLike
from gradfed_ipfs.errors import ChainDeadlineExceeded, FederatedError
from gradfed_ipfs.federated.agreed.history import load_chain
from gradfed_ipfs.formats.agreed.roster import AgreedRecord, Roster
from gradfed_ipfs.storage import Block, MemoryBlockStore
from gradfed_ipfs.storage.base import UNSET, Unset

ROUNDS = 40
SERVED = 12


class StallingStore(MemoryBlockStore):
    """Serves ``served`` blocks, then every ``get`` waits forever (a peer that stops answering)."""

    def __init__(self, served: int) -> None:
        super().__init__()
        self.served = served

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        if self.served <= 0:
            await asyncio.Event().wait()
        self.served -= 1
        return await super().get(cid, timeout=timeout)


async def forged_chain(store: MemoryBlockStore, rounds: int) -> tuple[CID, CID]:
    """A linked chain of ``rounds`` records that all keep the genesis as their model."""
    genesis = await put_gradient(store, np.zeros(4, np.float32))
    roster = await store.put(Roster.new("s", genesis, 0, genesis, "p", ["p"], {}).to_block())
    prev = None
    for r in range(rounds):
        record = AgreedRecord("s", genesis, r, prev, genesis, roster, genesis, 1.0)
        prev = await store.put(record.to_block())
    assert prev is not None
    return genesis, prev


async def test_a_walk_past_its_deadline_says_how_far_it_got() -> None:
    async with StallingStore(served=10**9) as store:
        genesis, head = await forged_chain(store, ROUNDS)
        assert len(await load_chain(store, head, session="s", genesis=genesis)) == ROUNDS
        store.served = SERVED  # from now on the walk stalls after SERVED records
        with pytest.raises(ChainDeadlineExceeded) as caught:
            await load_chain(store, head, session="s", genesis=genesis, deadline=0.2)
    error = caught.value
    assert isinstance(error, FederatedError)
    assert isinstance(error, TimeoutError)
    assert (error.records, error.deadline) == (SERVED, 0.2)
    assert f"after {SERVED} records (back to round {ROUNDS - SERVED})" in str(error)


async def test_a_walk_within_its_deadline_returns_the_chain() -> None:
    async with MemoryBlockStore() as store:
        genesis, head = await forged_chain(store, ROUNDS)
        chain = await load_chain(store, head, session="s", genesis=genesis, deadline=60.0)
    assert [record.round for _, record in chain] == list(range(ROUNDS))
