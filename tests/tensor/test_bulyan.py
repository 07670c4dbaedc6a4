"""Bulyan on a case worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from gradfed_ipfs.errors import EmptyGradientSet, InvalidGradient
from gradfed_ipfs.tensor import Bulyan, Contribution, bulyan


def test_bulyan_ignores_the_outlier() -> None:
    # Prepare: honest values 0..5 (second coordinate x10) and one attacker at 100.
    # Krum picks 2, 3, 1, 4, 0 in turn; median 2 (20); the 3 nearest are 2, 1, 3 (20, 10, 30).
    values = [0, 1, 2, 3, 4, 5, 100]
    grads = [np.array([v, 10 * v], dtype=np.float32) for v in values]
    # Execute
    result = bulyan(grads, f=1)
    # Assert
    np.testing.assert_allclose(result, [2.0, 20.0])


def test_bulyan_strategy_matches_the_function_and_checks_n() -> None:
    rng = np.random.default_rng(3)
    vectors = {f"p{i}": rng.standard_normal(4).astype(np.float32) for i in range(7)}
    peers = {p: Contribution.of(vectors[p]) for p in reversed(sorted(vectors))}
    expected = bulyan([vectors[p] for p in sorted(vectors)], f=1)
    np.testing.assert_array_equal(Bulyan(f=1).aggregate(peers), expected)
    with pytest.raises(InvalidGradient, match="4f"):
        Bulyan(f=2).aggregate(peers)
    with pytest.raises(EmptyGradientSet):
        bulyan([], f=0)
    with pytest.raises(InvalidGradient):
        Bulyan(f=-1)
