"""``gradfed-ipfs node start|stop|status|connect``: one managed, persistent Kubo daemon per user.

The node lives in a directory (default ``~/.local/share/gradfed-ipfs/node``; ``--node-dir`` or
``$GRADFED_IPFS_HOME`` override it) holding the Kubo repo (``repo/``), the daemon's log
(``daemon.log``) and its PID file (``daemon.pid``). The repo is initialised like every daemon of
this project (``--profile=test``, loopback only, ``Routing.Type=none``, pubsub on) and kept
between runs. The daemon outlives the CLI process; ``node stop`` ends it by its recorded PID.
``node connect TARGET`` dials another node (a multiaddr, or another daemon's API URL) from the
selected daemon (``--api``, ``$GRADFED_IPFS_API`` or the managed node).

The managed node keeps its connections and ports across restarts
(:mod:`~gradfed_ipfs.cli.known_peers`): ``node connect`` and ``node stop`` record its peers'
loopback addresses in ``peers.json``, every start records its API and swarm ports in
``ports.json``; ``node start`` listens on the same ports where they are still free (it says so
when one is not) and dials every recorded peer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from ..errors import KuboRpcError, KuboStartError
from ..federation import PNET_ENV, Federation, load_federation, private_network_config
from ..federation.network import DEFAULT_LISTEN, swarm_key_text
from ..kubo.binary import find_kubo_binary
from ..kubo.daemon import LOOPBACK_CONFIG, WAN_TUNING
from ..node import Node
from .common import UsageError, api_of, console, default_node_dir, err_console, run
from .known_peers import (
    PEERS_FILE,
    connected_peers,
    load_peers,
    load_ports,
    loopback_addresses,
    port_is_free,
    redial,
    remember_peers,
    save_ports,
)
from .managed import (
    LOG_FILE,
    PID_FILE,
    api_url,
    children,
    identify,
    is_kubo_daemon,
    read_pid,
    repo_dir,
    running_node_api,
)

__all__ = ["add_node_parser"]

logger = logging.getLogger("gradfed_ipfs.cli.node")

SWARM_KEY_FILE = "swarm.key"
MEMBER_FILE = "federation.json"


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
    env.pop("LIBP2P_FORCE_PNET", None)
    if (repo / SWARM_KEY_FILE).exists():
        env.update(PNET_ENV)  # a federation node never starts on the public network
    return env


def _log_tail(node_dir: Path, lines: int = 20) -> str:
    try:
        text = (node_dir / LOG_FILE).read_text(errors="replace")
    except OSError:
        return "(no daemon log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class PrivateNetwork:
    """``node start --federation``: the federation and where its node listens and announces."""

    federation: Federation
    listen: tuple[str, ...] = DEFAULT_LISTEN
    announce: tuple[str, ...] = ()


def _network_config(
    repo: Path, node_dir: Path, network: PrivateNetwork | None, ports: dict[str, int]
) -> list[tuple[str, str]]:
    """Return the config entries of this start; install the swarm key of a federation node.

    Raises
    ------
    UsageError
        If a node that joined a federation is started without one, or with another one.
    """
    key_file = repo / SWARM_KEY_FILE
    if network is None:
        if key_file.exists():
            raise UsageError(
                f"this node is a federation member ({_member_of(node_dir)}): start it with "
                "--federation FILE, or use another --node-dir for a loopback node"
            )
        return [*LOOPBACK_CONFIG, *_pinned(ports)]
    federation = network.federation
    text = swarm_key_text(federation)
    if key_file.exists() and key_file.read_text() != text:
        raise UsageError(
            f"this node is a member of {_member_of(node_dir)}, not of {federation.name} "
            f"(key {federation.fingerprint}); use another --node-dir"
        )
    descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    (node_dir / MEMBER_FILE).write_text(
        json.dumps({"federation": federation.name, "key": federation.fingerprint}) + "\n"
    )
    return private_network_config(
        federation, listen=network.listen, announce=network.announce, api_port=ports.get("api", 0)
    )


def _member_of(node_dir: Path) -> str:
    try:
        member = json.loads((node_dir / MEMBER_FILE).read_text())
        return f"federation {member['federation']}, key {member['key']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a federation"


def node_start(
    node_dir: Path, timeout: float, *, wan: bool = False, network: PrivateNetwork | None = None
) -> int:
    """Start the managed daemon (initialising its repo once); print its API URL.

    ``wan`` applies :data:`~gradfed_ipfs.kubo.daemon.WAN_TUNING` (wide-area links);
    ``network`` makes it a node of a federation's private network instead of a loopback one.
    """
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
    wanted = load_ports(node_dir)
    ports = {key: port for key, port in wanted.items() if port_is_free(port)}
    config = _network_config(repo, node_dir, network, ports)
    for key, value in [*config, *(WAN_TUNING.config() if wan else [])]:
        _ipfs(binary, repo, "config", "--json", key, value)
    started = _launch(binary, repo, node_dir, timeout)
    if started is None and ports:
        # a port was taken between the check and the daemon's bind: once more on fresh ones
        ports = {}
        for key, value in _pinned({"api": 0, "swarm": 0} if network is None else {"api": 0}):
            _ipfs(binary, repo, "config", "--json", key, value)
        started = _launch(binary, repo, node_dir, timeout)
    if started is None:
        raise KuboStartError(f"the daemon exited during start:\n{_log_tail(node_dir)}")
    pid, api, info = started
    got = _ports_of(api, info)
    save_ports(node_dir, got)
    console.print(f"node started: pid {pid}, api {api}, peer {info.get('ID')}")
    if network is not None:
        console.print(
            f"private network of federation {network.federation.name} "
            f"(key {network.federation.fingerprint}); listening on {', '.join(network.listen)}"
        )
    for key, port in wanted.items():
        if key in got and got[key] != port:
            console.print(f"note: the {key} port {port} is in use; this start got {got[key]}")
    console.print(f"use it with: export GRADFED_IPFS_API={api}")
    _reconnect(node_dir, api)
    return 0


def _pinned(ports: dict[str, int]) -> list[tuple[str, str]]:
    """Config entries that listen on the given loopback ports (0: any free one)."""
    entries = []
    if "api" in ports:
        entries.append(("Addresses.API", json.dumps(f"/ip4/127.0.0.1/tcp/{ports['api']}")))
    if "swarm" in ports:
        entries.append(("Addresses.Swarm", json.dumps([f"/ip4/127.0.0.1/tcp/{ports['swarm']}"])))
    return entries


def _ports_of(api: str, info: dict[str, Any]) -> dict[str, int]:
    ports = {"api": int(api.rsplit(":", 1)[1])}
    for address in loopback_addresses([str(a) for a in info.get("Addresses") or []]):
        if address.startswith("/ip4/127.0.0.1/tcp/"):
            ports["swarm"] = int(address.rsplit("/", 1)[1])
            break
    return ports


def _launch(
    binary: Path, repo: Path, node_dir: Path, timeout: float
) -> tuple[int, str, dict[str, Any]] | None:
    """Start the daemon and wait for its API; ``None`` if it exited (e.g. a port was taken).

    Raises
    ------
    KuboStartError
        If it does not answer within ``timeout`` seconds (it is then stopped).
    """
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
                children.pop(process.pid, None)
                (node_dir / PID_FILE).unlink(missing_ok=True)
                return None
            api = api_url(node_dir)
            info = identify(api) if api else None
            if api and info:
                return process.pid, api, info
            if time.monotonic() > deadline:
                _terminate(process.pid)
                raise KuboStartError(f"the daemon did not answer within {timeout:.0f}s")
            time.sleep(delay)  # readiness has no event to wait on: poll with a growing delay
            delay = min(delay * 1.5, 0.25)


def _reconnect(node_dir: Path, api: str) -> None:
    """Dial the peers this node was connected to before (best effort; failures are printed)."""
    known = load_peers(node_dir)
    if not known:
        return
    failed = run(redial(api, known))
    for peer, reason in failed.items():
        logger.warning("could not reconnect to %s: %s", peer, reason)
        err_console.print(f"could not reconnect to {peer} ({reason})", soft_wrap=True)
    count = len(known) - len(failed)
    console.print(
        f"reconnected to {count} of {len(known)} known peer{'s' if len(known) != 1 else ''}"
    )


def _remember_connections(node_dir: Path, api: str) -> None:
    """Record the running node's current peers for its next start (best effort)."""
    try:
        peers = run(connected_peers(api))
    except KuboRpcError as exc:
        logger.warning("could not list the node's peers: %s", exc)
        return
    remember_peers(node_dir, peers)


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
    api = api_url(node_dir)
    if api:
        _remember_connections(node_dir, api)
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
    known = load_peers(node_dir)
    table.add_row("known peers", f"{len(known)} (redialled on start; {node_dir / PEERS_FILE})")
    if info:
        table.add_row("peer id", str(info.get("ID")))
        table.add_row("agent", str(info.get("AgentVersion")))
        addresses = [str(a) for a in info.get("Addresses") or []]
        table.add_row("addresses", json.dumps(addresses))
    console.print(table)
    return 0 if info else 1


