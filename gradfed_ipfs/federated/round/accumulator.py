"""``DistributedGradientAccumulator``: commit locally, add peers' gradients by CID, aggregate.

The seed's flow (seed-api §6.13) with its defects fixed:

- every fetched block is re-hashed against its CID (the store does it) and decoded, then checked
  for finiteness and for the same length as the gradients already held *before* anything is
  stored, so a bad peer never leaves a partial update behind;
- ``WeightedMean`` weights map to peers by peer ID, never by dict order;
- ``gradient_clipping`` is applied to the aggregate;
- FedAvg is weighted by sample counts when peers give them;
- ``max_peers`` is enforced and ``timeout`` bounds every fetch;
- size is not a limit: ``commit_local`` stores a gradient whose encoding exceeds ``chunk_bytes``
  as a chunked DAG (dag-cbor manifest CID, see :mod:`gradfed_ipfs.storage.dag`) and a small one as a
  single raw block; ``add_peer_gradient`` accepts either CID and dispatches on its codec.

This class holds every peer's gradient in ``peer_gradients`` (N·d floats). For constant memory
whatever N, use :class:`~gradfed_ipfs.federated.round.streaming.StreamingAccumulator`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
from multiformats import CID

from ..._types import CIDLike, FloatArray, GradientLike
from ...cid import parse_cid
from ...errors import (
    DimensionMismatch,
    EmptyGradients,
    InvalidGradient,
    ShapeMismatch,
)
from ...storage.base import BlockStore
from ...storage.dag import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_CONCURRENCY,
    ProgressCallback,
    fetch_gradient,
    put_gradient,
    values_per_chunk,
)
from ...tensor.aggregation import Contribution, WeightedMean, as_float32_vector
from ...tensor.robust import clip_gradient_norm
from ...tensor.verification import check_finite
from .config import AccumulatorConfig

__all__ = ["LOCAL_PEER_ID", "DistributedGradientAccumulator"]

logger = logging.getLogger("gradfed_ipfs.federated")

LOCAL_PEER_ID = "local"
"""Key of the local gradient among the contributions, unless a ``local_peer_id`` is given."""


class DistributedGradientAccumulator:
    """Accumulates one local gradient and peers' gradients (fetched by CID) for one session.

    Parameters
    ----------
    session_id
        The session (e.g. training run) this accumulator belongs to.
    config
        Aggregation rule, clipping, peer limit and fetch timeout.
    local_peer_id
        The key of the local gradient among contributions (its own peer ID when known).
    chunk_bytes
        Largest block in bytes (≤ 2 MiB); larger encodings are committed as chunked DAGs.
    concurrency
        Chunks stored or fetched at once.
    progress
        Called with ``(done_bytes, total_bytes)`` during each commit and fetch.

    Attributes
    ----------
    local_gradient
        The committed local gradient (flat float32, length d); empty before ``commit_local``.
    peer_gradients
        Peer ID → flat float32 gradient, for every verified peer gradient.
    peer_samples
        Peer ID → sample count, for peers that gave one (FedAvg weights).
    peer_cids
        Peer ID → the CID each peer gradient was fetched from.
    """

    def __init__(
        self,
        session_id: str,
        config: AccumulatorConfig | None = None,
        *,
        local_peer_id: str = LOCAL_PEER_ID,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        concurrency: int = DEFAULT_CONCURRENCY,
        progress: ProgressCallback | None = None,
    ) -> None:
        values_per_chunk(chunk_bytes)  # validates the size
        if concurrency < 1:
            raise InvalidGradient(f"concurrency must be >= 1, got {concurrency}")
        self.chunk_bytes = chunk_bytes
        self.concurrency = concurrency
        self.progress = progress
        self._session_id = session_id
        self.config = config if config is not None else AccumulatorConfig()
        self.local_peer_id = local_peer_id
        self.local_gradient: FloatArray = np.empty(0, dtype=np.float32)
        self.local_samples: int | None = None
        self.local_cid: CID | None = None
        self.peer_gradients: dict[str, FloatArray] = {}
        self.peer_samples: dict[str, int] = {}
        self.peer_cids: dict[str, CID] = {}

    @classmethod
    def new(
        cls, session_id: str, config: AccumulatorConfig | None = None
    ) -> DistributedGradientAccumulator:
        """Seed-style constructor: ``DistributedGradientAccumulator.new(session_id, config)``."""
        return cls(session_id, config)

    @property
    def session_id(self) -> str:
        """The session this accumulator belongs to."""
        return self._session_id

    @property
    def peer_count(self) -> int:
        """Number of peer gradients held (the local gradient is not counted)."""
        return len(self.peer_gradients)

    def is_ready(self, min_peers: int) -> bool:
        """Return whether at least ``min_peers`` peer gradients are held (local not counted)."""
        return len(self.peer_gradients) >= min_peers

    async def commit_local(
        self, gradient: GradientLike, store: BlockStore, *, num_samples: int | None = None
    ) -> CID:
        """Encode the local gradient as Arrow IPC, store it and return its CID.

        An encoding up to ``chunk_bytes`` is one raw block (``bafkrei…``); a larger one is a
        chunked DAG whose dag-cbor manifest CID (``bafyrei…``) is returned, pinned recursively.
        The accumulator's state changes only after the store has accepted every block.

        Parameters
        ----------
        gradient
            Flat (or any-shaped, flattened row-major) gradient, converted to float32.
        store
            Where to put the block (pinned).
        num_samples
            Local samples behind the gradient (FedAvg weight).

        Raises
        ------
        InvalidGradient
            If the gradient has NaN or Inf values.
        """
        values = as_float32_vector(gradient)
        check_finite(values, "local gradient")
        cid = await put_gradient(
            store,
            values,
            chunk_bytes=self.chunk_bytes,
            concurrency=self.concurrency,
            progress=self.progress,
        )
        self.local_gradient = values
        self.local_samples = num_samples
        self.local_cid = cid
        return cid

    async def add_peer_gradient(
        self,
        peer_id: str,
        cid: CIDLike,
        store: BlockStore,
        *,
        num_samples: int | None = None,
    ) -> None:
        """Fetch a peer's gradient by CID, verify it, and hold it under ``peer_id``.

        ``cid`` may be a raw CID (one Arrow block) or a dag-cbor CID (a chunk manifest, whose
        chunks are fetched concurrently). A re-sent gradient from the same peer replaces the old
        one (one peer counts once).

        Parameters
        ----------
        peer_id
            The peer that announced the gradient.
        cid
            Its CID (raw or dag-cbor).
        store
            Where to fetch from.
        num_samples
            Samples behind the gradient (FedAvg weight), when announced.

        Raises
        ------
        BlockNotFound
            If a block is not found within ``config.timeout`` seconds.
        BlockCorrupt
            If fetched bytes do not hash to their CID (the message names the chunk).
        MalformedArrow, MalformedManifest
            If a block is not a gradient or a manifest.
        InvalidGradient
            If it has NaN/Inf values, or a new peer would exceed ``config.max_peers``.
        DimensionMismatch
            If its length differs from the gradients already held.
        """
        if peer_id == self.local_peer_id:
            raise InvalidGradient(f"peer id {peer_id!r} is the local peer's id")
        if peer_id not in self.peer_gradients and len(self.peer_gradients) >= self.config.max_peers:
            raise InvalidGradient(
                f"max_peers={self.config.max_peers} reached; refusing gradient from {peer_id}"
            )
        if num_samples is not None and num_samples < 0:
            raise InvalidGradient(f"num_samples must be >= 0, got {num_samples}")
        parsed = parse_cid(cid)
        expected = self._expected_length(excluding=peer_id)
        fetched = await fetch_gradient(
            store,
            parsed,
            concurrency=self.concurrency,
            timeout=self.config.timeout,
            progress=self.progress,
            expected_length=expected,
        )
        values = fetched.reshape(-1)
        check_finite(values, f"gradient of peer {peer_id} ({parsed})")
        self.peer_gradients[peer_id] = values
        self.peer_cids[peer_id] = parsed
        if num_samples is None:
            self.peer_samples.pop(peer_id, None)
        else:
            self.peer_samples[peer_id] = num_samples
        logger.debug("session %s: added %s from %s", self._session_id, parsed, peer_id)

    def contributions(self) -> dict[str, Contribution]:
        """Return every held gradient keyed by peer ID (local under ``local_peer_id``)."""
        result = {self.local_peer_id: Contribution(self.local_gradient, self.local_samples)}
        for peer, values in self.peer_gradients.items():
            result[peer] = Contribution(values, self.peer_samples.get(peer))
        return result

    def aggregate(self) -> FloatArray:
        """Aggregate the local and peer gradients with ``config.aggregation``, then clip.

        ``WeightedMean`` accepts weights as a mapping peer ID → weight, or (the seed's form) a
        sequence of ``1 + peer_count`` weights: the first for the local gradient, the rest for
        the peers in sorted peer-ID order.

        Raises
        ------
        EmptyGradients
            If no local gradient was committed.
        DimensionMismatch
            If the held gradients differ in length.
        InvalidGradient
            If weights do not match the contributions.
        """
        if self.local_gradient.size == 0:
            raise EmptyGradients()
        contributions = self.contributions()
        strategy = self.config.aggregation
        if isinstance(strategy, WeightedMean) and not isinstance(strategy.weights, Mapping):
            strategy = WeightedMean(self._positional_weights(list(strategy.weights)))
        try:
            result = strategy.aggregate(contributions)
        except ShapeMismatch as exc:
            raise DimensionMismatch(exc.expected, exc.actual) from None
        result = np.array(result, dtype=np.float32, copy=True)
        if self.config.gradient_clipping is not None:
            clip_gradient_norm(result, self.config.gradient_clipping)
        return result

    def reset_peers(self) -> None:
        """Forget every peer gradient (e.g. at the start of a new round)."""
        self.peer_gradients.clear()
        self.peer_samples.clear()
        self.peer_cids.clear()

    def _positional_weights(self, weights: list[float]) -> dict[str, float]:
        peers = sorted(self.peer_gradients)
        if len(weights) != 1 + len(peers):
            raise InvalidGradient(f"Gradient count {1 + len(peers)} != weight count {len(weights)}")
        mapping = {self.local_peer_id: weights[0]}
        mapping.update(zip(peers, weights[1:], strict=True))
        return mapping

    def _expected_length(self, *, excluding: str) -> int | None:
        if self.local_gradient.size:
            return int(self.local_gradient.size)
        for peer, values in self.peer_gradients.items():
            if peer != excluding:
                return int(values.size)
        return None
