"""The committed ABCI protobuf code is what ``scripts/gen-abci-proto`` generates today."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gradfed_ipfs.cometbft import COMETBFT_VERSION
from tests.required import skip_area

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "gradfed_ipfs" / "cometbft" / "abci" / "pb"

pytestmark = pytest.mark.cometbft


def _differences(left: Path, right: Path) -> list[str]:
    compared = filecmp.dircmp(left, right, ignore=["__pycache__"])
    found = [f"only in {left}: {n}" for n in compared.left_only]
    found += [f"only in {right}: {n}" for n in compared.right_only]
    found += [f"differs: {left / n}" for n in compared.diff_files]
    for sub in compared.common_dirs:
        found += _differences(left / sub, right / sub)
    return found


def test_generated_code_matches_the_pinned_protos(tmp_path: Path) -> None:
    if shutil.which("go") is None:
        skip_area("cometbft", "'go' is not on PATH: it downloads the CometBFT module's protos")
    out = tmp_path / "pb"
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(
        [str(ROOT / "scripts" / "gen-abci-proto"), str(out)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert f"cometbft {COMETBFT_VERSION}" in result.stderr
    assert _differences(COMMITTED, out) == []


def test_the_install_script_pins_the_package_version() -> None:
    script = (ROOT / "scripts" / "install-cometbft").read_text()
    assert f'COMETBFT_VERSION="${{GRADFED_COMETBFT_VERSION:-{COMETBFT_VERSION}}}"' in script
