"""The seed's ``GARW`` gradient block (seed-api §8.7): a small little-endian binary format.

Despite the seed's method names (``to_arrow_bytes``), this is *not* Arrow. It is kept for
compatibility with peers that speak the seed's format. The layout, all integers ``u32`` LE::

    offset  size          field
    0       4             magic b"GARW"
    4       4             shape_len
    8       4*shape_len   dims
    ..      4             values_len
    ..      4*values_len  values (f32 LE)
    ..      4             num_samples

``cid`` and ``layer_name`` are not serialized. Trailing bytes are ignored, as in the seed.

The seed's identifier :meth:`GradientArrowBlock.compute_cid` (``grad-`` + FNV-1a-64 hex) is not
a CID: FNV is not collision resistant and the layer name is not hashed. :meth:`real_cid` and
:meth:`to_block` give the real CIDv1 (raw, sha2-256) of the same bytes, which Kubo agrees with.

Decoding treats the input as untrusted: every length field is checked against the bytes that
remain *before* anything is allocated, so a lying header raises
:class:`~gradfed_ipfs.errors.TruncatedData` instead of allocating gigabytes.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
from multiformats import CID

from .._types import FloatArray, GradientLike
from ..cid import make_cid
from ..errors import (
    ArrowBlockError,
    ArrowBlockShapeMismatch,
    EmptyInput,
    InvalidMagic,
    TruncatedData,
)
from ..storage.base import Block
from ..tensor.aggregation import as_float32_vector

__all__ = [
    "GARW_MAGIC",
    "GradientArrowBlock",
    "fnv1a_64",
]

GARW_MAGIC: Final = b"GARW"
"""The four magic bytes that open every GARW block."""

_FNV_OFFSET: Final = 14695981039346656037
_FNV_PRIME: Final = 1099511628211
_MASK64: Final = (1 << 64) - 1
_U32_MAX: Final = 0xFFFFFFFF
_LE_F32: Final = np.dtype("<f4")
_LE_U32: Final = np.dtype("<u4")


def fnv1a_64(data: bytes | bytearray | memoryview) -> int:
    """Return the 64-bit FNV-1a hash of ``data`` (offset 14695981039346656037, prime 2^40+435).

    Parameters
    ----------
    data
        The bytes to hash.
    """
    h = _FNV_OFFSET
    for byte in bytes(data):
        h = ((h ^ byte) * _FNV_PRIME) & _MASK64
    return h


def _u32(value: int, what: str) -> bytes:
    if not 0 <= value <= _U32_MAX:
        raise ArrowBlockError(f"{what} {value} does not fit the GARW u32 field")
    return struct.pack("<I", value)


@dataclass(eq=False)
class GradientArrowBlock:
    """One layer's gradient in the seed's ``GARW`` format.

    Attributes
    ----------
    cid
        The block's identifier; by default the seed's ``grad-…`` id (see :meth:`compute_cid`).
    layer_name
        The layer this gradient belongs to (not serialized).
    shape
        The tensor's dimensions.
    values
        Flat float32 gradient values.
    num_samples
        Training samples behind the gradient (the FedAvg weight).
    """

    cid: str
    layer_name: str
    shape: list[int]
    values: FloatArray = field(repr=False)
    num_samples: int

    def __post_init__(self) -> None:
        self.values = as_float32_vector(self.values)
        self.shape = [int(d) for d in self.shape]

    @classmethod
    def new(
        cls,
        layer_name: str,
        values: GradientLike,
        num_samples: int,
        shape: Sequence[int] | None = None,
    ) -> GradientArrowBlock:
        """Build a block whose ``cid`` is :meth:`compute_cid` of its content.

        Parameters
        ----------
        layer_name
            The layer name.
        values
            The gradient; flattened to float32.
        num_samples
            The sample count (FedAvg weight), ``0 … 2**32-1``.
        shape
            The tensor shape; defaults to ``[len(values)]``. Its element count must match.

        Raises
        ------
        ArrowBlockShapeMismatch
            If ``prod(shape)`` differs from the number of values.
        """
        flat = as_float32_vector(values)
        dims = [flat.size] if shape is None else [int(d) for d in shape]
        if math.prod(dims) != flat.size:
            raise ArrowBlockShapeMismatch(
                f"Shape mismatch: shape {dims} holds {math.prod(dims)} values, got {flat.size}"
            )
        return cls(cls.compute_cid(layer_name, flat, num_samples), layer_name, dims, flat,
                   num_samples)  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GradientArrowBlock):
            return NotImplemented
        return (
            self.cid == other.cid
            and self.layer_name == other.layer_name
            and self.shape == other.shape
            and self.num_samples == other.num_samples
            and np.array_equal(self.values, other.values)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by content

    # ------------------------------------------------------------------ encoding

    def to_arrow_bytes(self) -> bytes:
        """Encode as GARW bytes (the seed's name; the format is not Arrow).

        Raises
        ------
        ArrowBlockError
            If a dimension, the value count or ``num_samples`` does not fit a ``u32`` (the seed
            silently truncated them).
        """
        parts = [GARW_MAGIC, _u32(len(self.shape), "shape length")]
        parts.extend(_u32(d, "dimension") for d in self.shape)
        parts.append(_u32(self.values.size, "value count"))
        parts.append(self.values.astype(_LE_F32, copy=False).tobytes())
        parts.append(_u32(self.num_samples, "num_samples"))
        return b"".join(parts)

    to_bytes = to_arrow_bytes

    @classmethod
    def from_arrow_bytes(
        cls,
        cid: str,
        layer_name: str,
        data: bytes | bytearray | memoryview,
        *,
        strict: bool = False,
    ) -> GradientArrowBlock:
        """Decode GARW bytes; ``cid`` and ``layer_name`` come from the arguments.

        Parameters
        ----------
        cid
            Identifier to attach (not checked against the bytes; see :meth:`verify_cid`).
        layer_name
            Layer name to attach.
        data
            Untrusted GARW bytes; trailing bytes are ignored.
        strict
            Also require ``prod(shape) == values_len`` (the seed does not check it).

        Raises
        ------
        TruncatedData
            If the input ends before a field the header promises (including fewer than four
            bytes, as in the seed).
        InvalidMagic
            If the first four bytes are not ``GARW``.
        ArrowBlockShapeMismatch
            With ``strict``, if the shape does not hold the values.
        """
        view = memoryview(data).cast("B")
        total = len(view)
        if total < 4:
            raise TruncatedData("Truncated data in Arrow block: fewer than 4 bytes")
        if bytes(view[:4]) != GARW_MAGIC:
            raise InvalidMagic("Invalid magic bytes in Arrow block")
        offset = 4

        def read_u32_array(count: int, what: str) -> tuple[list[int], int]:
            end = offset + 4 * count
            if end > total:
                raise TruncatedData(
                    f"Truncated data in Arrow block: {what} needs {4 * count} bytes at offset "
                    f"{offset}, only {total - offset} remain"
                )
            return np.frombuffer(view, dtype=_LE_U32, count=count, offset=offset).tolist(), end

        (shape_len,), offset = read_u32_array(1, "shape length")
        shape, offset = read_u32_array(shape_len, "shape")
        (values_len,), offset = read_u32_array(1, "value count")
        end = offset + 4 * values_len
        if end > total:
            raise TruncatedData(
                f"Truncated data in Arrow block: {values_len} values need {4 * values_len} "
                f"bytes at offset {offset}, only {total - offset} remain"
            )
        values = np.frombuffer(view, dtype=_LE_F32, count=values_len, offset=offset)
        offset = end
        (num_samples,), offset = read_u32_array(1, "num_samples")
        if strict and math.prod(shape) != values_len:
            raise ArrowBlockShapeMismatch(
                f"Shape mismatch: shape {shape} holds {math.prod(shape)} values, got {values_len}"
            )
        return cls(cid, layer_name, shape, values.astype(np.float32), num_samples)

    from_bytes = from_arrow_bytes

    # ------------------------------------------------------------------ identifiers

    @staticmethod
    def compute_cid(layer_name: str, values: GradientLike, num_samples: int) -> str:
        """Return the seed's id: ``"grad-"`` + 16 hex digits of FNV-1a-64 over GARW bytes.

        The bytes are those of ``{shape: [len(values)], values, num_samples}``. ``layer_name``
        does not influence the result (as in the seed), and this is not a CID; use
        :meth:`real_cid` for content addressing.

        Parameters
        ----------
        layer_name
            Accepted for compatibility; ignored.
        values
            The gradient values.
        num_samples
            The sample count.
        """
        del layer_name  # the seed does not hash it
        flat = as_float32_vector(values)
        data = GradientArrowBlock("", "", [flat.size], flat, num_samples).to_arrow_bytes()
        return f"grad-{fnv1a_64(data):016x}"

    def seed_cid(self) -> str:
        """Return :meth:`compute_cid` of this block's values and sample count."""
        return self.compute_cid(self.layer_name, self.values, self.num_samples)

    def verify_cid(self) -> bool:
        """Return whether :attr:`cid` equals the seed id of the content (:meth:`seed_cid`)."""
        return self.cid == self.seed_cid()

    def real_cid(self) -> CID:
        """Return the CIDv1 (raw codec, sha2-256) of :meth:`to_arrow_bytes`."""
        return make_cid(self.to_arrow_bytes(), "raw")

    def to_block(self) -> Block:
        """Return the GARW bytes as a raw :class:`~gradfed_ipfs.storage.base.Block`."""
        return Block.new(self.to_arrow_bytes(), "raw")

    # ------------------------------------------------------------------ aggregation

    @staticmethod
    def fedavg(blocks: Sequence[GradientArrowBlock]) -> FloatArray:
        """Sample-weighted federated average of the blocks' values.

        ``avg = Σ_b v_b · n_b / Σ n_b``, accumulated in float64 in list order; when every
        ``num_samples`` is zero, the unweighted mean.

        Parameters
        ----------
        blocks
            The blocks; all must have the first block's shape and value count.

        Raises
        ------
        EmptyInput
            If ``blocks`` is empty ("No gradient blocks provided").
        ArrowBlockShapeMismatch
            If a block's shape or value count differs from the first's. (The seed zipped
            shorter value lists silently; we refuse them.)
        """
        if not blocks:
            raise EmptyInput("No gradient blocks provided")
        first = blocks[0]
        for block in blocks[1:]:
            if block.shape != first.shape or block.values.size != first.values.size:
                message = f"Shape mismatch: expected {first.shape}, got {block.shape}"
                if block.shape == first.shape:
                    message += f": {block.values.size} values, the first block has "
                    message += f"{first.values.size}"
                raise ArrowBlockShapeMismatch(message)
        total = sum(b.num_samples for b in blocks)
        weights = (
            [1.0 / len(blocks)] * len(blocks)
            if total == 0
            else [b.num_samples / total for b in blocks]
        )
        result = np.zeros(first.values.size, dtype=np.float64)
        for block, weight in zip(blocks, weights, strict=True):
            result += block.values.astype(np.float64) * weight
        return result.astype(np.float32)
