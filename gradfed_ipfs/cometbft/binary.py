"""Locate the CometBFT binary, building the pinned version through ``scripts/install-cometbft``.

Order: ``$GRADFED_COMETBFT_BIN`` if set; the per-user cache
(``~/.cache/gradfed-ipfs/cometbft/<version>/cometbft``); otherwise run
``scripts/install-cometbft`` (``go install`` from the Go module proxy) when this package sits in
a source checkout.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Final

from ..errors import CometNotInstalled

__all__ = ["COMETBFT_VERSION", "default_cometbft_path", "find_cometbft_binary"]

COMETBFT_VERSION: Final = "v1.0.1"
"""The CometBFT release this project pins (the newest v1.0.x on the Go module proxy)."""


def default_cometbft_path(version: str = COMETBFT_VERSION) -> Path:
    """Return where ``scripts/install-cometbft`` puts the binary (under ``$XDG_CACHE_HOME``)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "gradfed-ipfs" / "cometbft" / version / "cometbft"


def _install_script() -> Path | None:
    candidate = Path(__file__).resolve().parents[2] / "scripts" / "install-cometbft"
    return candidate if candidate.is_file() else None


def find_cometbft_binary(*, build: bool = True) -> Path:
    """Return the path of a runnable CometBFT binary.

    Parameters
    ----------
    build
        Run ``scripts/install-cometbft`` when no binary is present (minutes the first time).

    Raises
    ------
    CometNotInstalled
        If no binary exists and none could be built.
    """
    override = os.environ.get("GRADFED_COMETBFT_BIN")
    path = Path(override) if override else default_cometbft_path()
    if path.is_file() and os.access(path, os.X_OK):
        return path
    script = _install_script()
    if build and script is not None:
        result = subprocess.run(
            [str(script)], capture_output=True, text=True, check=False, timeout=1800
        )
        built = Path(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
        if result.returncode == 0 and built is not None and built.is_file():
            return built
        raise CometNotInstalled(
            f"building CometBFT {COMETBFT_VERSION} with {script} failed "
            f"(exit {result.returncode}):\n" + "\n".join(result.stderr.splitlines()[-20:])
        )
    raise CometNotInstalled(
        f"no CometBFT binary at {path}; run scripts/install-cometbft (builds CometBFT "
        f"{COMETBFT_VERSION} from the Go module proxy) or set GRADFED_COMETBFT_BIN"
    )
