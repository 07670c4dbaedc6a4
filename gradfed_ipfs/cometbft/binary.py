"""Locate the CometBFT binary, building the pinned version through ``scripts/install-cometbft``.

Order: ``$GRADFED_COMETBFT_BIN`` if set; the per-user cache
(``~/.cache/gradfed-ipfs/cometbft/<version>/cometbft``); otherwise run
``scripts/install-cometbft`` (``go install`` from the Go module proxy) when this package sits in
a source checkout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from .._binary import PinnedBinary
from ..errors import CometNotInstalled

__all__ = ["COMETBFT_VERSION", "default_cometbft_path", "find_cometbft_binary"]

COMETBFT_VERSION: Final = "v1.0.1"
"""The CometBFT release this project pins (the newest v1.0.x on the Go module proxy)."""

_COMETBFT: Final = PinnedBinary(
    "CometBFT", COMETBFT_VERSION, "cometbft", "cometbft", "install-cometbft",
    "GRADFED_COMETBFT_BIN", CometNotInstalled,
)  # fmt: skip


def default_cometbft_path(version: str = COMETBFT_VERSION) -> Path:
    """Return where ``scripts/install-cometbft`` puts the binary (under ``$XDG_CACHE_HOME``)."""
    return _COMETBFT.default_path(version)


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
    return _COMETBFT.find(build=build)
