"""Kill the daemons this process started if it dies without stopping them (SIGKILL included).

``atexit`` hooks stop daemons on a normal exit, but not when this process is killed: a
SIGKILLed test run or demo would leave Kubo daemons and validators behind. :func:`watch` hands
each child's PID to one watcher process per parent (started on first use, in its own session so
a terminal's Ctrl-C or a process-group kill does not take it too). The watcher reads PIDs from
a pipe whose only writer is this process; when the pipe closes (this process is gone, however
it ended) it sends SIGTERM to every PID still watched, then SIGKILL after a grace period. A PID
is matched with its start time, so a PID the kernel has since reused is never signalled.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import subprocess
import sys
import threading
from typing import IO, Final

__all__ = ["forget", "watch", "watcher_pid"]

logger = logging.getLogger("gradfed_ipfs.reaper")

GRACE_SECONDS: Final = 10.0
"""How long the watcher waits after SIGTERM before SIGKILL."""

_WATCHER: Final = f"""
import os, signal, sys, time

def started(pid):
    try:
        with open(f"/proc/{{pid}}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == b"Z" else fields[19]

watched = {{}}
for line in sys.stdin.buffer:
    op, _, rest = line.strip().partition(b" ")
    if op == b"+":
        pid, start = rest.split()
        watched[int(pid)] = start
    elif op == b"-":
        watched.pop(int(rest), None)

def alive():
    return [p for p, s in watched.items() if started(p) == s]

for sig, wait in ((signal.SIGTERM, {GRACE_SECONDS}), (signal.SIGKILL, 0)):
    for pid in alive():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    deadline = time.monotonic() + wait
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
"""

_lock = threading.Lock()
_watcher: subprocess.Popen[bytes] | None = None


def _start_time(pid: int) -> bytes | None:
    """Return the kernel's start time of ``pid`` (field 22 of /proc/PID/stat), ``None`` if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19]


def _pipe() -> IO[bytes] | None:
    """Return the watcher's stdin, starting the watcher on first use (``None`` if it cannot run)."""
    global _watcher
    if _watcher is None or _watcher.poll() is not None:
        try:
            _watcher = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _WATCHER],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:  # no interpreter to run it: atexit hooks still stop children
            logger.debug("no reaper process: %s", exc)
            _watcher = None
            return None
    return _watcher.stdin


def _send(line: str) -> None:
    with _lock:
        pipe = _pipe()
        if pipe is None:
            return
        try:
            pipe.write(line.encode("ascii"))
            pipe.flush()
        except OSError as exc:
            logger.debug("reaper pipe: %s", exc)


def watch(pid: int) -> None:
    """Have ``pid`` killed if this process dies before :func:`forget` is called for it."""
    if sys.platform != "linux" or (start := _start_time(pid)) is None:
        return
    _send(f"+ {pid} {start.decode('ascii')}\n")


def forget(pid: int) -> None:
    """Stop watching ``pid`` (it was stopped, or is meant to outlive this process)."""
    if sys.platform == "linux" and _watcher is not None:
        _send(f"- {pid}\n")


def watcher_pid() -> int | None:
    """Return the watcher's PID while it runs (tests)."""
    with _lock:
        return _watcher.pid if _watcher is not None and _watcher.poll() is None else None


def _close_in_child() -> None:
    """Close the parent's pipe in a forked child (else the watcher would outlive the parent).

    The child starts a watcher of its own if it starts daemons; the lock is new (another
    thread may have held it at the fork).
    """
    global _watcher, _lock
    _lock = threading.Lock()
    watcher, _watcher = _watcher, None
    if watcher is not None and watcher.stdin is not None:
        with contextlib.suppress(OSError):
            watcher.stdin.close()


@atexit.register
def _close_at_exit() -> None:
    """Close the pipe at a normal exit and reap the watcher.

    Registered before the daemon modules' own exit hooks, so it runs after them: what they
    stopped is forgotten already, and the watcher ends at once (it waits out the grace period
    only for a child nobody stopped).
    """
    global _watcher
    watcher, _watcher = _watcher, None
    if watcher is None:
        return
    with contextlib.suppress(OSError):
        if watcher.stdin is not None:
            watcher.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        watcher.wait(timeout=GRACE_SECONDS + 2.0)


os.register_at_fork(after_in_child=_close_in_child)
