"""``StreamingAccumulator``: fold each gradient into a running sum as its chunks arrive.

The seed's accumulator (and :class:`~gradfed_ipfs.federated.accumulate.accumulator.
DistributedGradientAccumulator`, the default) holds every peer's gradient: N·d floats. For the
linear rules (Sum, Mean, FedAvg and WeightedMean with per-peer weights) the aggregate is
``Σ wᵢ·gᵢ / W``, so it can be folded chunk by chunk into one running float32 array of length d
while the chunks arrive. Peak extra memory is about one d-array plus the chunks in flight
(about ``concurrency`` × 2 × ``chunk_bytes`` of HTTP buffers), whatever the number of peers.
The default ``concurrency`` is therefore 2 here rather than 8: ``benchmarks/bench_swarm.py``
measured, for N = 16 and d = 10M, extra memory of 1.3 × d × 4 bytes at 2 chunks in flight,
1.8× at 4 and 2.6× at 8, with the same speed from a local daemon. Over bitswap more chunks in
flight fetch faster; raise it when memory allows.

A peer's gradient is verified whole before anything of it is folded in, so a rejected peer
leaves the sum exactly as it was (a finite first chunk of 3e38 then a junk chunk cannot poison
it). A raw block is fetched, re-hashed, decoded and checked (finite, length, and that the sum
stays finite) before it is added. A chunked one is read three times: once over the network to
verify every chunk (re-hashed against its CID, decoded, finite), then, one peer at a time, from
the local daemon that now holds the chunks, once to check that adding them keeps the sum finite
and once to fold them. An accepted chunked gradient thus costs two extra local reads. Only a
local failure or a cancellation during the last pass (the daemon dies; the round's deadline cuts
the fetch off) has to undo chunks already folded: they are read again and subtracted, exact up
to float32 rounding.

Robust rules (median, trimmed mean, Krum) need every gradient at once and are refused here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
from multiformats import CID

from ..._types import CIDLike, FloatArray, GradientLike
from ...cid import DAG_CBOR, RAW, parse_cid
from ...errors import ConfigError, DecodeError, DimensionMismatch, EmptyGradients, InvalidGradient
from ...storage.base import BlockStore
from ...storage.dag import (
    DEFAULT_CHUNK_BYTES,
    ChunkManifest,
    ChunkRef,
    ProgressCallback,
    fetch_chunks,
    fetch_gradient,
    fetch_manifest,
)
from ...tensor.aggregation import (
    Contribution,
    Mean,
    SampleWeightedMean,
    Sum,
    WeightedMean,
    as_float32_vector,
)
from ...tensor.verification import check_finite
from .accumulator import LOCAL_PEER_ID, AccumulatorBase, peer_data_boundary
from .config import AccumulatorConfig

__all__ = ["STREAMING_CONCURRENCY", "StreamingAccumulator"]

logger = logging.getLogger("gradfed_ipfs.federated")

STREAMING_CONCURRENCY = 2
"""Default chunks in flight per gradient for :class:`StreamingAccumulator`."""


class StreamingAccumulator(AccumulatorBase):
    """An accumulator that keeps one running sum instead of every peer's gradient.

    The protocol of :class:`~gradfed_ipfs.federated.accumulate.accumulator.GradientAccumulator`
    (``commit_local``, ``add``, ``finalize``), but a gradient cannot be replaced once folded
    (a re-send is refused), it holds no ``contributions()``, and only linear rules work.

    Parameters
    ----------
    session_id, local_peer_id, chunk_bytes, progress
        As :class:`~gradfed_ipfs.federated.accumulate.accumulator.AccumulatorBase`.
    config
        Aggregation rule (``Sum``, ``Mean``, ``FedAvg`` or ``WeightedMean`` with a mapping of
        peer ID → weight), clipping, peer limit, weight cap and fetch timeout.
    concurrency
        Chunks stored or fetched at once per gradient (default 2: each chunk in flight costs a
        few chunk sizes of transient memory).
    accumulate_dtype
        dtype of the running sum: float32 (default; one d×4-byte array) or float64 (twice the
        memory, less rounding).

    Raises
    ------
    ConfigError
        If the rule is not linear, or ``WeightedMean`` weights are positional.
    """

    holds_contributions: ClassVar[bool] = False

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
        super().__init__(
            session_id,
            config,
            local_peer_id=local_peer_id,
            chunk_bytes=chunk_bytes,
            concurrency=concurrency,
            progress=progress,
        )
        strategy = self.config.aggregation
        if not isinstance(strategy, Sum | Mean | SampleWeightedMean | WeightedMean):
            raise ConfigError(
                "streaming aggregation supports Sum, Mean, FedAvg and WeightedMean, "
                f"not {strategy!r}"
            )
        if isinstance(strategy, WeightedMean) and not isinstance(strategy.weights, Mapping):
            raise ConfigError("streaming WeightedMean needs weights as a peer ID → weight map")
        self.accumulate_dtype = np.dtype(accumulate_dtype)
        self.total: np.ndarray | None = None
        """The running weighted sum ``Σ wᵢ·gᵢ`` (length d), allocated by the first gradient."""
        self.weight_sum = 0.0
        self.local_folded = False
        self.peer_samples: dict[str, int | None] = {}
        self._samples_given: bool | None = None
        self._finalized = False
        self._fold_lock = asyncio.Lock()

    @property
    def length(self) -> int | None:
        """Length d of the gradients, once the first one is folded."""
        return None if self.total is None else int(self.total.size)

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
        weight = self._weight(self.local_peer_id, num_samples)
        self._check_length(values.size)
        values, cid = await self._store_local(values, store)
        self._fold(0, values, weight)
        self.weight_sum += weight
        self.local_cid = cid
        self.local_folded = True
        return cid

    async def add(
        self,
        peer_id: str,
        cid: CIDLike,
        store: BlockStore,
        *,
        num_samples: int | None = None,
    ) -> None:
        """Fetch a peer's gradient, verify all of it, then fold it in.

        Parameters
        ----------
        peer_id
            The announcing peer.
        cid
            Raw or dag-cbor CID of its gradient.
        store
            Where to fetch from.
        num_samples
            Samples behind it (FedAvg weight), clipped to ``config.max_weight``.

        Raises
        ------
        InvalidGradient
            If the peer was already folded in, ``max_peers`` is reached, the gradient has
            NaN/Inf values, or FedAvg sample counts are given for some gradients and not others.
        DimensionMismatch
            If its length differs (checked from the manifest, before any chunk is fetched).
        BlockNotFound, BlockCorrupt, DecodeError
            As :meth:`~gradfed_ipfs.federated.accumulate.DistributedGradientAccumulator.add`;
            nothing of the peer is folded in.
        """
        self._check_open()
        if peer_id in self.peer_cids:
            raise InvalidGradient(f"gradient of {peer_id} is already folded in; it counts once")
        samples = self._admit(peer_id, num_samples)
        parsed = parse_cid(cid)
        weight = self._weight(peer_id, samples)
        self.peer_cids[peer_id] = parsed  # reserve the slot while fetching (one peer counts once)
        try:
            with peer_data_boundary(peer_id, parsed):
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
            self.clipped_weights.pop(peer_id, None)
            raise
        self.weight_sum += weight
        self.peer_samples[peer_id] = samples
        logger.debug("session %s: folded %s from %s", self.session_id, parsed, peer_id)

    async def _fold_chunked(self, peer_id: str, cid: CID, store: BlockStore, weight: float) -> None:
        """Verify every chunk, then (one peer at a time) check the sum stays finite, then fold.

        Pass 1 fetches over the network, concurrently with other peers; passes 2 and 3 read the
        now-local chunks under a lock, so no other fold changes the sum between the check and
        the fold.
        """
        timeout = self.config.timeout
        manifest = await fetch_manifest(store, cid, timeout=timeout)
        self._check_length(manifest.length)

        def verify(ref: ChunkRef, values: FloatArray) -> None:
            check_finite(values, f"chunk at offset {ref.offset} of {peer_id}'s gradient {cid}")

        await fetch_chunks(
            store,
            manifest,
            verify,
            concurrency=self.concurrency,
            timeout=timeout,
            progress=self.progress,
            manifest_cid=cid,
        )
        async with self._fold_lock:
            self._check_length(manifest.length)  # another gradient may have set d meanwhile
            self._ensure_total(manifest.length)

            def would_fold(ref: ChunkRef, values: FloatArray) -> None:
                self._candidate(ref.offset, values, weight)

            await fetch_chunks(
                store, manifest, would_fold, concurrency=self.concurrency, timeout=timeout
            )
            folded: list[ChunkRef] = []

            def fold(ref: ChunkRef, values: FloatArray) -> None:
                self._fold(ref.offset, values, weight)
                folded.append(ref)

            try:
                await fetch_chunks(
                    store, manifest, fold, concurrency=self.concurrency, timeout=timeout
                )
            except BaseException:
                await self._unfold(store, manifest, folded, weight)
                raise

    async def _unfold(
        self, store: BlockStore, manifest: ChunkManifest, folded: list[ChunkRef], weight: float
    ) -> None:
        """Subtract the (verified) chunks already folded when the second pass failed locally."""
        if not folded:
            return
        undo = ChunkManifest(manifest.shape, manifest.length, tuple(folded))

        def subtract(ref: ChunkRef, values: FloatArray) -> None:
            target = self._total_or_raise()[ref.offset : ref.offset + values.size]
            target -= values * self.accumulate_dtype.type(weight)

        logger.warning("rolling back %d folded chunks by subtraction", len(folded))
        await fetch_chunks(
            store, undo, subtract, concurrency=self.concurrency, timeout=self.config.timeout
        )

    def contributions(self) -> dict[str, Contribution]:
        """Refuse: the contributions are folded into one sum, none is held.

        Raises
        ------
        InvalidGradient
            Always.
        """
        raise InvalidGradient("a streaming accumulator folds contributions into one sum")

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
            If the weights sum to zero, or the aggregate is not finite.
        """
        total = self._total()
        if self._finalized:
            return total.astype(np.float32, copy=True)
        if isinstance(self.config.aggregation, Sum):
            return self._finish(total.astype(np.float32, copy=True))
        scale = self.accumulate_dtype.type(self._weight_sum())
        return self._finish((total / scale).astype(np.float32, copy=False))

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
        total = self._total()
        if not isinstance(self.config.aggregation, Sum):
            total /= self.accumulate_dtype.type(self._weight_sum())
        self._finalized = True
        return self._finish(total.astype(np.float32, copy=False))

    # ------------------------------------------------------------------ internals

    def _total(self) -> np.ndarray:
        if not self.local_folded:
            raise EmptyGradients()
        return self._total_or_raise()

    def _total_or_raise(self) -> np.ndarray:
        if self.total is None:
            raise EmptyGradients()
        return self.total

    def _weight_sum(self) -> float:
        if self.weight_sum == 0.0:
            raise InvalidGradient("Sum of weights is zero")
        return self.weight_sum

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
        if isinstance(strategy, SampleWeightedMean):
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

    def _candidate(self, offset: int, values: FloatArray, weight: float) -> np.ndarray:
        """Return the running sum's slice at ``offset`` with ``weight · values`` added.

        Raises
        ------
        InvalidGradient
            If that would overflow (finite float32 values near the maximum).
        """
        total = self._ensure_total(values.size if offset == 0 and self.total is None else 0)
        with np.errstate(over="ignore", invalid="ignore"):
            candidate = values.astype(self.accumulate_dtype, copy=True)
            if weight != 1.0:
                candidate *= self.accumulate_dtype.type(weight)
            candidate += total[offset : offset + values.size]
        check_finite(candidate, "running sum (a contribution would overflow it)", offset)
        return candidate

    def _fold(self, offset: int, values: FloatArray, weight: float) -> None:
        """Add ``weight · values`` at ``offset``; nothing is added if the sum would overflow."""
        candidate = self._candidate(offset, values, weight)
        self._total_or_raise()[offset : offset + values.size] = candidate
