"""The one SecAgg settings type: the fixed-point encoding and the protocol's phase timeouts.

Every path that runs a SecAgg round takes these from one :class:`SecAggSettings`: a round of
its own (:class:`~gradfed_ipfs.federated.secagg_round.peer.SecureRoundConfig`), the
best-effort round's ``secure`` option
(:class:`~gradfed_ipfs.federated.besteffort.config.SecureOptions`) and the training wrapper
(:class:`~gradfed_ipfs.training.SecAgg`). What the settings leave out comes from the path: the
round (session, round id, roster, aggregator, threshold, vector length) and the transport of the
protocol's messages (``fetch_timeout``, ``republish_interval``, ``subscriber_timeout``, fields
of :class:`~gradfed_ipfs.federated.secagg_round.peer.SecureRoundConfig`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import SecAggSettingError

__all__ = ["SecAggSettings"]


@dataclass(frozen=True)
class SecAggSettings:
    """How a SecAgg round encodes its vectors and how long each of its phases may take.

    Attributes
    ----------
    clip_range
        Largest absolute value of a masked coordinate (vector units, finite and > 0); larger
        ones are clipped (see :class:`~gradfed_ipfs.federated.secagg.FixedPoint`).
    ring_bits
        The fixed-point ring Z/2^b: 32 or 64 bits.
    phase_timeout
        Seconds each party waits for the keys, the share bundles or the unmasking request.
    mask_timeout
        Seconds the aggregator waits for masked vectors once every share bundle is in;
        clients without one by then are dropped.
    response_timeout
        Seconds the aggregator waits for every survivor's unmasking answer after the views
        (then it uses the answers it has, if at least ``threshold``); also how long a client
        waits for the aggregator's ``done``.
    view_timeout
        Seconds a survivor waits for the other survivors' signed views before it decides
        (it needs ``threshold`` of them); the aggregator allows it on top of
        ``response_timeout``.

    Raises
    ------
    SecAggSettingError
        If ``ring_bits`` is not 32 or 64, ``clip_range`` is not finite and > 0, or a timeout
        is not > 0 (a :class:`~gradfed_ipfs.errors.ConfigError` and a
        :class:`~gradfed_ipfs.errors.SecureAggregationError`).
    """

    clip_range: float = 8.0
    ring_bits: int = 32
    phase_timeout: float = 30.0
    mask_timeout: float = 10.0
    response_timeout: float = 10.0
    view_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.ring_bits not in (32, 64):
            raise SecAggSettingError(f"ring_bits must be 32 or 64, got {self.ring_bits}")
        if not (math.isfinite(self.clip_range) and self.clip_range > 0):
            raise SecAggSettingError(f"clip_range must be finite and > 0, got {self.clip_range}")
        for name in ("phase_timeout", "mask_timeout", "response_timeout", "view_timeout"):
            if not getattr(self, name) > 0:
                raise SecAggSettingError(f"{name} must be > 0 seconds")
