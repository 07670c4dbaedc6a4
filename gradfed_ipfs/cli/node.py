"""``gradfed-ipfs node start|stop|status|connect``: one managed, persistent Kubo daemon per user.

The node lives in a directory (default ``~/.local/share/gradfed-ipfs/node``; ``--node-dir`` or
``$GRADFED_IPFS_HOME`` override it) holding the Kubo repo (``repo/``), the daemon's log
(``daemon.log``) and its PID file (``daemon.pid``). The repo is initialised like every daemon of
this project (``--profile=test``, loopback only, ``Routing.Type=none``, pubsub on) and kept
between runs. The daemon outlives the CLI process; ``node stop`` ends it by its recorded PID.
``node connect TARGET`` dials another node (a multiaddr, or another daemon's API URL) from the
selected daemon (``--api``, ``$GRADFED_IPFS_API`` or the managed node).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from ..errors import KuboStartError
from ..kubo.binary import find_kubo_binary
from ..kubo.daemon import LOOPBACK_CONFIG
from ..node import Node
from .common import UsageError, api_of, console, default_node_dir, err_console, run
from .managed import (
    LOG_FILE,
    PID_FILE,
    api_url,
    children,
    identify,
    is_kubo_daemon,
    read_pid,
    repo_dir,
)

__all__ = ["add_node_parser"]


def _ipfs(binary: Path, repo: Path, *args: str) -> None:
    result = subprocess.run(
        [str(binary), *args],
        env=_env(repo),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if result.returncode != 0:
        raise KuboStartError(f"ipfs {' '.join(args)} failed: {result.stderr.strip()[-1000:]}")


def _env(repo: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"IPFS_PATH": str(repo), "IPFS_TELEMETRY": "off", "GOLOG_LOG_LEVEL": "error"})
    return env


def _log_tail(node_dir: Path, lines: int = 20) -> str:
    try:
        text = (node_dir / LOG_FILE).read_text(errors="replace")
    except OSError:
        return "(no daemon log)"
    return "\n".join(text.splitlines()[-lines:])


def node_start(node_dir: Path, timeout: float) -> int:
    """Start the managed daemon (initialising its repo once); print its API URL."""
    pid = read_pid(node_dir)
    if pid is not None and is_kubo_daemon(pid):
        console.print(f"node already running: pid {pid}, api {api_url(node_dir)}")
        return 0
    with err_console.status("locating Kubo (building it the first time takes minutes)…"):
        binary = find_kubo_binary()
    repo = repo_dir(node_dir)
    repo.mkdir(parents=True, exist_ok=True)
    if not (repo / "config").exists():
        with err_console.status("initialising the Kubo repo…"):
            _ipfs(binary, repo, "init", "--profile=test")
    for key, value in LOOPBACK_CONFIG:
        _ipfs(binary, repo, "config", "--json", key, value)
    with contextlib.suppress(FileNotFoundError):
        (repo / "api").unlink()  # a stale file from a killed daemon would point at a dead port
    with (node_dir / LOG_FILE).open("ab") as log:
        process = subprocess.Popen(
            [str(binary), "daemon", "--migrate=false"],
            env=_env(repo),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives this CLI process and its terminal
        )
    children[process.pid] = process
    (node_dir / PID_FILE).write_text(f"{process.pid}\n")
    deadline = time.monotonic() + timeout
    delay = 0.02
    with err_console.status("waiting for the daemon's API…"):
        while True:
            if process.poll() is not None:
                raise KuboStartError(
                    f"the daemon exited with code {process.returncode}:\n{_log_tail(node_dir)}"
                )
            api = api_url(node_dir)
            info = identify(api) if api else None
            if api and info:
                break
            if time.monotonic() > deadline:
                _terminate(process.pid)
                raise KuboStartError(f"the daemon did not answer within {timeout:.0f}s")
            time.sleep(delay)  # readiness has no event to wait on: poll with a growing delay
            delay = min(delay * 1.5, 0.25)
    console.print(f"node started: pid {process.pid}, api {api}, peer {info.get('ID')}")
    console.print(f"use it with: export GRADFED_IPFS_API={api}")
    return 0


def _terminate(pid: int, grace: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    child = children.pop(pid, None)
    if child is not None:
        try:
            child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=grace)
        return
    deadline = time.monotonic() + grace
    while is_kubo_daemon(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.05)  # not our child: nothing to wait on but its /proc entry


def node_stop(node_dir: Path) -> int:
    """Stop the managed daemon by its recorded PID (SIGTERM, SIGKILL after 10 s)."""
    pid = read_pid(node_dir)
    if pid is None or not is_kubo_daemon(pid):
        console.print("node is not running")
        (node_dir / PID_FILE).unlink(missing_ok=True)
        return 0
    _terminate(pid)
    (node_dir / PID_FILE).unlink(missing_ok=True)
    console.print(f"node stopped (pid {pid}); repo kept at {repo_dir(node_dir)}")
    return 0


def node_status(node_dir: Path) -> int:
    """Print a table of the managed node; exit 0 if it runs and answers, 1 otherwise."""
    pid = read_pid(node_dir)
    running = pid is not None and is_kubo_daemon(pid)
    api = api_url(node_dir) if running else None
    info = identify(api) if api else None
    table = Table(title="gradfed-ipfs node", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", overflow="fold")
    state = "running" if info else ("not answering" if running else "stopped")
    table.add_row("state", state)
    table.add_row("directory", str(node_dir))
    table.add_row(
        "repo", str(repo_dir(node_dir)) + ("" if repo_dir(node_dir).exists() else " (none)")
    )
    if running:
        table.add_row("pid", str(pid))
        table.add_row("api", api or "?")
    if info:
        table.add_row("peer id", str(info.get("ID")))
        table.add_row("agent", str(info.get("AgentVersion")))
        addresses = [str(a) for a in info.get("Addresses") or []]
        table.add_row("addresses", json.dumps(addresses))
    console.print(table)
    return 0 if info else 1


async def node_connect(api: str, target: str, timeout: float) -> int:
    """``swarm/connect`` the daemon at ``api`` to ``target``; print the address and peer count."""
    async with Node(api, timeout=timeout) as node:
        address = await node.connect(target)
        peers = await node.peers()
    console.print(f"connected to {address}")
    console.print(f"this node now has {len(peers)} peer{'s' if len(peers) != 1 else ''}")
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    node_dir = Path(args.node_dir) if args.node_dir else default_node_dir()
    if args.action == "connect":
        if not args.target:
            raise UsageError(
                "node connect needs a target: a multiaddr (/ip4/…/tcp/…/p2p/…) or another "
                "daemon's API URL (http://127.0.0.1:5001)"
            )
        return run(node_connect(api_of(args), args.target, args.timeout))
    if args.target:
        raise UsageError(f"node {args.action} takes no target")
    if args.action == "start":
        return node_start(node_dir, args.start_timeout)
    if args.action == "stop":
        return node_stop(node_dir)
    return node_status(node_dir)


def add_node_parser(commands: Any) -> None:
    """Register ``node start|stop|status|connect`` on the subcommand group ``commands``."""
    node = commands.add_parser(
        "node",
        help="start, stop, inspect or connect the managed local Kubo daemon",
        description="Manage one persistent Kubo daemon on 127.0.0.1 under the user's data "
        "directory (default ~/.local/share/gradfed-ipfs/node, or $GRADFED_IPFS_HOME). The Kubo "
        "binary is found or built with scripts/install-kubo. Other subcommands use this daemon "
        "when neither --api nor $GRADFED_IPFS_API is given. `node connect TARGET` dials "
        "another node from the selected daemon.",
    )
    node.add_argument("action", choices=["start", "stop", "status", "connect"], help="what to do")
    node.add_argument(
        "target",
        nargs="?",
        help="for connect: a multiaddr (/ip4/…/tcp/…/p2p/ID) or another daemon's API URL",
    )
    node.add_argument(
        "--start-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the daemon's API on start (default 60)",
    )
    node.set_defaults(handler=_dispatch)
