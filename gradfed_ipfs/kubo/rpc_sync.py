"""``rpc_call_sync``: one Kubo RPC call from synchronous code, through :class:`KuboRpc`.

Daemon management, IPFS Cluster peers and the CLI's ``node start`` poll Kubo without an event
loop of their own; this runs the async client on a private one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .rpc import KuboRpc
from .rpc_errors import KUBO_ERRORS, ErrorFamily

__all__ = ["rpc_call_sync"]

T = TypeVar("T")


def rpc_call_sync(
    api_url: str,
    endpoint: str,
    params: Mapping[str, str] | None = None,
    *,
    timeout: float = 30.0,
    errors: ErrorFamily = KUBO_ERRORS,
    base_path: str = "/api/v0",
    method: str = "POST",
) -> Any:
    """One JSON call from synchronous code (daemon management, ``node start``).

    Runs :meth:`KuboRpc.post_json` on a private event loop (in a worker thread when the
    calling thread already runs one) and returns the decoded answer.

    Raises
    ------
    GradfedError
        Of ``errors``' family (default :class:`~gradfed_ipfs.errors.KuboRpcError`).
    """

    async def call() -> Any:
        async with KuboRpc(api_url, timeout=timeout, errors=errors, base_path=base_path) as rpc:
            return await rpc.post_json(endpoint, params, method=method)

    return _run_blocking(call)


def _run_blocking(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()
