"""A killed parent leaves no daemon behind: its reaper process ends what it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.polling import poll_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the reaper reads /proc")


def end(process: subprocess.Popen[str]) -> None:
    """SIGKILL the parent (no atexit hook runs) and reap it."""
    process.kill()
    process.wait(timeout=10)
    if process.stdout is not None:
        process.stdout.close()


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == b"Z"


def parent(code: str, tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    """Run ``code`` in a child Python that prints PIDs, one per line, then ``ready``."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(code))
    process = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd(),
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    pids = []
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == "ready":
            break
        pids.append(int(line))
    return process, pids


def test_a_sigkilled_parent_takes_its_watched_children_with_it(tmp_path: Path) -> None:
    process, (watched, forgotten, reaper) = parent(
        """
        import subprocess
        from gradfed_ipfs import _reaper
        a = subprocess.Popen(["sleep", "600"], start_new_session=True)
        b = subprocess.Popen(["sleep", "600"], start_new_session=True)
        _reaper.watch(a.pid)
        _reaper.watch(b.pid)
        _reaper.forget(b.pid)  # meant to outlive its parent
        print(a.pid, b.pid, _reaper.watcher_pid(), sep="\\n", flush=True)
        print("ready", flush=True)
        import time
        time.sleep(600)
        """,
        tmp_path,
    )
    try:
        assert not gone(watched)
        end(process)
        poll_until(lambda: gone(watched), timeout=20, what="the watched child ended")
        poll_until(lambda: gone(reaper), timeout=20, what="the reaper exited")
        assert not gone(forgotten)
    finally:
        for pid in (watched, forgotten):
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_reused_pid_is_not_signalled(tmp_path: Path) -> None:
    # The reaper matches start times: a watched PID whose process ended is skipped, and the
    # parent's own later children (another start time) are never signalled.
    process, (short, reaper) = parent(
        """
        import subprocess
        from gradfed_ipfs import _reaper
        a = subprocess.Popen(["true"])
        a.wait()
        _reaper.watch(a.pid)  # gone already: nothing is sent
        b = subprocess.Popen(["sleep", "600"], start_new_session=True)
        _reaper.watch(b.pid)
        print(b.pid, _reaper.watcher_pid(), sep="\\n", flush=True)
        print("ready", flush=True)
        import sys
        sys.stdin.read()
        """,
        tmp_path,
    )
    end(process)
    poll_until(lambda: gone(short), timeout=20, what="the watched child ended")
    poll_until(lambda: gone(reaper), timeout=20, what="the reaper exited")


@pytest.mark.kubo
def test_a_sigkilled_parent_leaves_no_kubo_daemon(tmp_path: Path, kubo_binary: Path) -> None:
    process, (daemon,) = parent(
        f"""
        from gradfed_ipfs.kubo import KuboDaemon
        d = KuboDaemon({str(tmp_path / "repo")!r}, binary={str(kubo_binary)!r}).start()
        print(d.pid, flush=True)
        print("ready", flush=True)
        import time
        time.sleep(600)
        """,
        tmp_path,
    )
    try:
        end(process)
        poll_until(lambda: gone(daemon), timeout=30, what="the Kubo daemon ended")
    finally:
        if not gone(daemon):
            os.kill(daemon, signal.SIGKILL)
