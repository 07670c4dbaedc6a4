"""``gradfed-ipfs federation init|show|add-bootstrap|allow|genesis``: the federation file.

``init NAME`` writes ``NAME.toml`` (mode 0600) with a fresh swarm key; the key is never
printed, only its fingerprint. ``add-bootstrap`` adds members' multiaddrs (``/…/tcp/…/p2p/ID``)
that new nodes dial first; ``allow`` adds peer IDs to the allow-list; ``genesis`` sets the
initial model's CID (``train --show-genesis`` prints it). Members start their node
with ``gradfed-ipfs node start --federation FILE``.
"""

from __future__ import annotations

import argparse
import logging
import stat
from pathlib import Path
from typing import Any

from rich.table import Table

from ..federation import ADMISSION_POLICIES, load_federation, new_federation, save_federation
from ..federation.file import Federation
from .common import console

__all__ = ["add_federation_parser"]

logger = logging.getLogger("gradfed_ipfs.cli.federation")


def _load(path: str) -> Federation:
    federation = load_federation(path)
    mode = stat.S_IMODE(Path(path).stat().st_mode)
    if mode & 0o077:
        logger.warning("%s is readable by others (mode %o): it holds the swarm key", path, mode)
        console.print(f"warning: {path} is readable by others (mode {mode:o}); chmod 600 it")
    return federation


def _init(args: argparse.Namespace) -> int:
    federation = new_federation(args.name, policy=args.policy, genesis=args.genesis)
    path = save_federation(federation, args.file or f"{args.name}.toml", overwrite=args.force)
    console.print(f"federation {federation.name} written to {path} (mode 600)")
    console.print(f"swarm key fingerprint {federation.fingerprint} (the key itself is a secret)")
    console.print(f"next: gradfed-ipfs node start --federation {path}")
    return 0


def _show(args: argparse.Namespace) -> int:
    federation = _load(args.file)
    session = federation.session
    table = Table(title=f"federation {federation.name}", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", overflow="fold")
    table.add_row("swarm key", f"fingerprint {federation.fingerprint} (secret: not shown)")
    table.add_row("bootstrap", "\n".join(federation.bootstrap) or "(none yet)")
    table.add_row("session", session.name)
    table.add_row("genesis", session.genesis or "(not set)")
    table.add_row("aggregation", session.aggregation)
    table.add_row(
        "timing",
        f"collect {session.collect_timeout:g} s, takeover {session.takeover_timeout:g} s, "
        f"round {session.round_timeout:g} s",
    )
    table.add_row("admission", federation.admission.policy)
    table.add_row("allowed", f"{len(federation.admission.allow)} peer IDs")
    console.print(table)
    return 0


def _add_bootstrap(args: argparse.Namespace) -> int:
    before = _load(args.file)
    after = before.with_bootstrap(*args.values)
    save_federation(after, args.file, overwrite=True)
    added = len(after.bootstrap) - len(before.bootstrap)
    console.print(f"{added} bootstrap address(es) added; {len(after.bootstrap)} in all")
    return 0


def _allow(args: argparse.Namespace) -> int:
    before = _load(args.file)
    after = before.with_allowed(*args.values)
    save_federation(after, args.file, overwrite=True)
    added, total = (
        len(after.admission.allow) - len(before.admission.allow),
        len(after.admission.allow),
    )
    console.print(f"{added} peer ID(s) allowed; {total} in all")
    return 0


def _genesis(args: argparse.Namespace) -> int:
    federation = _load(args.file).with_genesis(args.cid)
    save_federation(federation, args.file, overwrite=True)
    console.print(f"federation {federation.name} trains from {federation.session.genesis}")
    return 0


def add_federation_parser(commands: Any) -> None:
    """Register ``federation init|show|add-bootstrap|allow`` on ``commands``."""
    parser = commands.add_parser(
        "federation",
        help="make and edit a federation file: private-network key, bootstrap, admission",
        description="`federation init NAME` writes NAME.toml (mode 600): a fresh private-network "
        "swarm key (a secret: only holders can connect; never printed, never put in IPFS), the "
        "session's name and genesis, the admission policy. `show FILE` prints it without the "
        "key; `add-bootstrap FILE MULTIADDR…` and `allow FILE PEER_ID…` add entries. Members "
        "then run `gradfed-ipfs node start --federation FILE`.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = actions.add_parser("init", help="write a new federation file with a fresh swarm key")
    init.add_argument("name", help="the federation's name (also the session's)")
    init.add_argument("--file", metavar="FILE", help="where to write it (default NAME.toml)")
    init.add_argument(
        "--policy",
        choices=ADMISSION_POLICIES,
        default="allow-list",
        help="who may join (default allow-list)",
    )
    init.add_argument("--genesis", metavar="CID", help="the genesis model's CID")
    init.add_argument("--force", action="store_true", help="replace an existing file")
    init.set_defaults(handler=_init)
    show = actions.add_parser("show", help="print a federation file (never its swarm key)")
    show.add_argument("file", metavar="FILE")
    show.set_defaults(handler=_show)
    bootstrap = actions.add_parser("add-bootstrap", help="add members' multiaddrs to dial first")
    bootstrap.add_argument("file", metavar="FILE")
    bootstrap.add_argument("values", nargs="+", metavar="MULTIADDR", help="/…/tcp/…/p2p/ID")
    bootstrap.set_defaults(handler=_add_bootstrap)
    allow = actions.add_parser("allow", help="add peer IDs to the allow-list")
    allow.add_argument("file", metavar="FILE")
    allow.add_argument("values", nargs="+", metavar="PEER_ID", help="Ed25519 peer IDs")
    allow.set_defaults(handler=_allow)
    genesis = actions.add_parser(
        "genesis", help="set the session's initial model (`gradfed-ipfs train --show-genesis`)"
    )
    genesis.add_argument("file", metavar="FILE")
    genesis.add_argument("cid", metavar="CID")
    genesis.set_defaults(handler=_genesis)
