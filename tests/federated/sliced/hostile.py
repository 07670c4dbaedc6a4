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
    """Adds ``amount`` to every value of the first slice result or chained partial sum it
    announces (``partials``: only partial sums, or only slice results; ``None``: either), and
    shifts its own check value of that slice by the projection of its lie so that the
    projection check passes: by ``ratio / lr`` times it for a slice result, ``ratio`` for a
    partial sum (``ratio`` is ``W / w``: the roster's weight sum over its own weight)."""

    amount: float
    ratio: float
    lr: float
    partials: bool | None = None
    k: int | None = None
    length: int = 0
    scale: float = 0.0
    published: tuple[float, ...] = ()
    """The check values it published (its true ones are its rows')."""

    def alter(self, k: int, values: A) -> A:
        partial = values.dtype == np.float64
        if self.partials not in (None, partial) or self.k not in (None, k):
            return values
        if self.k is None:
            self.partials = partial
        self.k, self.length = k, int(values.size)
        self.scale = self.ratio if partial else self.ratio / self.lr
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
