"""Shared fixtures: Kubo providers, block stores, and the no-leftover check.

Providers (``--kubo=…``; the default comes from ``$GRADFED_KUBO_PROVIDER``, else ``binary``):

``binary`` (default)
    Local daemons from the pinned binary (``scripts/install-kubo``), on loopback, each with its
    own temporary repo.
``docker``
    Kubo containers via testcontainers from ``gradfed-ipfs/kubo:v0.43.1`` (built locally by
    ``scripts/build-kubo-image``, no pull; ``$GRADFED_KUBO_IMAGE`` picks another image) on an
    internal network, the API relayed to 127.0.0.1 (see ``tests/docker_kubo.py``). Skipped,
    with the reason, where no Docker engine answers or the image is missing.
``external``
    One running daemon at ``$GRADFED_IPFS_API``; multi-node tests skip.

The same integration test bodies run under every provider: they only see ``KuboNode`` objects
with an ``api_url`` and a ``peer_id``. A test marked ``@pytest.mark.docker`` that uses
``kubo_node``, ``kubo_swarm3`` or ``kubo_store`` runs once per provider: ``[binary]`` and
``[docker]`` by default, so the default suite covers the containers too. Only the ``[docker]``
variants keep the ``docker`` mark (``-m docker`` runs just those, ``-m "not docker"`` skips
them). The terminal summary ends with the pass counts per provider.

With ``CI=true``, a skipped test of a required area (docker, crate-oracle, ipfs-cluster, torch,
sklearn, netns, cometbft) fails the session unless ``GRADFED_ALLOW_SKIP`` names the area
(``tests/required.py``).
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from hypothesis import HealthCheck, settings

from gradfed_ipfs.cometbft import live_validator_pids
from gradfed_ipfs.kubo import KuboDaemon, KuboSwarm, find_kubo_binary, live_daemon_pids
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore
from tests import docker_kubo, required

# A run started in the background by a shell without job control (`nohup scripts/test &`)
# inherits SIGINT ignored, and so would every CLI the Ctrl+C tests start (Python keeps an
# ignored SIGINT ignored): the tests' processes get Python's own handler back.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

pytest_plugins = ("pytester",)  # for tests/test_required_areas.py

settings.register_profile(
    "ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "fuzz", max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

PROVIDERS = ("binary", "docker", "external")
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kubo",
        default=os.environ.get("GRADFED_KUBO_PROVIDER", "binary"),
        choices=PROVIDERS,
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


def _variants(config: pytest.Config) -> list[str]:
    """Providers a ``docker``-marked test runs on: the chosen one, and Docker besides."""
    chosen = _provider(config)
    return [chosen] if chosen == "docker" else [chosen, "docker"]


def pytest_configure(config: pytest.Config) -> None:
    required.register(config)
    config.addinivalue_line(
        "markers",
        "docker: runs on Kubo containers too (a [docker] variant beside the chosen provider)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("docker") is None:
        return
    if "kubo_provider" not in metafunc.fixturenames:
        return  # a Docker-only test (the compose test), not parametrized
    variants = _variants(metafunc.config)
    metafunc.parametrize("kubo_provider", variants, indirect=True, ids=variants)


def _item_provider(item: pytest.Item, default: str) -> str | None:
    """The Kubo provider a collected test runs on, or ``None`` for tests without Kubo."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "kubo_provider" in callspec.params:
        return str(callspec.params["kubo_provider"])
    fixtures = getattr(item, "fixturenames", ())
    if "kubo_binary" in fixtures:
        return "binary"
    if item.get_closest_marker("docker") is not None:
        return "docker"
    if "kubo_provider" in fixtures or item.get_closest_marker("kubo") is not None:
        return default
    return None


_item_providers: dict[str, str] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        provider = _item_provider(item, _provider(config))
        if provider is not None:
            _item_providers[item.nodeid] = provider
        if provider not in (None, "docker") and isinstance(item, pytest.Function):
            # The mark put this test on Docker too; its non-Docker variant is not a Docker test.
            item.own_markers[:] = [m for m in item.own_markers if m.name != "docker"]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """One line with the outcome counts per Kubo provider (and why Docker tests skipped)."""
    outcomes: dict[str, Counter[str]] = {}
    seen: set[tuple[str, str]] = set()
    docker_skips: set[str] = set()
    for category in OUTCOMES:
        for report in terminalreporter.stats.get(category, []):
            provider = _item_providers.get(getattr(report, "nodeid", ""))
            if provider is None or (report.nodeid, category) in seen:
                continue
            seen.add((report.nodeid, category))
            outcomes.setdefault(provider, Counter())[category] += 1
            if provider == "docker" and category == "skipped":
                longrepr = report.longrepr
                reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
                docker_skips.add(required.untagged(reason.removeprefix("Skipped: ")))
    if not outcomes:
        return
    parts = []
    for provider in sorted(outcomes, key=PROVIDERS.index):
        counts = outcomes[provider]
        parts.append(f"{provider} " + ", ".join(f"{counts[c]} {c}" for c in OUTCOMES if counts[c]))
    terminalreporter.write_line("kubo providers: " + "; ".join(parts))
    for reason in sorted(docker_skips):
        terminalreporter.write_line(f"kubo providers: docker tests skipped: {reason}")


