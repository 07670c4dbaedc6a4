"""Replicated pinning of round roots through IPFS Cluster, so they outlive the peers that made them.

A block store pins on its own daemon only: if that daemon goes, so do the round records, slice
results and models it held. :class:`ClusterPinning` asks an IPFS Cluster peer (its REST API on
loopback) to pin a root CID on ``replication_min``…``replication_max`` cluster peers; each of
them pins the whole DAG on its own Kubo daemon (fetching it over bitswap), so any one of them
can serve it afterwards. :meth:`ClusterPinning.wait_pinned` polls the cluster's view until
enough peers report ``pinned``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Final

from .._types import CIDLike
from ..cid import parse_cid
from ..errors import KuboRpcError
from ..kubo.rpc import KuboRpc
from .base import AsyncClosing

__all__ = ["PINNED", "ClusterPinning"]

PINNED: Final = "pinned"
"""The status a cluster peer reports once the whole DAG is pinned on its daemon."""


class ClusterPinning(AsyncClosing):
    """A durability provider over one IPFS Cluster peer's REST API; an async context manager.

    Parameters
    ----------
    api_url
        The cluster peer's REST API, e.g. ``http://127.0.0.1:9094``.
    timeout
        Total seconds per REST call.
    """

    def __init__(self, api_url: str, *, timeout: float = 30.0) -> None:
        self.api_url = api_url
        self._rpc = KuboRpc(api_url, timeout=timeout, base_path="")

    async def aclose(self) -> None:
        """Close the connections."""
        await self._rpc.aclose()

    async def pin(
        self,
        cid: CIDLike,
        *,
        replication_min: int = 2,
        replication_max: int = 2,
        name: str = "",
    ) -> list[str]:
        """Pin ``cid`` (and its DAG) across the cluster; return the allocated peer IDs.

        Raises
        ------
        ValueError
            If the replication factors are not ``1 <= min <= max``.
        KuboRpcError
            If the cluster refuses or cannot be reached.
        """
        if not 1 <= replication_min <= replication_max:
            raise ValueError(
                f"need 1 <= replication_min <= replication_max, got "
                f"{replication_min}, {replication_max}"
            )
        params = {
            "replication-min": str(replication_min),
            "replication-max": str(replication_max),
        }
        if name:
            params["name"] = name
        answer = await self._rpc.post_json(f"pins/{parse_cid(cid)}", params, method="POST")
        allocations = answer.get("allocations", []) if isinstance(answer, Mapping) else []
        return [str(peer) for peer in allocations]

    async def status(self, cid: CIDLike) -> dict[str, str]:
        """Return ``{cluster peer ID: status}`` for ``cid`` (``pinned``, ``pinning``, ...).

        Raises
        ------
        KuboRpcError
            If the cluster cannot be reached or answers something else than a pin status.
        """
        answer: Any = await self._rpc.post_json(f"pins/{parse_cid(cid)}", method="GET")
        peer_map = answer.get("peer_map") if isinstance(answer, Mapping) else None
        if not isinstance(peer_map, Mapping):
            raise KuboRpcError(
                f"cluster answered no peer_map for {parse_cid(cid)}: {answer!r:.200}"
            )
        return {
            str(peer): str(info.get("status", "")) if isinstance(info, Mapping) else ""
            for peer, info in peer_map.items()
        }

    async def wait_pinned(self, cid: CIDLike, at_least: int, *, timeout: float = 60.0) -> set[str]:
        """Wait until ``at_least`` cluster peers report ``cid`` pinned; return those peers.

        Raises
        ------
        TimeoutError
            If fewer peers report it pinned after ``timeout`` seconds (the last statuses are in
            the message).
        """
        deadline = time.monotonic() + timeout
        statuses: dict[str, str] = {}
        while True:
            statuses = await self.status(cid)
            pinned = {peer for peer, state in statuses.items() if state == PINNED}
            if len(pinned) >= at_least:
                return pinned
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{parse_cid(cid)} pinned on {len(pinned)} of {at_least} cluster peers wanted "
                    f"after {timeout:.0f}s: {statuses}"
                )
            await asyncio.sleep(0.25)  # polling the cluster's pin state, against the deadline
