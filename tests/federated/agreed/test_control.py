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
