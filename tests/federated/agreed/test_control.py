"""The control-plane setting: pubsub by default, cometbft only with a validator, any aggregation."""

from __future__ import annotations

import numpy as np
import pytest

from gradfed_ipfs.cometbft.abci import RoundsGenesis
from gradfed_ipfs.errors import ConfigError, InvalidGradient
from gradfed_ipfs.federated.agreed import (
    AgreedConfig,
    AgreedSession,
    rounds_genesis,
)
from gradfed_ipfs.federated.regional import RegionalConfig, RegionalSession
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore

MEMBERS = ("peer-a", "peer-b", "peer-c", "peer-d")


def test_control_is_pubsub_unless_asked() -> None:
    assert AgreedConfig(members=MEMBERS).control == "pubsub"
    assert AgreedConfig(members=MEMBERS, control="cometbft").control == "cometbft"
    with pytest.raises(InvalidGradient, match="control"):
        AgreedConfig(members=MEMBERS, control="raft")  # type: ignore[arg-type]
    for aggregation in ("reduce-scatter", "auto"):
        config = AgreedConfig(members=MEMBERS, control="cometbft", aggregation=aggregation)
        assert (config.control, config.aggregation) == ("cometbft", aggregation)


async def test_a_cometbft_session_needs_its_validator() -> None:
    store, bus = MemoryBlockStore(), MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, np.zeros(4, np.float32))
    config = AgreedConfig(members=MEMBERS, control="cometbft")
    with pytest.raises(ConfigError, match="validator_rpc"):
        AgreedSession(store, bus.endpoint("peer-a"), "s", genesis, config)


async def test_the_chain_genesis_follows_the_session_config() -> None:
    store = MemoryBlockStore()
    genesis = await AgreedSession.commit_genesis(store, np.zeros(4, np.float32))
    config = AgreedConfig(members=MEMBERS[::-1], min_peers=3, collect_timeout=2.5, max_weight=7)
    chain = rounds_genesis("s", genesis, config)
    assert chain == RoundsGenesis("s", str(genesis), MEMBERS, 3, 2500, 7)
    assert (chain.members, chain.f) == (MEMBERS, 1)


async def test_regions_take_the_control_plane_and_each_has_its_own_chain_genesis() -> None:
    regions = {"peer-a": "eu", "peer-b": "eu", "peer-c": "us"}
    config = RegionalConfig(regions, control="cometbft", min_peers=2)
    assert {config.agreed(r).control for r in ("eu", "us")} == {"cometbft"}
    store = MemoryBlockStore()
    genesis = await AgreedSession.commit_genesis(store, np.zeros(4, np.float32))
    chain = config.chain_genesis("lab", genesis, "eu")
    assert (chain.session, chain.members, chain.min_peers) == (
        "lab/region/eu",
        ("peer-a", "peer-b"),
        2,
    )
    with pytest.raises(ConfigError, match="control"):
        RegionalConfig(regions, control="raft")  # type: ignore[arg-type]
    bus = MemoryPubsubBus()
    session = RegionalSession(store, bus.endpoint("peer-c"), "lab", genesis, config)
    with pytest.raises(ConfigError, match="validator_rpc"):
        await session.start(np.zeros(4, np.float32))
