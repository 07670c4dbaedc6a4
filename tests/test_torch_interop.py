"""examples/torch_interop.py (the ``torch`` area: torch is in the test extra)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from gradfed_ipfs.storage import MemoryBlockStore
from tests.required import import_area

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def test_torch_example_averages_three_peers_bit_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    import_area("torch", "torch")
    from torch_interop import federated_step

    assert asyncio.run(federated_step(MemoryBlockStore())) is True
    out = capsys.readouterr().out
    assert "loaded bit-exactly: True" in out
    assert "1.num_batches_tracked" in out
