"""The training API on the CometBFT control plane: ``Peer(agreed=AgreedConfig(control=
"cometbft"), validator_rpc=...)``, four members, each a real Kubo daemon and validator.

Three FedAvg rounds end on one record per round on every member, each final on every
validator's app, and every member ends on the same model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dag_cbor
import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig
from gradfed_ipfs.cometbft import CometNetwork, CometRpc, launch_session_chain
from gradfed_ipfs.cometbft.abci import RoundView
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore
from gradfed_ipfs.training import Client, FederationConfig, Peer, VectorAdapter

pytestmark = [pytest.mark.cometbft, pytest.mark.kubo, pytest.mark.slow]

D = 64
SESSION = "comet-training"
ROUNDS = 3


def _client(index: int) -> Client[np.ndarray[Any, Any]]:
    """Moves the model a tenth of the way to this peer's target; ``index + 1`` samples."""
    target = np.random.default_rng([index, 5]).standard_normal(D).astype(np.float32)

    def train(model: np.ndarray[Any, Any], _config: object) -> tuple[Any, int, Mapping[str, float]]:
        return model + 0.1 * (target - model), index + 1, {}

    return Client(train)


async def test_training_peers_on_the_chain_end_on_one_record_per_round(
    kubo_swarm4: list[Any], cometbft_binary: Path
) -> None:
    members = tuple(n.peer_id for n in kubo_swarm4)
    agreed = AgreedConfig(
        members=members, control="cometbft", collect_timeout=3.0, round_timeout=60.0,
        fetch_timeout=20.0, announce_interval=0.1,
    )  # fmt: skip
    stores = [KuboBlockStore(n.api_url, timeout=30.0) for n in kubo_swarm4]
    pubsubs = [KuboPubsub(n.api_url) for n in kubo_swarm4]
    network = CometNetwork(4, binary=cometbft_binary)
    config: FederationConfig[np.ndarray[Any, Any]] = FederationConfig(
        rounds=ROUNDS, final_evaluation=False
    )
    try:
        peers = []
        for i, (store, pubsub) in enumerate(zip(stores, pubsubs, strict=True)):
            peers.append(
                Peer(
                    store=store,
                    pubsub=pubsub,
                    client=_client(i),
                    adapter=VectorAdapter(),
                    initial_model=np.zeros(D, np.float32),
                    config=config,
                    agreed=agreed,
                    session=SESSION,
                )
            )
        genesis = await peers[0].chain_genesis()
        assert {str(await p.chain_genesis()) for p in peers} == {str(genesis)}
        signers = [await pubsub.signer() for pubsub in pubsubs]
        await launch_session_chain(network, genesis, signers)
        for peer, validator in zip(peers, network, strict=True):
            peer.validator_rpc = validator.rpc_url  # its ports are known once it is prepared
        histories = await asyncio.gather(*(p.run(linger=10.0) for p in peers))
        for r in range(ROUNDS):
            entries_r = [next(e for e in h.entries if e.round == r) for h in histories]
            records = {e.record for e in entries_r}
            assert len(records) == 1, records
            assert all(len(e.roster) == 4 for e in entries_r)
            for validator in network:  # every validator's app finalized that record
                answer = await CometRpc(validator.rpc_url).abci_query("/round", str(r).encode())
                view = RoundView.from_dict(dag_cbor.decode(answer.value))
                assert (view.status, view.record) == ("final", entries_r[0].record)
        assert len({p.model_vector.tobytes() for p in peers}) == 1
    finally:
        await asyncio.to_thread(network.stop)
        for closable in [*stores, *pubsubs]:
            await closable.aclose()
