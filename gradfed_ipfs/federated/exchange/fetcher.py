"""Contribution fetches of an agreed round: started once per CID, verified, retried if transient."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
from multiformats import CID

from ..._types import FloatArray
from ...cid import cid_to_str
from ...errors import BlockCorrupt, DecodeError, GradientError, InvalidGradient
from ...storage.base import BlockStore
from ...storage.dag import fetch_gradient
from ...tensor.packing import PackSpec

__all__ = ["ContributionFetcher", "check_values", "is_transient"]


def is_transient(task: asyncio.Task[FloatArray]) -> bool:
    """Whether a finished fetch failed in a way worth retrying (not a hostile block)."""
    if task.cancelled():
        return True
    exc = task.exception()
    return exc is not None and not isinstance(exc, BlockCorrupt | DecodeError | GradientError)


def check_values(values: FloatArray, max_value: float | None, what: str) -> None:
    """Raise ``InvalidGradient`` if a value is not finite or of magnitude above ``max_value``."""
    if not np.isfinite(values).all():
        raise InvalidGradient(f"{what} has non-finite values")
    if max_value is not None and values.size and float(np.abs(values).max()) > max_value:
        raise InvalidGradient(f"{what} has a value of magnitude above max_value {max_value:g}")


async def _value(values: FloatArray) -> FloatArray:
    return values


class ContributionFetcher:
    """One fetch task per contribution CID; each result is ``length`` finite float32 values.

    A contribution with a non-finite value, or one of magnitude above ``max_value``, is refused
    (``InvalidGradient``, not transient): the check reads only its bytes, so every peer decides
    alike.

    Parameters
    ----------
    store
        Where blocks come from.
    timeout
        Seconds one contribution may take.
    on_done
        Called whenever a fetch finishes (wakes the round's waiters).
    max_value
        Largest magnitude a value may have (``None``: any finite value).
    packing
        Contributions are packed blocks of this encoding (``None``: dense); any other block is
        refused like a corrupt one.
    """

    def __init__(
        self,
        store: BlockStore,
        timeout: float,
        on_done: Callable[[], None],
        *,
        max_value: float | None = None,
        packing: PackSpec | None = None,
    ) -> None:
        self.store = store
        self.packing = packing
        self.timeout = timeout
        self.on_done = on_done
        self.max_value = max_value
        self.tasks: dict[bytes, asyncio.Task[FloatArray]] = {}

    def known(self, cid: CID, values: FloatArray) -> None:
        """Record values already at hand (this peer's own contribution)."""
        self.tasks[bytes(cid)] = asyncio.ensure_future(_value(values))

    def fetch(self, cid: CID, length: int) -> asyncio.Task[FloatArray]:
        """Return the fetch of ``cid``, starting it (again, after a transient failure) if needed."""
        task = self.tasks.get(bytes(cid))
        if task is None or (task.done() and is_transient(task)):
            task = asyncio.create_task(self._fetch(cid, length))
            task.add_done_callback(lambda _: self.on_done())
            self.tasks[bytes(cid)] = task
        return task

    def get(self, cid: CID) -> asyncio.Task[FloatArray] | None:
        """Return the fetch of ``cid`` if one was started."""
        return self.tasks.get(bytes(cid))

    async def _fetch(self, cid: CID, length: int) -> FloatArray:
        values = await fetch_gradient(
            self.store, cid, timeout=self.timeout, expected_length=length, packing=self.packing
        )
        flat = np.asarray(values, np.float32).reshape(-1)
        # cid_to_str: remembered and fast; multiformats' str(CID) costs ~1 ms, every fetch.
        check_values(flat, self.max_value, f"contribution {cid_to_str(cid)}")
        return flat

    def retain(self, keep: set[bytes]) -> None:
        """Cancel and forget every fetch but those of the CIDs (as bytes) in ``keep``."""
        for key in [k for k in self.tasks if k not in keep]:
            self.tasks.pop(key).cancel()

    def clear(self) -> list[asyncio.Task[FloatArray]]:
        """Cancel and forget every fetch; return the tasks (to await)."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        self.tasks = {}
        return tasks
