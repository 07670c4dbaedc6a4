"""Start, join and stop local Kubo daemons on loopback (tests, demos, a managed local node).

Each daemon has its own repo (``IPFS_PATH``), initialised with ``--profile=test`` (random
127.0.0.1 ports, no bootstrap peers, no mDNS, AutoConf off) and configured with
``Routing.Type=none`` and ``Pubsub.Enabled=true``. Nothing listens or dials beyond 127.0.0.1.
Readiness is a successful ``POST /api/v0/id``, polled against a deadline. Daemons are stopped by
their own PID and temporary repos are removed.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from .. import _reaper
from ..errors import KuboRpcError, KuboStartError
from .binary import find_kubo_binary
from .rpc_sync import rpc_call_sync

__all__ = [
    "LOOPBACK_CONFIG",
    "WAN_TUNING",
    "KuboDaemon",
    "KuboSwarm",
    "KuboTuning",
    "live_daemon_pids",
    "multiaddr_to_url",
]

logger = logging.getLogger("gradfed_ipfs.kubo")

LOOPBACK_CONFIG: Final[list[tuple[str, str]]] = [
    # (key, JSON value): applied after `init --profile=test` at every start, so a reused repo
    # stays loopback-only, routing-free and pubsub-enabled. Public: the CLI node uses it too.
    ("Addresses.API", '"/ip4/127.0.0.1/tcp/0"'),
    ("Addresses.Gateway", '"/ip4/127.0.0.1/tcp/0"'),
    ("Addresses.Swarm", '["/ip4/127.0.0.1/tcp/0"]'),
    ("Addresses.Announce", "[]"),
    ("Bootstrap", "[]"),
    ("Routing.Type", '"none"'),
    ("AutoConf.Enabled", "false"),
    ("Discovery.MDNS.Enabled", "false"),
    ("Pubsub.Enabled", "true"),
    ("Swarm.DisableNatPortMap", "true"),
]


@dataclass(frozen=True)
class KuboTuning:
    """Kubo settings for wide-area links, measured with ``benchmarks/bench_wan.py``.

    Apply with ``KuboDaemon(tuning=WAN_TUNING)`` or ``KuboSwarm(n, tuning=WAN_TUNING)``; for a
    daemon configured elsewhere (docker-compose), :meth:`config` gives the ``ipfs config
    --json`` entries.

    Attributes
    ----------
    outstanding_bytes_per_peer
        Bitswap's ``Internal.Bitswap.MaxOutstandingBytesPerPeer``: bytes a peer may have in
        flight to one requester (Kubo's default 1 MiB). A fetch cannot go faster than this per
        round trip, so it must cover the link's bandwidth-delay product: see :meth:`for_link`.
    conn_low_water, conn_high_water, conn_grace
        ``Swarm.ConnMgr`` water marks and grace period: above ``conn_high_water`` connections
        Kubo trims back to ``conn_low_water``, which must stay above the peers of a round
        (a trimmed round peer loses its pubsub mesh and bitswap session).
    """

    outstanding_bytes_per_peer: int = 8 << 20
    conn_low_water: int = 64
    conn_high_water: int = 192
    conn_grace: str = "60s"

    @classmethod
    def for_link(cls, rate_bps: float, rtt_s: float, **overrides: Any) -> KuboTuning:
        """Size the bitswap window to twice the bandwidth-delay product (at least 1 MiB).

        >>> KuboTuning.for_link(1e9, 0.150).outstanding_bytes_per_peer  # 1 Gbit/s, 150 ms
        37500000
        """
        window = max(1 << 20, int(2 * rate_bps / 8 * rtt_s))
        return cls(outstanding_bytes_per_peer=window, **overrides)

    def config(self) -> list[tuple[str, str]]:
        """Return the ``(key, JSON value)`` config entries of this tuning."""
        conn = {
            "Type": "basic",
            "LowWater": self.conn_low_water,
            "HighWater": self.conn_high_water,
            "GracePeriod": self.conn_grace,
        }
        return [
            ("Internal.Bitswap.MaxOutstandingBytesPerPeer", str(self.outstanding_bytes_per_peer)),
            ("Swarm.ConnMgr", json.dumps(conn, separators=(",", ":"))),
        ]


WAN_TUNING: Final = KuboTuning()
"""The project's wide-area tuning: an 8 MiB bitswap window (2 x the BDP of 100 Mbit/s at
300 ms RTT) and connection-manager marks that keep up to 64 round peers connected."""

_live: dict[int, KuboDaemon] = {}
_live_lock = threading.Lock()


def live_daemon_pids() -> list[int]:
    """Return the PIDs of daemons this process started and has not stopped."""
    with _live_lock:
        return [pid for pid, d in _live.items() if d.is_running()]


@atexit.register
def _stop_all_at_exit() -> None:  # pragma: no cover - safety net for crashed callers
    with _live_lock:
        daemons = list(_live.values())
    for daemon in daemons:
        with contextlib.suppress(Exception):
            daemon.stop()


class _StartStop:
    """Mixin: ``with thing:`` calls ``start()`` on entry and ``stop()`` on exit."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def multiaddr_to_url(multiaddr: str) -> str:
    """Turn ``/ip4/127.0.0.1/tcp/5001`` into ``http://127.0.0.1:5001``."""
    parts = multiaddr.strip().split("/")
    if len(parts) < 5 or parts[1] not in ("ip4", "ip6", "dns", "dns4", "dns6") or parts[3] != "tcp":
        raise ValueError(f"unsupported API multiaddr {multiaddr!r}")
    host = f"[{parts[2]}]" if parts[1] == "ip6" else parts[2]
    return f"http://{host}:{parts[4]}"


