from __future__ import annotations

import pytest

from gradfed_ipfs.cli import main


@pytest.mark.kubo
def test_demo_runs_a_real_round(capsys: pytest.CaptureFixture[str], kubo_binary: object) -> None:
    assert main(["demo", "--peers", "3", "--dim", "5000", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "OK: every peer's aggregate equals the NumPy reference" in out
    assert out.count("committed 5000 floats as bafkrei") == 3


def test_user_error_exits_with_code_and_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--peers", "1"]) == 1
    err = capsys.readouterr().err
    assert "at least 2 peers" in err
    assert "Traceback" not in err


def test_help_lists_demo(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "demo" in capsys.readouterr().out
