"""One member of a CometBFT-controlled agreed session as its own OS process (issue 36's tests).

Run from the repository root: ``python -m tests.cometbft.comet_peer --api URL --rpc URL ...``,
beside its own Kubo daemon (``--api``) and its own validator (``--rpc``). Prints one JSON object
per line on stdout (``start``, ``joined``, ``approved``, ``left``, ``round``, ``error``,
``final``), like :mod:`tests.multiprocess.peer`, and exits 0 after ``--rounds`` rounds (or once
it has left). Deltas are seeded by (peer index, round).

Membership, each step synchronised on the chain's state (never on time): ``--join`` asks to
join once the chain's current round is ``--join-from``; ``--await-join PEER ROUND`` holds
before ``ROUND`` until the chain holds PEER's join; ``--approve PEER ROUND`` does that, then
votes for it; ``--leave-after R`` asks (at the start) to leave after round ``R``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import dag_cbor

from gradfed_ipfs.cometbft import CometRpc
from gradfed_ipfs.errors import QuorumNotReached, RoundMismatch
from gradfed_ipfs.federated.agreed import Admission, AgreedConfig, AgreedSession
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore
from tests.multiprocess.peer import delta, emit, initial_model

DIM = 2_000
WAIT = 120.0
"""Seconds a membership step waits for the chain (the rounds before it must finish first)."""


def peer_config(members: tuple[str, ...], allow: tuple[str, ...]) -> AgreedConfig:
    """The session's settings: the peers' and the chain's genesis (``rounds_genesis``) alike.

    A round closes once every member's contribution is held; the collect deadline (block
    time) only matters for a missing member, and none is missing: room for a loaded machine.
    """
    return AgreedConfig(
        members=members, min_peers=3, control="cometbft", collect_timeout=20.0,
        round_timeout=90.0, fetch_timeout=20.0, announce_interval=0.2, learning_rate=0.5,
        model_every=1, admission=Admission("two-thirds", allow=allow),
    )  # fmt: skip


async def chain_members(rpc: CometRpc) -> dict[str, Any]:
    """The chain's ``/members`` answer (current round, members, pending joins)."""
    answer = await rpc.abci_query("/members", b"")
    info = dag_cbor.decode(answer.value)
    assert isinstance(info, dict), answer
    return info


async def until_chain(rpc: CometRpc, check: Any, what: str) -> dict[str, Any]:
    """Poll ``/members`` until ``check(info)``; the chain changes only with blocks."""
    deadline = time.monotonic() + WAIT
    while True:
        info = await chain_members(rpc)
        if check(info):
            return info
        if time.monotonic() > deadline:
            raise TimeoutError(f"the chain did not reach: {what}")
        await asyncio.sleep(0.1)


def holds_join(peer: str) -> Any:
    return lambda info: peer in dict(info["pending"]) or peer in info["members"]


async def run(args: argparse.Namespace) -> int:
    store = KuboBlockStore(args.api, timeout=20.0)
    pubsub = KuboPubsub(args.api)
    rpc = CometRpc(args.rpc)
    members, allow = tuple(args.members.split(",")), tuple(args.allow.split(","))
    config = peer_config(members, allow)
    session = AgreedSession(
        store, pubsub, args.session, args.genesis, config, validator_rpc=args.rpc
    )
    steps: dict[int, list[tuple[str, str]]] = {}
    for peer, r in args.await_join or []:
        steps.setdefault(int(r), []).append(("await", peer))
    for peer, r in args.approve or []:
        steps.setdefault(int(r), []).append(("approve", peer))
    try:
        if args.join:
            await until_chain(rpc, lambda i: i["current"] >= args.join_from, "the join round")
            joined = await session.join(timeout=WAIT)
            emit("joined", peer=session.peer_id, round=joined.round, model=str(joined.model))
        else:
            await session.start(initial_model(DIM))
        emit("start", peer=session.peer_id)
        if args.leave_after is not None:
            await session.leave(after=args.leave_after)
        while session.round < args.rounds and not session.left:
            r = session.round
            for op, peer in steps.get(r, []):
                await until_chain(rpc, holds_join(peer), f"{peer}'s join held")
                if op == "approve":
                    emit("approved", peer=peer, round=r, signed=await session.approve(peer))
            try:
                result = await session.run_round(delta(args.index, r, DIM), weight=1 + args.index)
            except (QuorumNotReached, RoundMismatch) as exc:
                emit("error", round=r, kind=type(exc).__name__, message=str(exc))
                return 1
            emit(
                "round", round=r, model=str(result.model), record=str(result.record),
                roster=list(result.roster.peers), expected=list(result.roster.expected),
                members=None if result.roster.members is None else str(result.roster.members),
            )  # fmt: skip
        if session.left:
            emit("left", round=session.round)
        emit("final", model=str(session.model_cid), head=str(session.head))
    finally:
        await session.aclose()
        await pubsub.aclose()
        await store.aclose()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--api", required=True)
    parser.add_argument("--rpc", required=True, help="this member's own validator")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--members", required=True, help="round 0's, comma-separated")
    parser.add_argument("--allow", required=True, help="the allow-list, comma-separated")
    parser.add_argument("--session", required=True)
    parser.add_argument("--genesis", required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--join", action="store_true")
    parser.add_argument("--join-from", type=int, default=0)
    parser.add_argument("--await-join", nargs=2, action="append", metavar=("PEER", "ROUND"))
    parser.add_argument("--approve", nargs=2, action="append", metavar=("PEER", "ROUND"))
    parser.add_argument("--leave-after", type=int, default=None)
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
