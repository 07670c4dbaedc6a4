"""Pick TCP ports on 127.0.0.1 that stay free while a daemon is stopped and started again.

A port the kernel hands out for ``bind(0)`` lies in the ephemeral range, which outgoing
connections also draw from: a validator or cluster peer that is stopped and restarted on the
same port (its peers know it by that port) can find it taken by some client's socket meanwhile.
:func:`free_port` picks from below the ephemeral range instead, where only explicit binds land.
"""

from __future__ import annotations

import secrets
import socket
import threading
from pathlib import Path
from typing import Final

__all__ = ["free_port"]

_LOWEST: Final = 20000
"""Lowest port tried: above the registered services most machines run."""

_RANGE_FILE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
_ATTEMPTS: Final = 200
_lock = threading.Lock()
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        low = int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
    return low if low > _LOWEST + 1000 else 0


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_port() -> int:
    """Return a TCP port free on 127.0.0.1 now, outside the ephemeral range where possible.

    A port is not handed out twice by one process. When the ephemeral range leaves no room
    below it, the kernel's choice is returned.
    """
    high = _ephemeral_low()
    if high == 0:
        return _kernel_port()
    with _lock:
        for _ in range(_ATTEMPTS):
            # Random, so that parallel processes do not walk the same sequence.
            port = _LOWEST + secrets.randbelow(high - _LOWEST)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    return _kernel_port()
