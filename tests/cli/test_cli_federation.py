"""``federation init`` and ``node start --federation``: a private network on loopback.

Members holding the federation's swarm key find each other through its bootstrap list and
exchange blocks; a node with another key, or a plain (public-network) daemon, cannot even
connect. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest

from gradfed_ipfs import Node
from gradfed_ipfs.block import Block
from gradfed_ipfs.errors import KuboRpcError
from gradfed_ipfs.kubo import KuboDaemon
from gradfed_ipfs.kubo.rpc_sync import rpc_call_sync
from tests.cli.test_cli import no_env_api, own_home, run_cli
from tests.cli.test_cli_node import peers_of, started
from tests.polling import poll_until

__all__ = ["no_env_api", "own_home"]  # fixtures used here

LOOPBACK = ("--listen", "/ip4/127.0.0.1/tcp/0")


def _swarm_address(api: str) -> str:
    answer = rpc_call_sync(api, "id", timeout=5.0)
    return next(a for a in answer["Addresses"] if a.startswith("/ip4/127.0.0.1/tcp/"))


async def _exchange(source: str, target: str, data: bytes) -> bytes:
    """Put ``data`` on the node at ``source``; fetch it by CID through the node at ``target``."""
    async with Node(source) as first, Node(target, timeout=15.0) as second:
        cid = await first.store.put(Block.new(data, "raw"))
        return (await second.store.get(cid)).data


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_init_writes_a_secret_file_that_show_never_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "lab.toml"
    code, out, err = run_cli(capsys, "federation", "init", "lab", "--file", str(path))
    assert code == 0, err
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = next(line for line in path.read_text().splitlines() if line.startswith("swarm_key"))
    secret = key.split('"')[1]
    code, shown, err = run_cli(capsys, "federation", "show", str(path))
    assert code == 0, err
    assert secret not in out + shown + err
    assert "fingerprint" in shown
    code, out, err = run_cli(capsys, "federation", "init", "lab", "--file", str(path))
    assert code == 11
    assert "exists" in err  # never replaces a key unless --force
    code, out, err = run_cli(capsys, "federation", "add-bootstrap", str(path), "/ip4/1.2.3.4")
    assert code == 11
    assert "network.bootstrap" in err


@pytest.mark.kubo
def test_members_connect_and_exchange_blocks_and_outsiders_cannot(
    no_env_api: None, kubo_binary: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lab, other = tmp_path / "lab.toml", tmp_path / "other.toml"
    assert run_cli(capsys, "federation", "init", "lab", "--file", str(lab))[0] == 0
    assert run_cli(capsys, "federation", "init", "other", "--file", str(other))[0] == 0
    a, b, c = (["--node-dir", str(tmp_path / name)] for name in "abc")
    outsider = KuboDaemon(binary=kubo_binary)  # the project's plain loopback daemon: no key
    try:
        code, out, err = run_cli(capsys, *a, "node", "start", "--federation", str(lab), *LOOPBACK)
        assert code == 0, err
        api_a, _ = started(out)
        assert "private network of federation lab" in out
        pid_a = int(out.split("pid ")[1].split(",")[0])
        assert _environ(pid_a)["LIBP2P_FORCE_PNET"] == "1"
        assert rpc_call_sync(api_a, "config", {"arg": "Addresses.Gateway"})["Value"] == []
        assert api_a.startswith("http://127.0.0.1:")
        address_a = _swarm_address(api_a)
        assert run_cli(capsys, "federation", "add-bootstrap", str(lab), address_a)[0] == 0

        # B knows only the federation file: it dials A from the bootstrap list by itself.
        code, out, err = run_cli(capsys, *b, "node", "start", "--federation", str(lab), *LOOPBACK)
        assert code == 0, err
        api_b, peer_b = started(out)
        poll_until(lambda: peer_b in peers_of(api_a), timeout=30, what="B joined A")
        assert asyncio.run(_exchange(api_b, api_a, b"members only")) == b"members only"

        # C holds another federation's key; the outsider holds none: neither gets in.
        code, out, err = run_cli(capsys, *c, "node", "start", "--federation", str(other), *LOOPBACK)
        assert code == 0, err
        api_c, peer_c = started(out)
        outsider.start()
        for api in (api_c, outsider.api_url):
            with pytest.raises(KuboRpcError):
                rpc_call_sync(api, "swarm/connect", {"arg": address_a}, timeout=10.0)
        assert not {peer_c, outsider.peer_id} & peers_of(api_a)

        # A member's node directory stays a member: a plain start is refused, not downgraded.
        assert run_cli(capsys, *a, "node", "stop")[0] == 0
        code, out, err = run_cli(capsys, *a, "node", "start")
        assert code != 0
        assert "federation member" in err
        code, out, err = run_cli(capsys, *a, "node", "start", "--federation", str(other))
        assert code != 0
        assert "not of other" in err
    finally:
        outsider.stop()
        for node in (c, b, a):
            run_cli(capsys, *node, "node", "stop")
