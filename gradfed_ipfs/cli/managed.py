"""Which managed node runs: its files, its PID, its RPC URL (no printing, no CLI imports).

The managed node lives in a directory holding the Kubo repo (``repo/``), the daemon's log
(``daemon.log``), its PID file (``daemon.pid``), and what it keeps across restarts: its peers
(``peers.json``) and ports (``ports.json``; see :mod:`~gradfed_ipfs.cli.known_peers`).
``cli.common`` asks this module for the running node's URL and ``cli.node`` starts and stops
it; neither imports the other for it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Final

from ..errors import KuboRpcError
from ..kubo.daemon import multiaddr_to_url
from ..kubo.rpc_sync import rpc_call_sync

__all__ = [
    "LOG_FILE",
    "PID_FILE",
    "api_url",
    "children",
    "identify",
    "is_kubo_daemon",
    "read_pid",
    "repo_dir",
    "running_node_api",
]

PID_FILE: Final = "daemon.pid"
LOG_FILE: Final = "daemon.log"
children: dict[int, subprocess.Popen[bytes]] = {}
"""Daemons this process started, by PID (reaped on stop)."""


def repo_dir(node_dir: Path) -> Path:
    """Return the managed node's Kubo repo directory."""
    return node_dir / "repo"


def read_pid(node_dir: Path) -> int | None:
    """Return the PID recorded in the node directory, if any."""
    try:
        return int((node_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def is_kubo_daemon(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) ``ipfs daemon`` process (guards PID reuse)."""
    child = children.get(pid)
    if child is not None and child.poll() is not None:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and len(cmdline) > 1 and cmdline[1] == b"daemon"


def api_url(node_dir: Path) -> str | None:
    """Return the RPC URL the node's ``repo/api`` file names, if readable."""
    try:
        return multiaddr_to_url((repo_dir(node_dir) / "api").read_text())
    except (OSError, ValueError):
        return None


def identify(api: str, timeout: float = 5.0) -> dict[str, Any] | None:
    """Return the daemon's ``id`` answer, or ``None`` if it does not answer within ``timeout``."""
    try:
        answer = rpc_call_sync(api, "id", timeout=timeout)
    except KuboRpcError:
        return None
    return answer if isinstance(answer, dict) and answer else None


def running_node_api(node_dir: Path) -> str | None:
    """Return the managed node's RPC URL if its daemon runs, else ``None``."""
    pid = read_pid(node_dir)
    if pid is None or not is_kubo_daemon(pid):
        return None
    return api_url(node_dir)
