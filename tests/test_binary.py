"""Pinned tools (Kubo, CometBFT): the override, the cache and the typed error when missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradfed_ipfs._binary import PinnedBinary
from gradfed_ipfs.errors import CometNotInstalled, KuboNotInstalled

TOOL = PinnedBinary("Tool", "v9", "tool", "tool", "install-no-such-tool", "GRADFED_TOOL_BIN",
                    KuboNotInstalled, hint=", or give up")  # fmt: skip


def test_the_override_wins_and_the_cache_path_names_the_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = tmp_path / "tool"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("GRADFED_TOOL_BIN", str(binary))
    assert TOOL.find(build=False) == binary
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert TOOL.default_path() == tmp_path / "cache" / "gradfed-ipfs" / "tool" / "v9" / "tool"
    assert TOOL.default_path("v1").parent.name == "v1"


def test_a_missing_tool_is_a_typed_error_saying_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRADFED_TOOL_BIN", str(tmp_path / "absent"))
    assert TOOL.script_path() is None  # no such script in scripts/
    with pytest.raises(KuboNotInstalled, match=r"run scripts/install-no-such-tool .* or give up"):
        TOOL.find()
    comet = PinnedBinary("C", "v1", "c", "c", "install-c", "GRADFED_C_BIN", CometNotInstalled)
    monkeypatch.setenv("GRADFED_C_BIN", str(tmp_path / "absent"))
    with pytest.raises(CometNotInstalled, match=r"set GRADFED_C_BIN$"):
        comet.find(build=False)
