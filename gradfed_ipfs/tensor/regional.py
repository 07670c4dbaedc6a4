"""Region-aware averaging: per-region means, data residency, and two-level (hierarchical) means.

The math of the crate's ``regional`` module (pure NumPy). Gradients come tagged with a region,
``[(region, gradient)]``, each gradient of shape ``(d,)``:

- :func:`federated_average_by_region`: the mean of each region, regions in sorted order;
- :func:`federated_average_in_regions`: one mean over the gradients of allowed regions only
  (data residency: nothing from another region enters the result);
- :func:`hierarchical_federated_average`: the mean of each region, then the unweighted mean of
  the region means, so every region weighs the same however many peers it has.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from .._types import FloatArray, GradientLike
from ..errors import DimensionMismatch, EmptyGradients, ShapeMismatch
from .aggregation import as_float32_vector, mean

__all__ = [
    "federated_average_by_region",
    "federated_average_in_regions",
    "hierarchical_federated_average",
]


def _mean(vectors: list[FloatArray]) -> FloatArray:
    if not vectors:
        raise EmptyGradients()
    try:
        return mean(vectors)
    except ShapeMismatch as exc:
        raise DimensionMismatch(exc.expected, exc.actual) from None


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
    return {region: _mean(groups[region]) for region in sorted(groups)}


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
    return _mean([as_float32_vector(g) for region, g in tagged if region in allowed_set])


def hierarchical_federated_average(tagged: Iterable[tuple[str, GradientLike]]) -> FloatArray:
    """Return the unweighted mean of the per-region means.

    Raises
    ------
    EmptyGradients
        If there is no gradient.
    DimensionMismatch
        If lengths differ.
    """
    return _mean(list(federated_average_by_region(tagged).values()))
