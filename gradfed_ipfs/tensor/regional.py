"""Region-aware averaging: per-region means, data residency, and two-level (hierarchical) means.

The math of the crate's ``regional`` module (pure NumPy), and the one home of the regional
formulas that :mod:`~gradfed_ipfs.federated.regional.session` runs over the network. Gradients
come tagged with a region, ``[(region, gradient)]``, each gradient of shape ``(d,)``:

- :func:`federated_average_by_region`: the mean of each region, regions in sorted order;
- :func:`federated_average_in_regions`: one mean over the gradients of allowed regions only
  (data residency: nothing from another region enters the result);
- :func:`hierarchical_federated_average`: the mean of each region, then the unweighted mean of
  the region means, so every region weighs the same however many peers it has.

Both levels use :func:`region_mean` (``float32(Σ (w_i/W)·float64(g_i))`` in the given order,
by :func:`~gradfed_ipfs.tensor.deterministic.deterministic_update`), so a result is
bit-identical on every machine and its CID is the same everywhere: a region's aggregate is
``region_mean`` of its gradients (weights = sample counts, 1 by default) and the two-level
result is :func:`combine_region_means` of the region aggregates, regions in sorted order.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np

from .._types import FloatArray, GradientLike
from ..errors import DimensionMismatch, EmptyGradients, ShapeMismatch
from .aggregation import as_float32_vector
from .deterministic import deterministic_update

__all__ = [
    "combine_region_means",
    "federated_average_by_region",
    "federated_average_in_regions",
    "hierarchical_federated_average",
    "region_mean",
]


def region_mean(
    gradients: Sequence[GradientLike], weights: Sequence[int] | None = None
) -> FloatArray:
    """Return ``float32(Σ (w_i/W)·g_i)`` over ``gradients`` in order, bit-reproducible.

    Parameters
    ----------
    gradients
        N ≥ 1 gradients of d values each.
    weights
        N positive integer weights (sample counts); ``None`` weighs each gradient 1.

    Returns
    -------
    FloatArray
        float32, shape ``(d,)``.

    Raises
    ------
    EmptyGradients
        If there is no gradient.
    DimensionMismatch
        If lengths differ.
    InvalidGradient
        If the weights do not match the gradients or are not positive.
    """
    if not gradients:
        raise EmptyGradients()
    rows = [as_float32_vector(g) for g in gradients]
    used = [1] * len(rows) if weights is None else list(weights)
    try:
        return deterministic_update(np.zeros(rows[0].size, np.float32), rows, used, 1.0)
    except ShapeMismatch as exc:
        raise DimensionMismatch(exc.expected, exc.actual) from None


def combine_region_means(
    means: Mapping[str, GradientLike], weights: Mapping[str, int] | None = None
) -> FloatArray:
    """Return the weighted mean of region aggregates, regions in sorted order.

    Parameters
    ----------
    means
        Region → its aggregate (d values).
    weights
        Region → positive integer weight (e.g. its sample total); ``None`` weighs every region
        1 (the hierarchical mean).

    Raises
    ------
    EmptyGradients
        If there is no region.
    DimensionMismatch
        If lengths differ.
    InvalidGradient
        If a weight is not positive.
    """
    regions = sorted(means)
    used = None if weights is None else [int(weights[r]) for r in regions]
    return region_mean([means[r] for r in regions], used)


def federated_average_by_region(
    tagged: Iterable[tuple[str, GradientLike]],
) -> dict[str, FloatArray]:
    """Return ``{region: mean of its gradients}`` with regions in sorted order.

    Raises
    ------
    EmptyGradients
        If there is no gradient.
    DimensionMismatch
        If lengths differ.
    """
    groups: dict[str, list[FloatArray]] = {}
    length: int | None = None
    for region, gradient in tagged:
        vector = as_float32_vector(gradient)
        if length is not None and vector.size != length:
            raise DimensionMismatch([length], [vector.size])
        length = vector.size
        groups.setdefault(region, []).append(vector)
    if not groups:
        raise EmptyGradients()
    return {region: region_mean(groups[region]) for region in sorted(groups)}


def federated_average_in_regions(
    tagged: Iterable[tuple[str, GradientLike]], allowed: Collection[str]
) -> FloatArray:
    """Return the mean of the gradients whose region is in ``allowed``.

    Raises
    ------
    EmptyGradients
        If no gradient comes from an allowed region.
    DimensionMismatch
        If lengths differ.
    """
    allowed_set = set(allowed)
    return region_mean([g for region, g in tagged if region in allowed_set])


def hierarchical_federated_average(tagged: Iterable[tuple[str, GradientLike]]) -> FloatArray:
    """Return the unweighted mean of the per-region means.

    Raises
    ------
    EmptyGradients
        If there is no gradient.
    DimensionMismatch
        If lengths differ.
    """
    return combine_region_means(federated_average_by_region(tagged))
