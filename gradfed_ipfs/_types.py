"""Input unions accepted across the public API, named once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
from multiformats import CID
from numpy.typing import NDArray

__all__ = ["CIDLike", "FloatArray", "GradientLike"]

CIDLike: TypeAlias = CID | str | bytes
"""A CID object, its string form (``bafk…``/``Qm…``) or its binary form."""

FloatArray: TypeAlias = NDArray[np.float32]
"""A float32 NumPy array; gradients are float32, flattened row-major where 1-D."""

GradientLike: TypeAlias = NDArray[np.floating] | Sequence[float]
"""Anything that converts to a float32 vector: a NumPy array or a sequence of floats."""
