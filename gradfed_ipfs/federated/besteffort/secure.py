"""The ``secure`` option of :class:`~.runner.RoundRunner`: a SecAgg round, optionally DP.

The runner's node is always a client of the SecAgg round (it brings a gradient); it may also be
the round's aggregator. The protocol is :mod:`gradfed_ipfs.federated.secagg_round.peer`, unchanged:
every message a block in the runner's store, announced on the session's SecAgg sub-topic through
the runner's gossip transport. Its parameters
(:class:`~gradfed_ipfs.federated.secagg_round.SecureRoundConfig`) are built from the round's one
:class:`~gradfed_ipfs.federated.besteffort.config.RoundConfig` by :func:`protocol_config`, and its
outcome is the one :class:`~gradfed_ipfs.federated.besteffort.result.RoundResult`.

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

import numpy as np
from multiformats import CID

from ..._types import FloatArray, GradientLike
from ...errors import InvalidGradient, PrivacyBudgetExhausted, SecureAggregationError
from ...storage.base import BlockStore
from ...tensor.aggregation import as_float32_vector
from ..privacy.mechanisms import AccountingMode, DifferentialPrivacy, DPMechanism, clip_l2_norm
from ..secagg_round.peer import RandBytes, SecureRoundConfig, SecureRoundPeer, SecureRoundResult
from .config import RoundConfig
from .gossip import GossipModelSync
from .result import RoundResult

__all__ = ["protocol_config", "run_secure"]


def protocol_config(
    config: RoundConfig, session_id: str, round_id: int, length: int
) -> SecureRoundConfig:
    """Return the SecAgg protocol's parameters for one round of ``config`` (its ``secure`` set).

    Parameters
    ----------
    config
        The round's settings; ``secure`` gives the roster, threshold and the SecAgg settings
        (encoding and phase timeouts), and the round's ``fetch_timeout``, ``republish_interval``
        and ``subscriber_timeout`` apply to the protocol's messages.
    session_id, round_id
        The round (they bind the masks).
    length
        Vector length d.

    Raises
    ------
    SecureAggregationError
        If ``config.secure`` is unset or the parameters are invalid.
    """
    options = config.secure
    if options is None:
        raise SecureAggregationError("the round has no secure= options")
    return SecureRoundConfig(
        session_id=session_id,
        round_id=round_id,
        clients=tuple(options.clients),
        aggregator=options.aggregator,
        threshold=options.threshold,
        length=length,
        settings=options.settings,
        fetch_timeout=config.fetch_timeout,
        republish_interval=config.republish_interval,
        subscriber_timeout=config.subscriber_timeout,
    )


def _check_central_dp(dp: DifferentialPrivacy) -> None:
    """Refuse on the aggregator before anything is posted (RDP only, one release affordable)."""
    if dp.accounting is not AccountingMode.RDP:
        raise InvalidGradient("DP rounds need RDP accounting (legacy ε/100 is no guarantee)")
    if not dp.budget.can_afford(dp.release_event(DPMechanism.GAUSSIAN)):
        raise PrivacyBudgetExhausted(
            f"Privacy budget exhausted: one more DP round would exceed "
            f"epsilon={dp.budget.epsilon:g} at delta={dp.budget.delta:g}"
        )


async def run_secure(
    store: BlockStore,
    gossip: GossipModelSync,
    config: RoundConfig,
    round_id: int,
    gradient: GradientLike,
    *,
    randbytes: RandBytes = os.urandom,
) -> RoundResult:
    """Run this node's client role (and aggregator role, if it is the aggregator) of one round.

    Parameters
    ----------
    store
        This node's block store.
    gossip
        This node's gossip endpoint (its transport carries the SecAgg sub-topic).
    config
        The round's settings, ``secure`` set; with ``dp``, central DP on the secure sum.
    round_id
        The round.
    gradient
        This node's vector.
    randbytes
        Cryptographic randomness of the client role.

    Returns
    -------
    RoundResult
        On the aggregator the survivors' mean; on a pure client an empty aggregate.

    Raises
    ------
    SecureAggregationError
        If this node is not a client of ``config.secure``, or the protocol fails (see
        :meth:`~gradfed_ipfs.federated.secagg_round.peer.SecureRoundPeer.aggregate`).
    PrivacyBudgetExhausted
        On the aggregator with ``dp``, before anything is posted, if one more release does not
        fit the budget.
    """
    started = time.monotonic()
    values = as_float32_vector(gradient)
    params = protocol_config(config, gossip.session_id, round_id, int(values.size))
    transport = gossip.transport
    peer_id = await transport.local_peer_id()
    if peer_id not in params.clients:
        raise SecureAggregationError(f"a runner's node must be a client; {peer_id} is not")
    dp = config.dp
    is_aggregator = peer_id == params.aggregator
    if dp is not None:
        if is_aggregator:
            _check_central_dp(dp)
        values = clip_l2_norm(values.astype(np.float64), dp.sensitivity).astype(np.float32)
    peer = SecureRoundPeer(store, transport, params, randbytes=randbytes)

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
    expected = sorted(params.clients)
    if not is_aggregator:
        return RoundResult(
            round_id,
            local_cid,
            np.zeros(0, dtype=np.float32),
            participants=[peer_id] if summed else [],
            expected=expected,
            duration_ms=int((time.monotonic() - started) * 1000),
            drops=drops,
        )
    if aggregator_task is None:  # pragma: no cover - started above for the aggregator
        raise SecureAggregationError("the aggregator produced no result")
    result = aggregator_task.result()
    mean, epsilon, delta = _released_mean(result, dp)
    return RoundResult(
        round_id,
        local_cid,
        mean,
        participants=sorted(result.survivors),
        contributors={c: cid for c, cid in result.masked_cids.items() if c != peer_id},
        expected=expected,
        dropped=sorted(result.dropped),
        epsilon=epsilon,
        delta=delta,
        duration_ms=int((time.monotonic() - started) * 1000),
        drops=drops,
    )


def _released_mean(
    result: SecureRoundResult, dp: DifferentialPrivacy | None
) -> tuple[FloatArray, float | None, float | None]:
    """Return the survivors' mean (noised under central DP) and the (ε, δ) spent so far.

    Under DP: checks, noises N(0, (zC)^2), charges (unchanged if refused); then the mean.
    """
    if dp is None:
        return result.mean, None, None
    total = np.array(result.total, dtype=np.float32, copy=True)
    dp.add_gaussian_noise(total)
    mean = (total / np.float32(len(result.survivors))).astype(np.float32)
    epsilon, delta = dp.spent()
    return mean, epsilon, delta
