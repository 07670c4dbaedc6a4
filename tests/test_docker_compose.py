"""docker-compose.yml itself: ``up -d``, one private network, a 3-peer round, ``down -v``.

The project gets a unique name and an override file that makes its network internal (no
egress). Docker ignores published ports on internal networks, so nothing binds the file's
127.0.0.1:5001-5003 and the test cannot clash with a compose project the user runs; the test
relays each API to an ephemeral 127.0.0.1 port instead (``tests/docker_kubo.py``). The round is
``scripts/compose_round.py``, the same program docs/howto/docker.md runs against a plain ``up -d``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gradfed_ipfs.kubo.rpc_sync import rpc_call_sync
from tests import docker_kubo
from tests.cli.test_cli_federation import _exchange
from tests.cli.test_cli_node import peers_of
from tests.docker_kubo import run_checked as run
from tests.polling import poll_until
from tests.required import skip_area

pytestmark = [pytest.mark.kubo, pytest.mark.docker]

SERVICES = ("kubo-0", "kubo-1", "kubo-2")


def test_compose_file_runs_a_three_peer_round(tmp_path: Path) -> None:
    reason = docker_kubo.docker_unavailable()
    if reason:
        skip_area("docker", reason)
    compose = docker_kubo.compose_command()
    if compose is None:
        skip_area("docker", "neither `docker compose` nor `docker-compose` works here")
    project = f"gradfed-test-{uuid.uuid4().hex[:8]}"
    compose_file = docker_kubo.ROOT / "docker-compose.yml"
    base = [*compose, "--project-name", project, "--file", str(compose_file)]
    base += [
        "--file",
        str(
            docker_kubo.compose_override(tmp_path / "docker-compose.test.yml", ("init", *SERVICES))
        ),
    ]
    env = {
        **os.environ,
        "GRADFED_KUBO_IMAGE": docker_kubo.KUBO_IMAGE,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(docker_kubo.ROOT), os.environ.get("PYTHONPATH")])
        ),
    }
    forwarders: list[docker_kubo.LoopbackForwarder] = []
    docker_kubo.note_docker_use()
    try:
        run([*base, "up", "-d", "--no-build"], env=env, timeout=180)
        container_ids = run([*base, "ps", "-q", *SERVICES], env=env, timeout=60).split()
        assert len(container_ids) == len(SERVICES)
        for container_id in container_ids:
            attrs = docker_kubo.inspect_container(container_id)
            assert not any(attrs["NetworkSettings"]["Ports"].values()), "a port is published"
            (network,) = attrs["NetworkSettings"]["Networks"]
            assert docker_kubo.network_is_internal(network)
            ip = docker_kubo.container_ip(container_id, network)
            forwarders.append(docker_kubo.LoopbackForwarder((ip, docker_kubo.API_PORT)).start())
        apis = [f"http://127.0.0.1:{forwarder.port}" for forwarder in forwarders]
        # One private network from the start: the nodes dial each other by themselves, and a
        # block put on one is fetched through another.
        ids = [rpc_call_sync(api, "id", timeout=10.0)["ID"] for api in apis]
        for api, own in zip(apis, ids, strict=True):
            others = set(ids) - {own}
            poll_until(lambda api=api, others=others: others <= peers_of(api), timeout=60,
                       what=f"{api} connected to the other two")  # fmt: skip
        assert asyncio.run(_exchange(apis[0], apis[2], b"one network")) == b"one network"
        for api in apis:
            key = rpc_call_sync(api, "config", {"arg": "Swarm.Transports.Network.QUIC"})
            assert key["Value"] is False
        round_script = docker_kubo.ROOT / "scripts" / "compose_round.py"
        command = [sys.executable, str(round_script), "--dim", "300000"]
        for api in apis:
            command += ["--api", api]
        output = run(command, env=env, timeout=300)
        assert "OK: every peer's aggregate equals the NumPy reference" in output, output
        assert output.count("took in 2 peer gradients") == len(SERVICES), output
    finally:
        for forwarder in forwarders:
            forwarder.stop()
        down = subprocess.run(
            [*base, "down", "--volumes", "--remove-orphans", "--timeout", "10"],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
            check=False,
        )
    assert down.returncode == 0, down.stderr
    assert docker_kubo.compose_project_resources(project) == []
