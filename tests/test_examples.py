"""The small examples say what they do (issue 17): output checked, not only the exit code."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


async def test_codec_accumulator_example_prints_sizes_and_agreement(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from codec_accumulator import demo

    error = await demo(dim=20_000)
    out = capsys.readouterr().out
    assert np.isfinite(error)
    assert "3 peers, d = 20,000 floats" in out
    assert out.count("committed bafkrei") == 3
    assert "dense 80,000" in out
    assert "every peer holds the same aggregate: True" in out
