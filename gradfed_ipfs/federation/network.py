"""A Kubo node's settings for a federation's private network (no I/O).

Kubo joins a private network when its repo holds ``swarm.key`` (:func:`swarm_key_text`);
``LIBP2P_FORCE_PNET=1`` (:data:`PNET_ENV`) makes it refuse to start without one, so a lost
key never silently puts the node on the public network. libp2p's private networks run over
TCP only (QUIC, WebTransport and WebRTC cannot carry the pre-shared key, and Kubo's
WebSocket shares the TCP listener, which a private network cannot), so those are off.

What the node exposes: its swarm port (TCP, default 4001) to holders of the key only; the
RPC API on 127.0.0.1 only; no gateway. Routing is a DHT server among members (``dhtserver``:
a DHT of a few members must not wait to learn it is publicly reachable). NAT: hole punching
(DCUtR) and relaying through members that run the relay service, within the private network;
UPnP port mapping is tried. A member behind NAT needs at least one reachable member (a public
address, ``--announce``d) to bootstrap and relay through.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from typing import Final

from ..errors import FederationFileError
from ..kubo.daemon import WAN_TUNING
from .file import Federation

__all__ = ["DEFAULT_LISTEN", "PNET_ENV", "private_network_config", "swarm_key_text"]

PNET_ENV: Final = {"LIBP2P_FORCE_PNET": "1"}
"""Environment of a private-network daemon: refuse to start without a swarm key."""
DEFAULT_LISTEN: Final = ("/ip4/0.0.0.0/tcp/4001", "/ip6/::/tcp/4001")
"""Where a federation node listens by default: every interface, TCP port 4001."""


def swarm_key_text(federation: Federation) -> str:
    """Return the ``swarm.key`` file of the federation (libp2p PSK v1, base16)."""
    return f"/key/swarm/psk/1.0.0/\n/base16/\n{federation.swarm_key.hex()}\n"


def _host(address: str) -> str:
    parts = address.split("/")
    if len(parts) < 5 or parts[0] or parts[1] not in ("ip4", "ip6") or parts[3] != "tcp":
        raise FederationFileError(f"listen address {address!r:.80} is not /ip4|ip6/<ip>/tcp/<port>")
    return parts[2]


def _all_loopback(addresses: Sequence[str]) -> bool:
    try:
        return all(ipaddress.ip_address(_host(a)).is_loopback for a in addresses)
    except ValueError:
        raise FederationFileError(f"bad IP in listen addresses {list(addresses)}") from None


def private_network_config(
    federation: Federation,
    *,
    listen: Sequence[str] = DEFAULT_LISTEN,
    announce: Sequence[str] = (),
    api_port: int = 0,
) -> list[tuple[str, str]]:
    """Return the ``(key, JSON value)`` Kubo config entries of a federation node.

    When every listen address is loopback (tests, one machine) nothing reaches beyond it: no
    port mapping, relaying or hole punching.

    Raises
    ------
    FederationFileError
        If a listen address is not ``/ip4|ip6/<ip>/tcp/<port>``.
    """
    local = _all_loopback(listen)
    settings: dict[str, object] = {
        "Addresses.API": f"/ip4/127.0.0.1/tcp/{api_port}",
        "Addresses.Gateway": [],
        "Addresses.Swarm": list(listen),
        "Addresses.Announce": list(announce),
        "Bootstrap": list(federation.bootstrap),
        "Routing.Type": "dhtserver",
        "AutoConf.Enabled": False,
        "Discovery.MDNS.Enabled": False,
        "Pubsub.Enabled": True,
        "Swarm.Transports.Network.QUIC": False,
        "Swarm.Transports.Network.Websocket": False,  # shares the TCP listener: not with a PSK
        "Swarm.Transports.Network.WebTransport": False,
        "Swarm.Transports.Network.WebRTCDirect": False,
        "Swarm.DisableNatPortMap": local,
        "Swarm.EnableHolePunching": not local,
        "Swarm.RelayClient.Enabled": not local,
        "Swarm.RelayService.Enabled": not local,
        "Swarm.ResourceMgr.Enabled": True,
        "Swarm.ResourceMgr.MaxMemory": "4GB",
    }
    entries = [(key, json.dumps(value)) for key, value in settings.items()]
    return [*entries, *WAN_TUNING.config()]
