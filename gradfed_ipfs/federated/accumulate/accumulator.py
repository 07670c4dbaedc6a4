"""The accumulator protocol, the code both accumulators share, and the holding accumulator.

One protocol, :class:`GradientAccumulator` (``commit_local``, ``add``, ``finalize``,
``contributions``), two implementations:

- :class:`DistributedGradientAccumulator` (here, the default) holds every peer's gradient
  (N·d floats), so any rule works, robust ones and DP's per-contribution clipping included;
- :class:`~gradfed_ipfs.federated.accumulate.streaming.StreamingAccumulator` folds each gradient
  into one running sum as its chunks arrive (constant memory in N; linear rules only).

Both take a peer's contribution the same way (:class:`AccumulatorBase`): the peer ID may not be
the local one, a new peer beyond ``max_peers`` is refused, ``num_samples`` must be ≥ 0 and is
clipped to ``max_weight`` (reported in ``clipped_weights``), and everything a decoder raises on
the peer's bytes becomes a typed :class:`~gradfed_ipfs.errors.DecodeError` naming the peer
(:func:`peer_data_boundary`), never a bare ``RecursionError`` or ``MemoryError``. Nothing of a
rejected peer stays in either accumulator. Every aggregate is checked finite before it is
returned.

The re-send rule differs, on purpose: the holding accumulator *replaces* a peer's earlier
gradient (the seed's semantics; one peer counts once), the streaming one *refuses* it, because a
folded gradient cannot be taken out of the running sum exactly. The runner never re-sends
(one announcement per peer and round), so rounds behave the same with either.

The holding accumulator's seed flow (seed-api §6.13) with its defects fixed: every block is
re-hashed against its CID (the store does it), decoded and checked (finite, same length) before
anything is stored; ``WeightedMean`` weights map to peers by peer ID; ``gradient_clipping``
applies to the aggregate; ``max_peers`` is enforced and ``timeout`` bounds every fetch; a large
gradient is committed as a chunked DAG (:mod:`gradfed_ipfs.storage.dag`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import ClassVar, Protocol

import numpy as np
from multiformats import CID

from ..._types import CIDLike, FloatArray, GradientLike
from ...cid import parse_cid
from ...errors import (
    ConfigError,
    DecodeError,
    DimensionMismatch,
    EmptyGradients,
    GradfedError,
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
from .regional import RegionalAggregation

__all__ = [
    "LOCAL_PEER_ID",
    "PEER_DATA_ERRORS",
    "AccumulatorBase",
    "DistributedGradientAccumulator",
    "GradientAccumulator",
    "peer_data_boundary",
]

logger = logging.getLogger("gradfed_ipfs.federated")

LOCAL_PEER_ID = "local"
"""Key of the local gradient among the contributions, unless a ``local_peer_id`` is given."""

PEER_DATA_ERRORS: tuple[type[BaseException], ...] = (
    ArithmeticError,  # OverflowError, ZeroDivisionError, FloatingPointError
    BufferError,
    LookupError,  # IndexError, KeyError
    MemoryError,
    RecursionError,
    TypeError,
    ValueError,  # UnicodeError, json.JSONDecodeError, pyarrow.ArrowInvalid
)
"""What a decoder may raise on hostile bytes besides our own errors (pyarrow's errors subclass
these); :func:`peer_data_boundary` turns each into a :class:`~gradfed_ipfs.errors.DecodeError`."""


@contextlib.contextmanager
def peer_data_boundary(peer_id: str, cid: object) -> Iterator[None]:
    """Turn anything a peer's bytes make a decoder raise into a ``DecodeError`` naming the peer.

    Our own errors (:class:`~gradfed_ipfs.errors.GradfedError`) pass unchanged; so do
    cancellation and ``KeyboardInterrupt`` (not :data:`PEER_DATA_ERRORS`).
    """
    try:
        yield
    except GradfedError:
        raise
    except PEER_DATA_ERRORS as exc:
        raise DecodeError(
            f"gradient {cid} of peer {peer_id} made the decoder raise {type(exc).__name__}: "
            f"{str(exc)[:200]}"
        ) from exc


class GradientAccumulator(Protocol):
    """What a round needs from an accumulator (holding or streaming)."""

    local_peer_id: str
    clipped_weights: dict[str, int]
    holds_contributions: ClassVar[bool]

    async def commit_local(
        self, gradient: GradientLike, store: BlockStore, *, num_samples: int | None = None
    ) -> CID:
        """Store the local gradient and return its CID."""
        ...

    async def add(
        self, peer_id: str, cid: CIDLike, store: BlockStore, *, num_samples: int | None = None
    ) -> None:
        """Fetch, verify and take in one peer's gradient (nothing of it stays if this raises)."""
        ...

    def contributions(self) -> dict[str, Contribution]:
        """Return every held gradient keyed by peer ID, the local one included."""
        ...

    def finalize(self) -> FloatArray:
        """Return the aggregate (float32, length d, finite); the accumulator is then done."""
        ...


