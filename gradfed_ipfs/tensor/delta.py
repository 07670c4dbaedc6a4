"""The per-model ``GradientDelta``: named layer gradients against a base model CID (seed §4.4)."""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Sequence
from typing import Final

from multiformats import CID

from .._types import CIDLike, FloatArray, GradientLike
from ..cid import parse_cid
from ..errors import ChecksumFailed, InvalidGradient
from .types import DenseGradient, LayerGradient, QuantizedGradient, SparseGradient, _len_prefixed

__all__ = ["GradientDelta"]

_CHECKSUM_DOMAIN: Final = b"gradfed-ipfs/gradient-delta/v1\x00"


class GradientDelta:
    """Per-layer gradients relative to a base model, with a SHA-256 checksum (seed §4.4).

    The checksum is SHA-256 (hex) over a canonical encoding: a domain tag, the base CID's
    bytes, the layer count, then for each layer in sorted-name order its UTF-8 name, kind,
    shape and *all* payload bytes (little-endian), every field length-prefixed. The timestamp
    is not covered, so equal content has an equal checksum.

    Parameters
    ----------
    base_model
        CID of the model the delta applies to.
    timestamp
        Unix seconds (UTC); defaults to now.
    """

    def __init__(self, base_model: CIDLike, timestamp: int | None = None) -> None:
        self.base_model: CID = parse_cid(base_model)
        self.layer_gradients: dict[str, LayerGradient] = {}
        self.timestamp: int = int(time.time()) if timestamp is None else int(timestamp)
        self.checksum: str = self.compute_checksum()

    def __repr__(self) -> str:
        return (
            f"GradientDelta(base_model={self.base_model}, layers={sorted(self.layer_gradients)}, "
            f"checksum={self.checksum[:16]}…)"
        )

    def add_layer(self, layer_name: str, gradient: LayerGradient) -> None:
        """Insert or replace a layer of any representation and recompute the checksum."""
        if not isinstance(gradient, LayerGradient):
            raise InvalidGradient(f"not a LayerGradient: {type(gradient).__name__}")
        self.layer_gradients[layer_name] = gradient
        self.checksum = self.compute_checksum()

    def add_dense_gradient(
        self, layer_name: str, values: GradientLike, shape: Sequence[int] | None = None
    ) -> None:
        """Insert or replace a dense layer (``ShapeMismatch`` if the shape does not fit)."""
        self.add_layer(layer_name, DenseGradient(values, shape))

    def add_sparse_gradient(self, layer_name: str, gradient: SparseGradient) -> None:
        """Insert or replace a sparse layer."""
        self.add_layer(layer_name, gradient)

    def add_quantized_gradient(self, layer_name: str, gradient: QuantizedGradient) -> None:
        """Insert or replace a quantized layer."""
        self.add_layer(layer_name, gradient)

    def compute_checksum(self) -> str:
        """Return the SHA-256 hex digest of the canonical encoding (see the class docstring)."""
        digest = hashlib.sha256(_CHECKSUM_DOMAIN)
        digest.update(_len_prefixed(bytes(self.base_model)))
        digest.update(struct.pack("<Q", len(self.layer_gradients)))
        for name in sorted(self.layer_gradients):
            layer = self.layer_gradients[name]
            digest.update(_len_prefixed(name.encode("utf-8")))
            digest.update(_len_prefixed(layer.kind.encode("ascii")))
            digest.update(struct.pack(f"<Q{len(layer.shape)}Q", len(layer.shape), *layer.shape))
            for part in layer.payload_parts():
                digest.update(part)
        return digest.hexdigest()

    def verify_checksum(self) -> None:
        """Recompute the checksum and compare.

        Raises
        ------
        ChecksumFailed
            If the content no longer matches :attr:`checksum`.
        """
        if self.compute_checksum() != self.checksum:
            raise ChecksumFailed()

    def total_memory_size(self) -> int:
        """Return the sum of the layers' :meth:`LayerGradient.memory_size` in bytes."""
        return sum(layer.memory_size() for layer in self.layer_gradients.values())

    def dense_layer(self, layer_name: str) -> FloatArray:
        """Return a layer's dense values reshaped to its shape (``KeyError`` if absent)."""
        layer = self.layer_gradients[layer_name]
        return layer.to_dense().reshape(layer.shape)
