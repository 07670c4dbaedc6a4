"""Locate the Kubo (``ipfs``) binary, building the pinned version through ``scripts/install-kubo``.

Order: ``$GRADFED_KUBO_BIN`` if set; the per-user cache
(``~/.cache/gradfed-ipfs/kubo/<version>/ipfs``); otherwise run ``scripts/install-kubo`` (which
builds it from the Go module proxy) when this package sits in a source checkout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from .._binary import PinnedBinary
from ..errors import KuboNotInstalled

__all__ = ["KUBO_VERSION", "default_kubo_path", "find_kubo_binary", "install_script_path"]

KUBO_VERSION: Final = "v0.43.1"
"""The Kubo release this project pins and tests against."""

_KUBO: Final = PinnedBinary(
    "Kubo", KUBO_VERSION, "kubo", "ipfs", "install-kubo", "GRADFED_KUBO_BIN", KuboNotInstalled,
    hint=", or point GRADFED_IPFS_API at a running daemon",
)  # fmt: skip


def default_kubo_path(version: str = KUBO_VERSION) -> Path:
    """Return where ``scripts/install-kubo`` puts the binary (under ``$XDG_CACHE_HOME``)."""
    return _KUBO.default_path(version)


def install_script_path() -> Path | None:
    """Return ``scripts/install-kubo`` of the source checkout this package runs from, if any."""
    return _KUBO.script_path()


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
    return _KUBO.find(build=build)
