"""``gradfed-ipfs demo`` end to end: peer processes beside their own Kubo daemons, agreed rounds.

Each test runs the real demo (it starts its own daemons and peer processes) and checks that
nothing it started is left: not on success, not on a failing peer, not on Ctrl-C.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gradfed_ipfs.cli import main
from gradfed_ipfs.cli.children import JsonLinesChild
from gradfed_ipfs.cli.demo.peer import DemoTask
from tests.polling import poll_until

ROOT = Path(__file__).resolve().parents[2]
CID = r"bafk\w+"


def demo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gradfed_ipfs.cli.app", "demo", *args]


def demo_env(kubo_binary: Path) -> dict[str, str]:
    return {**os.environ, "GRADFED_KUBO_BIN": str(kubo_binary)}


def started_pids(out: str) -> list[int]:
    """The PIDs the demo printed: its daemons' and its peer processes'."""
    daemons = re.findall(r"daemon \d+: \S+ api=\S+ pid=(\d+)", out)
    peers = re.findall(r"peer \d+: pid (\d+),", out)
    return [int(pid) for pid in [*daemons, *peers]]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def demo_children() -> list[int]:
    """Peer processes of this test process that are still alive."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and b"gradfed_ipfs.cli.demo.peer" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.kubo
def test_three_processes_agree_and_the_demo_exits_0(kubo_binary: Path) -> None:
    done = subprocess.run(
        demo_command("--rounds", "3"),
        cwd=ROOT,
        env=demo_env(kubo_binary),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    finals = re.findall(rf"peer (\d) \(pid \d+\) final model ({CID})", out)
    assert sorted(index for index, _ in finals) == ["0", "1", "2"]
    assert len({cid for _, cid in finals}) == 1
    agreed = re.search(rf"OK: 3 processes agree on model ({CID}); loss (\S+) -> (\S+)", out)
    assert agreed is not None, out
    assert agreed[1] == finals[0][1]
    assert float(agreed[3]) < float(agreed[2]) / 10  # 3 rounds of FedAvg learn the task
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("round")] == [
        "round 1/3",
        "round 2/3",
        "round 3/3",
    ]
    pids = started_pids(out)
    assert len(pids) == 6
    assert not [pid for pid in pids if alive(pid)]


@pytest.mark.kubo
def test_a_failing_peer_fails_the_demo_and_stops_everything(
    kubo_binary: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # every peer process gives up at once: the demo must report it and stop the rest
    assert main(["demo", "--rounds", "2", "--deadline", "0.001"]) == 1
    captured = capsys.readouterr()
    assert "FAILED" in captured.err
    assert "TimeoutError" in captured.err
    assert "OK:" not in captured.out
    pids = started_pids(captured.out)
    assert len(pids) == 6
    assert not [pid for pid in pids if alive(pid)]
    assert demo_children() == []


@pytest.mark.kubo
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_stops_every_daemon_and_peer_process(
    kubo_binary: Path, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    demo = JsonLinesChild(
        demo_command("--rounds", "10000"),
        stderr=tmp_path / "demo.err",
        cwd=ROOT,
        env=demo_env(kubo_binary),
    )
    try:

        def lines() -> str:
            return "\n".join(str(e.get("text", "")) for e in demo.of("text"))

        poll_until(
            lambda: "round 2/10000" in lines() or demo.poll() is not None,
            timeout=90,
            what="the demo's second round",
        )
        assert demo.poll() is None, demo.stderr_tail()
        os.kill(demo.pid, sig)
        assert demo.proc.wait(timeout=60) == code
    finally:
        demo.stop()
    if sig == signal.SIGINT:
        assert "interrupted" in demo.stderr_tail()
    pids = started_pids(lines())
    assert len(pids) == 6
    assert not [pid for pid in pids if alive(pid)]


def test_the_task_splits_its_data_and_learns() -> None:
    task = DemoTask(peers=3)
    parts = [task.part(i) for i in range(3)]
    assert [len(y) for _, y in parts] == [100, 200, 300]
    x, y = task.data()
    model = task.initial_model()
    update, samples = task.update(model, 2)
    assert samples == 300
    assert update.dtype == model.dtype
    assert update.shape == (task.features + 1,)
    assert task.loss(model + update, x, y) < task.loss(model, x, y)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dim", "5000"], "--dim goes with --best-effort"),
        (["--peers", "1"], "at least 2 peers"),
        (["--rounds", "0"], "at least 1 round"),
    ],
)
def test_bad_demo_options_end_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", *argv]) == 1
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