class AccumulatorBase:
    """What both accumulators share: settings, peer admission, weight cap, the last checks.

    Parameters
    ----------
    session_id
        The session (e.g. training run) this accumulator belongs to.
    config
        Aggregation rule, clipping, peer limit, weight cap and fetch timeout.
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
    clipped_weights
        Peer ID → the sample count it announced, for every claim above ``config.max_weight``
        (its weight was clipped to ``max_weight``).
    peer_cids
        Peer ID → the CID of each peer gradient taken in.
    """

    holds_contributions: ClassVar[bool] = True

    def __init__(
        self,
        session_id: str,
        config: AccumulatorConfig | None,
        *,
        local_peer_id: str,
        chunk_bytes: int,
        concurrency: int,
        progress: ProgressCallback | None,
    ) -> None:
        values_per_chunk(chunk_bytes)  # validates the size
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        self._session_id = session_id
        self.config = config if config is not None else AccumulatorConfig()
        self.local_peer_id = local_peer_id
        self.chunk_bytes = chunk_bytes
        self.concurrency = concurrency
        self.progress = progress
        self.local_cid: CID | None = None
        self.peer_cids: dict[str, CID] = {}
        self.clipped_weights: dict[str, int] = {}

    @property
    def session_id(self) -> str:
        """The session this accumulator belongs to."""
        return self._session_id

    @property
    def peer_count(self) -> int:
        """Number of peer gradients taken in (the local gradient is not counted)."""
        return len(self.peer_cids)

    def is_ready(self, min_peers: int) -> bool:
        """Return whether at least ``min_peers`` peer gradients are in (local not counted)."""
        return len(self.peer_cids) >= min_peers

    async def add(
        self, peer_id: str, cid: CIDLike, store: BlockStore, *, num_samples: int | None = None
    ) -> None:
        """Fetch, verify and take in one peer's gradient (each accumulator implements it)."""
        raise NotImplementedError

    async def add_peer_gradient(
        self, peer_id: str, cid: CIDLike, store: BlockStore, *, num_samples: int | None = None
    ) -> None:
        """Seed name of :meth:`add`."""
        await self.add(peer_id, cid, store, num_samples=num_samples)

    async def _store_local(
        self, gradient: GradientLike, store: BlockStore
    ) -> tuple[FloatArray, CID]:
        """Check the local gradient and store it (single block or chunked DAG, pinned)."""
        values = as_float32_vector(gradient)
        check_finite(values, "local gradient")
        cid = await put_gradient(
            store,
            values,
            chunk_bytes=self.chunk_bytes,
            concurrency=self.concurrency,
            progress=self.progress,
        )
        return values, cid

    def _admit(self, peer_id: str, num_samples: int | None) -> int | None:
        """Check that ``peer_id`` may contribute; return its sample count clipped to the cap."""
        if peer_id == self.local_peer_id:
            raise InvalidGradient(f"peer id {peer_id!r} is the local peer's id")
        if peer_id not in self.peer_cids and len(self.peer_cids) >= self.config.max_peers:
            raise InvalidGradient(
                f"max_peers={self.config.max_peers} reached; refusing gradient from {peer_id}"
            )
        return self._capped_samples(peer_id, num_samples)

    def _capped_samples(self, peer_id: str, num_samples: int | None) -> int | None:
        if num_samples is None:
            return None
        if num_samples < 0:
            raise InvalidGradient(f"num_samples must be >= 0, got {num_samples}")
        cap = self.config.max_weight
        if cap is not None and num_samples > cap:
            self.clipped_weights[peer_id] = num_samples
            logger.info("%s claims %d samples; weight clipped to %d", peer_id, num_samples, cap)
            return cap
        self.clipped_weights.pop(peer_id, None)
        return num_samples

    def _finish(self, result: FloatArray) -> FloatArray:
        """Clip the aggregate to ``gradient_clipping`` (when set) and check it is finite."""
        if self.config.gradient_clipping is not None:
            clip_gradient_norm(result, self.config.gradient_clipping)
        check_finite(result, f"aggregate of session {self._session_id}")
        return result


