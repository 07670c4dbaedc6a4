"""``node start`` on an existing repo keeps its ports and reconnects to its peers."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from gradfed_ipfs.cli.known_peers import load_peers, loopback_addresses, remember_peers
from gradfed_ipfs.kubo.rpc_sync import rpc_call_sync
from tests.cli.test_cli import no_env_api, own_home, run_cli
from tests.polling import poll_until

__all__ = ["no_env_api", "own_home"]  # fixtures used here

GHOST = "12D3KooWGhostGhostGhostGhostGhostGhostGhostGhost"


def started(out: str) -> tuple[str, str]:
    """The API URL and peer ID a ``node start`` printed."""
    match = re.search(r"node started: pid \d+, api (\S+), peer (\S+)", out)
    assert match, out
    return match.group(1), match.group(2)


def peers_of(api: str) -> set[str]:
    answer = rpc_call_sync(api, "swarm/peers", timeout=5.0) or {}
    return {str(p.get("Peer")) for p in answer.get("Peers") or []}


@pytest.mark.kubo
def test_a_restarted_node_keeps_its_ports_and_reconnects(
    no_env_api: None, kubo_binary: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = ["--node-dir", str(tmp_path / "a")], ["--node-dir", str(tmp_path / "b")]
    try:
        code, out, err = run_cli(capsys, *a, "node", "start")
        assert code == 0, err
        api_a, peer_a = started(out)
        code, out, err = run_cli(capsys, *b, "node", "start")
        assert code == 0, err
        api_b, peer_b = started(out)
        assert "known peer" not in out  # nothing to reconnect to yet

        code, out, err = run_cli(capsys, *b, "node", "connect", api_a)  # the managed node B
        assert code == 0, err
        assert peer_a in load_peers(tmp_path / "b")
        assert "known peers │ 1 (redialled on start" in run_cli(capsys, *b, "node", "status")[1]
        remember_peers(tmp_path / "b", {GHOST: ["/ip4/127.0.0.1/tcp/9"]})  # nobody listens

        # B restarts: same API port, A dialled again without a manual connect; the ghost is
        # reported and does not stop the start.
        assert run_cli(capsys, *b, "node", "stop")[0] == 0
        code, out, err = run_cli(capsys, *b, "node", "start")
        assert code == 0, err
        assert started(out) == (api_b, peer_b)
        assert "reconnected to 1 of 2 known peers" in out
        assert f"could not reconnect to {GHOST}" in err
        poll_until(lambda: peer_a in peers_of(api_b), timeout=20, what="B connected to A")

        # A restarts: it recorded B on stop (it never ran `node connect` itself).
        assert run_cli(capsys, *a, "node", "stop")[0] == 0
        assert set(load_peers(tmp_path / "a")) == {peer_b}
        code, out, err = run_cli(capsys, *a, "node", "start")
        assert code == 0, err
        assert started(out) == (api_a, peer_a)
        assert "reconnected to 1 of 1 known peer" in out
        poll_until(lambda: peer_b in peers_of(api_a), timeout=20, what="A connected to B")

        # B's API port is taken while it is down: it says which port it got, and reconnects.
        assert run_cli(capsys, *b, "node", "stop")[0] == 0
        port_b = int(api_b.rsplit(":", 1)[1])
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", port_b))
            squatter.listen()
            code, out, err = run_cli(capsys, *b, "node", "start")
        assert code == 0, err
        api_b2, _ = started(out)
        assert api_b2 != api_b
        got = api_b2.rsplit(":", 1)[1]
        assert f"note: the api port {port_b} is in use; this start got {got}" in out
        poll_until(lambda: peer_a in peers_of(api_b2), timeout=20, what="B connected to A")
    finally:
        run_cli(capsys, *b, "node", "stop")
        run_cli(capsys, *a, "node", "stop")


def test_the_peers_file_keeps_loopback_addresses_only(tmp_path: Path) -> None:
    remember_peers(tmp_path, {GHOST: [f"/ip4/127.0.0.1/tcp/9/p2p/{GHOST}"]})
    remember_peers(tmp_path, {"other": ["/ip4/10.0.0.1/tcp/4001", "/dns4/example.org/tcp/1"]})
    assert load_peers(tmp_path) == {GHOST: ["/ip4/127.0.0.1/tcp/9"]}  # loopback only
    (tmp_path / "peers.json").write_text("{not json")
    assert load_peers(tmp_path) == {}  # a damaged file is ignored, not fatal
    assert loopback_addresses(["/ip6/::1/tcp/5/p2p/X", "/ip6/::1/tcp/5"]) == ["/ip6/::1/tcp/5"]
