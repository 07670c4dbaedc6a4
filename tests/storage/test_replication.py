"""Replicated pinning through IPFS Cluster: a round root outlives the daemon that made it.

3 Kubo daemons with 3 cluster peers (CRDT, replication 2) and a fourth Kubo daemon, outside the
cluster, that reads. The round is committed on daemon 0, pinned through the cluster, daemon 0 is
killed, and the reader still fetches and re-verifies the whole round from the survivors.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator

import numpy as np
import pytest

from gradfed_ipfs import KuboBlockStore, KuboSwarm, put_gradient
from gradfed_ipfs.errors import KuboStartError
from gradfed_ipfs.kubo import cluster as cluster_module
from gradfed_ipfs.kubo.cluster import ClusterPeer, ClusterSwarm, find_cluster_binary
from gradfed_ipfs.provenance import ContributionRef, commit_round, verify_round
from gradfed_ipfs.storage.replication import ClusterPinning
from gradfed_ipfs.tensor import SampleWeightedMean
from tests.required import skip_area

pytestmark = [pytest.mark.kubo, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster_binary() -> None:
    try:
        find_cluster_binary()
    except KuboStartError as exc:  # no Go toolchain or no module proxy on this machine
        skip_area("ipfs-cluster", f"IPFS Cluster unavailable: {exc}")


@pytest.fixture
def swarm(cluster_binary: None) -> Iterator[KuboSwarm]:
    with KuboSwarm(4) as daemons:
        yield daemons


async def test_round_root_survives_its_origin_daemon(swarm: KuboSwarm) -> None:
    # Prepare: a round committed on daemon 0 (two chunked gradients, aggregate, record).
    origin, reader = swarm[0], swarm[3]
    rng = np.random.default_rng(11)
    with ClusterSwarm(list(swarm)[:3], replication=(2, 2)) as cluster:
        async with KuboBlockStore(origin.api_url) as store:
            refs = {}
            for peer, samples in (("peer-a", 10), ("peer-b", 30)):
                values = rng.standard_normal(300_000).astype(np.float32)
                cid = await put_gradient(store, values, chunk_bytes=256 * 1024)
                refs[peer] = ContributionRef(peer, str(cid), samples)
            record, _ = await commit_round(
                store, session="s", round=0, contributions=refs, aggregation=SampleWeightedMean()
            )
        # Execute: pin through the cluster, wait for 2 pinned copies, kill the origin.
        async with ClusterPinning(cluster[1].api_url) as pinning:
            allocated = await pinning.pin(record, replication_min=2, replication_max=2)
            pinned = await pinning.wait_pinned(record, 2, timeout=90)
        assert len(allocated) == 2
        assert pinned == set(allocated)
        origin.kill()
        # Assert: the reader, which never held the round, re-verifies it from the survivors.
        async with KuboBlockStore(reader.api_url, timeout=30) as store:
            verification = await verify_round(record, store)
        assert verification.ok, verification.mismatch


async def test_replication_factors_are_checked(cluster_binary: None) -> None:
    async with ClusterPinning("http://127.0.0.1:9") as pinning:
        with pytest.raises(ValueError, match="replication"):
            await pinning.pin(
                "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",
                replication_min=3,
                replication_max=2,
            )


def test_a_cluster_peer_whose_chosen_port_was_taken_starts_on_fresh_ports(
    cluster_binary: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: the first port the peer chooses is held by another socket (the race between
    # probing a free port and the peer binding it).
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    choose = cluster_module.free_port
    ports = iter([taken])
    monkeypatch.setattr(cluster_module, "free_port", lambda: next(ports, None) or choose())
    try:
        # Execute
        with KuboSwarm(1) as daemons, ClusterPeer(daemons[0], secret=secrets.token_hex(32)) as peer:
            # Assert: running on other ports, after the refused first start.
            assert peer.swarm_port != taken
            assert peer.rest("id")["id"] == peer.peer_id
            assert "address already in use" in peer._log_tail(200)
    finally:
        held.close()
