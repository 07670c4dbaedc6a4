"""Kubo daemon management: locate or build the binary, start loopback daemons and swarms."""

from .binary import KUBO_VERSION, default_kubo_path, find_kubo_binary
from .daemon import KuboDaemon, KuboSwarm, live_daemon_pids, multiaddr_to_url

__all__ = [
    "KUBO_VERSION",
    "KuboDaemon",
    "KuboSwarm",
    "default_kubo_path",
    "find_kubo_binary",
    "live_daemon_pids",
    "multiaddr_to_url",
]
