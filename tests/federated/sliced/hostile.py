"""Reducers that lie and cover their lies (issue 32, attacks 5 and 6), as fault hooks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

import numpy as np

from gradfed_ipfs._types import FloatArray
from gradfed_ipfs.federated.sliced import SliceFaults

A = TypeVar("A", bound=np.ndarray)


@dataclass
class HidingLiar(SliceFaults):
    """Adds ``amount`` to every value of the first slice (or, ``partials``, the first chained
    partial sum) it announces, and shifts its own check value of that slice by the projection
    of its lie: ``scale`` is ``W / (lr · w)`` for a slice result, ``W / w`` for a partial sum
    (``W`` the roster's weight sum, ``w`` its own weight), so the projection check passes."""

    amount: float
    scale: float
    partials: bool = False
    k: int | None = None
    length: int = 0
    published: tuple[float, ...] = ()
    """The check values it published (its true ones are its rows')."""

    def alter(self, k: int, values: A) -> A:
        if (values.dtype == np.float64) != self.partials or self.k not in (None, k):
            return values
        self.k, self.length = k, int(values.size)
        return cast(A, (values + values.dtype.type(self.amount)).astype(values.dtype))

    def check_values(
        self, values: tuple[float, ...], project: Callable[[int, FloatArray], float]
    ) -> tuple[float, ...]:
        if self.k is None:
            return values
        lie = np.full(self.length, self.amount, np.float32)
        shifted = list(values)
        shifted[self.k] += self.scale * project(self.k, lie)
        self.published = tuple(shifted)
        return self.published


@dataclass
class Censor(SliceFaults):
    """Claims, in every slice it reduces, that it could not fetch ``victim``'s slice."""

    victim: str

    def missing(self, k: int, missing: set[str]) -> set[str]:
        return missing | {self.victim}
