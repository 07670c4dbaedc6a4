"""Kubo in Docker containers for the tests: the ``--kubo=docker`` provider and the compose test.

Image: ``$GRADFED_KUBO_IMAGE``, default ``gradfed-ipfs/kubo:v0.43.1``, which
``scripts/build-kubo-image`` builds with no pull (``FROM scratch`` + the static Kubo binary). The
tests never pull: without the image they skip and say how to build it.

Networking. Each swarm gets a user-defined bridge network created with ``internal=True``: the
containers have no route out (no egress) and Docker drops forwarded traffic from every other
interface into it, so nothing on it is reachable from beyond this host. The nodes reach each
other there by container name (``/dns4/<name>/tcp/4001/p2p/<ID>``, Docker's embedded DNS).
Docker ignores published ports on internal networks, so the tests publish the RPC API
themselves: a :class:`LoopbackForwarder` listens on ``127.0.0.1:<ephemeral>`` and relays to the
API on the container's address on that bridge. Tests see ``http://127.0.0.1:<port>``, as with
local daemons. The alternative, a second non-internal network just for published ports, would
give every container a default route and NAT to the outside (egress), and before Docker 28 hosts
on the same link can reach such a network's published container ports directly.

Ryuk (testcontainers' reaper) needs an image from Docker Hub, so it is disabled; every container
and network carries the label ``org.gradfed.test-session=<SESSION>`` and is removed by id by its
owner, and the session fails if any is left (:func:`leftover_resources`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import shutil
import socket
import subprocess
import threading
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tests.polling import poll_until

# Before anything from testcontainers runs: Ryuk would need a pull from Docker Hub.
os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"

ROOT = Path(__file__).resolve().parent.parent
KUBO_IMAGE = os.environ.get("GRADFED_KUBO_IMAGE", "gradfed-ipfs/kubo:v0.43.1")
SESSION = uuid.uuid4().hex[:12]
LABEL = "org.gradfed.test-session"
API_PORT = 5001
SWARM_PORT = 4001

# The same configuration as docker-compose.yml's command and the local test daemons
# (gradfed_ipfs/kubo/daemon.py): --profile=test, no routing, no bootstrap peers, no mDNS,
# AutoConf off, pubsub on; API and swarm bound inside the container only.
KUBO_COMMAND = "; ".join(
    [
        "set -e",
        '[ -f "$IPFS_PATH/config" ] || ipfs init --profile=test',
        "ipfs config Routing.Type none",
        "ipfs config --json Bootstrap '[]'",
        "ipfs config --json AutoConf.Enabled false",
        "ipfs config --json Discovery.MDNS.Enabled false",
        "ipfs config --json Swarm.DisableNatPortMap true",
        "ipfs config --json Pubsub.Enabled true",
        f"ipfs config Addresses.API /ip4/0.0.0.0/tcp/{API_PORT}",
        f"ipfs config --json Addresses.Swarm '[\"/ip4/0.0.0.0/tcp/{SWARM_PORT}\"]'",
        "exec ipfs daemon --migrate=false",
    ]
)

_used = threading.Event()  # set once this process has created anything in Docker


def _client() -> Any:
    import docker  # type: ignore[import-untyped]

    return docker.from_env(timeout=30)


@functools.cache
def docker_unavailable() -> str | None:
    """Why the Docker tests cannot run here, or ``None`` when they can."""
    reason = os.environ.get("GRADFED_DOCKER_UNAVAILABLE")
    if reason:
        return reason
    try:
        import docker
        import testcontainers.core.container  # noqa: F401
    except ImportError as exc:
        return f"the Docker test dependencies are missing ({exc})"
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not Path(host.removeprefix("unix://")).exists():
        return f"no Docker engine ({host.removeprefix('unix://')} does not exist)"
    client = None
    try:
        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as exc:
        if client is not None:
            client.close()
        # from_env asks the engine for its API version while constructing, so a failure there
        # leaves a socket with no client to close it; collect it now, quietly, rather than let
        # its ResourceWarning land on whichever test runs when the collector next runs.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        return f"no Docker engine answers ({type(exc).__name__})"
    try:
        client.images.get(KUBO_IMAGE)
    except docker.errors.ImageNotFound:
        return f"image {KUBO_IMAGE} is not present: build it with scripts/build-kubo-image"
    except Exception as exc:
        return f"the Docker engine cannot inspect {KUBO_IMAGE} ({type(exc).__name__}: {exc})"
    finally:
        client.close()
    return None


def compose_command() -> list[str] | None:
    """``docker compose`` (v2 plugin) or ``docker-compose`` (1.29), whichever works here."""
    candidates = [["docker", "compose"], ["docker-compose"]]
    for command in candidates:
        if shutil.which(command[0]) is None:
            continue
        probe = subprocess.run(
            [*command, "version"], capture_output=True, text=True, check=False, timeout=30
        )
        if probe.returncode == 0:
            return command
    return None


def leftover_resources() -> list[str]:
    """Containers and networks of this test session still present in Docker."""
    if not _used.is_set():
        return []
    client = _client()
    try:
        selector = {"label": f"{LABEL}={SESSION}"}
        found = [f"container {c.name}" for c in client.containers.list(all=True, filters=selector)]
        found += [f"network {n.name}" for n in client.networks.list(filters=selector)]
    finally:
        client.close()
    return found


def note_docker_use() -> None:
    """Record that this session creates Docker resources (so the leftover check looks)."""
    _used.set()


def inspect_container(container_id: str) -> dict[str, Any]:
    """``docker inspect`` of one container."""
    client = _client()
    try:
        attrs: dict[str, Any] = client.api.inspect_container(container_id)
    finally:
        client.close()
    return attrs


def network_is_internal(name: str) -> bool:
    """Whether the Docker network ``name`` was created internal (no route out)."""
    client = _client()
    try:
        return bool(client.api.inspect_network(name)["Internal"])
    finally:
        client.close()


def container_ip(container_id: str, network: str) -> str:
    """The container's IPv4 address on ``network``."""
    networks = inspect_container(container_id)["NetworkSettings"]["Networks"]
    return str(networks[network]["IPAddress"])


