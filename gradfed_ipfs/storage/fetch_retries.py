"""Fetching one block of a gradient: retries of transient failures, and slow versus missing.

A block that timed out while other blocks of the same gradient kept arriving was waiting
behind them (slow, asked again); one that timed out while nothing else arrived is reported
with how much of the gradient had come (:class:`~gradfed_ipfs.errors.BlockTimeout`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from multiformats import CID

from ..errors import BlockCorrupt, BlockTimeout, StoreUnavailable
from .base import Block, BlockStore, Unset

__all__ = ["Arrivals", "get_with_retries"]

logger = logging.getLogger("gradfed_ipfs.storage.dag")


class Arrivals:
    """The blocks of one gradient that arrived so far: their bytes, and when the last came."""

    def __init__(self) -> None:
        self.received = 0
        self.last = time.monotonic()

    def arrived(self, block: Block) -> None:
        """Count ``block`` as arrived now."""
        self.received += len(block.data)
        self.last = time.monotonic()


async def get_with_retries(
    store: BlockStore,
    cid: CID,
    timeout: float | Unset,
    retries: int,
    what: str,
    arrivals: Arrivals | None = None,
) -> Block:
    """``store.get``, retrying transient errors and timeouts while ``arrivals`` grow.

    A block that timed out while others of the gradient arrived waited behind them: slow.
    """
    delay = 0.05
    attempt = 0
    while True:
        started = time.monotonic()
        try:
            block = await store.get(cid, timeout=timeout)
        except BlockCorrupt as exc:
            raise BlockCorrupt(f"{what} is corrupt: {exc}", cid=cid) from exc
        except BlockTimeout as exc:
            if arrivals is not None and arrivals.last > started:
                logger.debug("%s: timed out while other blocks arrived; asking again", what)
                continue
            received = arrivals.received if arrivals is not None else 0
            raise BlockTimeout(
                f"{what} timed out with nothing else arriving meanwhile ({received} bytes of "
                f"the gradient had arrived): {exc.args[0]}",
                cid=cid,
                received=received,
                deadline=exc.deadline,
            ) from exc
        except StoreUnavailable:
            if attempt == retries:
                raise
            attempt += 1
            logger.debug("%s: transient failure, retry %d", what, attempt)
            await asyncio.sleep(delay)  # backoff before a retry, not a synchronisation
            delay *= 2
            continue
        if arrivals is not None:
            arrivals.arrived(block)
        return block
