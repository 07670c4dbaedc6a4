"""Fault hooks of a reduce-scatter peer: how tests and benchmarks make a reducer misbehave.

A :class:`~.peer.ReduceScatterPeer` (and an agreed session, which passes them on) takes a
``faults=`` object and calls it at the points where a reducer's bytes leave it; the base
:class:`SliceFaults` does nothing there, so production peers never branch on a fault switch.
:class:`Lying` and :class:`Silent` are the two faults the benchmarks inject; tests subclass
:class:`SliceFaults` for others (garbage records, partial lies).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

import numpy as np

from ..._types import FloatArray
from ...block import Block
from ...storage.base import BlockStore

__all__ = ["Lying", "Silent", "SliceFaults"]

A = TypeVar("A", bound=np.ndarray)


class SliceFaults:
    """Fault hooks whose defaults do nothing (an honest reducer)."""

    def reduces(self) -> bool:
        """Return whether this peer announces the slices and chain steps it is ranked for."""
        return True

    def alter(self, k: int, values: A) -> A:
        """Return what this peer announces instead of ``values`` of slice ``k`` it computed.

        Called for the slice results and (chained) partial sums it serves, not for the slices
        it recomputes to check others.
        """
        return values

    def partial_blocks(self, k: int, acc: np.ndarray) -> list[Block] | None:
        """Return the value blocks of the partial record of slice ``k`` this peer announces.

        ``None`` (honest): the blocks of ``acc``, the (altered) partial sum it computed and
        goes on with. Other blocks are not kept locally: this peer reads them back as any
        other peer would.
        """
        return None

    async def commit(
        self, store: BlockStore, block: Block, values: FloatArray
    ) -> tuple[Block, FloatArray]:
        """Return the slice record and values this peer keeps, having put ``block`` (its own)."""
        return block, values

    def missing(self, k: int, missing: set[str]) -> set[str]:
        """Return the senders this peer's record (or partial) of slice ``k`` claims missing.

        Called for the slices and chain steps it serves; ``missing`` is what it really could
        not fetch (and the phase's exclusions).
        """
        return missing

    def check_values(
        self, values: tuple[float, ...], project: Callable[[int, FloatArray], float]
    ) -> tuple[float, ...]:
        """Return the check values this peer publishes instead of its true ``values``.

        ``project(k, v)`` is ``⟨z_k, v⟩`` of a vector of slice ``k``'s length (fedavg rounds):
        what a liar needs to shift its own value by the projection of its lie.
        """
        return values


@dataclass
class Lying(SliceFaults):
    """A reducer that adds ``amount`` to every value it announces (0: honest)."""

    amount: float = 1e-2

    def alter(self, k: int, values: A) -> A:
        """Return ``values + amount`` in their own precision."""
        if not self.amount:
            return values
        return cast(A, (values + values.dtype.type(self.amount)).astype(values.dtype))


class Silent(SliceFaults):
    """A reducer that never announces a slice or chain step (a dead reducer)."""

    def reduces(self) -> bool:
        """Return ``False``."""
        return False
