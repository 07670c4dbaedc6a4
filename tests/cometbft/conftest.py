"""Fixtures of the CometBFT tests: the pinned binary (a required area) and a 4-validator network."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gradfed_ipfs.cometbft import CometNetwork, find_cometbft_binary
from gradfed_ipfs.errors import CometNotInstalled
from tests.required import skip_area


@pytest.fixture(scope="session")
def cometbft_binary() -> Path:
    try:
        return find_cometbft_binary()
    except CometNotInstalled as exc:  # no Go toolchain or no module proxy on this machine
        skip_area("cometbft", f"CometBFT unavailable: {exc}")


@pytest.fixture
def network(cometbft_binary: Path) -> Iterator[CometNetwork]:
    """Four validators (f = 1), each with its own ABCI app process, producing blocks."""
    with CometNetwork(4, binary=cometbft_binary) as net:
        net.wait_for_height(1, timeout=30)
        yield net


@pytest.fixture
def kubo_swarm4(kubo_provider: str, kubo_pool: Any) -> list[Any]:
    """Four connected Kubo daemons shared by the session (one per member of a 4-member chain)."""
    nodes: list[Any] = kubo_pool.get(kubo_provider, 4)
    return nodes
