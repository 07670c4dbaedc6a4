"""The holding accumulator's region-aware aggregates (the crate's ``regional`` methods).

:class:`RegionalAggregation` is a mixin of
:class:`~gradfed_ipfs.federated.accumulate.accumulator.DistributedGradientAccumulator`: the local
gradient (when one was committed) is tagged ``local_region``, each peer's gradient with its
region from ``peer_regions`` or ``"unknown"``, peers in sorted peer-ID order after the local
one; the math is :mod:`gradfed_ipfs.tensor.regional`'s. As :meth:`aggregate` does, every result
is clipped to ``config.gradient_clipping`` (when set) and checked finite.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from ..._types import FloatArray
from ...tensor.regional import (
    federated_average_by_region,
    federated_average_in_regions,
    hierarchical_federated_average,
)

__all__ = ["UNKNOWN_REGION", "RegionalAggregation"]

UNKNOWN_REGION = "unknown"
"""The region of a peer that ``peer_regions`` does not name."""


class RegionalAggregation:
    """Region-aware aggregates over the held gradients (mixed into the holding accumulator)."""

    local_gradient: FloatArray
    peer_gradients: dict[str, FloatArray]

    if TYPE_CHECKING:

        def _finish(self, result: FloatArray) -> FloatArray:
            """Clip and check an aggregate (:class:`AccumulatorBase` provides it)."""

    def tagged_gradients(
        self, peer_regions: Mapping[str, str], local_region: str
    ) -> list[tuple[str, FloatArray]]:
        """Return ``[(region, gradient)]``: the local one first (if committed), peers sorted."""
        tagged = [(local_region, self.local_gradient)] if self.local_gradient.size else []
        for peer in sorted(self.peer_gradients):
            tagged.append((peer_regions.get(peer, UNKNOWN_REGION), self.peer_gradients[peer]))
        return tagged

    def aggregate_by_region(
        self, peer_regions: Mapping[str, str], local_region: str
    ) -> dict[str, FloatArray]:
        """Return ``{region: mean of its held gradients}``, regions sorted.

        Parameters
        ----------
        peer_regions
            Peer ID → region; peers it does not name are in :data:`UNKNOWN_REGION`.
        local_region
            The local gradient's region.

        Raises
        ------
        EmptyGradients
            If no gradient is held.
        DimensionMismatch
            If the held gradients differ in length.
        InvalidGradient
            If a result is not finite.
        """
        means = federated_average_by_region(self.tagged_gradients(peer_regions, local_region))
        return {region: self._finish(mean) for region, mean in means.items()}

    def aggregate_hierarchical(
        self, peer_regions: Mapping[str, str], local_region: str
    ) -> FloatArray:
        """Return the unweighted mean of the region means (every region weighs the same).

        Raises
        ------
        EmptyGradients, DimensionMismatch, InvalidGradient
            As :meth:`aggregate_by_region`.
        """
        tagged = self.tagged_gradients(peer_regions, local_region)
        return self._finish(hierarchical_federated_average(tagged))

    def aggregate_in_regions(
        self, peer_regions: Mapping[str, str], local_region: str, allowed: Collection[str]
    ) -> FloatArray:
        """Return the mean of the held gradients whose region is in ``allowed`` (data residency).

        Raises
        ------
        EmptyGradients
            If no held gradient is from an allowed region.
        DimensionMismatch, InvalidGradient
            As :meth:`aggregate_by_region`.
        """
        tagged = self.tagged_gradients(peer_regions, local_region)
        return self._finish(federated_average_in_regions(tagged, allowed))
