"""Codecs that choose a codec: the policy is itself a :class:`~.compression.Codec`.

As hivemind's ``SizeAdaptiveCompression``: small tensors are not worth compressing (framing
overhead, accuracy), large ones are. Payloads describe themselves, so decoding needs no policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .._types import GradientLike
from ..errors import ConfigError
from .codecs import Codec, Dense, TopK
from .types import LayerGradient

__all__ = ["BySize"]


@dataclass(frozen=True)
class BySize(Codec):
    """Use ``small`` below ``threshold`` elements and ``large`` from it on.

    Error bound: that of the chosen codec.

    Parameters
    ----------
    threshold
        Element count from which ``large`` is used, ``>= 0``.
    small
        Codec for tensors of fewer than ``threshold`` elements (default :class:`Dense`).
    large
        Codec for the others (default ``TopK(ratio=0.01)``).
    """

    codec_id: ClassVar[str] = "by-size"

    threshold: int = 65_536
    small: Codec = field(default_factory=Dense)
    large: Codec = field(default_factory=lambda: TopK(ratio=0.01))

    def __post_init__(self) -> None:
        if self.threshold < 0:
            raise ConfigError(f"threshold must be >= 0, got {self.threshold}")
        if not (isinstance(self.small, Codec) and isinstance(self.large, Codec)):
            raise ConfigError("small and large must be codecs")

    def choose(self, size: int) -> Codec:
        """Return the codec used for a tensor of ``size`` elements."""
        return self.small if size < self.threshold else self.large

    def encode(self, values: GradientLike, shape: Sequence[int] | None = None) -> LayerGradient:
        """Encode with the codec chosen for ``values``' size."""
        flat = np.asarray(values, dtype=np.float32).reshape(-1)
        return self.choose(flat.size).encode(flat, shape)

    def estimated_ratio(self, size: int) -> float:
        """Return the chosen codec's estimate."""
        return self.choose(size).estimated_ratio(size)

    def error_bound(self, values: GradientLike) -> float:
        """Return the chosen codec's bound."""
        flat = np.asarray(values, dtype=np.float32).reshape(-1)
        return self.choose(flat.size).error_bound(flat)