def compose_project_resources(project: str) -> list[str]:
    """Containers, networks and volumes of the compose project ``project`` still present."""
    client = _client()
    try:
        selector = {"label": f"com.docker.compose.project={project}"}
        found = [f"container {c.name}" for c in client.containers.list(all=True, filters=selector)]
        found += [f"network {n.name}" for n in client.networks.list(filters=selector)]
        found += [f"volume {v.name}" for v in client.volumes.list(filters=selector)]
    finally:
        client.close()
    return found


def compose_override(path: Path, services: tuple[str, ...]) -> Path:
    """Write a compose override: ``services`` labelled for this session, on an internal network."""
    label = f'{{"{LABEL}": "{SESSION}"}}'
    lines = "".join(f"  {name}:\n    labels: {label}\n" for name in services)
    path.write_text(
        "# A compose test's override: the same services, on an internal network.\n"
        f"services:\n{lines}"
        f"networks:\n  default:\n    internal: true\n    labels: {label}\n"
    )
    return path


def run_checked(command: list[str], *, env: dict[str, str], timeout: float) -> str:
    """Run ``command``; fail the test with its output unless it exits 0; return its stdout."""
    result = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    assert result.returncode == 0, (
        f"{' '.join(command)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    return result.stdout


class LoopbackForwarder:
    """Relay TCP connections from ``127.0.0.1:<ephemeral>`` to ``target`` (threads, no asyncio).

    Each accepted connection gets an upstream connection and two pump threads; end of stream
    in one direction is passed on as a half-close, so long HTTP responses (pubsub subscriptions)
    end when either side ends them. :meth:`stop` closes the listener and every connection.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def start(self) -> LoopbackForwarder:
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        with self._lock:
            self._closed = True
            sockets = list(self._sockets)
            threads = list(self._threads)
        # shutdown() wakes a thread blocked in accept()/recv() on Linux; close() alone does not.
        # The pumps then close their own sockets; whatever is left is closed after the joins.
        for sock in [self._listener, *sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for thread in threads:
            thread.join(timeout=5)
        for sock in sockets:
            sock.close()

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="loopback-forward")
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._sockets.update((client, upstream))
            pumps_left = [2]  # the second pump to finish closes both sockets
            self._spawn(self._pump, client, upstream, pumps_left)
            self._spawn(self._pump, upstream, client, pumps_left)

    def _pump(self, source: socket.socket, sink: socket.socket, pumps_left: list[int]) -> None:
        buffer = memoryview(bytearray(1 << 20))  # 1 MiB: few GIL round trips per gradient
        try:
            while received := source.recv_into(buffer):
                sink.sendall(buffer[:received])
            sink.shutdown(socket.SHUT_WR)  # pass the end of stream on
        except OSError:
            for sock in (source, sink):  # a reset or stop(): tear the whole connection down
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        with self._lock:
            pumps_left[0] -= 1
            last = pumps_left[0] == 0
            if last:
                self._sockets.difference_update((source, sink))
        if last:
            source.close()
            sink.close()


def _rpc(api_url: str, endpoint: str, timeout: float = 30.0, **params: str) -> Any:
    response = httpx.post(f"{api_url}/api/v0/{endpoint}", params=params, timeout=timeout)
    response.raise_for_status()
    return response.json() if response.text.strip() else None


class KuboContainer:
    """One Kubo container (testcontainers) on an internal network, its API on 127.0.0.1.

    ``name`` is also the container's DNS name on the network. Stop it with :meth:`stop`, which
    removes the container (and its anonymous volume) by id.
    """

    def __init__(self, name: str, network: Any, *, image: str = KUBO_IMAGE) -> None:
        from testcontainers.core.container import DockerContainer

        self.name = name
        self.network_name: str = network.name
        self.container_id = ""
        self.api_url = ""
        self.peer_id = ""
        self._forwarder: LoopbackForwarder | None = None
        self._container: Any = (
            DockerContainer(image)
            .with_name(name)
            .with_network(network)
            .with_network_aliases(name)
            .with_env("IPFS_TELEMETRY", "off")
            .with_env("GOLOG_LOG_LEVEL", "error")
            .with_tmpfs_mount("/data/ipfs")  # the repo: fast, and gone with the container
            .with_kwargs(entrypoint=["/bin/sh", "-c"], labels={LABEL: SESSION})
            .with_command([KUBO_COMMAND])
        )

    @property
    def swarm_multiaddr(self) -> str:
        """How the other containers dial this node: by container name."""
        return f"/dns4/{self.name}/tcp/{SWARM_PORT}/p2p/{self.peer_id}"

    def start(self, timeout: float = 60.0) -> KuboContainer:
        note_docker_use()
        self._container.start()
        wrapped = self._container.get_wrapped_container()
        self.container_id = wrapped.id
        ip = container_ip(self.container_id, self.network_name)
        self._forwarder = LoopbackForwarder((ip, API_PORT)).start()
        self.api_url = f"http://127.0.0.1:{self._forwarder.port}"

        def ready() -> bool:
            wrapped.reload()
            if wrapped.status not in ("created", "running"):
                logs = wrapped.logs(tail=30).decode(errors="replace")
                raise RuntimeError(f"container {self.name} is {wrapped.status}:\n{logs}")
            try:
                self.peer_id = str(_rpc(self.api_url, "id", timeout=2.0)["ID"])
            except httpx.HTTPError:
                return False
            return True

        poll_until(ready, timeout=timeout, what=f"the Kubo API of container {self.name}")
        return self

    def stop(self) -> None:
        """Stop the forwarder and remove the container by id (force, with its volumes)."""
        if self._forwarder is not None:
            self._forwarder.stop()
            self._forwarder = None
        wrapped = self._container._container  # set once create() has succeeded
        if wrapped is not None:
            client = _client()
            try:
                client.api.remove_container(wrapped.id, force=True, v=True)
            except Exception as exc:
                if "No such container" not in str(exc):
                    raise
            finally:
                client.close()
            self._container._container = None

    def rpc(self, endpoint: str, timeout: float = 30.0, **params: str) -> Any:
        """POST ``/api/v0/<endpoint>`` and return the decoded JSON answer."""
        return _rpc(self.api_url, endpoint, timeout, **params)

    def connect(self, other: KuboContainer) -> None:
        """``swarm/connect`` to ``other`` by its container name on the internal network."""
        self.rpc("swarm/connect", arg=other.swarm_multiaddr)

    def connected_peers(self) -> set[str]:
        """Peer IDs of this node's current swarm connections."""
        answer = self.rpc("swarm/peers") or {}
        return {str(p.get("Peer")) for p in answer.get("Peers") or []}


def _wait_connected(node: KuboContainer, others: set[str], timeout: float) -> None:
    poll_until(
        lambda: others <= node.connected_peers(),
        timeout=timeout,
        what=f"{node.name} connected to every other container",
    )


class KuboContainerSwarm:
    """``n`` Kubo containers on a fresh internal network, all connected to each other."""

    def __init__(self, n: int, *, image: str = KUBO_IMAGE) -> None:
        self.n = n
        self.image = image
        self.nodes: list[KuboContainer] = []
        self._network: Any = None

    def start(self, timeout: float = 60.0) -> KuboContainerSwarm:
        from testcontainers.core.network import Network

        tag = uuid.uuid4().hex[:8]
        network = Network(
            docker_network_kw={"driver": "bridge", "internal": True, "labels": {LABEL: SESSION}}
        )
        network.name = f"gradfed-test-{tag}"
        note_docker_use()
        self._network = network.create()
        try:
            self.nodes = [
                KuboContainer(f"gradfed-kubo-{tag}-{i}", network, image=self.image)
                for i in range(self.n)
            ]
            with ThreadPoolExecutor(max_workers=self.n) as pool:
                list(pool.map(lambda node: node.start(timeout), self.nodes))
            for i, node in enumerate(self.nodes):
                for other in self.nodes[i + 1 :]:
                    node.connect(other)
            for node in self.nodes:
                _wait_connected(node, {o.peer_id for o in self.nodes if o is not node}, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Remove every container by id, then the network; raise the first error at the end."""
        errors: list[BaseException] = []
        for node in self.nodes:
            try:
                node.stop()
            except Exception as exc:
                errors.append(exc)
        if self._network is not None:
            try:
                self._network.remove()
                self._network = None
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def __iter__(self) -> Iterator[KuboContainer]:
        return iter(self.nodes)
