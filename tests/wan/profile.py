"""When the WAN profile runs: ``GRADFED_WAN=1``, as root, with iproute2, iptables and gcc."""

from __future__ import annotations

import os
import shutil


def wan_skip_reason() -> str | None:
    """Return why the WAN profile cannot run here, or ``None`` when it can."""
    if os.environ.get("GRADFED_WAN") != "1":
        return "WAN profile (emulated 150 ms / 2 % loss links): set GRADFED_WAN=1, as root"
    if os.geteuid() != 0:
        return "WAN profile needs root (network namespaces)"
    missing = [t for t in ("ip", "tc", "iptables", "gcc", "curl", "jq") if not shutil.which(t)]
    if missing:
        return f"WAN profile needs {', '.join(missing)}"
    return None
