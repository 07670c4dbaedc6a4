"""One agreed-round peer as its own OS process, beside its own Kubo daemon.

Run from the repository root: ``python -m tests.multiprocess.peer --api URL --index I ...``.
Prints one JSON object per line on stdout (``start``, ``resync``, ``round``, ``error``,
``forged``, ``final``) and exits 0 after ``--rounds`` rounds (lingering until every member has
finished). Deltas are seeded by (peer index, round), so the expected models are reproducible.
Hostile and attack-watching modes (issue 32): ``--forge`` announces a forged head after the
rounds; ``--await-head R`` waits to hear a head of round ``R`` before a resync; ``--resync-after``
resyncs once the rounds are done; ``--hold`` keeps the process (and its head) up until stopped;
``--directed-from PEER`` takes PEER's messages from this peer's side topic only (a hostile
router: :mod:`tests.adversarial.equivocator`); ``--await-peers N`` starts once N other peers
are on the topic; ``--resync-delay S`` waits S seconds before the resync after a
``RoundMismatch`` (a slow peer, as on a loaded machine).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from typing import Any

import numpy as np

from gradfed_ipfs import AgreedConfig, AgreedSession
from gradfed_ipfs.errors import QuorumNotReached, RoundMismatch
from gradfed_ipfs.federated.agreed import Admission
from gradfed_ipfs.kubo import KuboPubsub, PubsubTransport
from gradfed_ipfs.storage import KuboBlockStore
from tests.adversarial.equivocator import DirectedPubsub
from tests.adversarial.hostile import forged_head
from tests.multiprocess.lossy import LossyPubsub


def initial_model(dim: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(dim).astype(np.float32)


def delta(index: int, round_number: int, dim: int) -> np.ndarray:
    rng = np.random.default_rng([index, round_number])
    return (0.01 * rng.standard_normal(dim)).astype(np.float32)


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "time": round(time.time(), 3), **fields}), flush=True)


def dump_tasks() -> None:
    """SIGUSR1: print every asyncio task's stack to stderr (diagnosing a stuck peer)."""
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


async def wait_for_join(session: AgreedSession, peer: str) -> None:
    """Hold before a round until this member holds ``peer``'s join (a test's synchronisation)."""
    tracker = session.board.requests
    deadline = time.monotonic() + 60.0
    while tracker is not None and peer not in tracker.joins and peer not in session.members:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no join of {peer} heard")
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace) -> int:
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)
    store = KuboBlockStore(args.api, timeout=10.0)
    pubsub: PubsubTransport = KuboPubsub(args.api)
    if args.loss > 0:
        pubsub = LossyPubsub(pubsub, args.loss, seed=args.index + 100)
    if args.directed_from is not None:  # behind a hostile router (tests.adversarial.equivocator)
        pubsub = DirectedPubsub(pubsub, await pubsub.local_peer_id(), args.directed_from)
    config = AgreedConfig(
        members=tuple(args.members.split(",")),
        min_peers=args.min_peers,
        collect_timeout=args.collect_timeout,
        takeover_timeout=args.collect_timeout / 2,
        round_timeout=args.round_timeout,
        announce_interval=0.2,
        fetch_timeout=10.0,
        aggregation=args.aggregation,
        admission=None if args.allow is None else Admission(allow=tuple(args.allow.split(","))),
    )
    session = AgreedSession(store, pubsub, args.session, args.genesis, config)
    try:
        if args.join:
            joined = await session.join(initial_model(args.dim), timeout=60.0)
            emit("joined", peer=session.peer_id, round=joined.round, head=str(joined.head))
        else:
            await session.start(initial_model(args.dim))
        emit("start", peer=session.peer_id)
        if args.await_peers:
            await await_peers(session, args.await_peers)
        if args.resync:
            await resync(session, args.await_head)
        while session.round < args.rounds:
            r = session.round
            if args.await_join is not None and r == args.await_join[1]:
                await wait_for_join(session, args.await_join[0])
            if args.all_from is not None and r >= args.all_from:
                session.config = dataclasses.replace(session.config, min_peers=None)
            try:
                result = await session.run_round(
                    delta(args.index, r, args.dim), weight=1 + args.index
                )
            except (QuorumNotReached, RoundMismatch) as exc:
                emit("error", round=r, kind=type(exc).__name__, message=str(exc))
                if isinstance(exc, RoundMismatch):
                    await asyncio.sleep(args.resync_delay)  # a slow peer (a loaded machine)
                    await session.resync(timeout=5.0)
                continue
            emit(
                "round",
                round=r,
                model=str(result.model),
                record=str(result.record),
                roster=list(result.roster.peers),
                coordinator=result.roster.coordinator,
                absent=list(result.absent),
                included=result.included,
                matched=result.matched,
                seconds=round(result.seconds, 3),
                aggregation=result.aggregation,
            )
        if args.resync_after:
            await resync(session, args.await_head)
        finished = await session.linger(timeout=args.linger)
        if args.forge:  # after lingering, which re-announces the real head
            await forge(session, args.dim)
        emit(
            "final",
            model=str(session.model_cid),
            head=str(session.head),
            lingered=sorted(finished),
            dropped=dict(session.board.dropped),
            lost=getattr(pubsub, "dropped", 0),
            proofs={p: str(proof.block.cid) for p, proof in session.proofs.items()},
        )
        if args.hold:
            await asyncio.Event().wait()  # until stopped; the announcer keeps our head heard
    finally:
        await session.aclose()
        await pubsub.aclose()
        await store.aclose()
    return 0


