"""``gradfed-ipfs round``: run one round of a session from the command line.

Every peer runs the same command beside its own daemon: its gradient is committed and announced,
the session's announcements are collected until ``--min-peers`` others (and every ``--expect``
peer) are in or ``--collect`` seconds pass, their gradients are fetched by CID (verified) and
aggregated with ``--method``. The command prints a report ("Received N results and M
failures", who was absent, dropped or rejected and why), writes the aggregate, and commits a
round record. Peers that aggregate the same contributions commit the *same* record CID: the
record's time is ``--record-time`` (default 0), not each peer's clock.
"""

from __future__ import annotations

import argparse
import asyncio
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..cid import parse_cid
from ..errors import DecodeError, GradfedError
from ..federated.accumulate import DistributedGradientAccumulator
from ..federated.besteffort import RoundConfig, RoundResult
from ..node import Node
from ..provenance.round_record import ContributionRef, commit_round
from ..tensor.aggregation import AggregationStrategy
from .common import (
    UsageError,
    async_handler,
    console,
    err_console,
    parse_method,
    read_gradient_file,
    shape_text,
    waiting,
    write_gradient_file,
)
from .samples import book_path, record_samples

__all__ = ["REPUBLISH_INTERVAL", "add_round_parser"]

REPUBLISH_INTERVAL = 0.5
"""Seconds between re-publications of this peer's announcement."""


def _report(result: RoundResult, samples: dict[str, int | None], me: str) -> None:
    failures = len(result.failures)
    console.print(
        f"round {result.round_id}: Received {len(result.participants)} results and "
        f"{failures} failure{'' if failures == 1 else 's'} ({result.duration_ms / 1000:.1f}s)"
    )
    for peer in result.participants:
        cid = result.local_cid if peer == me else result.contributors[peer]
        count = samples.get(peer)
        weight = "samples ?" if count is None else f"samples {count}"
        console.print(f"  {peer}  {cid}  {weight}{'  (this node)' if peer == me else ''}")
    for peer in result.absent:
        console.print(f"  absent:   {peer} (expected, never announced)")
    for peer, why in sorted(result.failures.items()):
        kind = "rejected" if peer in result.rejected else "dropped"
        console.print(f"  {kind}: {peer}: {why}")
    for peer, claimed in sorted(result.clipped_weights.items()):
        console.print(f"  clipped:  {peer} claimed {claimed} samples (weight capped)")


async def _record(
    node: Node,
    args: argparse.Namespace,
    result: RoundResult,
    samples: dict[str, int | None],
    strategy: AggregationStrategy,
) -> str:
    me = await node.peer_id()
    refs = {
        peer: ContributionRef(
            peer, str(result.local_cid if peer == me else result.contributors[peer]), samples[peer]
        )
        for peer in result.participants
    }
    cid, recomputed = await commit_round(
        node.store,
        session=args.session,
        round=args.round,
        contributions=refs,
        aggregation=strategy,
        previous=args.previous,
        timestamp_ms=args.record_time,
    )
    if not np.array_equal(recomputed, result.aggregate):
        raise GradfedError(f"the record's recomputed aggregate differs from the round's ({cid})")
    return str(cid)


