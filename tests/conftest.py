"""Shared fixtures: Kubo providers, block stores, and the no-leftover-daemon check.

Providers (``--kubo=…``):

``binary`` (default)
    Local daemons from the pinned binary (``scripts/install-kubo``), on loopback, each with its
    own temporary repo.
``docker``
    ``ipfs/kubo:v0.43.1`` containers via testcontainers; used only where a Docker engine
    answers (these machines have none, so the tests skip with that reason).
``external``
    One running daemon at ``$GRADFED_IPFS_API``; multi-node tests skip.

The same integration test bodies run under every provider: they only see ``KuboNode`` objects
with an ``api_url`` and a ``peer_id``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from hypothesis import HealthCheck, settings

from gradfed_ipfs.kubo import KuboDaemon, KuboSwarm, find_kubo_binary, live_daemon_pids
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore

settings.register_profile(
    "ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "fuzz", max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kubo",
        default=os.environ.get("GRADFED_KUBO_PROVIDER", "binary"),
        choices=["binary", "docker", "external"],
        help="where integration tests get Kubo daemons from (default: binary)",
    )


class KuboNode(Protocol):
    """What integration tests need from a daemon, whatever provides it."""

    api_url: str
    peer_id: str


@dataclass
class ExternalNode:
    api_url: str
    peer_id: str = ""


def _provider(config: pytest.Config) -> str:
    return str(config.getoption("--kubo"))


def _docker_engine_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=3).ping()
    except Exception:
        return False
    return True


class DockerKubo:
    """A Kubo container (testcontainers) with the API published on the host's loopback."""

    def __init__(self) -> None:
        from testcontainers.core.container import DockerContainer

        self._container: Any = (
            DockerContainer("ipfs/kubo:v0.43.1")
            .with_env("IPFS_PROFILE", "test")
            .with_env("IPFS_TELEMETRY", "off")
            .with_bind_ports(5001, ("127.0.0.1", 0))
        )
        self.api_url = ""
        self.peer_id = ""

    def start(self) -> DockerKubo:
        import httpx

        self._container.start()
        port = self._container.get_exposed_port(5001)
        self.api_url = f"http://127.0.0.1:{port}"
        from tests.polling import poll_until

        def ready() -> bool:
            try:
                self.peer_id = httpx.post(f"{self.api_url}/api/v0/id", timeout=2).json()["ID"]
            except Exception:
                return False
            return True

        poll_until(ready, timeout=60, what="kubo container API")
        return self

    def stop(self) -> None:
        self._container.stop()


@pytest.fixture(scope="session")
def kubo_provider(pytestconfig: pytest.Config) -> str:
    provider = _provider(pytestconfig)
    if provider == "docker" and not _docker_engine_answers():
        pytest.skip("--kubo=docker: no Docker engine answers on this machine")
    if provider == "external" and not os.environ.get("GRADFED_IPFS_API"):
        pytest.skip("--kubo=external needs GRADFED_IPFS_API")
    return provider


@pytest.fixture(scope="session")
def kubo_binary(kubo_provider: str) -> Path:
    if kubo_provider != "binary":
        pytest.skip(f"needs a local Kubo binary (provider is {kubo_provider})")
    return find_kubo_binary()


def _start_nodes(provider: str, n: int) -> tuple[list[Any], Any]:
    """Start ``n`` connected nodes; return them and a stopper."""
    if provider == "binary":
        swarm = KuboSwarm(n).start()
        return list(swarm), swarm.stop
    if provider == "docker":
        nodes = [DockerKubo().start() for _ in range(n)]
        return nodes, lambda: [node.stop() for node in nodes]
    if n > 1:
        pytest.skip("--kubo=external provides a single daemon")
    return [ExternalNode(os.environ["GRADFED_IPFS_API"])], lambda: None


@pytest.fixture(scope="session")
def kubo_node(kubo_provider: str) -> Iterator[KuboNode]:
    """One daemon shared by the whole session (tests must not depend on its contents)."""
    nodes, stop = _start_nodes(kubo_provider, 1)
    try:
        yield nodes[0]
    finally:
        stop()


@pytest.fixture(scope="session")
def kubo_swarm3(kubo_provider: str) -> Iterator[list[KuboNode]]:
    """Three connected daemons shared by the session (bitswap and pubsub between them)."""
    nodes, stop = _start_nodes(kubo_provider, 3)
    try:
        yield nodes
    finally:
        stop()


@pytest.fixture
def fresh_daemon(kubo_binary: Path) -> Iterator[KuboDaemon]:
    """A daemon of this test's own, for tests that stop, kill or restart it."""
    daemon = KuboDaemon(binary=kubo_binary).start()
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
async def kubo_store(kubo_node: KuboNode) -> AsyncIterator[KuboBlockStore]:
    """A ``KuboBlockStore`` on the session daemon (5 s default timeout)."""
    store = KuboBlockStore(kubo_node.api_url, timeout=5.0)
    try:
        yield store
    finally:
        await store.aclose()


@pytest.fixture
async def memory_store() -> AsyncIterator[MemoryBlockStore]:
    """An empty ``MemoryBlockStore``."""
    async with MemoryBlockStore() as store:
        yield store


def _child_daemon_pids(binary: Path) -> list[int]:
    """PIDs of ``ipfs daemon`` processes from ``binary`` whose parent is this test process.

    Only our own children count, so concurrent test runs on the same machine do not interfere.
    """
    pids = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        is_daemon = (
            len(cmdline) > 1 and cmdline[0] == str(binary).encode() and cmdline[1] == b"daemon"
        )
        if is_daemon and parent == me:
            pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="session", autouse=True)
def no_leftover_daemons(pytestconfig: pytest.Config) -> Iterator[None]:
    """Fail the session if any daemon this run started is still running at the end."""
    binary = None
    if _provider(pytestconfig) == "binary":
        try:
            binary = find_kubo_binary(build=False)
        except Exception:
            binary = None
    yield
    leftovers = live_daemon_pids()
    if binary:
        leftovers += _child_daemon_pids(binary)
    if leftovers:
        pytest.fail(f"Kubo daemons left running after the test session: {sorted(set(leftovers))}")
