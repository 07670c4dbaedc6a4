"""Run a whole training session in one process: N peers over the in-memory pubsub bus.

The counterpart of Flower's ``run_simulation``, without Ray: every peer is a
:class:`~gradfed_ipfs.training.peer.Peer` on one event loop, sharing one
:class:`~gradfed_ipfs.storage.MemoryBlockStore`; clients' ``train`` and ``evaluate`` run in
worker threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from ..errors import ConfigError
from ..federated.agreed.session import AgreedConfig
from ..kubo.pubsub import MemoryPubsubBus
from ..storage.memory import MemoryBlockStore
from ..tensor.codecs import Codec
from .history import History
from .peer import Client, FederationConfig, LocalDP, ModelAdapter, Peer
from .secure import SecAgg
from .strategy import Strategy

__all__ = ["SIMULATION_TIMING", "run_simulation"]

M = TypeVar("M")

SIMULATION_TIMING: Mapping[str, float] = {
    "collect_timeout": 5.0,
    "takeover_timeout": 2.0,
    "round_timeout": 120.0,
    "done_timeout": 2.0,
    "announce_interval": 0.05,
    "max_announce_interval": 0.5,
    "fetch_timeout": 10.0,
}
"""Agreed-round timing for one process (seconds): the bus loses nothing, so intervals are short."""


async def run_simulation(  # noqa: PLR0913 - public face: keyword-only settings
    clients: Sequence[Client[M]],
    *,
    adapter: ModelAdapter[M],
    initial_model: M,
    config: FederationConfig[M],
    strategy: Strategy | Callable[[], Strategy] | None = None,
    session: str = "simulation",
    log: Callable[[str], None] | None = None,
    timing: Mapping[str, Any] | None = None,
    privacy: Callable[[int], LocalDP | None] | None = None,
    compression: Codec | None = None,
) -> list[History]:
    """Run one peer per client (``peer-0``, ``peer-1``, ...); return their histories.

    ``strategy`` may be a factory (one instance per peer, as separate processes would have);
    ``log`` receives peer 0's report lines; ``privacy(i)`` gives peer ``i``'s :class:`LocalDP`;
    ``compression`` is the agreed rounds' contribution codec (``AgreedConfig.compression``, with
    its default error feedback; ``None``: dense float32); ``timing`` overrides
    :data:`SIMULATION_TIMING`.

    Raises
    ------
    ConfigError
        If one :class:`SecAgg` instance with ``central_dp`` would be shared (each peer charges
        its own accountant: pass a factory).
    """
    if isinstance(strategy, SecAgg) and strategy.central_dp is not None:
        raise ConfigError("SecAgg with central_dp needs a factory: one accountant per peer")
    bus = MemoryPubsubBus()
    members = tuple(f"peer-{i}" for i in range(len(clients)))
    timing = {**SIMULATION_TIMING, **(timing or {})}
    agreed = AgreedConfig(members=members, compression=compression, **timing)
    async with MemoryBlockStore() as store:
        peers = [
            Peer(
                store=store,
                pubsub=bus.endpoint(peer_id),
                client=client,
                adapter=adapter,
                initial_model=initial_model,
                config=config,
                agreed=replace(agreed),
                strategy=strategy() if callable(strategy) else strategy,
                session=session,
                log=log if i == 0 else (lambda _line: None),
                privacy=None if privacy is None else privacy(i),
            )
            for i, (peer_id, client) in enumerate(zip(members, clients, strict=True))
        ]
        return list(await asyncio.gather(*(peer.run() for peer in peers)))
