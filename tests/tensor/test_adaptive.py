from __future__ import annotations

import numpy as np
import pytest

from gradfed_ipfs import ConfigError
from gradfed_ipfs.formats import load_gradient_from_arrow, store_layer_as_arrow
from gradfed_ipfs.tensor import (
    BySize,
    Dense,
    DenseGradient,
    ErrorFeedback,
    Int8,
    QuantizedGradient,
    SparseGradient,
    TopK,
)


def test_by_size_chooses_by_element_count() -> None:
    policy = BySize(threshold=100, small=Dense(), large=TopK(ratio=0.1))
    small = policy.encode(np.ones(99, dtype=np.float32))
    large = policy.encode(np.arange(100, dtype=np.float32))
    assert isinstance(small, DenseGradient)
    assert isinstance(large, SparseGradient)
    assert large.nnz() == 10
    assert policy.estimated_ratio(99) == 1.0
    assert policy.estimated_ratio(1000) == pytest.approx(5.0)
    values = np.arange(100, dtype=np.float32)
    assert policy.error_bound(values) == TopK(ratio=0.1).error_bound(values)


def test_by_size_payloads_decode_without_the_policy() -> None:
    policy = BySize(threshold=10, large=Int8())
    values = np.linspace(-1, 1, 50, dtype=np.float32)
    payload = policy.encode(values, [5, 10])
    assert isinstance(payload, QuantizedGradient)
    decoded = load_gradient_from_arrow(store_layer_as_arrow(payload))
    assert decoded.shape == (5, 10)
    assert np.abs(decoded.reshape(-1) - values).max() <= policy.error_bound(values)


def test_by_size_under_error_feedback() -> None:
    feedback = ErrorFeedback(BySize(threshold=4, large=TopK(k=1)))
    first = feedback.encode("p", [3.0, 2.0, 1.0, 0.5])
    np.testing.assert_array_equal(first.to_dense(), [3, 0, 0, 0])
    np.testing.assert_array_equal(feedback.residual("p"), [0, 2, 1, 0.5])


def test_by_size_validates() -> None:
    with pytest.raises(ConfigError):
        BySize(threshold=-1)
    with pytest.raises(ConfigError):
        BySize(small="dense")  # type: ignore[arg-type]