class KuboDaemon(_StartStop):
    """A Kubo daemon on loopback with its own repo; a context manager.

    Parameters
    ----------
    repo
        Repo directory (``IPFS_PATH``); a temporary one, removed on :meth:`stop`, when ``None``.
    binary
        Kubo binary; found (or built) by :func:`find_kubo_binary` when ``None``.
    start_timeout
        Seconds to wait for the daemon to answer ``/api/v0/id``.
    extra_config
        Additional ``(key, JSON value)`` config entries applied before starting.
    tuning
        Wide-area settings (e.g. :data:`WAN_TUNING`) applied before ``extra_config``; ``None``
        keeps Kubo's defaults.
    """

    def __init__(
        self,
        repo: str | Path | None = None,
        *,
        binary: str | Path | None = None,
        start_timeout: float = 60.0,
        extra_config: list[tuple[str, str]] | None = None,
        tuning: KuboTuning | None = None,
    ) -> None:
        self._temporary = repo is None
        self.repo = (
            Path(repo) if repo is not None else Path(tempfile.mkdtemp(prefix="gradfed-kubo-"))
        )
        self.binary = Path(binary) if binary is not None else find_kubo_binary()
        self.start_timeout = start_timeout
        self.extra_config = [*(tuning.config() if tuning else []), *(extra_config or [])]
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None
        self.api_url: str = ""
        self.peer_id: str = ""
        self.multiaddrs: list[str] = []

    # ------------------------------------------------------------------ lifecycle

    @property
    def pid(self) -> int | None:
        """The daemon's process ID while it runs."""
        return self._process.pid if self._process is not None else None

    @property
    def log_path(self) -> Path:
        """Where the daemon's stdout and stderr go."""
        return self.repo / "daemon.log"

    def is_running(self) -> bool:
        """Return whether the daemon process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> Self:
        """Initialise the repo if needed, start the daemon and wait until its API answers.

        Raises
        ------
        KuboStartError
            If init fails or the API does not answer within ``start_timeout`` seconds; the
            message ends with the tail of the daemon's log.
        """
        if self.is_running():
            return self
        self.repo.mkdir(parents=True, exist_ok=True)
        if not (self.repo / "config").exists():
            self._ipfs("init", "--profile=test")
        for key, value in [*LOOPBACK_CONFIG, *self.extra_config]:
            self._ipfs("config", "--json", key, value)
        # A SIGKILLed daemon leaves its `api` file behind; a stale one would point us at a
        # dead port, so readiness only trusts a file written by this start.
        with contextlib.suppress(FileNotFoundError):
            (self.repo / "api").unlink()
        self._log_file = self.log_path.open("ab")
        self._process = subprocess.Popen(
            [str(self.binary), "daemon", "--migrate=false"],
            env=self._env(),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        with _live_lock:
            _live[self._process.pid] = self
        _reaper.watch(self._process.pid)  # killed even if this process is (atexit is not run)
        try:
            self._wait_ready()
        except BaseException:
            self._terminate()
            raise
        logger.info("kubo daemon pid=%s api=%s peer=%s", self.pid, self.api_url, self.peer_id)
        return self

    def stop(self, *, remove_repo: bool | None = None) -> None:
        """Stop the daemon by PID (SIGTERM, then SIGKILL after 10 s) and clean up.

        Parameters
        ----------
        remove_repo
            Delete the repo directory; by default only temporary repos are removed.
        """
        self._terminate()
        if remove_repo if remove_repo is not None else self._temporary:
            shutil.rmtree(self.repo, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the daemon (a crash, for fault tests); the repo is kept for :meth:`start`."""
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=10)
        self._forget()

    def restart(self) -> Self:
        """Stop (keeping the repo) and start again on the same repo; returns ``self``."""
        self._terminate()
        return self.start()

    # ------------------------------------------------------------------ control-plane RPC

    def rpc(self, endpoint: str, timeout: float = 30.0, **params: str) -> Any:
        """POST ``/api/v0/<endpoint>`` to this daemon and return the decoded JSON answer.

        Control-plane helper (sync, through :func:`~gradfed_ipfs.kubo.rpc_sync.rpc_call_sync`):
        data-plane calls go through ``KuboBlockStore``.

        Raises
        ------
        KuboRpcError
            If the daemon cannot be reached, refuses, or does not answer within ``timeout``.
        """
        return rpc_call_sync(self.api_url, endpoint, params, timeout=timeout)

    def connect(self, other: KuboDaemon) -> None:
        """``swarm/connect`` this daemon to ``other`` (both on loopback)."""
        address = next(a for a in other.multiaddrs if "/ip4/127.0.0.1/" in a)
        self.rpc("swarm/connect", arg=address)

    def disconnect(self, other: KuboDaemon) -> None:
        """``swarm/disconnect`` from ``other`` (it may reconnect later through bitswap dials)."""
        for address in other.multiaddrs:
            with contextlib.suppress(KuboRpcError):
                self.rpc("swarm/disconnect", arg=address)

    def connected_peers(self) -> set[str]:
        """Return the peer IDs of this daemon's current swarm connections."""
        answer = self.rpc("swarm/peers") or {}
        return {str(p.get("Peer")) for p in answer.get("Peers") or []}

    # ------------------------------------------------------------------ internals

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {"IPFS_PATH": str(self.repo), "IPFS_TELEMETRY": "off", "GOLOG_LOG_LEVEL": "error"}
        )
        env.pop("IPFS_GATEWAY", None)
        return env

    def _ipfs(self, *args: str) -> None:
        result = subprocess.run(
            [str(self.binary), *args],
            env=self._env(),
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if result.returncode != 0:
            raise KuboStartError(
                f"ipfs {' '.join(args)} failed (exit {result.returncode}): "
                f"{result.stderr.strip()[-2000:]}"
            )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        api_file = self.repo / "api"
        delay = 0.02
        last_error = "api file not written"
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise KuboStartError(
                    f"kubo daemon exited with code {self._process.returncode} during start\n"
                    f"{self._log_tail()}"
                )
            if api_file.exists():
                try:
                    self.api_url = multiaddr_to_url(api_file.read_text())
                    info = self.rpc("id", timeout=5.0)
                    self.peer_id = str(info["ID"])
                    self.multiaddrs = [str(a) for a in info.get("Addresses") or []]
                    if self.multiaddrs:
                        return
                    last_error = "no swarm addresses yet"
                except (KuboRpcError, ValueError, KeyError, TypeError) as exc:
                    last_error = str(exc)
            # Poll with a short, growing interval: readiness is an event we cannot subscribe to.
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)
        raise KuboStartError(
            f"kubo daemon not ready after {self.start_timeout:.0f}s ({last_error})\n"
            f"{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no daemon log)"
        return "--- daemon log (tail) ---\n" + "\n".join(text.splitlines()[-lines:])

    def _terminate(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self._forget()

    def _forget(self) -> None:
        if self._process is not None:
            with _live_lock:
                _live.pop(self._process.pid, None)
            _reaper.forget(self._process.pid)
        self._process = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


class KuboSwarm(_StartStop):
    """``n`` loopback daemons, started concurrently and all ``swarm/connect``-ed to each other.

    Parameters
    ----------
    n
        Number of daemons (≥ 1).
    binary
        Kubo binary for all of them (found or built when ``None``).
    tuning
        Wide-area settings for every daemon (see :class:`KuboTuning`).
    """

    def __init__(
        self, n: int, *, binary: str | Path | None = None, tuning: KuboTuning | None = None
    ) -> None:
        if n < 1:
            raise ValueError(f"a swarm needs at least one daemon, got {n}")
        self.n = n
        self.binary = Path(binary) if binary is not None else find_kubo_binary()
        self.tuning = tuning
        self.daemons: list[KuboDaemon] = []

    def start(self) -> Self:
        """Start every daemon and connect each pair; stops them all if any fails."""
        self.daemons = [KuboDaemon(binary=self.binary, tuning=self.tuning) for _ in range(self.n)]
        try:
            with ThreadPoolExecutor(max_workers=min(self.n, 8)) as pool:
                list(pool.map(KuboDaemon.start, self.daemons))
            for i, daemon in enumerate(self.daemons):
                for other in self.daemons[i + 1 :]:
                    daemon.connect(other)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every daemon and remove their repos."""
        for daemon in self.daemons:
            daemon.stop()

    def __iter__(self) -> Iterator[KuboDaemon]:
        return iter(self.daemons)

    def __len__(self) -> int:
        return len(self.daemons)

    def __getitem__(self, index: int) -> KuboDaemon:
        return self.daemons[index]