class DistributedGradientAccumulator(AccumulatorBase, RegionalAggregation):
    """Holds one local gradient and peers' gradients (fetched by CID) for one session.

    Region-aware aggregates (``aggregate_by_region``, ``aggregate_hierarchical``,
    ``aggregate_in_regions``) come from :class:`~.regional_accumulator.RegionalAggregation`.

    Parameters are those of :class:`AccumulatorBase` (``concurrency`` defaults to 8).

    Attributes
    ----------
    local_gradient
        The committed local gradient (flat float32, length d); empty before ``commit_local``.
    peer_gradients
        Peer ID → flat float32 gradient, for every verified peer gradient.
    peer_samples
        Peer ID → sample count (clipped to ``max_weight``), for peers that gave one.
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
        super().__init__(
            session_id,
            config,
            local_peer_id=local_peer_id,
            chunk_bytes=chunk_bytes,
            concurrency=concurrency,
            progress=progress,
        )
        self.local_gradient: FloatArray = np.empty(0, dtype=np.float32)
        self.local_samples: int | None = None
        self.peer_gradients: dict[str, FloatArray] = {}
        self.peer_samples: dict[str, int] = {}

    @classmethod
    def new(
        cls, session_id: str, config: AccumulatorConfig | None = None
    ) -> DistributedGradientAccumulator:
        """Seed-style constructor: ``DistributedGradientAccumulator.new(session_id, config)``."""
        return cls(session_id, config)

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
        values, cid = await self._store_local(gradient, store)
        self.local_gradient = values
        self.local_samples = num_samples
        self.local_cid = cid
        return cid

    async def add(
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
            Samples behind the gradient (FedAvg weight), when announced; clipped to
            ``config.max_weight``.

        Raises
        ------
        BlockNotFound
            If a block is not found within ``config.timeout`` seconds.
        BlockCorrupt
            If fetched bytes do not hash to their CID (the message names the chunk).
        DecodeError
            If a block is not a gradient or a manifest (``MalformedArrow``,
            ``MalformedManifest``), or a decoder failed in any other way on it.
        InvalidGradient
            If it has NaN/Inf values, or a new peer would exceed ``config.max_peers``.
        DimensionMismatch
            If its length differs from the gradients already held.
        """
        samples = self._admit(peer_id, num_samples)
        parsed = parse_cid(cid)
        with peer_data_boundary(peer_id, parsed):
            fetched = await fetch_gradient(
                store,
                parsed,
                concurrency=self.concurrency,
                timeout=self.config.timeout,
                progress=self.progress,
                expected_length=self._expected_length(excluding=peer_id),
            )
            values = fetched.reshape(-1)
            check_finite(values, f"gradient of peer {peer_id} ({parsed})")
        self.peer_gradients[peer_id] = values
        self.peer_cids[peer_id] = parsed
        if samples is None:
            self.peer_samples.pop(peer_id, None)
        else:
            self.peer_samples[peer_id] = samples
        logger.debug("session %s: added %s from %s", self._session_id, parsed, peer_id)

    @property
    def peer_count(self) -> int:
        """Number of peer gradients held, ``len(peer_gradients)`` as the seed (local excluded)."""
        return len(self.peer_gradients)

    def is_ready(self, min_peers: int) -> bool:
        """Return whether at least ``min_peers`` peer gradients are held (local not counted)."""
        return len(self.peer_gradients) >= min_peers

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
            If weights do not match the contributions, or the aggregate is not finite.
        """
        if self.local_gradient.size == 0:
            raise EmptyGradients()
        strategy = self.config.aggregation
        if isinstance(strategy, WeightedMean) and not isinstance(strategy.weights, Mapping):
            strategy = WeightedMean(self._positional_weights(list(strategy.weights)))
        try:
            with np.errstate(over="ignore"):  # an overflowing Sum is refused by _finish
                result = strategy.aggregate(self.contributions())
        except ShapeMismatch as exc:
            raise DimensionMismatch(exc.expected, exc.actual) from None
        return self._finish(np.array(result, dtype=np.float32, copy=True))

    def finalize(self) -> FloatArray:
        """Return :meth:`aggregate` (the holding accumulator stays usable)."""
        return self.aggregate()

    def reset_peers(self) -> None:
        """Forget every peer gradient (e.g. at the start of a new round)."""
        self.peer_gradients.clear()
        self.peer_samples.clear()
        self.peer_cids.clear()
        self.clipped_weights.clear()

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
