"""The exception tree in ``gradfed_ipfs.errors``: one base per idea, one exit code per family."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from gradfed_ipfs import DifferentialPrivacy, PrivacyBudget, TrimmedMean, errors
from gradfed_ipfs.errors import (
    ArrowBlockError,
    ArrowBlockShapeMismatch,
    ConfigError,
    DecodeError,
    DimensionMismatch,
    EmptyError,
    EmptyGradients,
    EmptyGradientSet,
    EmptyInput,
    FederatedDimensionMismatch,
    GradfedError,
    GradientError,
    InvalidGradient,
    NoContributions,
    ShapeMismatch,
)
from gradfed_ipfs.federated.accumulate import AccumulatorConfig
from gradfed_ipfs.federated.besteffort import RoundConfig
from gradfed_ipfs.seed import ConvergenceConfig

FAMILY_EXIT_CODES = {
    "GradfedError": 1,
    "GradientError": 3,
    "DecodeError": 4,
    "BlockStoreError": 5,
    "KuboError": 6,
    "FederatedError": 7,
    "CoordinationError": 8,
    "ComputationGraphError": 9,
    "PubsubError": 10,
    "ConfigError": 11,
    "CometError": 12,
}


MIXINS = {"RpcTimeout", "ResponseTooLarge"}  # cut across families, not GradfedErrors


def _classes() -> list[type[GradfedError]]:
    return [getattr(errors, name) for name in errors.__all__ if name not in MIXINS]


def test_every_family_has_its_own_exit_code() -> None:
    for name, code in FAMILY_EXIT_CODES.items():
        assert getattr(errors, name).exit_code == code, name
    assert len(set(FAMILY_EXIT_CODES.values())) == len(FAMILY_EXIT_CODES)


def test_every_class_takes_its_first_familys_exit_code() -> None:
    families = [getattr(errors, name) for name in FAMILY_EXIT_CODES if name != "GradfedError"]
    for cls in _classes():
        assert issubclass(cls, GradfedError), cls
        family = next((f for f in cls.__mro__ if f in families), GradfedError)
        assert cls.exit_code == family.exit_code, cls


@pytest.mark.parametrize(
    "cls", [DimensionMismatch, FederatedDimensionMismatch, ArrowBlockShapeMismatch]
)
def test_every_lengths_differ_class_is_a_shape_mismatch(cls: type[Exception]) -> None:
    assert issubclass(cls, ShapeMismatch)


def test_shape_mismatches_keep_their_family_and_message() -> None:
    fed = FederatedDimensionMismatch(3, 4)
    assert (fed.expected, fed.actual, fed.exit_code) == ([3], [4], 7)
    assert str(fed) == "Dimension mismatch between client gradients: expected 3, got 4"
    garw = ArrowBlockShapeMismatch("Shape mismatch: shape [2] holds 2 values, got 3")
    assert garw.exit_code == 4
    assert str(garw) == "Shape mismatch: shape [2] holds 2 values, got 3"
    assert str(DimensionMismatch([2], [3])).startswith("Gradient dimension mismatch")


@pytest.mark.parametrize("cls", [EmptyGradients, EmptyGradientSet, EmptyInput, NoContributions])
def test_every_empty_class_shares_one_base(cls: type[Exception]) -> None:
    assert issubclass(cls, EmptyError)
    assert issubclass(cls, ValueError)


def test_arrow_block_errors_are_decode_errors() -> None:
    assert issubclass(ArrowBlockError, DecodeError)
    assert ArrowBlockError.exit_code == DecodeError.exit_code
    with pytest.raises(DecodeError):
        raise EmptyInput("No gradient blocks provided")


def test_config_error_is_its_own_family_and_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)
    assert not issubclass(ConfigError, GradientError)
    assert not issubclass(ConfigError, InvalidGradient)


def test_the_tree_in_the_docstring_names_every_class() -> None:
    doc = errors.__doc__ or ""
    drawn = set(re.findall(r"[├└]── (\w+)", doc)) | {"GradfedError"}
    assert drawn == set(errors.__all__) - MIXINS
    assert all(f":class:`{name}`" in doc for name in MIXINS)


@pytest.mark.parametrize(
    ("make", "setting"),
    [
        (lambda: RoundConfig(min_peers=-1), "min_peers"),
        (lambda: RoundConfig(fetch_timeout=0), "fetch_timeout"),
        (lambda: RoundConfig(min_peers=3, max_peers=2), "max_peers"),
        (lambda: AccumulatorConfig(max_peers=0), "max_peers"),
        (lambda: TrimmedMean(beta=0.6), "beta"),
        (lambda: ConvergenceConfig(window_size=0), "window_size"),
        (lambda: PrivacyBudget(0.0, 1e-5), "epsilon"),
        (lambda: DifferentialPrivacy(1.0, 1e-5, 0.0), "sensitivity"),
    ],
)
def test_bad_settings_read_as_configuration_errors(
    make: Callable[[], object], setting: str
) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    message = str(info.value)
    assert message.startswith("Invalid setting: ")
    assert setting in message
    assert "gradient" not in message.lower()
    assert info.value.exit_code == 11
