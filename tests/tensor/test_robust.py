from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gradfed_ipfs import Krum, Median, MultiKrum, NormBounded, TrimmedMean
from gradfed_ipfs.errors import ConfigError, EmptyGradientSet, InvalidGradient, ShapeMismatch
from gradfed_ipfs.tensor import AggregationStrategy, Contribution, Mean, SampleWeightedMean
from gradfed_ipfs.tensor.robust import (
    clip_to_norm,
    coordinate_median,
    krum_scores,
    l2_norm,
    multikrum_select,
    pairwise_sq_distances,
    trimmed_mean,
)


def peers(*rows: list[float], counts: list[int | None] | None = None) -> dict[str, Contribution]:
    counts = counts or [None] * len(rows)
    pairs = enumerate(zip(rows, counts, strict=True))
    return {f"p{i}": Contribution.of(row, n) for i, (row, n) in pairs}


# ---------------------------------------------------------------- hand-checked small cases


def test_trimmed_mean_drops_extremes() -> None:
    # Prepare: four peers; beta 0.25 trims one value at each end of every coordinate.
    contributions = peers([-10] * 4, [0] * 4, [1] * 4, [10] * 4)
    # Execute
    result = TrimmedMean(beta=0.25).aggregate(contributions)
    # Assert: mean of the middle two, 0 and 1
    np.testing.assert_equal(result, np.full(4, 0.5, dtype=np.float32))


def test_trimmed_mean_trims_per_coordinate() -> None:
    rows = [np.array(r, dtype=np.float32) for r in ([1, 40], [2, 30], [3, 20], [100, 10])]
    np.testing.assert_equal(trimmed_mean(rows, 0.25), [2.5, 25.0])
    np.testing.assert_equal(trimmed_mean(rows, 0.0), [26.5, 25.0])


def test_median_odd_and_even() -> None:
    np.testing.assert_equal(Median().aggregate(peers([1, 5], [2, 0], [9, 3])), [2, 3])
    np.testing.assert_equal(Median().aggregate(peers([1], [2], [3], [100])), [2.5])


def test_krum_picks_most_central() -> None:
    # Prepare: 1-D peers 0, 1, 2, 3, 100 with f = 1, so each score sums 2 nearest distances.
    contributions = peers([0], [1], [2], [3], [100])
    values = [c.values for c in contributions.values()]
    # Execute / Assert: scores 5, 2, 2, 5 and huge; the tie goes to the lower peer ID.
    scores = krum_scores(values, f=1)
    np.testing.assert_equal(scores[:4], [5, 2, 2, 5])
    assert scores[4] > 9000
    np.testing.assert_equal(Krum(f=1).aggregate(contributions), [1.0])
    np.testing.assert_equal(MultiKrum(f=1, m=2).aggregate(contributions), [1.5])
    assert MultiKrum(f=1, m=3).select(contributions) == ["p0", "p1", "p2"]
    np.testing.assert_equal(multikrum_select(values, 1, 2), [1, 2])


def test_multikrum_averages_by_samples() -> None:
    contributions = peers([0], [1], [2], [3], [100], counts=[1, 1, 3, 1, 1])
    np.testing.assert_allclose(MultiKrum(f=1, m=2).aggregate(contributions), [1.75])


def test_krum_is_multikrum_with_m_one() -> None:
    krum = Krum(f=2)
    assert isinstance(krum, MultiKrum)
    assert krum.m == 1
    assert "f=2" in repr(krum)


def test_norm_bounded_clips_then_delegates() -> None:
    # seed: Mean of single [3, 4] with clip 1 → norm 1
    result = NormBounded(inner=Mean(), max_norm=1.0).aggregate(peers([3, 4]))
    np.testing.assert_allclose(result, [0.6, 0.8], rtol=1e-6)
    # within the bound: untouched; sample counts survive clipping
    bounded = NormBounded(inner=SampleWeightedMean(), max_norm=10.0)
    np.testing.assert_allclose(
        bounded.aggregate(peers([0, 0], [2, 4], counts=[100, 300])), [1.5, 3.0]
    )
    np.testing.assert_allclose(clip_to_norm(np.array([3, 4], np.float32), 2.5), [1.5, 2.0])


@pytest.mark.parametrize(
    "make",
    [
        lambda: TrimmedMean(beta=0.6),
        lambda: TrimmedMean(beta=-0.1),
        lambda: MultiKrum(f=-1),
        lambda: MultiKrum(f=1, m=0),
        lambda: Krum(f=-2),
        lambda: NormBounded(max_norm=0.0),
        lambda: NormBounded(max_norm=float("inf")),
        lambda: NormBounded(inner="fedavg", max_norm=1.0),  # type: ignore[arg-type]
    ],
)
def test_settings_validated_up_front(make: object) -> None:
    with pytest.raises(ConfigError):
        make()  # type: ignore[operator]


def test_krum_needs_enough_peers() -> None:
    with pytest.raises(InvalidGradient, match="more than f \\+ 2"):
        Krum(f=2).aggregate(peers([0], [1], [2], [3]))


@pytest.mark.parametrize(
    "strategy", [Median(), TrimmedMean(0.2), Krum(f=0), NormBounded()], ids=repr
)
def test_robust_errors(strategy: AggregationStrategy) -> None:
    with pytest.raises(EmptyGradientSet):
        strategy.aggregate({})
    with pytest.raises(ShapeMismatch):
        strategy.aggregate(peers([1, 2], [1, 2, 3], [1, 2]))


