"""``gradfed-ipfs commit``, ``fetch`` and ``aggregate``: gradients in and out of a daemon."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from multiformats import CID

from .._types import FloatArray
from ..cid import DAG_CBOR, RAW, parse_cid
from ..errors import BlockNotFound, DecodeError, DimensionMismatch, MalformedArrow
from ..formats.announcement import Announcement
from ..formats.arrow import decode_gradient, store_layer_as_arrow
from ..kubo.pubsub import KuboPubsub, session_topic
from ..storage.base import Block
from ..storage.dag import fetch_gradient, put_gradient
from ..storage.kubo import KuboBlockStore
from ..tensor.aggregation import Contribution
from .common import (
    UsageError,
    async_handler,
    console,
    err_console,
    explain_missing_block,
    human_bytes,
    parse_codec,
    parse_method,
    progress_bar,
    read_gradient_file,
    shape_text,
    write_gradient_file,
)

__all__ = ["add_data_parsers", "fetch_any"]


def _cid(text: str) -> CID:
    try:
        return parse_cid(text)
    except DecodeError as exc:
        raise UsageError(f"{text!r} is not a CID: {exc}") from None


async def fetch_any(
    store: KuboBlockStore, cid: CID, timeout: float, *, show_progress: bool = True
) -> tuple[FloatArray, str]:
    """Fetch a gradient of any encoding (raw block or chunk manifest), verified; densified.

    Returns the values in their recorded shape and the block's encoding.
    """
    try:
        if cid.codec.code == RAW:
            block = await store.get(cid, timeout=timeout)  # re-hashed against the CID
            decoded = decode_gradient(block.data)
            return decoded.tensor(), decoded.encoding
        if cid.codec.code != DAG_CBOR:
            raise DecodeError(f"{cid}: codec {cid.codec.name} is neither raw nor dag-cbor")
        with progress_bar(f"fetching {str(cid)[:16]}…", enabled=show_progress) as progress:
            values = await fetch_gradient(store, cid, timeout=timeout, progress=progress)
        return values, "dense (chunked)"
    except BlockNotFound as exc:
        await explain_missing_block(store.rpc, exc)
        raise


def _require_finite(values: FloatArray, what: str, error: type[DecodeError]) -> None:
    """Refuse NaN or infinity: a result that is not finite is never written."""
    bad = int(np.count_nonzero(~np.isfinite(values)))
    if bad:
        raise error(f"{what} has {bad} non-finite values of {values.size}; nothing written")


# --------------------------------------------------------------------------- commit


async def _commit(args: argparse.Namespace, api: str) -> int:
    values = read_gradient_file(Path(args.file))
    codec = parse_codec(args.compress)
    if args.announce and not args.session:
        raise UsageError("--announce needs --session")
    async with KuboBlockStore(api, timeout=args.timeout) as store:
        if codec is None:
            with progress_bar(f"committing {Path(args.file).name}") as progress:
                cid = await put_gradient(store, values, progress=progress)
            encoding = "dense" if cid.codec.code == RAW else "dense, chunked DAG"
        else:
            payload = codec.encode(values.reshape(-1), list(values.shape))
            block = Block.new(store_layer_as_arrow(payload))
            cid = await store.put(block)
            encoding = f"{codec.codec_id}, {human_bytes(len(block.data))}"
        err_console.print(f"committed {shape_text(values.shape)} as {encoding}")
        if args.announce:
            peer_id = await store.peer_id()
            announcement = Announcement.new(
                args.session, args.round, peer_id, cid, num_samples=args.samples, length=values.size
            )
            pubsub = KuboPubsub(api, timeout=args.timeout)
            try:
                await pubsub.publish(session_topic(args.session), announcement.encode())
            finally:
                await pubsub.aclose()
            err_console.print(f"announced on {session_topic(args.session)} (round {args.round})")
    console.print(str(cid))
    return 0


# --------------------------------------------------------------------------- fetch


async def _fetch(args: argparse.Namespace, api: str) -> int:
    cid = _cid(args.cid)
    out = Path(args.output)
    if out.suffix.lower() not in (".npy", ".arrow"):
        raise UsageError(f"{out}: the output must end in .npy or .arrow")
    async with KuboBlockStore(api, timeout=args.timeout) as store:
        values, encoding = await fetch_any(store, cid, args.timeout)
    _require_finite(values, f"gradient {cid}", MalformedArrow)
    write_gradient_file(out, np.asarray(values, dtype=np.float32))
    console.print(f"fetched {cid} ({encoding}, {shape_text(values.shape)}, verified) -> {out}")
    return 0


# --------------------------------------------------------------------------- aggregate


def _samples(text: str | None, count: int) -> list[int | None]:
    if not text:
        return [None] * count
    try:
        samples = [int(s) for s in text.split(",")]
    except ValueError:
        raise UsageError(f"--samples must be comma-separated integers, got {text!r}") from None
    if len(samples) != count or any(s < 0 for s in samples):
        raise UsageError(f"--samples needs {count} non-negative counts, one per CID")
    return list(samples)


async def _aggregate(args: argparse.Namespace, api: str) -> int:
    cids = [_cid(c) for c in args.cids]
    strategy = parse_method(args.method)
    samples = _samples(args.samples, len(cids))
    out = Path(args.output)
    if out.suffix.lower() not in (".npy", ".arrow"):
        raise UsageError(f"{out}: the output must end in .npy or .arrow")
    inputs: dict[str, Contribution] = {}
    shape: tuple[int, ...] | None = None
    async with KuboBlockStore(api, timeout=args.timeout) as store:
        for index, (cid, count) in enumerate(zip(cids, samples, strict=True)):
            values, _ = await fetch_any(store, cid, args.timeout)
            _require_finite(values, f"gradient {cid}", MalformedArrow)
            if shape is not None and values.size != int(np.prod(shape)):
                raise DimensionMismatch(list(shape), list(values.shape))
            shape = shape or tuple(values.shape)
            inputs[f"{index:06d}"] = Contribution.of(values.reshape(-1), count)
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
            aggregate = strategy.aggregate(inputs)
        result = np.asarray(aggregate, dtype=np.float32).reshape(shape or (-1,))
        _require_finite(result, f"the {strategy!r} aggregate", DecodeError)
        committed = await put_gradient(store, result) if args.commit else None
    write_gradient_file(out, result)
    console.print(f"aggregated {len(cids)} gradients with {strategy!r} -> {out}")
    if committed is not None:
        console.print(str(committed))
    return 0


# --------------------------------------------------------------------------- parsers


def add_data_parsers(commands: Any) -> None:
    """Register ``commit``, ``fetch`` and ``aggregate`` on ``commands``."""
    commit = commands.add_parser(
        "commit",
        help="store a gradient file in the daemon and print its CID",
        description="Store a .npy (loaded with allow_pickle=False) or .arrow gradient in the "
        "daemon, pinned, and print its CID on stdout. Gradients over 1 MiB become a chunked DAG "
        "(dag-cbor manifest CID). With --compress the gradient is encoded first (one block).",
    )
    commit.add_argument("file", help="the gradient: FILE.npy or FILE.arrow")
    commit.add_argument(
        "--compress", metavar="CODECS", help="topk:RATIO, int8, int4 or topk:RATIO,int8"
    )
    commit.add_argument("--session", help="session id of the announcement")
    commit.add_argument("--round", type=int, default=0, help="round number (default 0)")
    commit.add_argument("--samples", type=int, help="training samples behind the gradient")
    commit.add_argument(
        "--announce", action="store_true", help="publish the CID on gradfed/v1/<session>"
    )
    commit.set_defaults(handler=async_handler(_commit))

    fetch = commands.add_parser(
        "fetch",
        help="fetch a gradient by CID (verified) into a file",
        description="Fetch a gradient by CID through the daemon (bitswap from peers), re-hash "
        "every block against its CID, decode any encoding, and write it densely.",
    )
    fetch.add_argument("cid", help="gradient CID (raw block or chunk manifest)")
    fetch.add_argument("-o", "--output", required=True, help="FILE.npy or FILE.arrow")
    fetch.set_defaults(handler=async_handler(_fetch))

    aggregate = commands.add_parser(
        "aggregate",
        help="fetch gradients by CID and aggregate them into a file",
        description="Fetch every CID (verified), aggregate with --method, write the result.",
    )
    aggregate.add_argument("cids", nargs="+", metavar="CID", help="gradient CIDs")
    aggregate.add_argument(
        "--method",
        default="fedavg",
        help="fedavg (default), mean, sum, median, trimmed:BETA, krum:F or multikrum:F:M",
    )
    aggregate.add_argument("--samples", help="comma-separated sample counts (FedAvg weights)")
    aggregate.add_argument("-o", "--output", required=True, help="FILE.npy or FILE.arrow")
    aggregate.add_argument(
        "--commit", action="store_true", help="also store the aggregate and print its CID"
    )
    aggregate.set_defaults(handler=async_handler(_aggregate))
