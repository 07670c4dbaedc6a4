"""What a failed Kubo RPC call becomes: error families, and the errors built from them.

A caller of :class:`~gradfed_ipfs.kubo.rpc.KuboRpc` names an :class:`ErrorFamily` (the block
store's, pubsub's, or the control plane's :data:`KUBO_ERRORS`); the client sorts each failure
into one of its four kinds and builds the error with the functions here, which stamp on it the
daemon's URL and, for the block store, the endpoint. No ``httpx`` here: mapping ``httpx``'s
exceptions onto a kind stays in :mod:`gradfed_ipfs.kubo.rpc`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ..errors import (
    BlockStoreError,
    GradfedError,
    KuboRpcError,
    PubsubError,
    ResponseTooLarge,
    RpcTimeout,
)

__all__ = ["KUBO_ERRORS", "ErrorFamily", "rpc_error", "timeout_error", "too_large_error"]


@dataclass(frozen=True)
class ErrorFamily:
    """Which of our errors a caller's failures become; each field builds one from a message.

    Attributes
    ----------
    unavailable
        The daemon cannot be reached, or a stream broke.
    timeout
        An answer did not complete within the deadline; should build an :class:`RpcTimeout`.
    too_large
        An answer exceeded its cap; should build a :class:`ResponseTooLarge`.
    refused
        Kubo answered with an error (its message is in the text); may classify it further
        (the block store turns "not found" into ``BlockNotFound``).
    """

    unavailable: Callable[[str], GradfedError]
    timeout: Callable[[str], GradfedError]
    too_large: Callable[[str], GradfedError]
    refused: Callable[[str], GradfedError]


class _KuboRpcTimeout(KuboRpcError, RpcTimeout):
    """A control-plane call's answer did not complete within its deadline."""


class _KuboRpcTooLarge(KuboRpcError, ResponseTooLarge):
    """A control-plane call's answer exceeded its endpoint's cap."""


KUBO_ERRORS: Final = ErrorFamily(
    unavailable=KuboRpcError,
    timeout=_KuboRpcTimeout,
    too_large=_KuboRpcTooLarge,
    refused=KuboRpcError,
)
"""The control plane's family (``id``, ``swarm/*``): every failure is a ``KuboRpcError``."""


def rpc_error(
    build: Callable[[str], GradfedError], message: str, api_url: str, endpoint: str
) -> GradfedError:
    """Build an error of a family and stamp where it happened on it."""
    error = build(message)
    if isinstance(error, BlockStoreError):
        error.api_url = error.api_url or api_url
        error.endpoint = error.endpoint or endpoint
    elif isinstance(error, (PubsubError, KuboRpcError)):
        error.api_url = error.api_url or api_url
    return error


def timeout_error(
    family: ErrorFamily, api_url: str, endpoint: str, deadline: float, received: int
) -> GradfedError:
    """Build the error of an answer that did not complete within ``deadline`` seconds."""
    error = rpc_error(
        family.timeout,
        f"{endpoint}: no complete answer within {deadline:.1f}s ({received} bytes of it arrived)",
        api_url,
        endpoint,
    )
    if isinstance(error, RpcTimeout):
        error.received = received
        error.deadline = deadline
    return error


def too_large_error(
    family: ErrorFamily, api_url: str, endpoint: str, cap: int, seen: int
) -> GradfedError:
    """Build the error of an answer of at least ``seen`` bytes, over its ``cap``."""
    error = rpc_error(
        family.too_large,
        f"{endpoint} answer exceeds its {cap}-byte cap ({seen} bytes seen); reading stopped",
        api_url,
        endpoint,
    )
    if isinstance(error, ResponseTooLarge):
        error.rpc_endpoint = endpoint
        error.cap = cap
    return error
