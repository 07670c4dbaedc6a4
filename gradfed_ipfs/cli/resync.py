"""``gradfed-ipfs resync``: adopt a session's latest agreed head, verified back to its genesis.

Given a session name and genesis CID, it listens on the session's agreed topic for the peers'
``done`` heads (each peer re-announces its latest one), or takes ``--head CID``; walks the
head's record chain back to the genesis, checking every link, and recomputes every round's
aggregate (custom-rule rounds: links only); then fetches the head's model and writes it. A
head that does not verify is refused and the next best one tried.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path
from typing import Any

from multiformats import CID

from ..cid import parse_cid
from ..errors import (
    BlockStoreError,
    DecodeError,
    FederatedError,
    GradfedError,
    GradientError,
    RoundVerificationFailed,
)
from ..federated.agreed.config import agreed_topic
from ..federated.agreed.coordinator import Head, best_head
from ..federated.agreed.history import ResultLoad, check_exclusions, load_head, verify_record
from ..formats.pubsub import PubsubMessage
from ..formats.roster import AgreedMessage, AgreedRecord
from ..kubo.pubsub import KuboPubsub
from ..storage.base import BlockStore
from ..storage.dag import fetch_gradient
from ..storage.kubo import KuboBlockStore
from .common import async_handler, console, err_console, positive_float, write_gradient_file
from .records import NotARecordArgument, parse_cid_arg, require_record

__all__ = ["add_resync_parser", "listen_for_heads"]


def _head_of(
    message: PubsubMessage, session: str, genesis: CID, members: frozenset[str]
) -> tuple[str, Head] | None:
    """Return ``(peer, head)`` for a well-formed, authenticated ``done``; ``None`` otherwise."""
    try:
        decoded = AgreedMessage.decode(message.data)
    except DecodeError:
        return None
    if (
        decoded.kind != "done"
        or decoded.record is None
        or decoded.session != session
        or bytes(decoded.genesis) != bytes(genesis)
        or decoded.peer != message.from_peer  # Kubo signs messages: `from` is authenticated
        or (members and decoded.peer not in members)
    ):
        return None
    return decoded.peer, Head(decoded.round, decoded.cid, decoded.record)


async def listen_for_heads(
    api: str,
    session: str,
    genesis: CID,
    *,
    members: frozenset[str],
    timeout: float,
    grace: float,
) -> dict[str, Head]:
    """Collect each peer's latest ``done`` head on the session's agreed topic.

    Stops when every one of ``members`` is heard, ``grace`` seconds after the first head, or
    after ``timeout`` seconds, whichever comes first.
    """
    heads: dict[str, Head] = {}
    first: list[float] = []
    pubsub = KuboPubsub(api, timeout=min(timeout, 10.0))
    loop = asyncio.get_running_loop()

    async def consume() -> None:
        async for message in pubsub.subscribe(agreed_topic(session, genesis)):
            found = _head_of(message, session, genesis, members)
            if found is None:
                continue
            peer, head = found
            if peer not in heads or head.round >= heads[peer].round:
                heads[peer] = head
            first[:] = first or [loop.time()]
            if members and members <= heads.keys():
                return

    try:
        await pubsub.local_peer_id()  # an unreachable daemon fails here, not after `timeout`
        task = asyncio.create_task(consume())
        deadline = loop.time() + timeout
        try:
            while not task.done():
                end = min(deadline, first[0] + grace) if first else deadline
                if end <= loop.time():
                    break
                await asyncio.wait({task}, timeout=min(end - loop.time(), 0.1))
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        await pubsub.aclose()
    return heads


def _candidates(heads: dict[str, Head]) -> list[CID]:
    """Record CIDs of the distinct heads, best first (see :func:`best_head`)."""
    pool, ordered = list(heads.values()), []
    while (best := best_head(pool)) is not None:
        ordered.append(best.record)
        pool = [h for h in pool if bytes(h.record) != bytes(best.record)]
    return ordered


async def _verify_rounds(store: BlockStore, chain: list[tuple[CID, AgreedRecord]]) -> int:
    """Recompute every round of ``chain``; return how many used a rule (links checked only)."""
    custom, base = 0, None
    for _, record in chain:
        if record.rule is not None:
            custom, base = custom + 1, None
            continue
        try:  # each verified model is the next round's base: rebuilt models are not refetched
            _, model, state = await verify_record(store, record, None, base)
        except GradientError as exc:
            raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
        base = (model, state)
    return custom


async def _resync(args: argparse.Namespace, api: str) -> int:
    """``gradfed-ipfs resync``: adopt the latest verified head and write its model."""
    genesis = parse_cid(parse_cid_arg(args.genesis))
    head = None if args.head is None else parse_cid(parse_cid_arg(args.head))
    async with KuboBlockStore(api, timeout=args.timeout) as store:
        if head is not None and await require_record(str(head), store) != "agreed":
            raise NotARecordArgument(f"{head} is an older round record, not an agreed one")
        return await _adopt(args, api, store, genesis, head)


async def _adopt(
    args: argparse.Namespace, api: str, store: BlockStore, genesis: CID, head: CID | None
) -> int:
    members = frozenset(args.member or ())
    if head is None:
        topic = agreed_topic(args.session, genesis)
        with err_console.status(f"listening on {topic} for `done` heads…"):
            heads = await listen_for_heads(
                api, args.session, genesis, members=members, timeout=args.listen, grace=args.grace
            )
        if not heads:
            raise FederatedError(
                f"no `done` head of session {args.session!r} heard on {topic} within "
                f"{args.listen:g}s; pass --head CID or listen longer (--listen)"
            )
        rounds = sorted({h.round for h in heads.values()}, reverse=True)
        console.print(
            f"heard heads from {len(heads)} peer{'s' if len(heads) != 1 else ''} "
            f"(rounds {', '.join(map(str, rounds))})"
        )
        candidates = _candidates(heads)
    else:
        candidates = [head]
    length = (await fetch_gradient(store, genesis)).size
    adopted = None
    failure: GradfedError | None = None
    for candidate in candidates:
        try:
            with err_console.status(f"verifying the chain of {candidate}…"):
                chain, model, _ = await load_head(
                    store, candidate, session=args.session, genesis=genesis,
                    history=(), result=ResultLoad(length, args.timeout),
                )  # fmt: skip
                excluded = await check_exclusions(store, chain)  # fraud records: peers' data
                custom = 0 if args.links_only else await _verify_rounds(store, chain)
        except (FederatedError, BlockStoreError, DecodeError, GradientError) as exc:
            if len(candidates) > 1:
                err_console.print(f"head {candidate} refused: {exc}", soft_wrap=True)
            failure = exc
            continue
        adopted = chain, model, custom, excluded
        break
    if adopted is None:
        raise failure or FederatedError("no head to adopt")
    chain, model, custom, excluded = adopted
    last_cid, last = chain[-1]
    write_gradient_file(Path(args.output), model)
    if args.links_only:
        how = "links checked, aggregates not recomputed (--links-only)"
    else:
        how = "links checked and every aggregate recomputed"
        if custom:
            how += f", except {custom} custom-rule round{'s' if custom != 1 else ''}"
    console.print(f"round {last.round} (the next round is {last.round + 1})")
    console.print(f"model CID  {last.result}")
    console.print(f"record CID {last_cid}")
    console.print(f"records verified: {len(chain)} ({how})")
    if excluded:
        console.print(f"proven lying reducers, excluded: {', '.join(sorted(excluded))}")
    console.print(f"wrote {args.output} ({model.size:,} float32 values)")
    return 0


def add_resync_parser(commands: Any) -> None:
    """Register ``resync`` on the subcommand group ``commands``."""
    parser = commands.add_parser(
        "resync",
        help="adopt a session's latest agreed model: verify its record chain, write the model",
        description="Learn the latest agreed head of an agreed session (listen on "
        "gradfed/v1/<session>/agreed/<genesis> for the peers' `done` heads, or take --head), "
        "walk its round records back to the genesis checking every link, recompute every "
        "round's aggregate, fetch the head's model and write it. Prints the round, the model "
        "and record CIDs and how many records were verified. Exit 0 on success; 2 if --head is "
        "not an agreed round record; 7 if no head is heard or none verifies.",
    )
    parser.add_argument("--session", required=True, help="session name")
    parser.add_argument("--genesis", required=True, metavar="CID", help="the genesis model CID")
    parser.add_argument(
        "--head", metavar="CID", help="a known agreed round record CID (no listening)"
    )
    parser.add_argument(
        "--member",
        action="append",
        metavar="PEER",
        help="accept heads only from this peer ID (repeatable; default: any peer, the chain is "
        "verified either way); listening ends once every member is heard",
    )
    parser.add_argument(
        "--listen",
        type=positive_float,
        default=15.0,
        metavar="SECONDS",
        help="longest time to listen for heads (default 15)",
    )
    parser.add_argument(
        "--grace",
        type=positive_float,
        default=2.0,
        metavar="SECONDS",
        help="stop listening this long after the first head is heard (default 2)",
    )
    parser.add_argument(
        "--links-only",
        action="store_true",
        help="check the chain's links and genesis only; do not recompute the aggregates",
    )
    parser.add_argument(
        "-o", "--output", required=True, help="where to write the model (.npy or .arrow)"
    )
    parser.set_defaults(handler=async_handler(_resync))
