"""The deterministic update split along the roster: chained float64 partial sums, same bits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradfed_ipfs.errors import EmptyGradientSet, InvalidGradient, ShapeMismatch
from gradfed_ipfs.tensor.deterministic import (
    DETERMINISTIC_BLOCK,
    deterministic_update,
    finish_update,
    partial_update,
    update_coefficients,
)


def awkward(rng: np.random.Generator, d: int) -> np.ndarray:
    """Values whose sums round differently in another order: mixed scales, signed zeros."""
    values = rng.standard_normal(d) * 10.0 ** rng.integers(-30, 30, d)
    values[rng.random(d) < 0.1] = -0.0
    return values.astype(np.float32)


def chained(
    model: np.ndarray, grads: list[np.ndarray], weights: list[int], lr: float, cuts: list[int]
) -> np.ndarray:
    coefficients = update_coefficients(weights)
    partial = None
    for start, stop in zip([0, *cuts], [*cuts, len(grads)], strict=True):
        partial = partial_update(partial, grads[start:stop], coefficients[start:stop])
    assert partial is not None
    return finish_update(partial, model, lr)


@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 9),
    d=st.integers(1, 300),
    lr=st.sampled_from([1.0, 0.5, 1e-3, -2.0]),
    data=st.data(),
)
def test_chained_partial_sums_give_the_bits_of_the_whole_update(
    seed: int, n: int, d: int, lr: float, data: st.DataObject
) -> None:
    rng = np.random.default_rng(seed)
    model, grads = awkward(rng, d), [awkward(rng, d) for _ in range(n)]
    weights = [int(w) for w in rng.integers(1, 1000, n)]
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=n - 1))) if n > 1 else []
    whole = deterministic_update(model, grads, weights, lr)
    assert chained(model, grads, weights, lr, cuts).tobytes() == whole.tobytes()


def test_a_split_across_blocks_and_groups_matches_at_a_realistic_size() -> None:
    rng = np.random.default_rng(3)
    d = DETERMINISTIC_BLOCK * 2 + 17
    model, grads = awkward(rng, d), [awkward(rng, d) for _ in range(8)]
    weights = list(range(1, 9))
    whole = deterministic_update(model, grads, weights, 0.25)
    assert chained(model, grads, weights, 0.25, [2, 4, 6]).tobytes() == whole.tobytes()


def test_the_order_matters_and_the_chain_keeps_it() -> None:
    # (1e30 + 1) - 1e30 is 0 in float64, (1e30 - 1e30) + 1 is 1: a tree of partial sums that
    # regrouped the roster would not give the all-to-all bits; a chain in roster order does.
    model = np.zeros(1, np.float32)
    grads = [np.array([v], np.float32) for v in (1e30, 1.0, -1e30)]
    whole = deterministic_update(model, grads, [1, 1, 1], 3.0)
    assert whole[0] == 0.0
    assert chained(model, grads, [1, 1, 1], 3.0, [1, 2])[0] == 0.0
    third = update_coefficients([1, 1, 1])[0]
    outer = partial_update(None, [grads[0], grads[2]], [third, third])  # 1e30 - 1e30 first
    assert finish_update(partial_update(outer, [grads[1]], [third]), model, 3.0)[0] == 1.0


def test_bad_partial_sums_and_arguments_are_refused() -> None:
    grads = [np.ones(4, np.float32)]
    with pytest.raises(EmptyGradientSet):
        partial_update(None, [], [])
    with pytest.raises(InvalidGradient, match="coefficients"):
        partial_update(None, grads, [0.5, 0.5])
    with pytest.raises(InvalidGradient, match="float64"):
        partial_update(np.zeros(4, np.float32), grads, [1.0])
    with pytest.raises(ShapeMismatch):
        partial_update(np.zeros(5), grads, [1.0])
    with pytest.raises(ShapeMismatch):
        finish_update(np.zeros(5), np.zeros(4, np.float32), 1.0)
    with pytest.raises(InvalidGradient, match="finite"):
        finish_update(np.zeros(4), np.zeros(4, np.float32), float("nan"))
    with pytest.raises(InvalidGradient, match="positive"):
        update_coefficients([1, 0])
    partial = np.zeros(4)
    partial_update(partial, grads, [1.0])
    assert not partial.any()  # not modified in place
