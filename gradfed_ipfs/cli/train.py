"""``gradfed-ipfs train --federation F task.py``: train as a member of a federation.

Runs a :class:`~gradfed_ipfs.training.Peer` from the member's task file
(:mod:`gradfed_ipfs.federation.task`) on the selected node (the managed one by default, started
with ``node start --federation F``), with the federation's session, members and timing. A node
that is not one of the genesis members joins the running session (admitted by the
federation's policy) and contributes from the round after its admission. Each round prints one
line (round, results, the round's member count, loss), and each join, approval or leave the
peer newly holds one line (``holds join of P``, ``holds approval of P by A``, ``holds leave
of P (its last round: R)``): the next roster it makes can carry it. The first Ctrl+C leaves
cleanly (a signed leave after the current round, exit 0 once a record names a member set
without this peer); a second one quits at once (exit 130). The node keeps running unless
``--stop-node``. A genesis member that restarts passes ``--resume``: it adopts the members'
head rather than start at round 0, and if it had left (or was evicted) it asks to join again.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from typing import Any

from ..federated.agreed.members import HeldRequest
from ..federation import load_federation, member_peer
from ..federation.file import Federation
from ..formats.agreed.membership import APPROVE, LEAVE
from ..node import Node
from ..training import History, Peer
from .common import async_handler, console, default_node_dir, err_console, positive_float
from .node import node_stop

__all__ = ["add_train_parser"]


def _line(text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _held(request: HeldRequest) -> None:
    """Print one line for a join, approval or leave the peer newly holds (train's rounds)."""
    if request.kind == APPROVE:
        _line(f"holds approval of {request.peer} by {request.author}")
    elif request.kind == LEAVE:
        last = "" if request.round is None else f" (its last round: {request.round + 1})"
        _line(f"holds leave of {request.peer}{last}")
    else:
        _line(f"holds join of {request.peer}")


class _Interrupts:
    """Ctrl+C during ``train``: the first leaves cleanly, the second quits at once."""

    def __init__(self, peer: Peer[object], run: asyncio.Task[History]) -> None:
        self.peer, self.run, self.forced = peer, run, False

    def __call__(self) -> None:
        if not self.forced and self.peer.leave():
            self.forced = True  # the next Ctrl+C quits
            err_console.print("leaving after this round (Ctrl+C again to quit now)…")
            return
        self.forced = True
        self.run.cancel()


async def _run(peer: Peer[object], args: argparse.Namespace, joining: bool) -> History | None:
    """Run the peer with Ctrl+C handled (see the module docstring); ``None``: quit."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(
        peer.run(
            linger=args.linger,
            join=joining,
            join_timeout=args.join_timeout,
            resume=args.resume and not joining,
        )
    )
    loop.add_signal_handler(signal.SIGINT, _Interrupts(peer, task))
    try:
        return await task
    except asyncio.CancelledError:
        if not task.cancelled():
            raise
        return None
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def _intro(federation: Federation, peer: Peer[object], peer_id: str, genesis: str) -> str:
    if peer_id not in federation.genesis_members:
        policy = federation.admission.policy
        return (
            f"peer {peer_id} asks to join {federation.name} ({policy}); it trains from the "
            f"round after its admission, {peer.config.rounds} rounds in all"
        )
    return (
        f"member {peer_id} of {federation.name}: {len(peer.agreed.members)} members, "
        f"{peer.config.rounds} rounds, genesis {genesis}"
    )


def _ending(history: History | None) -> tuple[str, int]:
    if history is None:
        return "quit without leaving (the others evict this peer after absent rounds)", 130
    last = history.entries[-1] if history.entries else None
    model = "" if last is None else f", model {last.model}"
    if history.ended == "left":
        return f"left the session after {len(history.entries)} rounds{model}", 0
    if history.ended == "evicted":
        return f"evicted from the session after {len(history.entries)} rounds{model}", 1
    return f"done: {len(history.entries)} rounds{model}", 0


def _stop_node(args: argparse.Namespace) -> None:
    if args.api:
        err_console.print("--stop-node: not a managed node (--api given); it keeps running")
        return
    node_stop(Path(args.node_dir) if args.node_dir else default_node_dir())


async def _train(args: argparse.Namespace, api: str) -> int:
    federation = load_federation(args.federation)
    async with Node(api, timeout=args.timeout) as node:
        peer, genesis = await member_peer(
            federation, args.task, node, log=_line, member=not args.show_genesis,
            source=args.federation, on_request=_held,
        )  # fmt: skip
        if args.show_genesis:
            console.print(str(genesis))
            return 0
        if federation.session.genesis is None:
            err_console.print(
                f"note: {args.federation} names no genesis; this task's is {genesis} "
                "(members with another initial model end up in another session)"
            )
        peer_id = await node.peer_id()
        joining = peer_id not in federation.genesis_members
        console.print(_intro(federation, peer, peer_id, str(genesis)))
        history = await _run(peer, args, joining)
    text, code = _ending(history)
    (console if code == 0 else err_console).print(text)
    if args.stop_node:
        _stop_node(args)
    return code


def add_train_parser(commands: Any) -> None:
    """Register ``train`` on the subcommand group ``commands``."""
    parser = commands.add_parser(
        "train",
        help="train as a member of a federation from a task file (the member's ClientApp)",
        description="Run a training peer for the federation's session on the selected node "
        "(default: the managed node, started with `node start --federation F`). TASK is a "
        "Python file defining `task`: a gradfed_ipfs.federation.Task (client, adapter, "
        "initial model, FederationConfig, optional strategy), or a function of a Member "
        "(peer_id, index, members) returning one. The genesis members train from round 0; "
        "any other node asks to join the running session (allow-listed, or approved by the "
        "members per the federation's policy: each member approves the peers on its own "
        "copy's allow-list, read again every round), fetches the model and history by CID "
        "and trains from the next round. The task's initial model must be the federation's "
        "genesis when it names one. Prints one line per round (round, results, members, "
        "loss). Ctrl+C leaves cleanly (a signed leave, exit 0 once it takes effect); a "
        "second Ctrl+C quits at once (exit 130). Exit 0 when every round is done, 1 if this "
        "peer was evicted.",
    )
    parser.add_argument("--federation", required=True, metavar="FILE", help="federation file")
    parser.add_argument("task", metavar="TASK", help="the task file (task.py)")
    parser.add_argument(
        "--linger",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="after the last round (or leaving), keep serving the head until every member is "
        "done, or at most this long (default 30)",
    )
    parser.add_argument(
        "--join-timeout",
        type=positive_float,
        default=600.0,
        metavar="SECONDS",
        help="a joining node waits at most this long to be admitted (default 600)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="a genesis member that restarts: adopt the members' latest head first (not round "
        "0), and ask to join again if it left or was evicted",
    )
    parser.add_argument(
        "--stop-node",
        action="store_true",
        help="stop the managed node when train ends (default: it keeps running)",
    )
    parser.add_argument(
        "--show-genesis",
        action="store_true",
        help="print the task's genesis CID (for `federation genesis`) and exit; any node will "
        "do, a member's or not",
    )
    parser.set_defaults(handler=async_handler(_train))
