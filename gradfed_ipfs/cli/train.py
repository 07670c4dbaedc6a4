"""``gradfed-ipfs train --federation F task.py``: train as a member of a federation.

Runs a :class:`~gradfed_ipfs.training.Peer` from the member's task file
(:mod:`gradfed_ipfs.federation.task`) on the selected node (the managed one by default, started
with ``node start --federation F``), with the federation's session, members and timing. Each
round prints one line (round, participants, loss); Ctrl+C leaves the session and keeps the
node running.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..federation import load_federation, member_peer
from ..node import Node
from .common import async_handler, console, err_console, positive_float

__all__ = ["add_train_parser"]


def _line(text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


async def _train(args: argparse.Namespace, api: str) -> int:
    federation = load_federation(args.federation)
    async with Node(api, timeout=args.timeout) as node:
        peer, genesis = await member_peer(
            federation, args.task, node, log=_line, member=not args.show_genesis
        )
        if args.show_genesis:
            console.print(str(genesis))
            return 0
        if federation.session.genesis is None:
            err_console.print(
                f"note: {args.federation} names no genesis; this task's is {genesis} "
                "(members with another initial model end up in another session)"
            )
        console.print(
            f"member {await node.peer_id()} of {federation.name}: "
            f"{len(peer.agreed.members)} members, {peer.config.rounds} rounds, genesis {genesis}"
        )
        try:
            history = await peer.run(linger=args.linger)
        except KeyboardInterrupt:  # pragma: no cover - interactive
            err_console.print("left the session; the node keeps running")
            return 130
    console.print(f"done: {len(history.entries)} rounds, model {history.entries[-1].model}")
    return 0


def add_train_parser(commands: Any) -> None:
    """Register ``train`` on the subcommand group ``commands``."""
    parser = commands.add_parser(
        "train",
        help="train as a member of a federation from a task file (the member's ClientApp)",
        description="Run a training peer for the federation's session on the selected node "
        "(default: the managed node, started with `node start --federation F`). TASK is a "
        "Python file defining `task`: a gradfed_ipfs.federation.Task (client, adapter, "
        "initial model, FederationConfig, optional strategy), or a function of a Member "
        "(peer_id, index, members) returning one. The members are the federation's "
        "allow-list; the task's initial model must be the federation's genesis when it names "
        "one. Prints one line per round; exit 0 when every round is done.",
    )
    parser.add_argument("--federation", required=True, metavar="FILE", help="federation file")
    parser.add_argument("task", metavar="TASK", help="the task file (task.py)")
    parser.add_argument(
        "--linger",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="after the last round, keep serving the head until every member is done, or at "
        "most this long (default 30)",
    )
    parser.add_argument(
        "--show-genesis",
        action="store_true",
        help="print the task's genesis CID (for `federation genesis`) and exit; any node will "
        "do, a member's or not",
    )
    parser.set_defaults(handler=async_handler(_train))
