"""An accumulator for :class:`~gradfed_ipfs.RoundRunner` that sends encoded deltas.

``DistributedGradientAccumulator`` commits dense float32 blocks. This one encodes the local
delta with a codec behind per-peer error feedback (top-k, int8, ...), commits it as one Arrow
block, and decodes peers' blocks of any encoding; everything else (announce, collect, fetch,
exclude) is the runner's. Blocks are re-hashed against their CID by the store.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from multiformats import CID

from gradfed_ipfs._types import CIDLike, FloatArray, GradientLike
from gradfed_ipfs.errors import DimensionMismatch, InvalidGradient
from gradfed_ipfs.formats.arrow import load_gradient_from_arrow, store_layer_as_arrow
from gradfed_ipfs.storage import Block
from gradfed_ipfs.storage.base import BlockStore
from gradfed_ipfs.tensor.aggregation import AggregationStrategy, Contribution, as_float32_vector
from gradfed_ipfs.tensor.compression import ErrorFeedback


class CodecAccumulator:
    """Holds the decoded local and peer deltas of one round; aggregates with ``strategy``.

    Implements the runner's :class:`~gradfed_ipfs.federated.round.GradientAccumulator` protocol
    (``commit_local``, ``add``, ``contributions``, ``finalize``); sample counts are not capped.

    Parameters
    ----------
    local_peer_id
        This peer's ID (its contribution's key).
    feedback
        The codec with this peer's error-feedback memory (kept across rounds).
    strategy
        The aggregation rule.
    timeout
        Seconds a peer's block may take to arrive.
    """

    def __init__(
        self,
        local_peer_id: str,
        feedback: ErrorFeedback,
        strategy: AggregationStrategy,
        timeout: float,
    ) -> None:
        self.local_peer_id = local_peer_id
        self.feedback = feedback
        self.strategy = strategy
        self.timeout = timeout
        self.inputs: dict[str, Contribution] = {}
        self.clipped_weights: dict[str, int] = {}

    holds_contributions: ClassVar[bool] = True

    async def commit_local(
        self, gradient: GradientLike, store: BlockStore, *, num_samples: int | None = None
    ) -> CID:
        """Encode (with error feedback), store as one block, keep the decoded version."""
        payload = self.feedback.encode("delta", as_float32_vector(gradient))
        block = Block.new(store_layer_as_arrow(payload))
        cid = await store.put(block)
        decoded = load_gradient_from_arrow(block.data).reshape(-1)
        self.inputs[self.local_peer_id] = Contribution(decoded, num_samples)
        return cid

    async def add(
        self, peer_id: str, cid: CIDLike, store: BlockStore, *, num_samples: int | None = None
    ) -> None:
        """Fetch a peer's block (verified), decode any encoding, check it, hold it."""
        block = await store.get(cid, timeout=self.timeout)
        values = load_gradient_from_arrow(block.data).reshape(-1)
        local = self.inputs.get(self.local_peer_id)
        if local is not None and values.size != local.values.size:
            raise DimensionMismatch([local.values.size], [values.size])
        if not np.isfinite(values).all():
            raise InvalidGradient(f"non-finite values in the delta of {peer_id}")
        self.inputs[peer_id] = Contribution(values, num_samples)

    def contributions(self) -> dict[str, Contribution]:
        """Return the held deltas keyed by peer ID, the local one included."""
        return dict(self.inputs)

    def finalize(self) -> FloatArray:
        """Aggregate the held deltas (sorted by peer ID inside the strategy)."""
        return np.asarray(self.strategy.aggregate(self.inputs), dtype=np.float32)
