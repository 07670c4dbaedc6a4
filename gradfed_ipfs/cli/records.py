"""``gradfed-ipfs verify-round``, ``history`` and ``watch``: round records and announcements."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from ..cid import parse_cid
from ..errors import DecodeError, GradfedError, NotARoundRecord, RoundVerificationFailed
from ..federated.regional import verify_regional_round
from ..federation import load_federation, task_rule
from ..formats.announcement import AnnouncementFilter
from ..kubo.pubsub import KuboPubsub, session_topic
from ..provenance.round_record import RoundRecord, RoundVerification, verify_history, verify_round
from ..storage.kubo import KuboBlockStore
from ..verification import RecordKind, record_kind
from .agreed import (
    DEFAULT_DEADLINE,
    Deadline,
    MemberPolicy,
    agreed_history,
    history_summary,
    verify_agreed,
    verify_final,
)
from .comet import read_bundle
from .common import UsageError, async_handler, console, err_console, positive_float
from .samples import book_path, record_samples

__all__ = ["NotARecordArgument", "add_record_parsers", "parse_cid_arg", "require_record"]


class NotARecordArgument(UsageError):
    """The CID given to ``verify-round`` or ``history`` names no round record; exit 2 (usage)."""

    exit_code = 2


def _epsilon(record: RoundRecord | None) -> str:
    if record is None:
        return "?"
    for key in ("epsilon_spent", "epsilon"):
        value = record.privacy.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return f"{value:.3g}"
    return "-"


def _table(title: str, rows: list[tuple[RoundVerification, RoundRecord | None]]) -> Table:
    table = Table(title=title)
    for column in ("round", "record CID", "peers", "method", "ε spent", "status"):
        table.add_column(column, overflow="fold")
    for verification, record in rows:
        method = "?" if record is None else repr(record.aggregation)
        peers = "?" if record is None else str(len(record.contributions))
        colour = "green" if verification.ok else "yellow" if verification.unverifiable else "red"
        status = f"[{colour}]{verification.status}[/]"
        table.add_row(
            str(verification.round) if verification.round >= 0 else "?",
            verification.record_cid,
            peers,
            method,
            _epsilon(record),
            status,
        )
    return table


async def _load(cid: str, store: KuboBlockStore) -> RoundRecord | None:
    try:
        return await RoundRecord.load(cid, store)
    except GradfedError:
        return None


def parse_cid_arg(text: str) -> str:
    """Return ``text`` as a canonical CID string (:class:`UsageError` if it is not one)."""
    try:
        return str(parse_cid(text))
    except DecodeError as exc:
        raise UsageError(f"{text!r} is not a CID: {exc}") from None


async def require_record(cid: str, store: KuboBlockStore) -> RecordKind:
    """Return which kind of round record ``cid`` names (see :func:`~gradfed_ipfs.verify`).

    Raises
    ------
    NotARecordArgument
        If it names something else (a gradient, a roster, another record); exit 2.
    BlockStoreError
        If the block cannot be fetched (exit 5), which is not a failed check.
    """
    try:
        return await record_kind(store, cid)
    except NotARoundRecord as exc:
        raise NotARecordArgument(str(exc)) from None


def _summary(verification: RoundVerification) -> str:
    return f"round {verification.round if verification.round >= 0 else '?'}: {verification.status}"


async def _verify_round(args: argparse.Namespace, api: str) -> int:
    cid = parse_cid_arg(args.cid)
    async with KuboBlockStore(api, timeout=args.timeout) as store:
        kind = await require_record(cid, store)
        if kind == "agreed":
            if args.commits is not None:
                bundle = await asyncio.to_thread(read_bundle, Path(args.commits))
                return await verify_final(store, parse_cid(cid), bundle)
            return await verify_agreed(store, parse_cid(cid))
        if kind == "regional":
            return await _verify_regional(store, cid)
        verification = await verify_round(cid, store)
        record = await _load(cid, store) if verification.round >= 0 else None
    console.print(_table("round record", [(verification, record)]))
    if not verification.ok:
        err_console.print(_summary(verification))
    return 0 if verification.ok else 1


async def _verify_regional(store: KuboBlockStore, cid: str) -> int:
    """``verify-round`` of a regional record: one line; 0 only if every region re-verifies."""
    try:  # the kind is known: its check directly, not verify() reading the record again
        verified = await verify_regional_round(store, cid)
    except RoundVerificationFailed as exc:
        err_console.print(f"regional record {cid}: mismatch: {exc}", soft_wrap=True)
        return 1
    console.print(f"regional round {verified.round} ({cid}): verified", soft_wrap=True)
    return 0


async def _history(args: argparse.Namespace, api: str) -> int:
    cid = parse_cid_arg(args.cid)
    async with KuboBlockStore(api, timeout=args.timeout) as store:
        kind = await require_record(cid, store)
        deadline = Deadline(args.deadline)
        if kind == "agreed":
            policy = None
            if args.federation is not None:
                federation = load_federation(args.federation)
                rule = None if args.task is None else task_rule(federation, args.task)
                policy = MemberPolicy(federation.genesis_members, federation.admission, rule)
            elif args.task is not None:
                raise UsageError("--task needs --federation FILE (the session's settings)")
            return await agreed_history(store, parse_cid(cid), deadline, policy)
        if kind == "regional":  # a regional record links no previous round: its one round
            return await _verify_regional(store, cid)
        with err_console.status("verifying every round…"):
            what = f"the walk of the best-effort chain from {cid}"
            results = await deadline.run(verify_history(cid, store), what)
        rows = [(r, await _load(r.record_cid, store) if r.round >= 0 else None) for r in results]
    first = rows[-1][1] if rows and rows[-1][1] is not None else None
    session = f" of session {first.session!r}" if first is not None else ""
    console.print(_table(f"history{session}, newest first", rows))
    failed = sum(not r.ok for r in results)
    return history_summary(len(results), failed, sum(r.unverifiable is not None for r in results))


def _drop_table(topic: str, checks: AnnouncementFilter) -> None:
    table = Table(title=f"announcements on {topic}")
    table.add_column("accepted")
    for reason, _ in checks.counts():
        table.add_column(f"dropped: {reason}")
    table.add_row(str(checks.accepted), *(str(count) for _, count in checks.counts()))
    console.print(table)


async def _watch(args: argparse.Namespace, api: str) -> int:
    pubsub = KuboPubsub(api, timeout=args.timeout)
    topic = session_topic(args.session)
    book = book_path(args)
    checks: AnnouncementFilter | None = None
    seen = 0
    try:
        own = await pubsub.local_peer_id()
        checks = AnnouncementFilter(args.session, own)
        err_console.print(f"watching {topic} on {api} (Ctrl-C to stop)")

        async def consume(checks: AnnouncementFilter) -> None:
            nonlocal seen
            async for message in pubsub.subscribe(topic):
                announcement = checks.accept(message)
                if announcement is None:
                    continue
                seen += 1
                record_samples(book, {str(announcement.cid): announcement.num_samples})
                stamp = time.strftime("%H:%M:%S", time.localtime(announcement.timestamp_ms / 1e3))
                console.print(
                    f"{stamp} round {announcement.round} peer {announcement.peer_id} "
                    f"cid {announcement.cid} samples {announcement.num_samples} "
                    f"length {announcement.length}"
                )
                if args.count and seen >= args.count:
                    return

        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(consume(checks), timeout=args.duration)
    except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels us, then exits 130
        if checks is not None:
            _drop_table(topic, checks)
        raise
    finally:
        await pubsub.aclose()
    _drop_table(topic, checks)
    return 0


def add_record_parsers(commands: Any) -> None:
    """Register ``verify-round``, ``history`` and ``watch`` on ``commands``."""
    verify = commands.add_parser(
        "verify-round",
        help="re-check one round record (re-fetch everything, recompute the aggregate)",
        description="Fetch a round record, every contribution and the aggregate it links "
        "(each block re-hashed against its CID), recompute the aggregate and compare it bit for "
        "bit. An agreed round record is re-checked as the agreed protocol: its roster, every "
        "listed contribution and the base model are fetched, the deterministic update is "
        "recomputed with the record's learning rate and compared with the result CID. Exit 0 "
        "if it verifies; 1 on a mismatch, or if it is unverifiable (a DP noise claim, or an "
        "agreed round's custom rule, cannot be recomputed here: reported unverifiable, never "
        "verified); 2 if the CID is not a round record.",
    )
    verify.add_argument("cid", help="round record CID (bafyrei…)")
    verify.add_argument(
        "--commits",
        metavar="FILE",
        help="an agreed record of the CometBFT plane: first prove it final from this commit "
        "bundle (`comet-export`): >2/3 of the genesis validators, bound to the members, signed "
        "a header whose app hash commits it; exit 1 if that fails",
    )
    verify.set_defaults(handler=async_handler(_verify_round))

    history = commands.add_parser(
        "history",
        help="verify a round record and every earlier one (a table of rounds)",
        description="Walk the chain of round records back to round 0 from the given one, "
        "verify every round, and print a table: round, peers, method, ε spent and status (for "
        "an agreed head: round, roster size, roster CID, result CID, update rule and status). "
        "A round that cannot be recomputed here (a DP noise claim, an agreed round's custom "
        "rule) is reported unverifiable, never verified. Exit 0 if every round verifies, 1 if "
        "not (unverifiable rounds included), 2 if the CID is not a round record, 7 if the walk "
        "and re-check do not end within --deadline (ChainDeadlineExceeded; nothing verified).",
    )
    history.add_argument("cid", help="the last round's record CID")
    history.add_argument(
        "--deadline",
        type=positive_float,
        default=DEFAULT_DEADLINE,
        metavar="SECONDS",
        help="longest time the chain's walk and re-check may take together "
        f"(default {DEFAULT_DEADLINE:g}; a long chain needs more)",
    )
    history.add_argument(
        "--federation",
        metavar="FILE",
        help="an agreed session of this federation: also check every round's member set "
        "against its genesis members and admission policy, and print the changes",
    )
    history.add_argument(
        "--task",
        metavar="TASK",
        help="with --federation: the members' task file; its training rule recomputes every "
        "round's model (a training session's rounds are unverifiable without it)",
    )
    history.set_defaults(handler=async_handler(_history))

    watch = commands.add_parser(
        "watch",
        help="print a session's gradient announcements live, with drop counters",
        description="Subscribe to gradfed/v1/<session> and print every valid announcement; "
        "malformed, forged, duplicate, foreign-session and own messages are dropped and "
        "counted. Ends on Ctrl-C, after --count announcements or after --duration seconds.",
    )
    watch.add_argument("--session", required=True, help="session id")
    watch.add_argument("--count", type=int, default=0, help="stop after N announcements")
    watch.add_argument("--duration", type=float, default=None, help="stop after SECONDS")
    watch.set_defaults(handler=async_handler(_watch))
