"""Kubo: the binary, loopback daemons and swarms, pubsub (Kubo's and an in-memory bus), signing."""

from __future__ import annotations

from .binary import KUBO_VERSION, default_kubo_path, find_kubo_binary
from .daemon import (
    LOOPBACK_CONFIG,
    WAN_TUNING,
    KuboDaemon,
    KuboSwarm,
    KuboTuning,
    live_daemon_pids,
    multiaddr_to_url,
)
from .pubsub import KuboPubsub, MemoryPubsub, MemoryPubsubBus, PubsubTransport, PubsubWrapper
from .signing import KuboSigner

__all__ = [
    "KUBO_VERSION",
    "LOOPBACK_CONFIG",
    "WAN_TUNING",
    "KuboDaemon",
    "KuboPubsub",
    "KuboSigner",
    "KuboSwarm",
    "KuboTuning",
    "MemoryPubsub",
    "MemoryPubsubBus",
    "PubsubTransport",
    "PubsubWrapper",
    "default_kubo_path",
    "find_kubo_binary",
    "live_daemon_pids",
    "multiaddr_to_url",
]
