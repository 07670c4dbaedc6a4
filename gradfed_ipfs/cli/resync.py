"""``gradfed-ipfs resync``: adopt a session's latest agreed head, verified back to its genesis.

Given a session name and genesis CID, it listens on the session's agreed topic for the peers'
``done`` heads (each peer re-announces its latest one; a heard head counts only with ``done``
votes from more than half of its roster's peers, as a peer's resync counts them:
:func:`~gradfed_ipfs.federated.agreed.heads.count_votes`), or takes ``--head CID`` (the caller's
choice: no votes counted); checks every roster's entry and coordinator signatures; walks the
head's record chain back to the genesis, checking every link, and recomputes every round's
aggregate; then fetches the head's model and writes it. A head that does not verify is refused
and the next best one tried, and so is one the CLI cannot recompute: a round with a custom rule
(``record.rule``, a training-API server optimizer) is unverifiable here. Only ``--unverified``
adopts such a head (or, with ``--links-only``, any head without recomputing), with a warning.
Each head's walk and re-check must end within ``--deadline`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multiformats import CID

from .._types import FloatArray
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
from ..federated.agreed.heads import count_votes, has_majority, ranked_heads
from ..federated.agreed.history import (
    ResultLoad,
    check_exclusions,
    check_roster_signatures,
    load_head,
    load_record,
    load_roster,
    verify_record,
)
from ..federated.agreed.round.coordinator import Head
from ..formats.agreed.roster import AgreedRecord, open_message
from ..formats.pubsub import PubsubMessage
from ..kubo.pubsub import KuboPubsub
from ..storage.base import BlockStore
from ..storage.dag import fetch_gradient
from ..storage.kubo import KuboBlockStore
from .agreed import DEFAULT_DEADLINE, Deadline
from .common import (
    UsageError,
    async_handler,
    console,
    err_console,
    positive_float,
    write_gradient_file,
)
from .records import NotARecordArgument, parse_cid_arg, require_record

__all__ = ["add_resync_parser", "listen_for_heads"]


def _head_of(
    message: PubsubMessage, session: str, genesis: CID, members: frozenset[str]
) -> tuple[str, Head] | None:
    """Return ``(peer, head)`` for a well-formed ``done`` its sender signed; ``None`` otherwise."""
    try:
        decoded, _ = open_message(message.data)  # Kubo peers: their keys are their IDs
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
    """Record CIDs of the distinct heads, best first (see :func:`ranked_heads`)."""
    return [head.record for head in ranked_heads(heads.values())]


class _Votes:
    """Counts the ``done`` votes behind a heard head as a peer's resync does.

    A head counts only with votes from more than half of its roster's peers
    (:func:`~gradfed_ipfs.federated.agreed.heads.count_votes`, :func:`has_majority`): each
    peer's latest head is its vote, for its record and every record it extends (the records
    of the heads loaded so far link them, best first: a later head is loaded before the one it
    extends).
    """

    def __init__(self, heads: dict[str, Head], timeout: float) -> None:
        self.heads, self.timeout = heads, timeout
        self.links: dict[bytes, bytes | None] = {}

    async def problem(self, store: BlockStore, candidate: CID) -> str:
        """Why ``candidate`` lacks the votes to be adopted (``""``: it has them)."""
        record = await load_record(store, candidate, timeout=self.timeout)
        self.links[bytes(candidate)] = None if record.prev is None else bytes(record.prev)
        roster = await load_roster(store, record.roster, timeout=self.timeout)
        votes = count_votes(self.heads, candidate, roster.peers, self.links)
        if has_majority(votes, roster.peers):
            return ""
        return f"done votes from {len(votes)} of its roster's {len(roster.peers)} peers"


def _unrecomputable(chain: list[tuple[CID, AgreedRecord]]) -> list[AgreedRecord]:
    """Return the records of ``chain`` whose custom rule the CLI cannot re-run."""
    return [record for _, record in chain if record.rule is not None]


def _refusal(custom: list[AgreedRecord]) -> RoundVerificationFailed:
    """Return the error refusing a head whose chain has ``custom``-rule rounds."""
    first = custom[0]
    rules = sorted({str(record.rule) for record in custom})
    return RoundVerificationFailed(
        f"unverifiable: round {first.round} used rule {first.rule!r}"
        + (f" ({len(custom)} rounds, rules {', '.join(rules)})" if len(custom) > 1 else "")
        + ", which the CLI cannot re-run; verify the chain with the training API and that rule "
        "(verify_agreed_history(..., rule=peer.rule)), or adopt it unverified with --unverified"
    )


async def _verify_rounds(
    store: BlockStore, chain: list[tuple[CID, AgreedRecord]], done: list[int]
) -> None:
    """Recompute every default-rule round of ``chain``; append each round number to ``done``."""
    base = None
    for _, record in chain:
        if record.rule is not None:  # only with --unverified: not recomputed, said so
            base = None
            continue
        try:  # each verified model is the next round's base: rebuilt models are not refetched
            _, model, state = await verify_record(store, record, None, base)
        except GradientError as exc:
            raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
        base = (model, state)
        done.append(record.round)


async def _resync(args: argparse.Namespace, api: str) -> int:
    """``gradfed-ipfs resync``: adopt the latest verified head and write its model."""
    if args.links_only and not args.unverified:
        raise UsageError(
            "--links-only adopts a model without recomputing it: pass --unverified with it"
        )
    genesis = parse_cid(parse_cid_arg(args.genesis))
    head = None if args.head is None else parse_cid(parse_cid_arg(args.head))
    async with KuboBlockStore(api, timeout=args.timeout) as store:
        if head is not None and await require_record(str(head), store) != "agreed":
            raise NotARecordArgument(f"{head} is an older round record, not an agreed one")
        return await _adopt(args, api, store, genesis, head)


async def _listen(args: argparse.Namespace, api: str, genesis: CID) -> dict[str, Head]:
    """Return each peer's latest head heard on the session's agreed topic."""
    members = frozenset(args.member or ())
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
    return heads


@dataclass(frozen=True)
class _Adopted:
    """A head that checked out: its chain, model, proven liars and rounds not recomputed."""

    chain: list[tuple[CID, AgreedRecord]]
    model: FloatArray
    excluded: frozenset[str]
    custom: list[AgreedRecord]


async def _check_head(
    args: argparse.Namespace, store: BlockStore, genesis: CID, candidate: CID, length: int
) -> _Adopted:
    """Walk and re-check one head within ``--deadline``; raise if it is not to be adopted."""
    deadline = Deadline(args.deadline)
    with deadline.hint():
        chain, model, _ = await load_head(
            store, candidate, session=args.session, genesis=genesis,
            history=(), result=ResultLoad(length, args.timeout), deadline=deadline.left(),
        )  # fmt: skip
    custom = _unrecomputable(chain)
    if custom and not args.unverified:
        raise _refusal(custom)
    done: list[int] = []
    # --unverified takes the custom-rule rounds on trust, their rosters' signatures too
    signed = [(cid, record) for cid, record in chain if record.rule is None or not custom]

    async def recheck() -> frozenset[str]:
        await check_roster_signatures(store, signed)  # owners' contributions, coordinators'
        excluded = await check_exclusions(store, chain)  # fraud records: peers' data
        if not args.links_only:
            await _verify_rounds(store, chain, done)
        return excluded

    what = f"the re-check of the chain from {candidate}"
    excluded = await deadline.run(recheck(), what, lambda: len(done), len(chain))
    return _Adopted(chain, model, excluded, custom)


async def _adopt(
    args: argparse.Namespace, api: str, store: BlockStore, genesis: CID, head: CID | None
) -> int:
    heads = None if head is not None else await _listen(args, api, genesis)
    candidates = _candidates(heads) if heads is not None else [head] if head is not None else []
    votes = None if heads is None else _Votes(heads, args.timeout)  # --head: no votes heard
    length = (await fetch_gradient(store, genesis)).size
    adopted = None
    failure: GradfedError | None = None
    for candidate in candidates:
        try:
            outvoted = "" if votes is None else await votes.problem(store, candidate)
            if outvoted:
                raise FederatedError(outvoted)
            with err_console.status(f"verifying the chain of {candidate}…"):
                adopted = await _check_head(args, store, genesis, candidate, length)
        except (FederatedError, BlockStoreError, DecodeError, GradientError) as exc:
            if len(candidates) > 1:
                err_console.print(f"head {candidate} refused: {exc}", soft_wrap=True)
            failure = exc
            continue
        break
    if adopted is None:
        raise failure or FederatedError("no head to adopt")
    _report(args, adopted)
    return 0


def _report(args: argparse.Namespace, adopted: _Adopted) -> None:
    """Write the adopted model and say what was checked (and, loudly, what was not)."""
    chain, model, custom = adopted.chain, adopted.model, adopted.custom
    last_cid, last = chain[-1]
    write_gradient_file(Path(args.output), model)
    if args.links_only:
        how = "links checked, no aggregate recomputed (--links-only)"
        unverified = f"{len(chain)} aggregates not recomputed (--links-only)"
    elif custom:
        rules = ", ".join(sorted({str(record.rule) for record in custom}))
        rounds = f"{len(custom)} custom-rule round{'s' if len(custom) != 1 else ''}"
        how = (
            f"links checked, {len(chain) - len(custom)} of {len(chain)} aggregates recomputed, "
            f"{rounds} unverifiable (rule {rules})"
        )
        unverified = f"{rounds} not recomputed (rule {rules})"
    else:
        how, unverified = "links checked and every aggregate recomputed", ""
    console.print(f"round {last.round} (the next round is {last.round + 1})")
    console.print(f"model CID  {last.result}")
    console.print(f"record CID {last_cid}")
    if unverified:
        console.print(f"records checked: {len(chain)} ({how})")
        err_console.print(
            f"[yellow]warning[/] the model is NOT verified (--unverified): {unverified}",
            soft_wrap=True,
        )
    else:
        console.print(f"records verified: {len(chain)} ({how})")
    if adopted.excluded:
        console.print(f"proven lying reducers, excluded: {', '.join(sorted(adopted.excluded))}")
    console.print(f"wrote {args.output} ({model.size:,} float32 values)")


def add_resync_parser(commands: Any) -> None:
    """Register ``resync`` on the subcommand group ``commands``."""
    parser = commands.add_parser(
        "resync",
        help="adopt a session's latest agreed model: verify its record chain, write the model",
        description="Learn the latest agreed head of an agreed session (listen on "
        "gradfed/v1/<session>/agreed/<genesis> for the peers' `done` heads, or take --head), "
        "count only a heard head with done votes from more than half of its roster's peers, "
        "walk its round records back to the genesis checking every link, recompute every "
        "round's aggregate, fetch the head's model and write it. Prints the round, the model "
        "and record CIDs and how many records were verified. A round with a custom update rule "
        "(a training-API server optimizer) cannot be recomputed here: its head is refused as "
        "unverifiable unless --unverified, which adopts it with a warning. Exit 0 on success; "
        "2 if --head is not an agreed round record; 7 if no head is heard, none verifies (or "
        "every one is unverifiable), or the last one's walk and re-check do not end within "
        "--deadline (ChainDeadlineExceeded). Nothing is written unless exit 0.",
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
        "--unverified",
        action="store_true",
        help="adopt a head even if some of its rounds cannot be recomputed here (custom rules); "
        "prints a warning that the model is NOT verified",
    )
    parser.add_argument(
        "--links-only",
        action="store_true",
        help="with --unverified: check the chain's links and genesis only; do not recompute "
        "the aggregates",
    )
    parser.add_argument(
        "--deadline",
        type=positive_float,
        default=DEFAULT_DEADLINE,
        metavar="SECONDS",
        help="longest time each head's chain walk and re-check may take together "
        f"(default {DEFAULT_DEADLINE:g}; a long chain needs more)",
    )
    parser.add_argument(
        "-o", "--output", required=True, help="where to write the model (.npy or .arrow)"
    )
    parser.set_defaults(handler=async_handler(_resync))
