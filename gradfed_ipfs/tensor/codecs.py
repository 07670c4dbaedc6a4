"""Gradient codecs: top-k, threshold, random-k, int8/int4 and error feedback (pure NumPy).

:class:`Codec` objects (``codec_id``, ``encode``, ``decode``, ``estimated_ratio``,
``error_bound``) are registered in :data:`CODECS` by id; the registry is checked at import.
:class:`ErrorFeedback` wraps any codec and keeps a residual per stream (peer), so what a round
does not send is added to the next one (Seide et al., 2014; Karimireddy et al., 2019,
https://arxiv.org/abs/1901.09847). The sparsification math is the seed's
:class:`~gradfed_ipfs.tensor.compression.GradientCompressor`.

Codecs are stateless except :class:`RandomK`, whose explicit ``np.random.Generator`` is the
only source of randomness (seeded by default).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final

import numpy as np

from .._types import FloatArray, GradientLike
from ..errors import ConfigError, InvalidCompressionRatio, InvalidGradient, ShapeMismatch
from .compression import (
    _EPS32,
    GradientCompressor,
    _dims,
    _flat,
    _float_tolerance,
    top_k_indices,
)
from .packing import (
    DEFAULT_PACK_BLOCK,
    PackedChunk,
    PackSpec,
    keep_count,
    pack_chunks,
)
from .types import (
    DenseGradient,
    LayerGradient,
    QuantizedGradient,
    SparseGradient,
    SparseQuantizedGradient,
)

__all__ = [
    "CODECS",
    "Codec",
    "Dense",
    "ErrorFeedback",
    "Int2",
    "Int4",
    "Int8",
    "QuantizedCodec",
    "RandomK",
    "Threshold",
    "TopK",
    "TopKInt2",
    "TopKInt8",
]


class Codec(ABC):
    """A gradient codec: settings plus ``encode``/``decode`` (hivemind's ``CompressionBase``).

    ``decode(encode(x))`` approximates ``x`` within :meth:`error_bound` element-wise.
    """

    codec_id: ClassVar[str]

    @abstractmethod
    def encode(self, values: GradientLike, shape: Sequence[int] | None = None) -> LayerGradient:
        """Compress a gradient.

        Parameters
        ----------
        values
            Gradient values of any shape (flattened row-major).
        shape
            Dense shape recorded on the result (default ``[len(values)]``).

        Returns
        -------
        LayerGradient
            The compressed representation (storable with ``store_layer_as_arrow``).
        """

    def decode(self, payload: LayerGradient) -> FloatArray:
        """Return the flat float32 dense approximation of ``payload``."""
        return payload.to_dense()

    @abstractmethod
    def estimated_ratio(self, size: int) -> float:
        """Return dense bytes / encoded payload bytes for ``size`` float32 values.

        Answers without compressing; for data-dependent codecs it is the worst case.
        """

    @abstractmethod
    def error_bound(self, values: GradientLike) -> float:
        """Return a bound on ``max |decode(encode(values)) - values|`` (incl. float32 slack)."""

    def packing(self, exact_tail: int = 0) -> PackSpec:
        """Return this codec's encoding in agreed rounds (:mod:`~gradfed_ipfs.tensor.packing`).

        Raises
        ------
        ConfigError
            If the codec has no packed form (``Dense``, ``Threshold``, ``RandomK``).
        """
        return PackSpec(self.codec_id, getattr(self, "block", DEFAULT_PACK_BLOCK), exact_tail)

    def pack(
        self, values: FloatArray, ranges: list[tuple[int, int]], exact_tail: int = 0
    ) -> list[PackedChunk]:
        """Encode ``values`` for an agreed round: one chunk per ``(offset, length)`` range."""
        return pack_chunks(self.packing(exact_tail), values, ranges)


@dataclass(frozen=True)
class Dense(Codec):
    """No compression. Error bound: 0 (exact)."""

    codec_id: ClassVar[str] = "dense"

    def encode(self, values: GradientLike, shape: Sequence[int] | None = None) -> DenseGradient:
        """Wrap the values unchanged."""
        flat = _flat(values)
        return DenseGradient(flat, _dims(flat, shape))

    def estimated_ratio(self, size: int) -> float:
        """Return 1.0."""
        return 1.0

    def error_bound(self, values: GradientLike) -> float:
        """Return 0.0."""
        return 0.0


def _kth_dropped_magnitude(values: FloatArray, k: int) -> float:
    """Return the largest magnitude that top-k drops (0 when nothing is dropped)."""
    if k >= values.size:
        return 0.0
    magnitude = np.abs(values)
    return float(np.partition(magnitude, values.size - k - 1)[values.size - k - 1])


@dataclass(frozen=True)
class TopK(Codec):
    """Keep the ``k`` (or ``ceil(ratio·n)``) largest magnitudes.

    Error bound: the largest dropped magnitude, i.e. the (k+1)-th largest ``|v|``; kept entries
    are exact. Encoded as ``index`` + ``value`` (8 bytes per kept entry).

    Parameters
    ----------
    ratio
        Fraction of entries to keep, in ``(0, 1]`` (used when ``k`` is ``None``).
    k
        Fixed number of entries to keep (at most n).
    """

    codec_id: ClassVar[str] = "topk"

    ratio: float = 0.01
    k: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio <= 1.0:
            raise InvalidCompressionRatio(self.ratio)
        if self.k is not None and self.k <= 0:
            raise InvalidCompressionRatio(0.0)

    def encode(self, values: GradientLike, shape: Sequence[int] | None = None) -> SparseGradient:
        """Top-k sparsify (empty input gives an empty sparse gradient)."""
        flat = _flat(values)
        k = keep_count(self.ratio, self.k, flat.size)
        if k == 0:
            return SparseGradient([], [], _dims(flat, shape))
        return GradientCompressor.top_k(flat, shape, k)

    def estimated_ratio(self, size: int) -> float:
        """Return ``4n / 8k``."""
        k = keep_count(self.ratio, self.k, size)
        return 4 * size / (8 * k) if k else 1.0

    def error_bound(self, values: GradientLike) -> float:
        """Return the (k+1)-th largest magnitude."""
        flat = _flat(values)
        return _kth_dropped_magnitude(flat, keep_count(self.ratio, self.k, flat.size))

    def pack(
        self, values: FloatArray, ranges: list[tuple[int, int]], exact_tail: int = 0
    ) -> list[PackedChunk]:
        """Keep the top-k of the lossy part (before the exact tail), values as float32."""
        keep = keep_count(self.ratio, self.k, max(0, values.size - exact_tail))
        return pack_chunks(self.packing(exact_tail), values, ranges, keep=keep)


@dataclass(frozen=True)
class Threshold(Codec):
    """Keep entries with ``|v| >= threshold``.

    Error bound: ``threshold`` (dropped entries are strictly smaller; kept ones are exact).

    Parameters
    ----------
    threshold
        Magnitude cut-off, ``>= 0``.
    """

    codec_id: ClassVar[str] = "threshold"

    threshold: float = 1e-3

    def __post_init__(self) -> None:
        if not (math.isfinite(self.threshold) and self.threshold >= 0):
            raise ConfigError(f"threshold must be finite and >= 0, got {self.threshold}")

    def encode(self, values: GradientLike, shape: Sequence[int] | None = None) -> SparseGradient:
        """Threshold sparsify."""
        return GradientCompressor.threshold(values, shape, self.threshold)

    def estimated_ratio(self, size: int) -> float:
        """Return 0.5, the worst case (every entry kept costs 8 bytes)."""
        return 0.5

    def error_bound(self, values: GradientLike) -> float:
        """Return ``threshold``."""
        return float(self.threshold)


@dataclass(frozen=True)
class RandomK(Codec):
    """Unbiased random sparsification, exactly ``k = max(1, round(ratio·n))`` entries.

    Error bound: ``max|v| · max(1, n/k - 1)`` (dropped entries lose ``|v|``, kept ones gain
    ``|v|·(n/k - 1)``); unbiased in expectation. The codec owns its generator (seeded with 0 by
    default), so successive calls draw different subsets reproducibly.

    Parameters
    ----------
    ratio
        Fraction of entries to keep, in ``(0, 1]``.
    rng
        The random generator, advanced on every call.
    """

    codec_id: ClassVar[str] = "randomk"

    ratio: float = 0.01
    rng: np.random.Generator = field(
        default_factory=lambda: np.random.default_rng(0), compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio <= 1.0:
            raise InvalidCompressionRatio(self.ratio)

    def encode(self, values: GradientLike, shape: Sequence[int] | None = None) -> SparseGradient:
        """Draw exactly k entries and rescale them by ``n/k``."""
        return GradientCompressor.random_sparsification(
            values, shape, self.ratio, self.rng, exact=True
        )

    def estimated_ratio(self, size: int) -> float:
        """Return ``4n / 8k``."""
        k = min(size, max(1, round(self.ratio * size))) if size else 0
        return 4 * size / (8 * k) if k else 1.0

    def error_bound(self, values: GradientLike) -> float:
        """Return ``max|v| · max(1, n/k - 1)`` plus float slack."""
        flat = _flat(values)
        if flat.size == 0:
            return 0.0
        k = min(flat.size, max(1, round(self.ratio * flat.size)))
        peak = float(np.max(np.abs(flat)))
        return peak * max(1.0, flat.size / k - 1.0) * (1 + 4 * _EPS32)


@dataclass(frozen=True)
class QuantizedCodec(Codec):
    """Min/max affine quantization to ``bits`` bits; subclasses fix ``bits``.

    Error bound: ``scale/2`` with ``scale = (max - min)/(2**bits - 1)``, plus float32 slack
    (without clipping).

    In agreed rounds (:meth:`pack`) the values are quantized symmetrically instead, one absmax
    scale per ``block`` values (:mod:`~gradfed_ipfs.tensor.packing`).

    Parameters
    ----------
    block
        Agreed rounds: values per float32 scale (1 … 2**24).
    clip_sigmas
        Clip values to ``mean ± clip_sigmas·std`` before quantizing (per block in agreed
        rounds, over the whole gradient in :meth:`encode`), as INTELLECT-1 does; ``None``: no
        clipping (absmax). Clipped values are not sent: error feedback carries them.
    """

    codec_id: ClassVar[str] = "quantized"
    bits: ClassVar[int] = 8

    block: int = DEFAULT_PACK_BLOCK
    clip_sigmas: float | None = None

    def __post_init__(self) -> None:
        if self.clip_sigmas is not None and not (
            math.isfinite(self.clip_sigmas) and self.clip_sigmas > 0
        ):
            raise ConfigError(f"clip_sigmas must be finite and > 0, got {self.clip_sigmas}")
        if not 1 <= self.block <= 1 << 24:
            raise ConfigError(f"block must be in 1..{1 << 24}, got {self.block}")

    def _clip(self, values: GradientLike) -> FloatArray:
        flat = _flat(values)
        if self.clip_sigmas is None or flat.size == 0:
            return flat
        wide = flat.astype(np.float64)
        mean, std = wide.mean(), wide.std()
        return np.clip(wide, mean - self.clip_sigmas * std, mean + self.clip_sigmas * std).astype(
            np.float32
        )

    def encode(self, values: GradientLike, shape: Sequence[int] | None = None) -> QuantizedGradient:
        """Quantize with the seed's formula at :attr:`bits` bits (after clipping, if set)."""
        return GradientCompressor.quantize(self._clip(values), shape, self.bits)

    def pack(
        self, values: FloatArray, ranges: list[tuple[int, int]], exact_tail: int = 0
    ) -> list[PackedChunk]:
        """Quantize per ``block`` values (absmax, after ``clip_sigmas`` clipping if set)."""
        spec = self.packing(exact_tail)
        return pack_chunks(spec, values, ranges, clip_sigmas=self.clip_sigmas)

    def estimated_ratio(self, size: int) -> float:
        """Return ``4n / (payload + 8)``."""
        payload = size if self.bits == 8 else (size + 1) // 2
        return 4 * size / (payload + 8)

    def error_bound(self, values: GradientLike) -> float:
        """Return ``scale/2`` plus float32 slack."""
        flat = _flat(values)
        if flat.size == 0:
            return 0.0
        span = float(np.float32(flat.max()) - np.float32(flat.min()))
        scale = 1.0 if abs(span) < 1e-8 else span / (2**self.bits - 1)
        return (scale / 2 if span >= 1e-8 else span) + _float_tolerance(flat)


@dataclass(frozen=True)
class Int8(QuantizedCodec):
    """int8 quantization (256 levels, the seed's formula). Error bound ``(max - min)/510``."""

    codec_id: ClassVar[str] = "int8"
    bits: ClassVar[int] = 8


@dataclass(frozen=True)
class Int4(QuantizedCodec):
    """int4 quantization (16 levels, two per byte). Error bound ``(max - min)/30``."""

    codec_id: ClassVar[str] = "int4"
    bits: ClassVar[int] = 4


def _two_bit(values: FloatArray) -> QuantizedGradient:
    """Affine min/max quantization to 4 levels, held in an int4 :class:`QuantizedGradient`.

    ``scale = (max - min)/3`` (1.0 when below 1e-8), ``q = rint((v - min)/scale)`` in 0..3,
    stored as ``q - 8`` so that the int4 dequantization ``(q + 8)·scale + min`` reads it.
    """
    if values.size == 0:
        return QuantizedGradient([], 1.0, 0.0, [0], bits=4)
    if not np.isfinite(values).all():
        raise InvalidGradient("cannot quantize non-finite values")
    lo = np.float32(values.min())
    span = np.float32(values.max()) - lo
    scale = np.float32(1.0) if abs(span) < 1e-8 else np.float32(span / np.float32(3))
    q = np.clip(np.rint((values - lo) / scale), 0, 3).astype(np.int8) - np.int8(8)
    return QuantizedGradient(q, float(scale), float(lo), [values.size], bits=4)


@dataclass(frozen=True)
class Int2(QuantizedCodec):
    """2-bit quantization (4 levels). Error bound ``(max - min)/6``.

    Agreed rounds pack four values per byte (:meth:`pack`); :meth:`encode` (the best-effort
    round's representation) holds the 4 levels in an int4 payload, two values per byte.
    """

    codec_id: ClassVar[str] = "int2"
    bits: ClassVar[int] = 2

    def encode(self, values: GradientLike, shape: Sequence[int] | None = None) -> QuantizedGradient:
        """Quantize to 4 affine levels (after clipping, if set), in an int4 payload."""
        flat = self._clip(values)
        quantized = _two_bit(flat)
        quantized.shape = tuple(_dims(flat, shape))
        return quantized


@dataclass(frozen=True)
class TopKInt8(Codec):
    """Top-k, then int8 quantization of the kept values (``index`` + ``q`` on the wire).

    Error bound: ``max(largest dropped magnitude, scale_kept/2)`` with
    ``scale_kept = (max_kept - min_kept)/255``, plus float32 slack. About 5 bytes per kept
    entry: 1% top-k is ~80x smaller than dense.

    In agreed rounds (:meth:`pack`) the kept values are quantized symmetrically, one absmax
    scale per ``block`` kept values of a chunk.

    Parameters
    ----------
    ratio
        Fraction of entries to keep, in ``(0, 1]``.
    block
        Agreed rounds: kept values per float32 scale (1 … 2**24).
    """

    codec_id: ClassVar[str] = "topk-int8"

    ratio: float = 0.01
    block: int = DEFAULT_PACK_BLOCK

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio <= 1.0:
            raise InvalidCompressionRatio(self.ratio)
        if not 1 <= self.block <= 1 << 24:
            raise ConfigError(f"block must be in 1..{1 << 24}, got {self.block}")

    def pack(
        self, values: FloatArray, ranges: list[tuple[int, int]], exact_tail: int = 0
    ) -> list[PackedChunk]:
        """Keep the top-k of the lossy part and quantize the kept values per ``block``."""
        keep = keep_count(self.ratio, None, max(0, values.size - exact_tail))
        return pack_chunks(self.packing(exact_tail), values, ranges, keep=keep)

    def encode(
        self, values: GradientLike, shape: Sequence[int] | None = None
    ) -> SparseQuantizedGradient:
        """Top-k then int8."""
        flat = _flat(values)
        k = keep_count(self.ratio, None, flat.size)
        if k == 0:
            empty = QuantizedGradient.from_dense([], [0])
            return SparseQuantizedGradient([], empty, _dims(flat, shape))
        return GradientCompressor.top_k_quantized(flat, shape, k, 8)

    def estimated_ratio(self, size: int) -> float:
        """Return ``4n / (5k + 8)``."""
        k = keep_count(self.ratio, None, size)
        return 4 * size / (5 * k + 8) if k else 1.0

    def error_bound(self, values: GradientLike) -> float:
        """Return the larger of the top-k and the int8 bounds."""
        flat = _flat(values)
        k = keep_count(self.ratio, None, flat.size)
        if k == 0:
            return 0.0
        kept = flat[top_k_indices(flat, k)]
        span = float(np.float32(kept.max()) - np.float32(kept.min()))
        quant = span / 510 if span >= 1e-8 else span
        return max(_kth_dropped_magnitude(flat, k), quant) + _float_tolerance(flat)


@dataclass(frozen=True)
class TopKInt2(TopKInt8):
    """Top-k, then 2-bit values: SparseLoCo's encoding (Sarfi et al., 2025).

    Agreed rounds send a varint delta per kept index (about 1 byte at 1-3 % density) and
    2 bits per kept value, plus a float32 scale per ``block`` kept values; use it with error
    feedback. :meth:`encode` (the best-effort representation) holds the 4 affine levels of the
    kept values in an int4 payload. Error bound: ``max(largest dropped magnitude,
    (max_kept - min_kept)/6)`` plus float32 slack.
    """

    codec_id: ClassVar[str] = "topk-int2"

    def encode(
        self, values: GradientLike, shape: Sequence[int] | None = None
    ) -> SparseQuantizedGradient:
        """Top-k, then 4 affine levels of the kept values (int4 payload)."""
        flat = _flat(values)
        k = keep_count(self.ratio, None, flat.size)
        indices = top_k_indices(flat, k)
        return SparseQuantizedGradient(indices, _two_bit(flat[indices]), _dims(flat, shape))

    def error_bound(self, values: GradientLike) -> float:
        """Return the larger of the top-k and the 2-bit bounds."""
        flat = _flat(values)
        k = keep_count(self.ratio, None, flat.size)
        if k == 0:
            return 0.0
        kept = flat[top_k_indices(flat, k)]
        span = float(np.float32(kept.max()) - np.float32(kept.min()))
        quant = span / 6 if span >= 1e-8 else span
        return max(_kth_dropped_magnitude(flat, k), quant) + _float_tolerance(flat)


class ErrorFeedback:
    """Error feedback around a codec: a residual memory per stream (peer, layer...).

    Each call sends ``codec.encode(g + decay·r)`` and keeps ``r' = (g + decay·r) - decode(sent)``.
    Over rounds with ``decay = 1``, ``Σ decode(sent_t) + r_final = Σ g_t`` up to float32
    rounding, so nothing the codec drops is lost, only delayed (Karimireddy et al., 2019,
    https://arxiv.org/abs/1901.09847). :meth:`corrected` and :meth:`keep` are the two halves,
    for callers that encode another way (an agreed round's packed contribution).

    Parameters
    ----------
    codec
        The compressing codec, e.g. ``TopK(ratio=0.01)``.
    decay
        Factor of the residual carried into the next call (1.0: all of it).
    """

    def __init__(self, codec: Codec, decay: float = 1.0) -> None:
        if not math.isfinite(decay):
            raise ConfigError(f"decay must be finite, got {decay}")
        self.codec = codec
        self.decay = float(decay)
        self._residuals: dict[str, FloatArray] = {}

    def __repr__(self) -> str:
        return f"ErrorFeedback({self.codec!r}, streams={len(self._residuals)})"

    def encode(
        self, stream_id: str, values: GradientLike, shape: Sequence[int] | None = None
    ) -> LayerGradient:
        """Compress ``values`` plus the stream's residual and update the residual.

        Raises
        ------
        ShapeMismatch
            If the length differs from this stream's earlier gradients.
        """
        corrected = self.corrected(stream_id, values)
        payload = self.codec.encode(corrected, shape)
        self.keep(stream_id, corrected, self.codec.decode(payload))
        return payload

    def corrected(self, stream_id: str, values: GradientLike) -> FloatArray:
        """Return ``values + decay·residual`` (a copy of ``values`` before the first call).

        Raises
        ------
        ShapeMismatch
            If the length differs from this stream's residual.
        """
        flat = _flat(values)
        residual = self._residuals.get(stream_id)
        if residual is None:
            return flat.copy()
        if residual.size != flat.size:
            raise ShapeMismatch([residual.size], [flat.size])
        if self.decay == 1.0:
            return flat + residual
        return flat + np.float32(self.decay) * residual

    def keep(self, stream_id: str, corrected: FloatArray, sent: FloatArray) -> None:
        """Set the stream's residual to ``corrected - sent`` (what was not sent)."""
        self._residuals[stream_id] = np.asarray(corrected - sent, np.float32)

    def residual(self, stream_id: str) -> FloatArray | None:
        """Return a copy of the stream's residual, or ``None`` before its first encode."""
        residual = self._residuals.get(stream_id)
        return None if residual is None else residual.copy()

    def reset(self, stream_id: str | None = None) -> None:
        """Forget one stream's residual, or all of them."""
        if stream_id is None:
            self._residuals.clear()
        else:
            self._residuals.pop(stream_id, None)

    @property
    def streams(self) -> list[str]:
        """Sorted ids of the streams with a residual."""
        return sorted(self._residuals)


def _build_registry(codecs: Sequence[Codec]) -> dict[str, Codec]:
    registry: dict[str, Codec] = {}
    for codec in codecs:
        if codec.codec_id in registry:
            raise RuntimeError(f"duplicate codec id {codec.codec_id!r}")
        if type(codec).__dict__.get("codec_id") != codec.codec_id:
            raise RuntimeError(f"{type(codec).__name__} does not declare its own codec_id")
        registry[codec.codec_id] = codec
    return registry


CODECS: Final[dict[str, Codec]] = _build_registry(
    (Dense(), TopK(), Threshold(), RandomK(), Int8(), Int4(), TopKInt8())
)
"""Every codec by id, with default settings; ids are unique (checked at import)."""
