"""Ports for daemons that restart on the port their peers know: outside the ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

from gradfed_ipfs._ports import free_port


def _ephemeral_range() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def test_ports_are_bindable_distinct_and_below_the_ephemeral_range() -> None:
    low, _ = _ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(20000 <= port < low for port in ports), ports
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", ports[0]))


def test_a_port_in_use_is_never_handed_out() -> None:
    held = []
    try:
        for _ in range(20):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", free_port()))
            sock.listen()
            held.append(sock)
        taken = {sock.getsockname()[1] for sock in held}
        assert not taken & {free_port() for _ in range(200)}
    finally:
        for sock in held:
            sock.close()