async def node_connect(api: str, target: str, timeout: float, node_dir: Path | None) -> int:
    """``swarm/connect`` the daemon at ``api`` to ``target``; print the address and peer count.

    ``node_dir`` (the managed node's, when ``api`` is it) remembers the connection for the
    node's next start.
    """
    async with Node(api, timeout=timeout) as node:
        address = await node.connect(target)
        peers = await node.peers()
    if node_dir is not None:
        try:
            remember_peers(node_dir, await connected_peers(api))
        except KuboRpcError as exc:  # the connection stands; only its memory is lost
            logger.warning("could not record the node's peers: %s", exc)
    console.print(f"connected to {address}")
    console.print(f"this node now has {len(peers)} peer{'s' if len(peers) != 1 else ''}")
    return 0


def _network_of(args: argparse.Namespace) -> PrivateNetwork | None:
    if not args.federation:
        if args.listen or args.announce:
            raise UsageError("--listen and --announce need --federation FILE")
        return None
    federation = load_federation(args.federation)
    listen = tuple(args.listen) if args.listen else DEFAULT_LISTEN
    return PrivateNetwork(federation, listen, tuple(args.announce or ()))


def _dispatch(args: argparse.Namespace) -> int:
    node_dir = Path(args.node_dir) if args.node_dir else default_node_dir()
    if args.action == "connect":
        if not args.target:
            raise UsageError(
                "node connect needs a target: a multiaddr (/ip4/…/tcp/…/p2p/…) or another "
                "daemon's API URL (http://127.0.0.1:5001)"
            )
        api = api_of(args)
        managed = node_dir if api == running_node_api(node_dir) else None
        return run(node_connect(api, args.target, args.timeout, managed))
    if args.target:
        raise UsageError(f"node {args.action} takes no target")
    if args.action == "start":
        return node_start(node_dir, args.start_timeout, wan=args.wan, network=_network_of(args))
    if args.federation or args.listen or args.announce:
        raise UsageError("--federation, --listen and --announce are options of node start")
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
    node.add_argument(
        "--wan",
        action="store_true",
        help="for start: tune Kubo for wide-area links (an 8 MiB bitswap window, connection "
        "manager marks 64/192); see benchmarks/bench_wan.py",
    )
    node.add_argument(
        "--federation",
        metavar="FILE",
        help="for start: join the private network of this federation file (gradfed-ipfs "
        "federation init): its swarm key, bootstrap peers, TCP only, API on 127.0.0.1, no gateway",
    )
    node.add_argument(
        "--listen",
        action="append",
        metavar="MULTIADDR",
        help="with --federation: a swarm listen address (repeatable; default "
        "/ip4/0.0.0.0/tcp/4001 and /ip6/::/tcp/4001)",
    )
    node.add_argument(
        "--announce",
        action="append",
        metavar="MULTIADDR",
        help="with --federation: an address to announce to members (repeatable), e.g. "
        "/ip4/<public IP>/tcp/4001 behind a port forward",
    )
    node.set_defaults(handler=_dispatch)
