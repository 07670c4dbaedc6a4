"""What the managed node keeps across restarts: its peers and its ports.

Kubo forgets its connections when it stops, and a ``tcp/0`` listener gets a new port at each
start. The managed node therefore records the loopback swarm addresses of the peers it was
connected to (``peers.json``, written on ``node connect`` and ``node stop``) and the API and
swarm ports it got (``ports.json``); ``node start`` asks for the same ports again where they
are still free and dials every recorded peer, best effort, with a short timeout each. No
printing here (``cli.node`` prints).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path
from typing import Any, Final

from ..errors import KuboRpcError
from ..kubo.rpc import KuboRpc

__all__ = [
    "MAX_KNOWN_PEERS",
    "PEERS_FILE",
    "PORTS_FILE",
    "REDIAL_TIMEOUT",
    "connected_peers",
    "load_peers",
    "load_ports",
    "loopback_addresses",
    "port_is_free",
    "redial",
    "remember_peers",
    "save_ports",
]

PEERS_FILE: Final = "peers.json"
PORTS_FILE: Final = "ports.json"
MAX_KNOWN_PEERS: Final = 64
"""Most peers remembered (the most recently seen are kept)."""
REDIAL_TIMEOUT: Final = 3.0
"""Seconds one ``swarm/connect`` of a remembered peer may take on start."""
_LOOPBACK: Final = ("/ip4/127.0.0.1/tcp/", "/ip6/::1/tcp/")


def loopback_addresses(addresses: list[str]) -> list[str]:
    """Keep the loopback TCP multiaddrs, without any ``/p2p/`` suffix, in order, once each."""
    kept: list[str] = []
    for address in addresses:
        base = address.split("/p2p/")[0]
        if base.startswith(_LOOPBACK) and base not in kept:
            kept.append(base)
    return kept


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # missing or damaged: start without it


def _write_json(path: Path, value: Any) -> None:
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
    os.replace(temporary, path)  # atomic: a concurrent reader sees the old or the new file


def load_peers(node_dir: Path) -> dict[str, list[str]]:
    """Return the remembered peers: peer ID → loopback multiaddrs (without ``/p2p/``)."""
    value = _read_json(node_dir / PEERS_FILE)
    peers = value.get("peers") if isinstance(value, dict) else None
    if not isinstance(peers, dict):
        return {}
    known: dict[str, list[str]] = {}
    for peer, addresses in peers.items():
        if isinstance(peer, str) and isinstance(addresses, list):
            kept = loopback_addresses([a for a in addresses if isinstance(a, str)])
            if kept:
                known[peer] = kept
    return known


def remember_peers(node_dir: Path, peers: dict[str, list[str]]) -> None:
    """Merge ``peers`` into the remembered ones (newest last; at most :data:`MAX_KNOWN_PEERS`)."""
    known = load_peers(node_dir)
    for peer, addresses in peers.items():
        kept = loopback_addresses(addresses)
        if kept:
            known.pop(peer, None)
            known[peer] = kept
    newest = dict(list(known.items())[-MAX_KNOWN_PEERS:])
    _write_json(node_dir / PEERS_FILE, {"peers": newest})


def load_ports(node_dir: Path) -> dict[str, int]:
    """Return the ports the node had last time: ``{"api": N, "swarm": M}`` (either may miss)."""
    value = _read_json(node_dir / PORTS_FILE)
    if not isinstance(value, dict):
        return {}
    return {
        key: port
        for key, port in value.items()
        if key in ("api", "swarm") and isinstance(port, int) and 0 < port < 65536
    }


def save_ports(node_dir: Path, ports: dict[str, int]) -> None:
    """Record the ports the running node got."""
    _write_json(node_dir / PORTS_FILE, ports)


def port_is_free(port: int) -> bool:
    """Whether a listener could bind ``127.0.0.1:port`` now (as Go does: with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def connected_peers(api: str, timeout: float = 5.0) -> dict[str, list[str]]:
    """Return the daemon's connected peers with their loopback listen addresses.

    The listen addresses come from ``swarm/addrs`` (what each peer told us); the connection's
    own address is the fallback.
    """
    async with KuboRpc(api, timeout=timeout) as rpc:
        answer = await rpc.post_json("swarm/peers") or {}
        book = (await rpc.post_json("swarm/addrs") or {}).get("Addrs") or {}
    peers: dict[str, list[str]] = {}
    for line in answer.get("Peers") or []:
        peer = str(line.get("Peer") or "")
        listed = book.get(peer) if isinstance(book, dict) else None
        addresses = [str(a) for a in listed or []] + [str(line.get("Addr") or "")]
        kept = loopback_addresses(addresses)
        if peer and kept:
            peers[peer] = kept
    return peers


async def redial(
    api: str, peers: dict[str, list[str]], timeout: float = REDIAL_TIMEOUT
) -> dict[str, str]:
    """Dial every peer at its recorded addresses concurrently; return peer → why it failed.

    Each address gets one ``swarm/connect`` of at most ``timeout`` seconds; a peer counts as
    reconnected once one of its addresses answers.
    """
    async with KuboRpc(api, timeout=timeout) as rpc:

        async def dial(peer: str, addresses: list[str]) -> str:
            reason = "no address"
            for address in addresses:
                try:
                    await rpc.post_json("swarm/connect", {"arg": f"{address}/p2p/{peer}"})
                except KuboRpcError as exc:
                    reason = f"{address}: {exc}"
                    continue
                return ""
            return reason

        reasons = await asyncio.gather(*(dial(p, a) for p, a in peers.items()))
    return {peer: why for peer, why in zip(peers, reasons, strict=True) if why}
