"""A federation of four hosts (network namespaces this test creates), set up through the CLI.

``scripts/wan/setup.sh --no-kubo`` makes the hosts: each namespace has its own address on the
script's own veths behind a router namespace, and nothing else. On each host a member runs
``node start --federation`` with the deployment defaults (listening on every interface of its
namespace, TCP 4001) and ``train``; a fifth host runs a plain node without the swarm key. All
traffic stays inside the namespaces; everything is torn down by PID at the end.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.federation.test_train_processes import TASK
from tests.required import skip_area

pytestmark = pytest.mark.kubo

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("gradfed-ipfs"))
TOOLS = ("ip", "tc", "iptables", "iptables-restore", "gcc", "curl", "jq", "chrt", "numfmt")
PREFIX = "gfed"


def _needs() -> None:
    if os.geteuid() != 0:
        skip_area("netns", "network namespaces need root")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        skip_area("netns", f"missing {', '.join(missing)} (apt-get install iproute2 iptables …)")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory, kubo_binary: Path) -> Iterator[list[str]]:
    """Five host namespaces ``gfedA..gfedE``, addresses 10.201.0.6, .10, …; torn down after."""
    _needs()
    run_dir = tmp_path_factory.mktemp("hosts")
    env = {**os.environ, "WAN_RUN_DIR": str(run_dir), "GRADFED_KUBO_BIN": str(kubo_binary)}
    script = ROOT / "scripts" / "wan"
    setup = [str(script / "setup.sh"), "-n", "5", "-r", "none", "-p", PREFIX, "--no-kubo"]
    subprocess.run(setup, env=env, check=True, capture_output=True, timeout=120)
    try:
        yield [f"{PREFIX}{letter}" for letter in "ABCDE"]
    finally:
        subprocess.run([str(script / "teardown.sh")], env=env, check=False, timeout=120)


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRADFED_TASK_ROUNDS": "10"}
    env.pop("GRADFED_IPFS_API", None)
    return env


def _on(host: str, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", host, CLI, *argv],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _trainer(host: str, node_dir: Path, federation: Path) -> subprocess.Popen[str]:
    argv = ["--node-dir", str(node_dir), "train", "--federation", str(federation), str(TASK)]
    return subprocess.Popen(
        ["ip", "netns", "exec", host, CLI, *argv, "--linger", "20"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _start(host: str, node_dir: Path, *argv: str) -> str:
    done = _on(host, "--node-dir", str(node_dir), "node", "start", *argv)
    assert done.returncode == 0, done.stderr
    match = re.search(r"peer (\S+)", done.stdout)
    assert match, done.stdout
    return match.group(1)


def test_four_hosts_train_to_one_model_and_a_keyless_node_gets_nothing(
    hosts: list[str], tmp_path: Path
) -> None:
    lab = tmp_path / "lab.toml"
    assert _on(hosts[0], "federation", "init", "lab", "--file", str(lab)).returncode == 0
    dirs = [tmp_path / host for host in hosts]
    members = hosts[:4]
    try:
        first = _start(members[0], dirs[0], "--federation", str(lab))  # default listen
        bootstrap = f"/ip4/10.201.0.6/tcp/4001/p2p/{first}"
        assert _on(members[0], "federation", "add-bootstrap", str(lab), bootstrap).returncode == 0
        peers = [first] + [
            _start(host, node_dir, "--federation", str(lab))
            for host, node_dir in zip(members[1:], dirs[1:4], strict=True)
        ]
        assert _on(members[0], "federation", "allow", str(lab), *peers).returncode == 0
        shown = _on(members[0], "--node-dir", str(dirs[0]), "train", "--federation", str(lab),
                    str(TASK), "--show-genesis")  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        genesis = shown.stdout.strip()
        assert _on(members[0], "federation", "genesis", str(lab), genesis).returncode == 0

        trainers = [
            _trainer(host, node_dir, lab) for host, node_dir in zip(members, dirs[:4], strict=True)
        ]
        outputs = [process.communicate(timeout=300) for process in trainers]
        models = set()
        for process, (out, err) in zip(trainers, outputs, strict=True):
            assert process.returncode == 0, err[-3000:]
            models.add(re.findall(r"done: 10 rounds, model (\S+)", out)[0])
        assert len(models) == 1, outputs  # one model CID on all four hosts

        # Host E: a plain node with no swarm key can neither connect nor fetch the model.
        _start(hosts[4], dirs[4])
        dial = _on(hosts[4], "--node-dir", str(dirs[4]), "node", "connect", bootstrap)
        assert dial.returncode != 0, dial.stdout
        fetched = _on(hosts[4], "--node-dir", str(dirs[4]), "--timeout", "5", "fetch",
                      models.pop(), "-o", str(tmp_path / "stolen.npy"))  # fmt: skip
        assert fetched.returncode != 0
        assert not (tmp_path / "stolen.npy").exists()
    finally:
        for host, node_dir in zip(hosts, dirs, strict=True):
            _on(host, "--node-dir", str(node_dir), "node", "stop")
