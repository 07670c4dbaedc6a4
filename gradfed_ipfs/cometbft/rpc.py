"""CometBFT's JSON-RPC over HTTP on loopback: ``status``, ``broadcast_tx_*``, ``abci_query``.

:func:`comet_call` is one blocking call (the validator manager polls readiness with it);
:class:`CometRpc` runs the same calls off the event loop for async callers. Answers are bounded
(:data:`MAX_ANSWER_BYTES`) before decoding, and every failure is a
:class:`~gradfed_ipfs.errors.CometRpcError` naming the URL and method.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..errors import CometRpcError

__all__ = ["MAX_ANSWER_BYTES", "BroadcastResult", "CometRpc", "QueryResult", "comet_call"]

MAX_ANSWER_BYTES: Final = 16 * 1024 * 1024
"""Largest JSON-RPC answer read, in bytes (a 4 MiB block in base64 fits)."""
_ids = itertools.count(1)


def comet_call(
    rpc_url: str, method: str, params: Mapping[str, Any] | None = None, *, timeout: float = 10.0
) -> Any:
    """POST one JSON-RPC 2.0 request to ``rpc_url`` and return its ``result``.

    Raises
    ------
    CometRpcError
        If the validator cannot be reached, answers with an error or with too much, or does
        not answer within ``timeout`` seconds.
    """
    if not rpc_url.startswith("http://127.0.0.1:"):
        raise CometRpcError(f"refusing a non-loopback RPC URL {rpc_url!r}", rpc_url=rpc_url)
    body = json.dumps(
        {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": dict(params or {})}
    ).encode()
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked above
        rpc_url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
            raw = answer.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as exc:  # JSON-RPC errors may come with HTTP 500
        raw = exc.read(MAX_ANSWER_BYTES + 1)
    except (OSError, ValueError) as exc:
        raise CometRpcError(f"{method} at {rpc_url}: {exc}", rpc_url=rpc_url) from exc
    if len(raw) > MAX_ANSWER_BYTES:
        raise CometRpcError(f"{method} at {rpc_url}: answer over {MAX_ANSWER_BYTES} bytes")
    try:
        decoded = json.loads(raw)
    except ValueError as exc:
        raise CometRpcError(f"{method} at {rpc_url}: not JSON ({exc})", rpc_url=rpc_url) from exc
    if not isinstance(decoded, dict):
        raise CometRpcError(f"{method} at {rpc_url}: not a JSON-RPC answer", rpc_url=rpc_url)
    if decoded.get("error"):
        error = decoded["error"]
        raise CometRpcError(f"{method} at {rpc_url}: {error!s:.500}", rpc_url=rpc_url)
    return decoded.get("result")


@dataclass(frozen=True)
class BroadcastResult:
    """What a validator said about a submitted transaction.

    Attributes
    ----------
    code
        CheckTx's code (0: accepted into the mempool), or FinalizeBlock's for a committed one.
    log
        The app's reason for a non-zero code.
    tx_hash
        Upper-case hex SHA-256 of the transaction.
    height
        The block that holds it (``broadcast_tx_commit`` only, else 0).
    """

    code: int
    log: str
    tx_hash: str
    height: int = 0


@dataclass(frozen=True)
class QueryResult:
    """An ``abci_query`` answer: ``code`` 0 with ``value``, or a code and ``log``; ``height``."""

    code: int
    value: bytes
    log: str
    height: int


class CometRpc:
    """Async calls to one validator's RPC (each runs :func:`comet_call` in a worker thread).

    Parameters
    ----------
    rpc_url
        ``http://127.0.0.1:PORT`` of the validator.
    timeout
        Seconds per call.
    """

    def __init__(self, rpc_url: str, *, timeout: float = 15.0) -> None:
        self.rpc_url = rpc_url
        self.timeout = timeout

    async def call(self, method: str, *, timeout: float | None = None, **params: Any) -> Any:
        """One JSON-RPC call (within ``timeout`` s, default :attr:`timeout`); its ``result``."""
        wait = self.timeout if timeout is None else timeout
        return await asyncio.to_thread(comet_call, self.rpc_url, method, params, timeout=wait)

    async def status(self) -> dict[str, Any]:
        """``/status``: node info, sync info (latest height, app hash), validator info."""
        result = await self.call("status")
        if not isinstance(result, dict):
            raise CometRpcError(f"status at {self.rpc_url}: no result", rpc_url=self.rpc_url)
        return result

    async def latest(self) -> tuple[int, str]:
        """Return ``(latest block height, its app hash in upper-case hex)``."""
        sync = (await self.status()).get("sync_info") or {}
        return int(sync.get("latest_block_height", 0)), str(sync.get("latest_app_hash", ""))

    async def check_tx(self, tx: bytes) -> BroadcastResult:
        """Run the app's CheckTx on ``tx`` without submitting it."""
        result = await self.call("check_tx", tx=base64.b64encode(tx).decode())
        return BroadcastResult(int(result.get("code", 0)), str(result.get("log", "")), "")

    async def broadcast_tx_sync(self, tx: bytes) -> BroadcastResult:
        """Submit ``tx``; returns once CheckTx has accepted it.

        Raises
        ------
        CometRpcError
            If CheckTx refuses it (CometBFT v1 answers a refusal with an RPC error that names
            the app's code and log), or the transaction is already in the mempool's cache.
        """
        result = await self.call("broadcast_tx_sync", tx=base64.b64encode(tx).decode())
        return BroadcastResult(int(result["code"]), str(result.get("log", "")), result["hash"])

    async def broadcast_tx_commit(
        self, tx: bytes, *, timeout: float | None = None
    ) -> BroadcastResult:
        """Submit ``tx``; returns once it is in a committed block (or CheckTx refused it).

        ``timeout`` bounds the wait (default :attr:`timeout`; the validator's own is
        ``timeout_broadcast_tx_commit``, 10 s): a transaction that no proposal takes (the app's
        PrepareProposal drops it) is never committed.
        """
        encoded = base64.b64encode(tx).decode()
        result = await self.call("broadcast_tx_commit", timeout=timeout, tx=encoded)
        check, executed = result.get("check_tx") or {}, result.get("tx_result") or {}
        code = int(check.get("code", 0)) or int(executed.get("code", 0))
        log = str(check.get("log", "") or executed.get("log", ""))
        return BroadcastResult(code, log, str(result["hash"]), int(result.get("height", 0)))

    async def abci_query(self, path: str, data: bytes) -> QueryResult:
        """Ask the validator's app about its committed state (see the app's ``query``)."""
        result = await self.call("abci_query", path=path, data=data.hex())
        answer = result["response"]
        value = base64.b64decode(answer.get("value") or "")
        return QueryResult(
            int(answer.get("code", 0)), value, str(answer.get("log", "")), int(answer["height"])
        )
