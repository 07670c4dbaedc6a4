"""Child processes that report in JSON lines: started, read and stopped by their own PID.

A child prints one JSON object per line on stdout (``{"event": "round", ...}``); a reader
thread collects them in :attr:`JsonLinesChild.events` (a line that is not a JSON object becomes
``{"event": "text", "text": line}``) and may hand each one, then ``None`` at the end of the
output, to a callback, so a parent can wait on a queue instead of polling. The child's stderr
goes to a file. :meth:`JsonLinesChild.stop` ends it by its PID (SIGTERM, then SIGKILL), never by
name. The demo's peers and the multi-process tests' peers run this way.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from .. import _reaper

__all__ = ["ONE_BLAS_THREAD", "Event", "JsonLinesChild", "environment"]

Event = dict[str, Any]
"""One line a child printed, decoded."""

ONE_BLAS_THREAD: Final[Mapping[str, str]] = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
"""Environment of children with small models: N processes on few cores lose to BLAS threads."""


class JsonLinesChild:
    """One child process whose stdout is JSON lines.

    Parameters
    ----------
    argv
        The command, e.g. ``[sys.executable, "-m", "package.module", ...]``.
    stderr
        File the child's stderr goes to (created or truncated).
    env, cwd
        The child's environment and working directory (default: this process's).
    on_event
        Called from the reader thread with each event, then once with ``None`` when the
        child's stdout ends (it exited, or closed it).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        stderr: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        on_event: Callable[[Event | None], None] | None = None,
    ) -> None:
        self.stderr_path = stderr
        self.events: list[Event] = []
        self._on_event = on_event
        self._stderr = stderr.open("w")
        try:
            self.proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=None if env is None else dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
            )
        except BaseException:
            self._stderr.close()
            raise
        _reaper.watch(self.proc.pid)  # ended if the parent is killed (its daemons go with it)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        """The child's process ID."""
        return self.proc.pid

    def _read(self) -> None:
        try:
            for line in self.proc.stdout or ():
                if line.strip():
                    event = _decode(line)
                    self.events.append(event)
                    if self._on_event is not None:
                        self._on_event(event)
        finally:
            if self._on_event is not None:
                self._on_event(None)

    def of(self, event: str) -> list[Event]:
        """Return the events named ``event`` received so far, in order."""
        return [e for e in list(self.events) if e.get("event") == event]

    def final(self) -> Event | None:
        """Return the first ``final`` event, if one arrived."""
        finals = self.of("final")
        return finals[0] if finals else None

    def poll(self) -> int | None:
        """Return the exit status, or ``None`` while the child runs."""
        return self.proc.poll()

    def stderr_tail(self, chars: int = 4000) -> str:
        """Return the end of what the child wrote to stderr (also after :meth:`stop`)."""
        try:
            return self.stderr_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the child (by PID) and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        """End the child if it still runs (SIGTERM, SIGKILL after ``timeout`` s); close up."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        _reaper.forget(self.proc.pid)
        self._reader.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


def _decode(line: str) -> Event:
    try:
        value = json.loads(line)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"event": "text", "text": line.rstrip("\n")}


def environment(**extra: str) -> dict[str, str]:
    """Return this process's environment with :data:`ONE_BLAS_THREAD` and ``extra``."""
    return {**os.environ, **ONE_BLAS_THREAD, **extra}
