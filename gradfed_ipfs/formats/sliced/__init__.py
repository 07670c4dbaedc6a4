"""Reduce-scatter records: slice claims and results, chained partials.

:mod:`~.slices` (slice records, missing and fraud claims) and :mod:`~.partials` (the partial
sums of chained rounds).
"""
