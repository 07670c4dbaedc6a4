"""docker-compose.members.yml: three federation members, one per service, train to one model.

Each member is a container of the member image (scripts/build-member-image: no pull) running its
own Kubo node in the federation's private network and ``gradfed-ipfs train``; the ``init``
service makes the federation file. The project gets a unique name and an override that makes its
network internal (no egress) and labels every container for the session's leftover check.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from gradfed_ipfs.federation import Federation, load_federation
from tests import docker_kubo
from tests.docker_kubo import compose_override as override
from tests.docker_kubo import run_checked as run
from tests.polling import poll_until
from tests.required import skip_area

pytestmark = [pytest.mark.docker]

MEMBERS = ("member-0", "member-1", "member-2")
ROUNDS = 4


def compose_run(base: list[str], env: dict[str, str]) -> list[str]:
    """A one-off container of the init service's image with the federation volume, no network."""
    return [*base, "run", "--rm", "--no-deps", "-T", "init"]


def load_federation_text(text: str) -> Federation:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "federation.toml"
        path.write_text(text)
        path.chmod(0o600)
        return load_federation(path)


def member_image(env: dict[str, str]) -> str:
    """Build (or find, cached by digest) the member image; return its tag."""
    script = docker_kubo.ROOT / "scripts" / "build-member-image"
    return run([str(script)], env=env, timeout=900).strip().splitlines()[-1]


def test_three_member_services_train_to_one_model(tmp_path: Path) -> None:
    reason = docker_kubo.docker_unavailable()
    if reason:
        skip_area("docker", reason)
    compose = docker_kubo.compose_command()
    if compose is None:
        skip_area("docker", "neither `docker compose` nor `docker-compose` works here")
    env = {**os.environ, "GRADFED_TASK_ROUNDS": str(ROUNDS)}
    env["GRADFED_MEMBER_IMAGE"] = member_image(env)
    project = f"gradfed-members-{uuid.uuid4().hex[:8]}"
    base = [*compose, "--project-name", project]
    base += ["--file", str(docker_kubo.ROOT / "docker-compose.members.yml")]
    base += [
        "--file",
        str(override(tmp_path / "docker-compose.test.yml", ("init", *MEMBERS))),
    ]
    docker_kubo.note_docker_use()
    try:
        run([*base, "up", "-d", "--no-build"], env=env, timeout=300)
        ids = dict(zip(MEMBERS, run([*base, "ps", "-q", *MEMBERS], env=env, timeout=60).split(),
                       strict=True))  # fmt: skip
        for container in ids.values():
            attrs = docker_kubo.inspect_container(container)
            assert not any((attrs["NetworkSettings"]["Ports"] or {}).values()), "a port published"
            (network,) = attrs["NetworkSettings"]["Networks"]
            assert docker_kubo.network_is_internal(network)

        def finished() -> bool:
            states = [docker_kubo.inspect_container(c)["State"] for c in ids.values()]
            return all(state["Status"] == "exited" for state in states)

        poll_until(finished, timeout=300, what="every member's training finished")
        logs = {m: run([*base, "logs", "--no-color", m], env=env, timeout=60) for m in MEMBERS}
        codes = {m: docker_kubo.inspect_container(c)["State"]["ExitCode"] for m, c in ids.items()}
        assert codes == dict.fromkeys(MEMBERS, 0), logs
        models = {m: re.findall(rf"done: {ROUNDS} rounds, model (\S+)", text)
                  for m, text in logs.items()}  # fmt: skip
        assert all(len(found) == 1 for found in models.values()), logs
        assert len({found[0] for found in models.values()}) == 1, models  # one model for all
        for text in logs.values():
            assert f"3 members, {ROUNDS} rounds" in text
            assert text.count("received 3 results") == ROUNDS, text
        init = run([*base, "logs", "--no-color", "init"], env=env, timeout=60)
        assert "fingerprint" in init
        # The federation file is mode 600 in its volume, and its key is in no log.
        stat, text = run(
            [
                *compose_run(base, env),
                "stat -c %a /federation/federation.toml; cat /federation/federation.toml",
            ],
            env=env,
            timeout=120,
        ).split("\n", 1)
        assert stat == "600"
        key = load_federation_text(text).swarm_key.hex()
        assert all(key not in log for log in [init, *logs.values()])
    finally:
        down = subprocess.run(
            [*base, "down", "--volumes", "--remove-orphans", "--timeout", "10"],
            capture_output=True, text=True, env=env, timeout=180, check=False,
        )  # fmt: skip
    assert down.returncode == 0, down.stderr
    assert docker_kubo.compose_project_resources(project) == []
