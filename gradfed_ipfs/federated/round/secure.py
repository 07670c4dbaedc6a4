"""SecAgg rounds for :class:`~gradfed_ipfs.RoundRunner`, optionally central DP.

The runner's node is always a client of the SecAgg round (it brings a gradient); it may also be
the round's aggregator. The protocol is :mod:`gradfed_ipfs.federated.round.secagg`, unchanged:
every message a block in the runner's store, announced on the session's SecAgg sub-topic through
the runner's gossip transport.

DP + SecAgg (central DP on the secure sum, when the runner has ``dp``):

1. each client clips its vector to L2 norm C = ``dp.sensitivity``
   (:func:`..privacy.mechanisms.clip_l2_norm`) *before* masking, so every survivor's
   term in the sum is bounded by C whatever the aggregator sees;
2. the aggregator unmasks only the survivors' sum, adds N(0, (zC)²) per coordinate and charges
   one Gaussian release with
   :meth:`~gradfed_ipfs.DifferentialPrivacy.add_gaussian_noise` (the RDP
   accountant is checked before noise is drawn and charged before the sum is returned), then
   divides by the number n of survivors: the mean carries N(0, (zC/n)²) noise;
3. an aggregator whose budget cannot afford the release raises
   :class:`~gradfed_ipfs.errors.PrivacyBudgetExhausted` before the round starts: it posts no
   block and announces nothing (its clients then time out).

The reported ε is the aggregator's, for the released mean at the budget's δ; a pure client
charges nothing and reports ``None``. Clipping to C on the client is sound only if the client is
honest (the aggregator cannot check a masked vector); the fixed-point encoding also clips each
coordinate to ``clip_range`` and rounds to its resolution, which never increases the L2 norm
beyond C by more than the rounding (≤ √d · 2⁻ᶠ⁺¹).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

import numpy as np
from multiformats import CID

from ..._types import FloatArray, GradientLike
from ...errors import InvalidGradient, PrivacyBudgetExhausted, SecureAggregationError
from ...kubo.pubsub import PubsubTransport
from ...storage.base import BlockStore
from ...tensor.aggregation import as_float32_vector
from ..privacy.mechanisms import AccountingMode, DifferentialPrivacy, DPMechanism, clip_l2_norm
from .secagg import RandBytes, SecureRoundConfig, SecureRoundPeer, SecureRoundResult
from .stats import RoundStats

__all__ = ["SecureOutcome", "run_runner_secure_round"]


@dataclass
class SecureOutcome:
    """What one node's SecAgg round produced (the runner turns it into a ``RoundResult``).

    Attributes
    ----------
    local_cid
        CID of this node's *masked* block (its unmasked vector is never stored).
    aggregate
        On the aggregator: the survivors' mean (noised with ``dp``). On a pure client: an empty
        float32 array (length 0); the protocol publishes no sum to clients.
    stats
        On the aggregator: ``participants`` = survivors, ``dropped_clients`` /
        ``missing_clients`` = clients that shared keys but whose masked vector was not summed,
        ε/δ spent with ``dp``. On a pure client: ``participants`` 1 if its vector was summed
        (else 0), no ε.
    contributors
        On the aggregator: every other survivor → CID of its masked block.
    drops
        SecAgg announcements dropped, by reason.
    """

    local_cid: CID
    aggregate: FloatArray
    stats: RoundStats
    contributors: dict[str, CID] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)


def _check_central_dp(dp: DifferentialPrivacy) -> None:
    """Refuse on the aggregator before anything is posted (RDP only, one release affordable)."""
    if dp.accounting is not AccountingMode.RDP:
        raise InvalidGradient("DP rounds need RDP accounting (legacy ε/100 is no guarantee)")
    if not dp.budget.can_afford(dp.release_event(DPMechanism.GAUSSIAN)):
        raise PrivacyBudgetExhausted(
            f"Privacy budget exhausted: one more DP round would exceed "
            f"epsilon={dp.budget.epsilon:g} at delta={dp.budget.delta:g}"
        )


async def run_runner_secure_round(
    store: BlockStore,
    transport: PubsubTransport,
    config: SecureRoundConfig,
    gradient: GradientLike,
    *,
    dp: DifferentialPrivacy | None = None,
    randbytes: RandBytes = os.urandom,
) -> SecureOutcome:
    """Run this node's client role (and aggregator role, if it is the aggregator) of one round.

    Raises
    ------
    SecureAggregationError
        If this node is not a client of ``config``, or the protocol fails (see
        :meth:`~gradfed_ipfs.federated.round.secagg.SecureRoundPeer.aggregate`).
    PrivacyBudgetExhausted
        On the aggregator with ``dp``, before anything is posted, if one more release does not
        fit the budget.
    """
    started = time.monotonic()
    values = as_float32_vector(gradient)
    peer_id = await transport.local_peer_id()
    if peer_id not in config.clients:
        raise SecureAggregationError(f"a runner's node must be a client; {peer_id} is not")
    is_aggregator = peer_id == config.aggregator
    if dp is not None:
        if is_aggregator:
            _check_central_dp(dp)
        values = clip_l2_norm(values.astype(np.float64), dp.sensitivity).astype(np.float32)
    peer = SecureRoundPeer(store, transport, config, randbytes=randbytes)

    async def client() -> tuple[CID, bool]:
        await peer.share_keys()
        cid = await peer.send_masked(values)
        return cid, await peer.answer_unmask()

    client_task: asyncio.Task[tuple[CID, bool]] | None = None
    aggregator_task: asyncio.Task[SecureRoundResult] | None = None
    try:
        await peer.start()
        client_task = asyncio.ensure_future(client())
        tasks: list[asyncio.Future[object]] = [client_task]  # type: ignore[list-item]
        if is_aggregator:
            aggregator_task = asyncio.ensure_future(peer.aggregate())
            tasks.append(aggregator_task)  # type: ignore[arg-type]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        drops = dict(peer.drops)
    finally:
        await peer.aclose()
    local_cid, summed = client_task.result()
    if not is_aggregator:
        stats = RoundStats(
            round_id=config.round_id,
            participants=int(bool(summed)),
            missing_clients=[],
            duration_ms=int((time.monotonic() - started) * 1000),
        )
        return SecureOutcome(local_cid, np.zeros(0, dtype=np.float32), stats, drops=drops)
    if aggregator_task is None:  # pragma: no cover - started above for the aggregator
        raise SecureAggregationError("the aggregator produced no result")
    result = aggregator_task.result()
    return _release(result, local_cid, peer_id, dp, drops, started)


def _release(
    result: SecureRoundResult,
    local_cid: CID,
    peer_id: str,
    dp: DifferentialPrivacy | None,
    drops: dict[str, int],
    started: float,
) -> SecureOutcome:
    """Release the mean, or with ``dp`` the noised sum divided by n (aggregator only)."""
    epsilon: float | None = None
    delta: float | None = None
    if dp is None:
        mean = result.mean
    else:
        total = np.array(result.total, dtype=np.float32, copy=True)
        dp.add_gaussian_noise(total)  # checks, noises N(0, (zC)^2), charges; unchanged if refused
        mean = (total / np.float32(len(result.survivors))).astype(np.float32)
        epsilon, delta = dp.spent()
    stats = RoundStats(
        round_id=result.stats.round_id,
        participants=len(result.survivors),
        missing_clients=list(result.dropped),
        duration_ms=int((time.monotonic() - started) * 1000),
        epsilon_spent=epsilon,
        delta_spent=delta,
        dropped_clients=list(result.dropped),
    )
    contributors = {c: cid for c, cid in result.masked_cids.items() if c != peer_id}
    return SecureOutcome(local_cid, mean, stats, contributors, drops)