def test_clip_to_norm_rejects_non_finite() -> None:
    with pytest.raises(InvalidGradient):
        clip_to_norm(np.array([np.inf, 1], np.float32), 1.0)


# ---------------------------------------------------------------- properties


@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 8), st.integers(1, 20)),
        elements=st.floats(-1e3, 1e3, width=32),
    )
)
def test_pairwise_sq_distances_match_brute_force(matrix: np.ndarray) -> None:
    rows = list(matrix)
    distances = pairwise_sq_distances(rows)
    brute = ((matrix[:, None, :].astype(np.float64) - matrix[None, :, :]) ** 2).sum(axis=2)
    assert distances.shape == (len(rows), len(rows))
    assert np.all(distances >= 0)
    np.testing.assert_array_equal(np.diag(distances), 0)
    np.testing.assert_allclose(distances, distances.T)
    scale = max(1.0, float((matrix.astype(np.float64) ** 2).sum(axis=1).max()))
    np.testing.assert_allclose(distances, brute, atol=1e-9 * scale)


@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 9), st.integers(1, 10)),
        elements=st.floats(-1e3, 1e3, width=32),
    )
)
def test_median_and_trimmed_mean_stay_in_range(matrix: np.ndarray) -> None:
    rows = list(matrix)
    low, high = matrix.min(axis=0), matrix.max(axis=0)
    for result in (coordinate_median(rows), trimmed_mean(rows, 0.2)):
        assert np.all(result >= low - 1e-3)
        assert np.all(result <= high + 1e-3)


# ---------------------------------------------------------------- Byzantine peers


def byzantine_round(attack: str, n_bad: int) -> tuple[dict[str, Contribution], np.ndarray, float]:
    """10 peers: honest ones are the true gradient plus noise; n_bad send attacked copies."""
    rng = np.random.default_rng(42)
    d = 200
    true = rng.normal(size=d).astype(np.float32)
    honest = [true + 0.1 * rng.normal(size=d).astype(np.float32) for _ in range(10 - n_bad)]
    honest_mean = np.mean(honest, axis=0)
    if attack == "scaled":
        bad = [100 * honest[i] for i in range(n_bad)]
    else:
        bad = [-honest[i] for i in range(n_bad)]
    # Byzantine peers sort first and in the middle: order must not matter.
    contributions = {f"bad-{i}": Contribution.of(g, 100) for i, g in enumerate(bad)}
    contributions.update({f"honest-{i}": Contribution.of(g, 100) for i, g in enumerate(honest)})
    # Stated bound: the largest distance of an honest gradient from the honest mean.
    radius = max(float(np.linalg.norm(h - honest_mean)) for h in honest)
    return contributions, honest_mean, radius


@pytest.mark.parametrize("attack", ["scaled", "flipped"])
@pytest.mark.parametrize("n_bad", [2, 3])
@pytest.mark.parametrize(
    "strategy", [Median(), TrimmedMean(beta=0.3), Krum(f=3), MultiKrum(f=3, m=4)], ids=repr
)
def test_robust_rules_resist_byzantine_peers(
    strategy: AggregationStrategy, attack: str, n_bad: int
) -> None:
    contributions, honest_mean, radius = byzantine_round(attack, n_bad)
    result = strategy.aggregate(contributions)
    assert np.linalg.norm(result - honest_mean) <= radius


@pytest.mark.parametrize("attack", ["scaled", "flipped"])
@pytest.mark.parametrize("n_bad", [2, 3])
def test_fedavg_does_not_resist(attack: str, n_bad: int) -> None:
    contributions, honest_mean, radius = byzantine_round(attack, n_bad)
    result = SampleWeightedMean().aggregate(contributions)
    assert np.linalg.norm(result - honest_mean) > 3 * radius


def test_one_wild_peer_among_five() -> None:
    contributions = peers([1.0, 1.0], [1.1, 0.9], [0.9, 1.1], [1.0, 1.05], [1e6, -1e6])
    for strategy in (Median(), Krum(f=1), TrimmedMean(beta=0.2)):
        result = strategy.aggregate(contributions)
        assert np.all(np.abs(result - 1.0) < 0.11), strategy
    assert np.abs(SampleWeightedMean().aggregate(contributions)).max() > 1e5


@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 9), st.integers(1, 10)),
        elements=st.floats(width=32, allow_nan=False, allow_infinity=False),
    )
)
def test_coordinate_median_matches_numpy(matrix: np.ndarray) -> None:
    expected = np.median(matrix.astype(np.float64), axis=0).astype(np.float32)
    np.testing.assert_array_equal(coordinate_median(list(matrix)), expected)


def test_l2_norm_survives_float32_overflow() -> None:
    big = np.full(4, 3e38, dtype=np.float32)
    assert l2_norm(big) == pytest.approx(6e38)
    clipped = clip_to_norm(big, 1.0)
    assert l2_norm(clipped) == pytest.approx(1.0, rel=1e-6)
    small = np.array([0.3, 0.4], dtype=np.float32)
    assert clip_to_norm(small, 1.0) is small  # within the bound: no copy
