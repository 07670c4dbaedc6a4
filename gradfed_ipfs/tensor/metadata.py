"""Tensor descriptors of the seed (seed-api §4.0): element types and tensor metadata."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import numpy as np

__all__ = ["TensorDtype", "TensorMetadata"]


class TensorDtype(enum.Enum):
    """Element types of tensors (seed §4.0); the value is the lower-case display name."""

    FLOAT32 = "float32"
    FLOAT64 = "float64"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"

    @property
    def element_size(self) -> int:
        """Bytes per element (4, 8, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2 in declaration order)."""
        return _ELEMENT_SIZES[self]

    @property
    def numpy_dtype(self) -> np.dtype[np.generic]:
        """The NumPy storage dtype (``bfloat16`` is stored as ``uint16``, as in Arrow)."""
        if self is TensorDtype.BFLOAT16:
            return np.dtype(np.uint16)
        dtype: np.dtype[np.generic] = np.dtype(self.value)
        return dtype

    def __str__(self) -> str:
        return self.value


_ELEMENT_SIZES: Final = {
    TensorDtype.FLOAT32: 4,
    TensorDtype.FLOAT64: 8,
    TensorDtype.INT8: 1,
    TensorDtype.INT16: 2,
    TensorDtype.INT32: 4,
    TensorDtype.INT64: 8,
    TensorDtype.UINT8: 1,
    TensorDtype.UINT16: 2,
    TensorDtype.UINT32: 4,
    TensorDtype.UINT64: 8,
    TensorDtype.BFLOAT16: 2,
    TensorDtype.FLOAT16: 2,
}


@dataclass(frozen=True)
class TensorMetadata:
    """Descriptive metadata of a tensor (seed §4.0).

    Attributes
    ----------
    name
        Tensor name, e.g. ``"sparse_gradient"``.
    shape
        Dimensions, row-major.
    dtype
        Element type.
    strides
        Optional strides in elements.
    custom
        Free-form string annotations.
    """

    name: str
    shape: tuple[int, ...]
    dtype: TensorDtype = TensorDtype.FLOAT32
    strides: tuple[int, ...] | None = None
    custom: Mapping[str, str] = field(default_factory=dict)
