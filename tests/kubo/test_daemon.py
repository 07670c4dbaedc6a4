from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest

from gradfed_ipfs.errors import KuboStartError
from gradfed_ipfs.kubo import KuboDaemon, live_daemon_pids, multiaddr_to_url

pytestmark = pytest.mark.kubo


def test_multiaddr_to_url() -> None:
    assert multiaddr_to_url("/ip4/127.0.0.1/tcp/5001\n") == "http://127.0.0.1:5001"
    assert multiaddr_to_url("/ip6/::1/tcp/5001") == "http://[::1]:5001"
    with pytest.raises(ValueError, match="unsupported"):
        multiaddr_to_url("/unix/tmp/sock")


def test_daemon_lifecycle_is_loopback_only(kubo_binary: Path) -> None:
    with KuboDaemon(binary=kubo_binary) as daemon:
        pid = daemon.pid
        assert pid in live_daemon_pids()
        assert daemon.api_url.startswith("http://127.0.0.1:")
        assert daemon.peer_id.startswith("12D3")
        assert daemon.multiaddrs
        assert all("/ip4/127.0.0.1/" in a for a in daemon.multiaddrs)
        config = httpx.post(f"{daemon.api_url}/api/v0/config/show", timeout=10).json()
        assert config["Bootstrap"] == []
        assert config["Routing"]["Type"] == "none"
        assert config["Pubsub"]["Enabled"] is True
        assert config["AutoConf"]["Enabled"] is False
        repo = daemon.repo
    assert pid not in live_daemon_pids()
    assert not repo.exists()  # temporary repos are removed


def test_persistent_repo_survives_restart(kubo_binary: Path, tmp_path: Path) -> None:
    daemon = KuboDaemon(tmp_path / "repo", binary=kubo_binary).start()
    try:
        peer = daemon.peer_id
        daemon.restart()
        assert daemon.peer_id == peer
    finally:
        daemon.stop()
    assert (tmp_path / "repo" / "config").exists()  # persistent repos are kept


def test_failed_start_reports_log_tail(kubo_binary: Path, tmp_path: Path) -> None:
    fake = tmp_path / "ipfs"
    fake.write_text(
        f'#!/bin/sh\nif [ "$1" = daemon ]; then echo "fatal: simulated failure" >&2; exit 3; fi\n'
        f'exec "{kubo_binary}" "$@"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    daemon = KuboDaemon(binary=fake, start_timeout=20)
    with pytest.raises(KuboStartError, match="simulated failure"):
        daemon.start()
    daemon.stop()


@pytest.mark.docker
def test_swarm_is_fully_connected(kubo_swarm3: list[KuboDaemon]) -> None:
    for daemon in kubo_swarm3:
        others = {d.peer_id for d in kubo_swarm3 if d is not daemon}
        assert others <= daemon.connected_peers()