def _unavailable(provider: str) -> str | None:
    if provider == "docker":
        return docker_kubo.docker_unavailable()
    if provider == "external" and not os.environ.get("GRADFED_IPFS_API"):
        return "--kubo=external needs GRADFED_IPFS_API"
    return None


@pytest.fixture
def kubo_provider(request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> str:
    """The provider of this test's nodes: its ``[variant]``, else the ``--kubo`` option."""
    provider = str(getattr(request, "param", _provider(pytestconfig)))
    reason = _unavailable(provider)
    if reason and provider == "docker":
        required.skip_area("docker", reason)
    if reason:
        pytest.skip(reason)  # --kubo=external without an API: not a required area
    return provider


@pytest.fixture(scope="session")
def kubo_binary(pytestconfig: pytest.Config) -> Path:
    """The local Kubo binary, for tests that run (stop, kill, restart) their own daemons."""
    provider = _provider(pytestconfig)
    if provider != "binary":
        pytest.skip(f"needs a local Kubo binary (provider is {provider})")
    return find_kubo_binary()


def _start_nodes(provider: str, n: int) -> tuple[list[Any], Callable[[], None]]:
    """Start ``n`` connected nodes; return them and a stopper."""
    if provider == "binary":
        swarm = KuboSwarm(n).start()
        return list(swarm), swarm.stop
    if provider == "docker":
        containers = docker_kubo.KuboContainerSwarm(n).start()
        return list(containers), containers.stop
    if n > 1:
        pytest.skip("--kubo=external provides a single daemon")
    return [ExternalNode(os.environ["GRADFED_IPFS_API"])], lambda: None


class _NodePool:
    """Nodes started on first use, per (provider, count), shared by the session.

    The ``[binary]`` and ``[docker]`` variants interleave in collection order; pooling (instead of
    a parametrized session fixture) starts each set once rather than at every switch.
    """

    def __init__(self) -> None:
        self._started: dict[tuple[str, int], tuple[list[Any], Callable[[], None]]] = {}
        self._failed: dict[tuple[str, int], BaseException] = {}

    def get(self, provider: str, n: int) -> list[Any]:
        key = (provider, n)
        if key in self._failed:
            raise RuntimeError(f"{n} {provider} node(s) failed to start") from self._failed[key]
        if key not in self._started:
            try:
                self._started[key] = _start_nodes(provider, n)
            except Exception as exc:  # not pytest.skip (a BaseException): that is not cached
                self._failed[key] = exc
                raise
        return self._started[key][0]

    def stop(self) -> None:
        errors: list[BaseException] = []
        for _nodes, stop in reversed(self._started.values()):
            try:
                stop()
            except Exception as exc:
                errors.append(exc)
        self._started.clear()
        if errors:
            raise errors[0]


@pytest.fixture(scope="session")
def kubo_pool() -> Iterator[_NodePool]:
    pool = _NodePool()
    try:
        yield pool
    finally:
        pool.stop()


@pytest.fixture
def kubo_node(kubo_provider: str, kubo_pool: _NodePool) -> KuboNode:
    """One daemon shared by the whole session (tests must not depend on its contents)."""
    node: KuboNode = kubo_pool.get(kubo_provider, 1)[0]
    return node


@pytest.fixture
def kubo_swarm3(kubo_provider: str, kubo_pool: _NodePool) -> list[KuboNode]:
    """Three connected daemons shared by the session (bitswap and pubsub between them)."""
    return kubo_pool.get(kubo_provider, 3)


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


def _child_pids(matches: Callable[[list[bytes]], bool]) -> list[int]:
    """PIDs of this test process's children whose command line ``matches``.

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
        if parent == me and matches(cmdline):
            pids.append(int(entry.name))
    return pids


def _child_daemon_pids(binary: Path) -> list[int]:
    """PIDs of ``ipfs daemon`` processes from ``binary`` whose parent is this test process."""
    return _child_pids(lambda argv: argv[:2] == [str(binary).encode(), b"daemon"])


def _child_validator_pids() -> list[int]:
    """PIDs of ``cometbft node`` and ABCI app processes whose parent is this test process."""
    app = b"gradfed_ipfs.cometbft.abci"
    return _child_pids(
        lambda argv: (
            (len(argv) > 1 and argv[0].endswith(b"/cometbft") and argv[1] == b"node") or app in argv
        )
    )


@pytest.fixture(scope="session", autouse=True)
def no_leftover_daemons(pytestconfig: pytest.Config) -> Iterator[None]:
    """Fail the session if a daemon, validator, container or network this run started is left."""
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
    validators = sorted(set(live_validator_pids() + _child_validator_pids()))
    if validators:
        pytest.fail(f"CometBFT validators or ABCI apps left after the test session: {validators}")
    docker_leftovers = docker_kubo.leftover_resources()
    if docker_leftovers:
        pytest.fail(f"Docker resources left after the test session: {docker_leftovers}")
