"""The roster step's incremental readiness: what it counts as contributions and fetches arrive."""

from __future__ import annotations

import asyncio
import time

import numpy as np
from multiformats import CID

from gradfed_ipfs.federated.agreed import AgreedConfig
from gradfed_ipfs.federated.agreed.context import OwnContribution, RoundContext
from gradfed_ipfs.federated.agreed.round.coordinator import Contribution
from gradfed_ipfs.federated.agreed.round.readiness import ReadyTracker
from gradfed_ipfs.federated.exchange.fetcher import ContributionFetcher
from gradfed_ipfs.storage import MemoryBlockStore
from gradfed_ipfs.storage.dag import put_gradient
from tests.polling import apoll_until

D = 8
MEMBERS = ("a", "b", "c", "d", "e", "f", "g")


def values(seed: int, d: int = D) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(d).astype(np.float32)


async def round_context(store: MemoryBlockStore, fetcher: ContributionFetcher) -> RoundContext:
    base = await put_gradient(store, np.zeros(D, np.float32))
    own = values(0)
    cid = await put_gradient(store, own)
    fetcher.known(cid, own)
    stored: asyncio.Future[CID] = asyncio.get_running_loop().create_future()
    stored.set_result(cid)
    return RoundContext(
        number=0, config=AgreedConfig(members=MEMBERS, max_weight=10), peer="a", base=base,
        base_model=np.zeros(D, np.float32), rule_state=None, head=None,
        excluded=frozenset({"e"}), own=OwnContribution(cid, own, 1, stored),
        ranking=MEMBERS, started=time.monotonic(),
    )  # fmt: skip


async def test_the_tracker_takes_in_only_what_changed_with_a_full_walks_rules() -> None:
    store, elsewhere = MemoryBlockStore(), MemoryBlockStore()
    fetcher = ContributionFetcher(store, timeout=0.2, on_done=lambda: None)
    ctx = await round_context(store, fetcher)
    board: dict[str, Contribution] = {}
    tracker = ReadyTracker(ctx, board, fetcher)
    late = values(3)
    board["b"] = Contribution(await put_gradient(store, values(2)), 1, ctx.base)
    board["c"] = Contribution(await put_gradient(elsewhere, late), 1, ctx.base)  # not served
    board["d"] = Contribution(await put_gradient(store, values(4)), 11, ctx.base)  # too heavy
    board["e"] = Contribution(await put_gradient(store, values(5)), 1, ctx.base)  # a liar
    board["f"] = Contribution(await put_gradient(store, values(6, D + 1)), 1, ctx.base)  # bad
    board["g"] = Contribution(await put_gradient(store, values(7)), 1, board["b"].cid)  # base

    async def settled() -> bool:
        tracker.update()
        return "b" in tracker.ready and "f" in ctx.rejected

    await apoll_until(settled, timeout=30.0, what="the fetches to finish")
    assert set(tracker.ready) == {"a", "b"}
    assert set(ctx.rejected) == {"d", "f"}  # too heavy, and a contribution of d + 1 values
    assert "c" not in tracker.ready  # not served (a transient failure: fetched again)
    await put_gradient(store, late)  # now served: the transient failure's retry finds it

    async def retried() -> bool:
        tracker.update()
        return "c" in tracker.ready

    await apoll_until(retried, timeout=30.0, what="the retried fetch")
    assert set(tracker.ready) == {"a", "b", "c"}
    assert fetcher.get(board["g"].cid) is None  # on another base: never fetched
    assert fetcher.get(board["e"].cid) is None  # a proven liar's: never fetched
