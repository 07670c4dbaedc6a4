"""Rust's ``Display`` of floats, for the messages the seed crate formats with ``{}``.

The crate's errors print floats the Rust way: the shortest digits that read back to the same
``f32`` (or ``f64``), never in exponent notation, no trailing ``.0``, and ``NaN``/``inf``/
``-inf``. So ``1.0`` prints ``1``, ``float32(4/3)`` prints ``1.3333334``, ``1e-7`` prints
``0.0000001`` and ``1e20`` prints ``100000000000000000000``. When two shortest candidates are
equally close (``float32(-288948.625)``), Rust takes the one further from zero
(``-288948.63``) where NumPy and Python round half to even. This module is the one place that
formats floats the Rust way; ``tests/seed/test_crate_oracle.py`` checks it against Rust itself.
"""

from __future__ import annotations

import math
from decimal import ROUND_FLOOR, Decimal, localcontext
from typing import Literal

import numpy as np

__all__ = ["rust_display"]


def rust_display(value: float, bits: Literal[32, 64] = 64) -> str:
    """Format ``value`` as Rust's ``format!("{}", value)`` does for ``f32`` or ``f64``.

    Parameters
    ----------
    value
        The number; for ``bits=32`` it is first rounded to float32, as the crate holds it.
    bits
        32 for an ``f32`` field, 64 for an ``f64`` one.

    Returns
    -------
    str
        For example ``"NaN"``, ``"-inf"``, ``"-0"``, ``"10"``, ``"1.3333334"``.
    """
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    number: np.float32 | np.float64 = np.float32(value) if bits == 32 else np.float64(value)
    sign = "-" if math.copysign(1.0, float(number)) < 0 else ""
    if number == 0:
        return sign + "0"
    digits = _shortest(np.abs(number))
    return sign + format(digits, "f")


def _shortest(number: np.float32 | np.float64) -> Decimal:
    """Return the shortest decimal reading back as ``number`` (> 0); closest, ties upward."""
    with localcontext() as context, np.errstate(over="ignore"):
        context.prec = 800  # exact for every float64 and for midpoints between them
        exact = Decimal(float(number))
        below = Decimal(float(np.nextafter(number, number.dtype.type(0))))
        above_value = np.nextafter(number, number.dtype.type(np.inf))
        above = Decimal(float(above_value)) if np.isfinite(above_value) else 2 * exact - below
        low, high = (exact + below) / 2, (exact + above) / 2
        # Parsing rounds half to even: a midpoint reads back as ``number`` iff its mantissa is even.
        even = int(number.view(np.uint32 if number.dtype == np.float32 else np.uint64)) % 2 == 0

        def reads_back(candidate: Decimal) -> bool:
            if even:
                return low <= candidate <= high
            return low < candidate < high

        for precision in range(1, 18):
            quantum = Decimal(10) ** (exact.adjusted() - precision + 1)
            down = (exact / quantum).to_integral_value(rounding=ROUND_FLOOR) * quantum
            candidates = [c for c in (down, down + quantum) if c > 0 and reads_back(c)]
            if candidates:
                best = min(candidates, key=lambda c: (abs(c - exact), -c))
                return best.normalize()
        return exact.normalize()  # pragma: no cover - 17 digits always read back
