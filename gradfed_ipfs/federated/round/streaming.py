"""``StreamingAccumulator``: fold each gradient into a running sum as its chunks arrive.

The seed's accumulator (and :class:`~gradfed_ipfs.federated.round.accumulator.
DistributedGradientAccumulator`, the default) holds every peer's gradient: N·d floats. For the
linear rules (Sum, Mean, FedAvg and WeightedMean with per-peer weights) the aggregate is
``Σ wᵢ·gᵢ / W``, so it can be folded chunk by chunk into one running float32 array of length d
while the chunks arrive. Peak extra memory is about one d-array plus the chunks in flight
(about ``concurrency`` × 2 × ``chunk_bytes`` of HTTP buffers), whatever the number of peers.
The default ``concurrency`` is therefore 2 here rather than 8: ``benchmarks/bench_swarm.py``
measured, for N = 16 and d = 10M, extra memory of 1.3 × d × 4 bytes at 2 chunks in flight,
1.8× at 4 and 2.6× at 8, with the same speed from a local daemon. Over bitswap more chunks in
flight fetch faster; raise it when memory allows.

Each chunk is verified (re-hashed against its CID) and checked for finiteness before it is
folded. If a later chunk of the same gradient fails, the chunks already folded are fetched again
(from the local daemon, which now holds them) and subtracted, so a bad peer leaves no trace in
the sum beyond float32 rounding (``(a + x) − x`` may differ from ``a`` in the last bit).

Robust rules (median, trimmed mean, Krum) need every gradient at once and are refused here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
from multiformats import CID

from ..._types import CIDLike, FloatArray, GradientLike
from ...cid import DAG_CBOR, RAW, parse_cid
from ...errors import DecodeError, DimensionMismatch, EmptyGradients, InvalidGradient
from ...storage.base import BlockStore
from ...storage.dag import (
    DEFAULT_CHUNK_BYTES,
    ChunkManifest,
    ChunkRef,
    ProgressCallback,
    fetch_chunks,
    fetch_gradient,
    fetch_manifest,
    put_gradient,
    values_per_chunk,
)
from ...tensor.aggregation import FedAvg, Mean, Sum, WeightedMean, as_float32_vector
from ...tensor.robust import clip_gradient_norm
from ...tensor.verification import check_finite
from .accumulator import LOCAL_PEER_ID
from .config import AccumulatorConfig

__all__ = ["STREAMING_CONCURRENCY", "StreamingAccumulator"]

logger = logging.getLogger("gradfed_ipfs.federated")

STREAMING_CONCURRENCY = 2
"""Default chunks in flight per gradient for :class:`StreamingAccumulator`."""


class StreamingAccumulator:
    """An accumulator that keeps one running sum instead of every peer's gradient.

    Same calls as :class:`~gradfed_ipfs.federated.round.accumulator.DistributedGradientAccumulator`
    (``commit_local``, ``add_peer_gradient``, ``aggregate``, ``is_ready``, ``peer_count``), but
    a gradient cannot be replaced once folded, and only linear rules are supported.

    Parameters
    ----------
    session_id
        The session this accumulator belongs to.
    config
        Aggregation rule (``Sum``, ``Mean``, ``FedAvg`` or ``WeightedMean`` with a mapping of
        peer ID → weight), clipping, peer limit and fetch timeout.
    local_peer_id
        Key of the local gradient (for ``WeightedMean`` weights).
    chunk_bytes
        Largest block in bytes for ``commit_local``.
    concurrency
        Chunks stored or fetched at once per gradient (default 2: each chunk in flight costs a
        few chunk sizes of transient memory).
    progress
        Called with ``(done_bytes, total_bytes)`` during each commit and fetch.
    accumulate_dtype
        dtype of the running sum: float32 (default; one d×4-byte array) or float64 (twice the
        memory, less rounding).

    Raises
    ------
    InvalidGradient
        If the rule is not linear, or ``WeightedMean`` weights are positional.
    """

    def __init__(
        self,
        session_id: str,
        config: AccumulatorConfig | None = None,
        *,
        local_peer_id: str = LOCAL_PEER_ID,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        concurrency: int = STREAMING_CONCURRENCY,
        progress: ProgressCallback | None = None,
        accumulate_dtype: type[np.floating] = np.float32,
    ) -> None:
        self.config = config if config is not None else AccumulatorConfig()
        strategy = self.config.aggregation
        if not isinstance(strategy, Sum | Mean | FedAvg | WeightedMean):
            raise InvalidGradient(
                "streaming aggregation supports Sum, Mean, FedAvg and WeightedMean, "
                f"not {strategy!r}"
            )
        if isinstance(strategy, WeightedMean) and not isinstance(strategy.weights, Mapping):
            raise InvalidGradient("streaming WeightedMean needs weights as a peer ID → weight map")
        values_per_chunk(chunk_bytes)
        if concurrency < 1:
            raise InvalidGradient(f"concurrency must be >= 1, got {concurrency}")
        self._session_id = session_id
        self.local_peer_id = local_peer_id
        self.chunk_bytes = chunk_bytes
        self.concurrency = concurrency
        self.progress = progress
        self.accumulate_dtype = np.dtype(accumulate_dtype)
        self.total: np.ndarray | None = None
        """The running weighted sum ``Σ wᵢ·gᵢ`` (length d), allocated by the first gradient."""
        self.weight_sum = 0.0
        self.local_cid: CID | None = None
        self.local_folded = False
        self.peer_cids: dict[str, CID] = {}
        self.peer_samples: dict[str, int | None] = {}
        self._samples_given: bool | None = None
        self._finalized = False

    @property
    def session_id(self) -> str:
        """The session this accumulator belongs to."""
        return self._session_id

    @property
    def peer_count(self) -> int:
        """Number of peer gradients folded in (the local gradient is not counted)."""
        return len(self.peer_cids)

    @property
    def length(self) -> int | None:
        """Length d of the gradients, once the first one is folded."""
        return None if self.total is None else int(self.total.size)

    def is_ready(self, min_peers: int) -> bool:
        """Return whether at least ``min_peers`` peer gradients are folded in."""
        return len(self.peer_cids) >= min_peers

    async def commit_local(
        self, gradient: GradientLike, store: BlockStore, *, num_samples: int | None = None
    ) -> CID:
        """Store the local gradient (single block or chunked DAG), fold it in, return its CID.

        Parameters
        ----------
        gradient
            The local gradient, converted to flat float32.
        store
            Where to put it (pinned).
        num_samples
            Local samples behind it (FedAvg weight).

        Raises
        ------
        InvalidGradient
            If it has NaN/Inf values, or the local gradient was already committed.
        DimensionMismatch
            If its length differs from gradients already folded.
        """
        self._check_open()
        if self.local_folded:
            raise InvalidGradient("the local gradient was already committed and folded in")
        values = as_float32_vector(gradient)
        check_finite(values, "local gradient")
        weight = self._weight(self.local_peer_id, num_samples)
        self._check_length(values.size)
        cid = await put_gradient(
            store,
            values,
            chunk_bytes=self.chunk_bytes,
            concurrency=self.concurrency,
            progress=self.progress,
        )
        self._fold(0, values, weight)
        self.weight_sum += weight
        self.local_cid = cid
        self.local_folded = True
        return cid

    async def add_peer_gradient(
        self,
        peer_id: str,
        cid: CIDLike,
        store: BlockStore,
        *,
        num_samples: int | None = None,
    ) -> None:
        """Fetch a peer's gradient and fold it in chunk by chunk as the chunks arrive.

        Parameters
        ----------
        peer_id
            The announcing peer.
        cid
            Raw or dag-cbor CID of its gradient.
        store
            Where to fetch from.
        num_samples
            Samples behind it (FedAvg weight).

        Raises
        ------
        InvalidGradient
            If the peer was already folded in, ``max_peers`` is reached, the gradient has
            NaN/Inf values, or FedAvg sample counts are given for some gradients and not others.
        DimensionMismatch
            If its length differs (checked from the manifest, before any chunk is fetched).
        BlockNotFound, BlockCorrupt, MalformedArrow, MalformedManifest
            As :func:`gradfed_ipfs.storage.dag.fetch_gradient`; nothing stays folded in.
        """
        self._check_open()
        if peer_id == self.local_peer_id:
            raise InvalidGradient(f"peer id {peer_id!r} is the local peer's id")
        if peer_id in self.peer_cids:
            raise InvalidGradient(f"gradient of {peer_id} is already folded in; it counts once")
        if len(self.peer_cids) >= self.config.max_peers:
            raise InvalidGradient(
                f"max_peers={self.config.max_peers} reached; refusing gradient from {peer_id}"
            )
        parsed = parse_cid(cid)
        weight = self._weight(peer_id, num_samples)
        self.peer_cids[peer_id] = parsed  # reserve the slot while fetching (one peer counts once)
        try:
            if parsed.codec.code == RAW:
                values = await fetch_gradient(
                    store, parsed, timeout=self.config.timeout, expected_length=self.length
                )
                flat = values.reshape(-1)
                check_finite(flat, f"gradient of {peer_id}")
                self._check_length(flat.size)
                self._fold(0, flat, weight)
            elif parsed.codec.code == DAG_CBOR:
                await self._fold_chunked(peer_id, parsed, store, weight)
            else:
                raise DecodeError(
                    f"{parsed}: codec {parsed.codec.name} is neither raw nor dag-cbor"
                )
        except BaseException:
            del self.peer_cids[peer_id]
            raise
        self.weight_sum += weight
        self.peer_samples[peer_id] = num_samples
        logger.debug("session %s: folded %s from %s", self._session_id, parsed, peer_id)

    async def _fold_chunked(self, peer_id: str, cid: CID, store: BlockStore, weight: float) -> None:
        manifest = await fetch_manifest(store, cid, timeout=self.config.timeout)
        self._check_length(manifest.length)
        self._ensure_total(manifest.length)
        folded: list[ChunkRef] = []

        def fold(ref: ChunkRef, values: FloatArray) -> None:
            check_finite(values, f"chunk at offset {ref.offset} of {peer_id}'s gradient {cid}")
            self._fold(ref.offset, values, weight)
            folded.append(ref)

        try:
            await fetch_chunks(
                store,
                manifest,
                fold,
                concurrency=self.concurrency,
                timeout=self.config.timeout,
                progress=self.progress,
                manifest_cid=cid,
            )
        except BaseException:
            await self._unfold(store, manifest, folded, weight)
            raise

    async def _unfold(
        self, store: BlockStore, manifest: ChunkManifest, folded: list[ChunkRef], weight: float
    ) -> None:
        """Subtract the chunks of a failed gradient that were already folded in."""
        if not folded:
            return
        undo = ChunkManifest(manifest.shape, manifest.length, tuple(folded))

        def subtract(ref: ChunkRef, values: FloatArray) -> None:
            self._fold(ref.offset, values, -weight)

        logger.debug("rolling back %d folded chunks", len(folded))
        await fetch_chunks(
            store, undo, subtract, concurrency=self.concurrency, timeout=self.config.timeout
        )

    def aggregate(self) -> FloatArray:
        """Return the aggregate: the running sum, divided by the weight sum except for Sum.

        Returns
        -------
        FloatArray
            A new float32 array of length d (clipped when ``config.gradient_clipping`` is set).

        Raises
        ------
        EmptyGradients
            If no local gradient was committed.
        InvalidGradient
            If the weights sum to zero.
        """
        if not self.local_folded or self.total is None:
            raise EmptyGradients()
        if self._finalized:
            return self.total.astype(np.float32, copy=True)
        if isinstance(self.config.aggregation, Sum):
            result = self.total.astype(np.float32, copy=True)
        else:
            if self.weight_sum == 0.0:
                raise InvalidGradient("Sum of weights is zero")
            result = (self.total / self.accumulate_dtype.type(self.weight_sum)).astype(
                np.float32, copy=False
            )
        if self.config.gradient_clipping is not None:
            clip_gradient_norm(result, self.config.gradient_clipping)
        return result

    def finalize(self) -> FloatArray:
        """Like :meth:`aggregate` but in place: no second d-array; the accumulator is then done.

        Returns
        -------
        FloatArray
            The aggregate (float32 of length d); for a float32 running sum it *is* that array.

        Raises
        ------
        EmptyGradients, InvalidGradient
            As :meth:`aggregate`.
        """
        if not self.local_folded or self.total is None:
            raise EmptyGradients()
        total = self.total
        if not isinstance(self.config.aggregation, Sum):
            if self.weight_sum == 0.0:
                raise InvalidGradient("Sum of weights is zero")
            total /= self.accumulate_dtype.type(self.weight_sum)
        self._finalized = True
        result: FloatArray = total.astype(np.float32, copy=False)
        if self.config.gradient_clipping is not None:
            clip_gradient_norm(result, self.config.gradient_clipping)
        return result

    # ------------------------------------------------------------------ internals

    def _weight(self, peer_id: str, num_samples: int | None) -> float:
        """Return the fold weight of a contribution, validated before anything is fetched."""
        if num_samples is not None and num_samples < 0:
            raise InvalidGradient(f"num_samples must be >= 0, got {num_samples}")
        strategy = self.config.aggregation
        if isinstance(strategy, WeightedMean):
            weights = strategy.weights
            if not isinstance(weights, Mapping) or peer_id not in weights:
                raise InvalidGradient(f"no weight for peer {peer_id}")
            return float(weights[peer_id])
        if isinstance(strategy, FedAvg):
            given = num_samples is not None
            if self._samples_given is not None and given != self._samples_given:
                raise InvalidGradient(
                    "streaming FedAvg needs sample counts for every gradient or for none"
                )
            self._samples_given = given
            return float(num_samples) if num_samples is not None else 1.0
        return 1.0

    def _check_open(self) -> None:
        if self._finalized:
            raise InvalidGradient("the accumulator was finalized; start a new one")

    def _check_length(self, length: int) -> None:
        if self.total is not None and length != self.total.size:
            raise DimensionMismatch([int(self.total.size)], [length])

    def _ensure_total(self, length: int) -> np.ndarray:
        if self.total is None:
            self.total = np.zeros(length, dtype=self.accumulate_dtype)
        return self.total

    def _fold(self, offset: int, values: FloatArray, weight: float) -> None:
        total = self._ensure_total(values.size if offset == 0 and self.total is None else 0)
        target = total[offset : offset + values.size]
        if weight == 1.0:
            target += values
        else:
            target += values * self.accumulate_dtype.type(weight)
