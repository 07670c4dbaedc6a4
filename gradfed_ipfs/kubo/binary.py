"""Locate the Kubo (``ipfs``) binary, building the pinned version through ``scripts/install-kubo``.

Order: ``$GRADFED_KUBO_BIN`` if set; the per-user cache
(``~/.cache/gradfed-ipfs/kubo/<version>/ipfs``); otherwise run ``scripts/install-kubo`` (which
builds it from the Go module proxy) when this package sits in a source checkout.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Final

from ..errors import KuboNotInstalled

__all__ = ["KUBO_VERSION", "default_kubo_path", "find_kubo_binary", "install_script_path"]

KUBO_VERSION: Final = "v0.43.1"
"""The Kubo release this project pins and tests against."""


def default_kubo_path(version: str = KUBO_VERSION) -> Path:
    """Return where ``scripts/install-kubo`` puts the binary (under ``$XDG_CACHE_HOME``)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "gradfed-ipfs" / "kubo" / version / "ipfs"


def install_script_path() -> Path | None:
    """Return ``scripts/install-kubo`` of the source checkout this package runs from, if any."""
    candidate = Path(__file__).resolve().parents[2] / "scripts" / "install-kubo"
    return candidate if candidate.is_file() else None


def find_kubo_binary(*, build: bool = True) -> Path:
    """Return the path of a runnable Kubo binary.

    Parameters
    ----------
    build
        Run ``scripts/install-kubo`` when no binary is present (takes minutes the first time).

    Raises
    ------
    KuboNotInstalled
        If no binary exists and none could be built.
    """
    override = os.environ.get("GRADFED_KUBO_BIN")
    path = Path(override) if override else default_kubo_path()
    if path.is_file() and os.access(path, os.X_OK):
        return path
    script = install_script_path()
    if build and script is not None:
        result = subprocess.run(
            [str(script)], capture_output=True, text=True, check=False, timeout=1800
        )
        built = Path(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
        if result.returncode == 0 and built is not None and built.is_file():
            return built
        raise KuboNotInstalled(
            f"building Kubo {KUBO_VERSION} with {script} failed (exit {result.returncode}):\n"
            + "\n".join(result.stderr.splitlines()[-20:])
        )
    raise KuboNotInstalled(
        f"no Kubo binary at {path}; run scripts/install-kubo (builds Kubo {KUBO_VERSION} from the "
        "Go module proxy) or set GRADFED_KUBO_BIN, or point GRADFED_IPFS_API at a running daemon"
    )
