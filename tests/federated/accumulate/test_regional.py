"""The accumulator's region methods with the crate's vectors (the oracle crate, 0.2.0, predates
them: seed-api §9), through the seed's name and the native one (the same class)."""

from __future__ import annotations

import numpy as np
import pytest

from gradfed_ipfs.errors import EmptyGradients
from gradfed_ipfs.federated.accumulate import AccumulatorConfig
from gradfed_ipfs.federated.accumulate import DistributedGradientAccumulator as Native
from gradfed_ipfs.seed import BackwardPassConfig, DistributedGradientAccumulator
from gradfed_ipfs.storage import MemoryBlockStore, put_gradient

REGIONS = {"p1": "eu", "p2": "us"}


async def crate_accumulator(store: MemoryBlockStore) -> DistributedGradientAccumulator:
    # The crate's fixture: local [0, 0] in eu, p1 [2, 2] in eu, p2 [4, 4] in us.
    acc = DistributedGradientAccumulator.new("regional", BackwardPassConfig())
    await acc.commit_local([0.0, 0.0], store)
    for peer, values in (("p1", [2.0, 2.0]), ("p2", [4.0, 4.0])):
        await acc.add_peer_gradient(peer, await put_gradient(store, values), store)
    return acc


@pytest.fixture
async def acc() -> DistributedGradientAccumulator:
    store = MemoryBlockStore()
    return await crate_accumulator(store)


def test_seed_and_native_are_one_class() -> None:
    assert DistributedGradientAccumulator is Native


def test_by_region(acc: DistributedGradientAccumulator) -> None:
    result = acc.aggregate_by_region(REGIONS, "eu")
    assert list(result) == ["eu", "us"]
    np.testing.assert_array_equal(result["eu"], [1.0, 1.0])
    np.testing.assert_array_equal(result["us"], [4.0, 4.0])


def test_in_regions(acc: DistributedGradientAccumulator) -> None:
    np.testing.assert_array_equal(acc.aggregate_in_regions(REGIONS, "eu", ["eu"]), [1.0, 1.0])
    with pytest.raises(EmptyGradients):
        acc.aggregate_in_regions(REGIONS, "eu", ["ap"])


def test_hierarchical_weighs_regions_equally(acc: DistributedGradientAccumulator) -> None:
    np.testing.assert_array_equal(acc.aggregate_hierarchical(REGIONS, "eu"), [2.5, 2.5])
    np.testing.assert_array_equal(acc.aggregate(), [2.0, 2.0])  # the flat mean


def test_unmapped_peers_are_unknown_and_an_empty_accumulator_raises(
    acc: DistributedGradientAccumulator,
) -> None:
    result = acc.aggregate_by_region({"p1": "eu"}, "eu")
    assert list(result) == ["eu", "unknown"]
    np.testing.assert_array_equal(result["unknown"], [4.0, 4.0])
    empty = DistributedGradientAccumulator.new("empty")
    for call in (
        lambda: empty.aggregate_by_region(REGIONS, "eu"),
        lambda: empty.aggregate_hierarchical(REGIONS, "eu"),
        lambda: empty.aggregate_in_regions(REGIONS, "eu", ["eu"]),
    ):
        with pytest.raises(EmptyGradients):
            call()


async def test_peers_alone_when_nothing_was_committed_and_clipping_applies() -> None:
    store = MemoryBlockStore()
    acc = Native("s", AccumulatorConfig(gradient_clipping=1.0))
    await acc.add("p2", await put_gradient(store, [3.0, 4.0]), store)
    result = acc.aggregate_by_region(REGIONS, "eu")
    assert list(result) == ["us"]  # no local gradient: nothing tagged eu
    np.testing.assert_allclose(result["us"], [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(acc.aggregate_hierarchical(REGIONS, "eu"), [0.6, 0.8], rtol=1e-6)