async def _round(args: argparse.Namespace, api: str) -> int:
    values = read_gradient_file(Path(args.file))
    strategy = parse_method(args.method)
    out = Path(args.output)
    if out.suffix.lower() not in (".npy", ".arrow"):
        raise UsageError(f"{out}: the output must end in .npy or .arrow")
    if args.min_peers < 0 or (args.samples is not None and args.samples < 0):
        raise UsageError("--min-peers and --samples must be >= 0")
    if args.previous is not None:
        try:
            args.previous = str(parse_cid(args.previous))
        except DecodeError as exc:
            raise UsageError(f"--previous {args.previous!r} is not a CID: {exc}") from None
    config = RoundConfig(
        min_peers=args.min_peers,
        collect_timeout=args.collect,
        fetch_timeout=args.timeout,
        subscriber_timeout=args.collect,
        republish_interval=REPUBLISH_INTERVAL,
        # re-announce through the subscriber wait, the collection and the linger, not less
        max_republish=math.ceil((2 * args.collect + args.linger) / REPUBLISH_INTERVAL) + 1,
        aggregation=strategy,
    )
    async with Node(api, timeout=args.timeout) as node:
        me = await node.peer_id()
        held: list[DistributedGradientAccumulator] = []

        def accumulator() -> DistributedGradientAccumulator:
            held.append(
                DistributedGradientAccumulator(
                    args.session, config.accumulator_config(), local_peer_id=me
                )
            )
            return held[-1]

        runner = node.runner(args.session, config=config, accumulator_factory=accumulator)
        err_console.print(
            f"round {args.round} of session {args.session!r}: {shape_text(values.shape)} "
            f"from {me}; waiting up to {args.collect:g}s for {args.min_peers} other "
            f"peer{'' if args.min_peers == 1 else 's'}"
        )
        with waiting(f"collecting announcements on gradfed/v1/{args.session}"):
            result = await runner.run_round(
                args.round,
                values.reshape(-1),
                num_samples=args.samples,
                expected_peers=args.expect or [],
            )
        samples = {peer: c.num_samples for peer, c in held[-1].contributions().items()}
        _report(result, samples, me)
        record_samples(
            book_path(args),
            {str(result.contributors[p]): n for p, n in samples.items() if p != me},
        )
        aggregate = result.aggregate.reshape(values.shape)
        write_gradient_file(out, aggregate)
        console.print(f"aggregate ({strategy!r}, {len(result.participants)} peers) -> {out}")
        record = None if args.no_record else await _record(node, args, result, samples, strategy)
        if args.linger > 0:  # keep re-announcing: slower peers may still be collecting
            with waiting(f"re-announcing for {args.linger:g}s for slower peers"):
                await asyncio.sleep(args.linger)
    if record is not None:
        console.print(f"record {record}")
    return 0


def add_round_parser(commands: Any) -> None:
    """Register ``round`` on ``commands``."""
    parser = commands.add_parser(
        "round",
        help="run one round of a session: commit, announce, collect, aggregate, record",
        description="Commit FILE, announce it on gradfed/v1/<session>, collect the session's "
        "announcements of this round until --min-peers others (and every --expect peer) are in "
        "or --collect seconds pass, fetch and verify their gradients, aggregate with --method, "
        "print the report, write the aggregate to -o, and commit a round record (its CID is the "
        "last line). Every peer runs the same command beside its own daemon.",
    )
    parser.add_argument("file", help="this peer's gradient: FILE.npy or FILE.arrow")
    parser.add_argument("--session", required=True, help="session id")
    parser.add_argument("--round", type=int, default=0, help="round number (default 0)")
    parser.add_argument("--samples", type=int, help="training samples behind the gradient")
    parser.add_argument(
        "--method",
        default="fedavg",
        help="fedavg (default), mean, sum, median, trimmed:BETA, krum:F or multikrum:F:M",
    )
    parser.add_argument("--min-peers", type=int, default=1, help="other peers needed (default 1)")
    parser.add_argument("--expect", nargs="+", metavar="PEER", help="peer IDs to wait for")
    parser.add_argument(
        "--collect", type=float, default=60.0, help="seconds to collect (default 60)"
    )
    parser.add_argument("-o", "--output", required=True, help="FILE.npy or FILE.arrow")
    parser.add_argument("--previous", metavar="CID", help="the previous round's record CID")
    parser.add_argument(
        "--record-time",
        type=int,
        default=0,
        metavar="MS",
        help="the record's timestamp in ms (default 0: peers must agree on it)",
    )
    parser.add_argument("--no-record", action="store_true", help="do not commit a round record")
    parser.add_argument(
        "--linger",
        type=float,
        default=5.0,
        help="seconds to keep re-announcing after the round, for slower peers (default 5)",
    )
    parser.set_defaults(handler=async_handler(_round))
