"""The main job, ``gradfed-ipfs demo``: agreed training rounds between OS processes.

This process starts one loopback Kubo daemon per peer (a :class:`~gradfed_ipfs.KuboSwarm`),
then one peer process per daemon (:mod:`~gradfed_ipfs.cli.demo.peer`), each talking only to its
own daemon's API. The peers train :class:`~gradfed_ipfs.cli.demo.peer.DemoTask` over agreed
rounds: contributions cross between daemons over bitswap, announcements over pubsub. Every
process prints its final model CID; the demo succeeds only if they are all equal. Every child
and daemon is stopped by its PID on the way out: at the end, on a failing child, at the
deadline, and on Ctrl-C, SIGTERM or SIGHUP.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import queue
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import GradfedError
from ...kubo.daemon import KuboSwarm
from ..children import Event, JsonLinesChild, environment
from ..common import console, err_console

__all__ = ["DemoPeerRun", "DemoRun", "cmd_demo", "run_demo"]

_STOPPED = (-signal.SIGTERM, -signal.SIGKILL)
"""Exit statuses of a peer process this process stopped (after another failed)."""


@dataclass
class DemoPeerRun:
    """What one peer process did."""

    index: int
    pid: int
    api_url: str
    peer_id: str
    exit_code: int | None = None
    start: Event | None = None
    final: Event | None = None
    error: str = ""

    @property
    def model(self) -> str | None:
        """The final model CID of the process (``None`` if it did not finish)."""
        return None if self.final is None else str(self.final["model"])


@dataclass
class DemoRun:
    """The outcome of :func:`run_demo`."""

    peers: list[DemoPeerRun]
    rounds: int
    seconds: float = 0.0
    failure: str = ""
    losses: list[float] = field(default_factory=list)
    """The loss before round 1, then after each round (peer 0's view)."""

    @property
    def agreed(self) -> bool:
        """Whether every process exited 0 on one and the same model CID."""
        models = {p.model for p in self.peers}
        ok = all(p.exit_code == 0 for p in self.peers) and None not in models
        return ok and len(models) == 1 and not self.failure


def run_demo(
    peers: int = 3,
    rounds: int = 5,
    *,
    seed: int = 0,
    deadline: float = 120.0,
    log: Callable[[str], None] = print,
) -> DemoRun:
    """Run ``rounds`` agreed rounds between ``peers`` processes, each beside its own daemon.

    Parameters
    ----------
    peers
        Number of peer processes and daemons (≥ 2).
    rounds
        Agreed rounds to train (≥ 1).
    seed
        Seed of the synthetic data (the same on every peer).
    deadline
        Seconds each peer process may take (this process waits 30 s more, then stops them).
    log
        Receives one progress line per step (daemons, processes, each round, each final CID).

    Returns
    -------
    DemoRun
        Every process's events and exit status; :attr:`DemoRun.agreed` is the verdict.
    """
    if peers < 2:
        raise GradfedError("the demo needs at least 2 peers")
    if rounds < 1:
        raise GradfedError("the demo needs at least 1 round")
    started = time.monotonic()
    log(f"starting {peers} Kubo daemons on 127.0.0.1 (one loopback swarm)…")
    with tempfile.TemporaryDirectory(prefix="gradfed-demo-") as workdir, KuboSwarm(peers) as swarm:
        for i, daemon in enumerate(swarm):
            log(f"  daemon {i}: {daemon.peer_id} api={daemon.api_url} pid={daemon.pid}")
        members = ",".join(daemon.peer_id for daemon in swarm)
        runs = [DemoPeerRun(i, 0, d.api_url, d.peer_id) for i, d in enumerate(swarm)]
        run = DemoRun(runs, rounds)
        inbox: queue.Queue[tuple[int, Event | None]] = queue.Queue()
        children: list[JsonLinesChild] = []
        try:
            for i, daemon in enumerate(swarm):
                argv = [
                    sys.executable, "-m", "gradfed_ipfs.cli.demo.peer", "--api", daemon.api_url,
                    "--index", str(i), "--members", members, "--rounds", str(rounds),
                    "--seed", str(seed), "--deadline", str(deadline),
                ]  # fmt: skip
                child = JsonLinesChild(
                    argv,
                    stderr=Path(workdir) / f"peer{i}.log",
                    env=environment(),
                    on_event=functools.partial(_put, inbox, i),
                )
                children.append(child)
                runs[i].pid = child.pid
                log(f"  peer {i}: pid {child.pid}, talks only to {daemon.api_url}")
            _follow(run, children, inbox, time.monotonic() + deadline + 30.0, log)
        finally:
            for child in children:
                child.stop()
        for peer, child in zip(runs, children, strict=True):
            peer.exit_code = child.poll()
            if peer.exit_code not in (0, None) and not peer.error:
                peer.error = _last_line(child.stderr_tail())
    run.seconds = time.monotonic() - started
    return run


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "(nothing on stderr)"


def _put(inbox: queue.Queue[tuple[int, Event | None]], index: int, event: Event | None) -> None:
    inbox.put((index, event))


def _follow(
    run: DemoRun,
    children: list[JsonLinesChild],
    inbox: queue.Queue[tuple[int, Event | None]],
    deadline: float,
    log: Callable[[str], None],
) -> None:
    """Log the children's events as they come until every child's output ends (or one fails)."""
    running, reported = set(range(len(children))), dict[int, set[int]]()
    while running:
        try:
            i, event = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            run.failure = "deadline passed with peers still running"
            return
        if event is not None:
            _record(run, reported, len(children), i, event, log)
            continue
        running.discard(i)  # its stdout ended: it exited (reaped here)
        if not _exited_cleanly(run, children[i], i):
            return


def _exited_cleanly(run: DemoRun, child: JsonLinesChild, i: int) -> bool:
    """Reap peer ``i`` whose output ended; on a non-zero status record the run's failure."""
    peer = run.peers[i]
    try:
        code = child.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        code = -1  # it closed its stdout but runs on: stopped by the caller
    if code == 0:
        return True
    peer.error = peer.error or _last_line(child.stderr_tail())
    run.failure = f"peer {i} exited with status {code}: {peer.error}"
    return False


def _record(
    run: DemoRun,
    reported: dict[int, set[int]],
    peers: int,
    i: int,
    event: Event,
    log: Callable[[str], None],
) -> None:
    """Take one event of peer ``i``: its start, a round, its final model or its error.

    A round is logged once all ``peers`` have reported it.
    """
    peer = run.peers[i]
    kind = event["event"]
    if kind in ("start", "round") and i == 0:
        run.losses.append(float(event["loss"]))
    if kind == "start":
        peer.start = event
        log(f"  peer {i} joined as {event['peer']}: {event['samples']} samples")
    elif kind == "round":
        r = int(event["round"])
        reported.setdefault(r, set()).add(i)
        if len(reported[r]) == peers:
            log(
                f"round {r + 1}/{run.rounds}: model {event['model']}, "
                f"{event['peers']} contributions, loss {event['loss']:.4f}"
            )
    elif kind == "final":
        peer.final = event
        log(f"peer {i} (pid {peer.pid}) final model {event['model']}")
    elif kind == "error":
        peer.error = f"{event['kind']}: {event['message']}"


@contextlib.contextmanager
def _exit_on_termination() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into ``SystemExit(128 + signal)``, so cleanup runs as on Ctrl-C."""

    def leave(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, leave) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run ``gradfed-ipfs demo``; return 0 only if every process ends on the same model CID."""
    console.print(
        f"[bold]gradfed-ipfs demo[/]: {args.peers} peers as {args.peers} OS processes, each "
        f"beside its own Kubo daemon; {args.rounds} agreed rounds of linear regression",
        highlight=False,
        soft_wrap=True,
    )
    with _exit_on_termination():
        run = run_demo(
            args.peers,
            args.rounds,
            seed=args.seed,
            deadline=args.deadline,
            log=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True),
        )
    if not run.agreed:
        models = {p.model for p in run.peers}
        why = run.failure or f"the processes ended on {len(models)} different models"
        err_console.print(f"[red]FAILED[/]: {why}", highlight=False, soft_wrap=True)
        for p in run.peers:
            status = "stopped by the demo" if p.exit_code in _STOPPED else f"exit {p.exit_code}"
            detail = f"; {p.error}" if p.error and p.exit_code not in _STOPPED else ""
            err_console.print(
                f"  peer {p.index} (pid {p.pid}): {status}, final model {p.model or '-'}{detail}",
                markup=False, highlight=False, soft_wrap=True,
            )  # fmt: skip
        return 1
    before, after = run.losses[0], run.losses[-1]
    console.print(
        f"[green]OK[/]: {len(run.peers)} processes agree on model {run.peers[0].model}; "
        f"loss {before:.4f} -> {after:.4f} after {run.rounds} rounds in {run.seconds:.1f} s",
        highlight=False,
        soft_wrap=True,
    )
    return 0
