"""examples/torch_interop.py: runs where torch imports, skips elsewhere.

torch is not installed on this project's CI machine (the PyPI wheel pulls gigabytes of CUDA
libraries); the adapter's NumPy side is tested in tests/adapters/test_numpy.py.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from gradfed_ipfs.storage import MemoryBlockStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def test_torch_example_averages_three_peers_bit_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from torch_interop import federated_step

    assert asyncio.run(federated_step(MemoryBlockStore())) is True
    out = capsys.readouterr().out
    assert "loaded bit-exactly: True" in out
    assert "1.num_batches_tracked" in out