async def await_peers(session: AgreedSession, count: int) -> None:
    """Hold before round 0 until ``count`` other peers are on the topic (a test's start line)."""
    deadline = time.monotonic() + 60.0
    while len(await session.pubsub.peers(session.topic)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {count} peers on {session.topic}")
        await asyncio.sleep(0.05)


async def resync(session: AgreedSession, await_head: int | None) -> None:
    """Resync and emit what it did; first, with ``await_head``, wait (up to 30 s) to hear every
    other member's head, one of them of round ``await_head`` or later."""
    if await_head is not None:
        others = set(session.config.members) - {session.peer_id}

        def heard() -> bool:
            heads = session.board.heads
            return others <= heads.keys() and any(h.round >= await_head for h in heads.values())

        await session.board.wait_until(heard, 30.0)
    synced = await session.resync(timeout=20.0)
    emit(
        "resync", changed=synced.changed, round=synced.round, model=str(synced.model),
        head=str(synced.head), refused=synced.refused, recomputed=synced.recomputed,
    )  # fmt: skip


async def forge(session: AgreedSession, dim: int) -> None:
    """Announce a forged next-round head: a stored fake model, a roster nobody serves."""
    assert session.head is not None
    result, record = await forged_head(session.store, session.head, dim)
    await session._parts.messages.done(session.round, result, record)
    emit("forged", round=session.round, record=str(record), model=str(result))


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("GRADFED_PEER_DEBUG"):
        logging.basicConfig(
            level=logging.DEBUG, format="%(relativeCreated)7.0f %(name)s %(message)s"
        )
        logging.getLogger("gradfed_ipfs.storage").setLevel(logging.INFO)
        logging.getLogger("httpx").setLevel(logging.INFO)
        logging.getLogger("httpcore").setLevel(logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--api", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--members", required=True, help="comma-separated peer IDs")
    parser.add_argument("--session", required=True)
    parser.add_argument("--genesis", required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--dim", type=int, default=10_000)
    parser.add_argument("--min-peers", type=int, default=None)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--collect-timeout", type=float, default=2.0)
    parser.add_argument("--round-timeout", type=float, default=30.0)
    parser.add_argument("--linger", type=float, default=15.0)
    parser.add_argument("--resync", action="store_true")
    parser.add_argument("--resync-after", action="store_true", help="resync after the rounds")
    parser.add_argument(
        "--resync-delay", type=float, default=0.0, help="seconds before a resync on a mismatch"
    )
    parser.add_argument("--await-head", type=int, default=None, help="before a resync")
    parser.add_argument("--forge", action="store_true", help="then announce a forged head")
    parser.add_argument("--hold", action="store_true", help="stay up until stopped")
    parser.add_argument(
        "--all-from", type=int, default=None, help="from this round on, min_peers = all members"
    )
    parser.add_argument(
        "--aggregation", choices=["all-to-all", "reduce-scatter", "auto"], default="all-to-all"
    )
    parser.add_argument("--allow", default=None, help="admission allow-list (peer IDs, commas)")
    parser.add_argument("--join", action="store_true", help="join the running session")
    parser.add_argument(
        "--directed-from", default=None, help="take this member's messages from a side topic"
    )
    parser.add_argument("--await-peers", type=int, default=0, help="peers on the topic first")
    parser.add_argument(
        "--await-join", nargs=2, default=None, metavar=("PEER", "ROUND"),
        help="before ROUND, wait until PEER's join is held",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.await_join is not None:
        args.await_join = (args.await_join[0], int(args.await_join[1]))
    profile_to = os.environ.get("GRADFED_PEER_PROFILE")
    if profile_to:  # a diagnosis aid: where a peer process spends its CPU
        import cProfile

        with cProfile.Profile() as profiler:
            code = asyncio.run(run(args))
        profiler.dump_stats(f"{profile_to}.{args.index}")
        return code
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
