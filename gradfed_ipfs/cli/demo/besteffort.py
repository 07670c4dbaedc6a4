"""``gradfed-ipfs demo --best-effort``: one best-effort FedAvg round in one process.

Each peer commits a gradient to its own daemon and gets a CID; every other peer adds that
gradient by CID through *its own* daemon (the bytes cross over bitswap), verifies it and
aggregates with FedAvg weighted by sample counts. Every peer's aggregate must equal a NumPy
reference computed from the original arrays.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from multiformats import CID
from rich.table import Table

from ..._types import FloatArray
from ...errors import GradfedError
from ...federated.accumulate.accumulator import DistributedGradientAccumulator
from ...federated.accumulate.config import AccumulatorConfig
from ...kubo.daemon import KuboDaemon, KuboSwarm
from ...storage.kubo import KuboBlockStore
from ...tensor.aggregation import AggregationMethod
from ..common import console, err_console

__all__ = ["DemoPeer", "DemoResult", "cmd_best_effort_demo", "run_demo_round"]


@dataclass
class DemoPeer:
    """One peer of the demo round and what it saw."""

    name: str
    peer_id: str
    api_url: str
    num_samples: int
    cid: CID | None = None
    commit_seconds: float = 0.0
    fetch_seconds: float = 0.0
    max_abs_error: float = float("nan")
    aggregate_head: list[float] = field(default_factory=list)


@dataclass
class DemoResult:
    """The outcome of :func:`run_demo_round`."""

    peers: list[DemoPeer]
    dimension: int
    reference_head: list[float]
    total_seconds: float

    @property
    def ok(self) -> bool:
        """Whether every peer's aggregate matched the NumPy reference (max |err| ≤ 1e-6)."""
        return all(p.max_abs_error <= 1e-6 for p in self.peers)


def _reference_fedavg(gradients: list[FloatArray], samples: list[int]) -> FloatArray:
    weights = np.asarray(samples, dtype=np.float64)
    stacked = np.stack([g.astype(np.float64) for g in gradients])
    reference: FloatArray = ((weights / weights.sum()) @ stacked).astype(np.float32)
    return reference


async def run_demo_round(
    daemons: list[KuboDaemon],
    *,
    dimension: int = 200_000,
    seed: int = 0,
    log: Callable[[str], None] = lambda _: None,
) -> DemoResult:
    """Run one FedAvg round between ``daemons`` (one peer per daemon).

    Parameters
    ----------
    daemons
        Running, connected daemons; peer *i* uses ``daemons[i]`` only.
    dimension
        Gradient length d (float32; d·4 bytes per gradient, kept under Kubo's 2 MiB block).
    seed
        Seed of the synthetic gradients and sample counts.
    log
        Receives one human-readable line per step.
    """
    rng = np.random.default_rng(seed)
    gradients = [rng.standard_normal(dimension, dtype=np.float32) for _ in daemons]
    samples = [int(s) for s in rng.integers(50, 500, size=len(daemons))]
    reference = _reference_fedavg(gradients, samples)
    peers = [DemoPeer(f"peer-{i}", d.peer_id, d.api_url, samples[i]) for i, d in enumerate(daemons)]
    stores = [KuboBlockStore(d.api_url, timeout=30.0) for d in daemons]
    config = AccumulatorConfig(aggregation=AggregationMethod.FedAvg(), timeout=30.0)
    accumulators = [
        DistributedGradientAccumulator("demo", config, local_peer_id=p.peer_id) for p in peers
    ]
    started = time.perf_counter()
    try:
        for peer, acc, store, gradient in zip(peers, accumulators, stores, gradients, strict=True):
            t0 = time.perf_counter()
            peer.cid = await acc.commit_local(gradient, store, num_samples=peer.num_samples)
            peer.commit_seconds = time.perf_counter() - t0
            log(f"{peer.name} committed {dimension} floats as {peer.cid}")

        async def gather(index: int) -> None:
            me, acc, store = peers[index], accumulators[index], stores[index]
            t0 = time.perf_counter()
            for other in peers:
                if other is me or other.cid is None:
                    continue
                await acc.add_peer_gradient(
                    other.peer_id, other.cid, store, num_samples=other.num_samples
                )
            me.fetch_seconds = time.perf_counter() - t0
            result = acc.aggregate()
            me.max_abs_error = float(np.max(np.abs(result - reference)))
            me.aggregate_head = [float(v) for v in result[:4]]
            log(
                f"{me.name} fetched {acc.peer_count} peer gradients over bitswap in "
                f"{me.fetch_seconds:.3f}s; max |aggregate - reference| = {me.max_abs_error:.2e}"
            )

        await asyncio.gather(*(gather(i) for i in range(len(peers))))
    finally:
        for store in stores:
            await store.aclose()
    return DemoResult(
        peers, dimension, [float(v) for v in reference[:4]], time.perf_counter() - started
    )


def cmd_best_effort_demo(args: argparse.Namespace) -> int:
    """Run ``gradfed-ipfs demo --best-effort``; return its exit status."""
    if args.peers < 2:
        raise GradfedError("a federated round needs at least 2 peers")
    console.print(
        f"[bold]gradfed-ipfs demo[/]: {args.peers} peers, each with its own Kubo daemon "
        f"on 127.0.0.1, d = {args.dim:,} floats"
    )
    with console.status("starting Kubo daemons…"):
        swarm = KuboSwarm(args.peers).start()
    try:
        for daemon in swarm:
            console.print(f"  daemon {daemon.peer_id} api={daemon.api_url} pid={daemon.pid}")
        result = asyncio.run(
            run_demo_round(list(swarm), dimension=args.dim, seed=args.seed, log=console.print)
        )
    finally:
        swarm.stop()
    table = Table(title="FedAvg round over Kubo (bitswap)")
    for column in ("peer", "samples", "gradient CID", "commit s", "fetch s", "max |err|"):
        table.add_column(column, overflow="fold")
    for peer in result.peers:
        table.add_row(
            peer.name,
            str(peer.num_samples),
            str(peer.cid),
            f"{peer.commit_seconds:.3f}",
            f"{peer.fetch_seconds:.3f}",
            f"{peer.max_abs_error:.1e}",
        )
    console.print(table)
    console.print(f"reference FedAvg[:4] = {[round(v, 6) for v in result.reference_head]}")
    console.print(f"total round time {result.total_seconds:.2f}s")
    if not result.ok:
        err_console.print("[red]FAILED[/]: an aggregate differs from the NumPy reference")
        return 1
    console.print("[green]OK[/]: every peer's aggregate equals the NumPy reference")
    return 0
