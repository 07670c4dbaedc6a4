"""One SecAgg settings type: validated once, passed through unchanged by every path."""

from __future__ import annotations

import math

import pytest
from multiformats import CID

from gradfed_ipfs.errors import ConfigError, SecAggSettingError, SecureAggregationError
from gradfed_ipfs.federated.besteffort import RoundConfig, SecureOptions
from gradfed_ipfs.federated.besteffort.secure import protocol_config
from gradfed_ipfs.federated.secagg_round import SecAggSettings, SecureRoundConfig
from gradfed_ipfs.training import FedAvg, SecAgg

CLIENTS = ("peer-0", "peer-1", "peer-2")
GENESIS = CID.decode("bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy")


def test_defaults_are_the_protocols_defaults() -> None:
    settings = SecAggSettings()
    assert (settings.clip_range, settings.ring_bits) == (8.0, 32)
    assert (settings.phase_timeout, settings.mask_timeout) == (30.0, 10.0)
    assert (settings.response_timeout, settings.view_timeout) == (10.0, 10.0)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ring_bits", 16, "ring_bits must be 32 or 64"),
        ("clip_range", 0.0, "clip_range must be finite and > 0"),
        ("clip_range", math.inf, "clip_range must be finite and > 0"),
        ("clip_range", math.nan, "clip_range must be finite and > 0"),
        ("phase_timeout", 0.0, "phase_timeout must be > 0 seconds"),
        ("mask_timeout", -1.0, "mask_timeout must be > 0 seconds"),
        ("response_timeout", 0.0, "response_timeout must be > 0 seconds"),
        ("view_timeout", math.nan, "view_timeout must be > 0 seconds"),
    ],
)
def test_a_bad_setting_is_refused_as_config_and_secagg_error(
    field: str, value: float, message: str
) -> None:
    with pytest.raises(SecAggSettingError, match=message) as caught:
        SecAggSettings(**{field: value})  # type: ignore[arg-type]
    assert isinstance(caught.value, ConfigError)
    assert isinstance(caught.value, SecureAggregationError)
    assert caught.value.exit_code == ConfigError.exit_code


def test_round_config_keeps_its_own_refusals() -> None:
    with pytest.raises(SecureAggregationError, match="fetch_timeout must be > 0"):
        SecureRoundConfig("s", 0, CLIENTS, CLIENTS[0], 2, 10, fetch_timeout=0.0)
    with pytest.raises(SecureAggregationError, match="republish_interval must be > 0"):
        SecureRoundConfig("s", 0, CLIENTS, CLIENTS[0], 2, 10, republish_interval=0.0)
    with pytest.raises(SecureAggregationError, match="length >= 1"):
        SecureRoundConfig("s", 0, CLIENTS, CLIENTS[0], 2, 0)


def test_best_effort_passes_the_one_settings_object_through() -> None:
    settings = SecAggSettings(clip_range=4.0, ring_bits=64, mask_timeout=2.0, view_timeout=3.0)
    config = RoundConfig(
        secure=SecureOptions(CLIENTS, CLIENTS[0], 2, settings),
        fetch_timeout=7.0,
        republish_interval=0.25,
        subscriber_timeout=2.0,
    )
    params = protocol_config(config, "sess", 3, 100)
    assert params.settings is settings
    assert (params.fetch_timeout, params.republish_interval, params.subscriber_timeout) == (
        7.0,
        0.25,
        2.0,
    )


def test_training_passes_the_one_settings_object_through() -> None:
    settings = SecAggSettings(clip_range=2.0, phase_timeout=5.0)
    secagg = SecAgg(FedAvg(), settings=settings, republish_interval=0.1, subscriber_timeout=1.0)
    params = secagg.protocol_config("s", GENESIS, GENESIS, 1, CLIENTS, 100)
    assert params.settings is settings
    assert (params.fetch_timeout, params.republish_interval, params.subscriber_timeout) == (
        30.0,
        0.1,
        1.0,
    )
    assert SecAgg(FedAvg()).settings == SecAggSettings()


def test_training_keeps_its_extra_clip_range_check() -> None:
    # A weight w = n / max_weight <= 1 rides in the masked vector: clip_range must cover it.
    with pytest.raises(ConfigError, match="clip_range must be finite and >= 1"):
        SecAgg(FedAvg(), settings=SecAggSettings(clip_range=0.5))
