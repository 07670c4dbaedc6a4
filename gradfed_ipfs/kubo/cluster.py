"""IPFS Cluster peers beside local Kubo daemons, on loopback: replicated pinning of round roots.

Each :class:`ClusterPeer` runs ``ipfs-cluster-service`` (CRDT consensus) in its own temporary
directory, drives one :class:`~gradfed_ipfs.kubo.KuboDaemon` through its RPC API, and serves
Cluster's REST API on 127.0.0.1. Its libp2p host listens on 127.0.0.1 only, with mDNS off and
no relay service; the binary is built by ``scripts/install-ipfs-cluster`` without NAT port
mapping, so nothing is sent beyond loopback. Peers of one :class:`ClusterSwarm` share a secret
and bootstrap from the peers started before them. Every process is stopped by its own PID.

Cluster is optional: only replicated pinning needs it, and it is built on first use.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final, Self

from .. import _reaper
from .._ports import free_port
from ..errors import KuboRpcError, KuboStartError
from .daemon import KuboDaemon
from .rpc_sync import rpc_call_sync

__all__ = [
    "CLUSTER_VERSION",
    "ClusterPeer",
    "ClusterSwarm",
    "find_cluster_binary",
]

logger = logging.getLogger("gradfed_ipfs.kubo.cluster")

CLUSTER_VERSION: Final = "v1.1.6"
"""The IPFS Cluster release ``scripts/install-ipfs-cluster`` builds."""
_BINARY_ENV: Final = "GRADFED_CLUSTER_BIN"


def find_cluster_binary() -> Path:
    """Return ``ipfs-cluster-service``: ``$GRADFED_CLUSTER_BIN``, the cache, or a fresh build.

    Raises
    ------
    KuboStartError
        If the binary is missing and ``scripts/install-ipfs-cluster`` cannot build it.
    """
    override = os.environ.get(_BINARY_ENV)
    if override and Path(override).is_file():
        return Path(override)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    cached = (
        Path(cache) / "gradfed-ipfs" / "ipfs-cluster" / CLUSTER_VERSION / "ipfs-cluster-service"
    )
    if cached.is_file():
        return cached
    script = Path(__file__).resolve().parents[2] / "scripts" / "install-ipfs-cluster"
    if not script.is_file():
        raise KuboStartError(
            f"ipfs-cluster-service not found; set {_BINARY_ENV} or build it with "
            "scripts/install-ipfs-cluster from a source checkout"
        )
    result = subprocess.run([str(script)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise KuboStartError(f"building ipfs-cluster-service failed: {result.stderr[-2000:]}")
    return Path(result.stdout.strip())


_PORT_ATTEMPTS: Final = 3
"""Starts tried with fresh ports when a chosen port was taken before the peer bound it."""


def _api_multiaddr(kubo: KuboDaemon) -> str:
    return (kubo.repo / "api").read_text().strip()


class ClusterPeer:
    """One ``ipfs-cluster-service`` peer driving ``kubo``; a context manager.

    Parameters
    ----------
    kubo
        The running Kubo daemon this peer pins on.
    secret
        The cluster's shared secret (64 hex characters); peers with the same one form a cluster.
    replication
        ``(min, max)`` replication factor of pins that do not set their own.
    binary
        ``ipfs-cluster-service``; :func:`find_cluster_binary` when ``None``.
    start_timeout
        Seconds to wait for the REST API to answer.
    """

    def __init__(
        self,
        kubo: KuboDaemon,
        *,
        secret: str,
        replication: tuple[int, int] = (-1, -1),
        binary: str | Path | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        self.kubo = kubo
        self.secret = secret
        self.replication = replication
        self.binary = Path(binary) if binary is not None else find_cluster_binary()
        self.start_timeout = start_timeout
        self.path = Path(tempfile.mkdtemp(prefix="gradfed-cluster-"))
        self.peer_id = ""
        self.swarm_port = 0
        self.api_url = ""
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def multiaddr(self) -> str:
        """The peer's cluster (libp2p) address, for ``--bootstrap``."""
        return f"/ip4/127.0.0.1/tcp/{self.swarm_port}/p2p/{self.peer_id}"

    @property
    def pid(self) -> int | None:
        """The process ID while it runs."""
        return self._process.pid if self._process is not None else None

    def is_running(self) -> bool:
        """Return whether the process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self, bootstrap: Sequence[str] = ()) -> Self:
        """Write a loopback-only configuration, start the peer and wait for its REST API.

        Parameters
        ----------
        bootstrap
            Cluster multiaddrs of peers to join.

        Raises
        ------
        KuboStartError
            If init fails or the API does not answer within ``start_timeout`` seconds.
        """
        if self.is_running():
            return self
        if not (self.path / "service.json").exists():
            self._run("init", "--consensus", "crdt")
            self._configure()
        self.peer_id = json.loads((self.path / "identity.json").read_text())["id"]
        args = [str(self.binary), "daemon"]
        for address in bootstrap:
            args += ["--bootstrap", address]
        for attempt in range(_PORT_ATTEMPTS):
            self._log = (self.path / "daemon.log").open("ab")
            self._process = subprocess.Popen(
                args,
                env=self._env(),
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            _reaper.watch(self._process.pid)
            try:
                self._wait_ready()
                break
            except KuboStartError:
                # The ports were free when chosen, then another process took one (a race no
                # probe can close): choose new ones and start again.
                if attempt + 1 < _PORT_ATTEMPTS and "address already in use" in self._log_tail():
                    self._terminate()
                    self._configure()
                    continue
                self.stop()
                raise
            except BaseException:
                self.stop()
                raise
        logger.info("cluster peer pid=%s api=%s id=%s", self.pid, self.api_url, self.peer_id)
        return self

    def stop(self) -> None:
        """Stop the peer by PID (SIGTERM, then SIGKILL after 10 s) and remove its directory."""
        self._terminate()
        shutil.rmtree(self.path, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the peer (a crash, for fault tests); its directory stays until :meth:`stop`."""
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=10)

    def rest(self, path: str, *, method: str = "GET", timeout: float = 10.0, **params: str) -> Any:
        """Call Cluster's REST API (``GET /id``, ``POST /pins/<cid>``) and decode its JSON.

        Raises
        ------
        KuboRpcError
            If the peer cannot be reached, refuses, or does not answer within ``timeout``.
        """
        return rpc_call_sync(
            self.api_url, path, params, timeout=timeout, base_path="", method=method
        )

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _configure(self) -> None:
        config_path = self.path / "service.json"
        config = json.loads(config_path.read_text())
        self.swarm_port = free_port()
        rest_port, proxy_port, pinsvc_port = free_port(), free_port(), free_port()
        cluster = config["cluster"]
        cluster.update(
            secret=self.secret,
            listen_multiaddress=[f"/ip4/127.0.0.1/tcp/{self.swarm_port}"],
            announce_multiaddress=[f"/ip4/127.0.0.1/tcp/{self.swarm_port}"],
            enable_relay_hop=False,
            mdns_interval="0s",
            replication_factor_min=self.replication[0],
            replication_factor_max=self.replication[1],
            monitor_ping_interval="2s",
            peer_watch_interval="2s",
        )
        node = _api_multiaddr(self.kubo)
        config["ipfs_connector"]["ipfshttp"].update(
            node_multiaddress=node, connect_swarms_delay="1s"
        )
        api = config["api"]
        api["restapi"]["http_listen_multiaddress"] = f"/ip4/127.0.0.1/tcp/{rest_port}"
        api["ipfsproxy"]["listen_multiaddress"] = f"/ip4/127.0.0.1/tcp/{proxy_port}"
        api["ipfsproxy"]["node_multiaddress"] = node
        api["pinsvcapi"]["http_listen_multiaddress"] = f"/ip4/127.0.0.1/tcp/{pinsvc_port}"
        config_path.write_text(json.dumps(config, indent=2))
        (self.path / "swarm_port").write_text(str(self.swarm_port))
        self.api_url = f"http://127.0.0.1:{rest_port}"
        (self.path / "api_url").write_text(self.api_url)

    def _wait_ready(self) -> None:
        self.swarm_port = int((self.path / "swarm_port").read_text())
        self.api_url = (self.path / "api_url").read_text()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if not self.is_running():
                raise KuboStartError(f"ipfs-cluster-service exited early:\n{self._log_tail()}")
            with contextlib.suppress(KuboRpcError):
                self.rest("id", timeout=2.0)
                return
            time.sleep(0.2)  # polling a starting process, against the deadline above
        raise KuboStartError(
            f"cluster REST API {self.api_url} not ready within {self.start_timeout}s:\n"
            f"{self._log_tail()}"
        )

    def _run(self, *args: str) -> None:
        result = subprocess.run(
            [str(self.binary), *args], env=self._env(), capture_output=True, check=False
        )
        if result.returncode != 0:
            raise KuboStartError(
                f"ipfs-cluster-service {' '.join(args)} failed: "
                f"{result.stderr.decode(errors='replace')[-2000:]}"
            )

    def _env(self) -> dict[str, str]:
        return {**os.environ, "IPFS_CLUSTER_PATH": str(self.path)}

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = (self.path / "daemon.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            _reaper.forget(process.pid)
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None


class ClusterSwarm:
    """One cluster peer per Kubo daemon of ``daemons``, all joined; a context manager.

    Parameters
    ----------
    daemons
        Running Kubo daemons (for example a :class:`~gradfed_ipfs.kubo.KuboSwarm`).
    replication
        Default ``(min, max)`` replication factor.
    """

    def __init__(
        self, daemons: Sequence[KuboDaemon], *, replication: tuple[int, int] = (-1, -1)
    ) -> None:
        secret = secrets.token_hex(32)
        self.peers = [ClusterPeer(d, secret=secret, replication=replication) for d in daemons]

    def start(self) -> Self:
        """Start the peers, each bootstrapping from those before it; wait for all to see all.

        Raises
        ------
        KuboStartError
            If a peer does not start, or the peers do not all see each other within 60 s.
        """
        try:
            for index, peer in enumerate(self.peers):
                peer.start(bootstrap=[earlier.multiaddr for earlier in self.peers[:index]])
            self._wait_joined(60.0)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every peer by PID and remove their directories."""
        for peer in self.peers:
            peer.stop()

    def __iter__(self) -> Iterator[ClusterPeer]:
        return iter(self.peers)

    def __getitem__(self, index: int) -> ClusterPeer:
        return self.peers[index]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @staticmethod
    def _metric_peers(peer: ClusterPeer) -> set[str]:
        metrics = peer.rest("monitor/metrics/freespace")
        if not isinstance(metrics, list):
            return set()
        return {str(m.get("peer")) for m in metrics if isinstance(m, dict) and m.get("valid")}

    def _wait_joined(self, timeout: float) -> None:
        want = {peer.peer_id for peer in self.peers}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Status and pin RPCs go peer to peer, so every peer must see every other one.
            views = [peer.rest("id") for peer in self.peers]
            # Allocation needs every peer's free-space metric; until each peer has them from
            # all peers, a pin with replication > 1 is refused as "not enough peers".
            if all(want <= {v.get("id"), *v.get("cluster_peers", [])} for v in views) and all(
                want <= self._metric_peers(peer) for peer in self.peers
            ):
                return
            time.sleep(0.25)  # polling the cluster's membership, against the deadline above
        raise KuboStartError(f"cluster peers did not all join within {timeout}s")
