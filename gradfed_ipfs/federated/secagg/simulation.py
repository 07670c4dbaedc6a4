"""Run the SecAgg protocol in one process: the in-process driver and the seed's API (§6.5).

:func:`run_secure_aggregation` plays every client and the server of
:mod:`~gradfed_ipfs.federated.secagg.protocol` in order, with simulated dropouts, including the
consistency round (every survivor signs the view and checks the others' signatures).
:class:`SecureAggregation` keeps the seed's API with the real protocol behind it. Nothing here
crosses a network: for rounds over IPFS see :mod:`gradfed_ipfs.federated.secagg_round.peer`.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..._types import FloatArray, GradientLike
from ...errors import ConfigError, FederatedDimensionMismatch, SecureAggregationError
from .fixed_point import RingArray
from .protocol import RandBytes, SecAggClient, SecAggServer

__all__ = ["SecAggResult", "SecureAggregation", "run_secure_aggregation"]


@dataclass
class SecAggResult:
    """Outcome of an in-process run: the sum and what the server saw."""

    total: FloatArray
    survivors: list[str]
    dropped: list[str]
    masked: dict[str, RingArray] = field(default_factory=dict)


def run_secure_aggregation(
    inputs: Mapping[str, GradientLike],
    threshold: int,
    *,
    clip_range: float = 8.0,
    ring_bits: int = 32,
    context: bytes = b"",
    drop_before_masking: Collection[str] = (),
    silent_in_unmasking: Collection[str] = (),
    randbytes: RandBytes = os.urandom,
) -> SecAggResult:
    """Run every round of the protocol in-process over ``inputs`` (simulating dropouts).

    Parameters
    ----------
    inputs
        Client id -> vector of shape ``(d,)``.
    threshold
        t.
    clip_range, ring_bits, context, randbytes
        As for :class:`SecAggClient`.
    drop_before_masking
        Clients that share keys, then vanish before sending their masked vector.
    silent_in_unmasking
        Survivors that send their masked vector and sign the survivor set, but do not answer
        the unmasking request.

    Returns
    -------
    SecAggResult
        The survivors' sum and the masked vectors the server received.
    """
    clients = {
        cid: SecAggClient(
            cid,
            threshold,
            clip_range=clip_range,
            ring_bits=ring_bits,
            context=context,
            randbytes=randbytes,
        )
        for cid in sorted(inputs)
    }
    server = SecAggServer(
        threshold, clip_range=clip_range, ring_bits=ring_bits, context=context, randbytes=randbytes
    )
    roster = server.register(c.advertise_keys() for c in clients.values())
    routed = server.route_shares(m for c in clients.values() for m in c.share_keys(roster))
    for cid, client in clients.items():
        client.receive_shares(routed.get(cid, []))
    masked = {}
    for cid, client in clients.items():
        if cid not in drop_before_masking:
            masked[cid] = client.masked_input(inputs[cid])
            server.receive_masked(cid, masked[cid], client.rejected)
    survivors, dropped = server.unmask_request()
    views = [clients[v].confirm(survivors, dropped) for v in survivors]
    answers = [
        clients[v].unmask(survivors, dropped, views)
        for v in survivors
        if v not in silent_in_unmasking
    ]
    return SecAggResult(server.finalize(answers), survivors, dropped, masked)


class SecureAggregation:
    """The seed's ``SecureAggregation`` API (§6.5) with the real protocol behind it.

    Parameters
    ----------
    min_participants
        Fewest gradients (and registered participants) an aggregation accepts.
    threshold
        Shamir threshold; ``None`` uses a majority, ``n // 2 + 1``, of the gradients passed
        (so at least 2 gradients: a sum of one would be that client's vector).
    clip_range, ring_bits
        The :class:`FixedPoint` settings.
    randbytes
        Cryptographic randomness (``os.urandom``).
    """

    def __init__(
        self,
        min_participants: int,
        *,
        threshold: int | None = None,
        clip_range: float = 8.0,
        ring_bits: int = 32,
        randbytes: RandBytes = os.urandom,
    ) -> None:
        if min_participants < 1:
            raise ConfigError(f"min_participants must be >= 1, got {min_participants}")
        self.min_participants = min_participants
        self.threshold = threshold
        self.clip_range = clip_range
        self.ring_bits = ring_bits
        self._rand = randbytes
        self._count = 0
        self.last_result: SecAggResult | None = None

    def add_participant(self) -> None:
        """Register one more participant."""
        self._count += 1

    def participant_count(self) -> int:
        """Return the number of registered participants."""
        return self._count

    def can_aggregate(self) -> bool:
        """Return whether enough participants are registered."""
        return self._count >= self.min_participants

    def reset(self) -> None:
        """Forget the registered participants."""
        self._count = 0

    def aggregate_secure(self, gradients: Sequence[GradientLike]) -> FloatArray:
        """Return the mean of ``gradients``, computed through secure aggregation.

        Parameters
        ----------
        gradients
            One vector of shape ``(d,)`` per participant; values beyond ``clip_range`` are clipped.

        Returns
        -------
        FloatArray
            The mean, float32, exact to the fixed-point resolution.

        Raises
        ------
        SecureAggregationError
            ``"Not enough participants: need N, have M"`` (the seed's text; the seed raised
            ``InvalidGradient``); or a threshold below 2, as for a single gradient, which masks
            cannot hide (the seed returned it in the clear).
        FederatedDimensionMismatch
            If the gradients differ in length.
        """
        need = self.min_participants
        if self._count < need or len(gradients) < need:
            have = min(self._count, len(gradients))
            raise SecureAggregationError(f"Not enough participants: need {need}, have {have}")
        vectors = [np.asarray(g, dtype=np.float32).reshape(-1) for g in gradients]
        for v in vectors[1:]:
            if v.shape != vectors[0].shape:
                raise FederatedDimensionMismatch(int(vectors[0].shape[0]), int(v.shape[0]))
        n = len(vectors)
        threshold = self.threshold if self.threshold is not None else n // 2 + 1
        inputs = {f"participant-{i:06d}": v for i, v in enumerate(vectors)}
        self.last_result = run_secure_aggregation(
            inputs,
            threshold,
            clip_range=self.clip_range,
            ring_bits=self.ring_bits,
            randbytes=self._rand,
        )
        return (self.last_result.total / np.float32(n)).astype(np.float32)
