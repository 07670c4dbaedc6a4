"""``gradfed-ipfs comet-export``: the commit bundle that proves an agreed round final.

A member (or anyone who can reach one of the chain's validators on loopback) writes the bundle;
``gradfed-ipfs verify-round RECORD --commits FILE`` then checks it with nothing but the file and
IPFS (:func:`~gradfed_ipfs.federated.agreed.verify_final_record`).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from ..cometbft.finality import FinalityBundle, export_finality, verify_finality
from ..cometbft.rpc import CometRpc
from ..errors import FinalityNotProven
from .common import console, err_console, positive_float, run

__all__ = ["add_comet_parser", "read_bundle"]


def read_bundle(path: Path) -> FinalityBundle:
    """Read a bundle file (size-checked before decoding; :class:`FinalityNotProven` if bad)."""
    with path.open("rb") as handle:
        raw = handle.read(2 << 20)
    return FinalityBundle.decode(raw)


async def _export(args: argparse.Namespace) -> int:
    rpc = CometRpc(args.rpc, timeout=args.timeout)
    bundle = await export_finality(rpc, args.round, timeout=args.timeout)
    try:
        finality = verify_finality(bundle)  # a validator that lies is caught before writing
    except FinalityNotProven as exc:
        err_console.print(f"the validator's commits do not prove round {args.round}: {exc}")
        return 1
    await asyncio.to_thread(Path(args.output).write_bytes, bundle.encode())
    console.print(
        f"round {finality.round}: record {finality.record} final at height {finality.height} "
        f"(power {finality.power[0]}/{finality.power[1]}); wrote {args.output}",
        soft_wrap=True,
    )
    return 0


def add_comet_parser(commands: Any) -> None:
    """Register ``comet-export`` on ``commands``."""
    export = commands.add_parser(
        "comet-export",
        help="write the commit bundle that proves an agreed round final (CometBFT plane)",
        description="Ask a validator of a CometBFT-controlled agreed session for round R's "
        "inclusion proof and the signed header and commit whose app hash carries it, with the "
        "chain's genesis (validators and their bindings to members), check it, and write it to "
        "--output. `verify-round RECORD --commits FILE` verifies it offline. Exit 0 when "
        "written; 1 if the validator's commits do not prove the round; 12 if the round is not "
        "final or the validator does not answer.",
    )
    export.add_argument("--rpc", required=True, help="a validator's RPC (http://127.0.0.1:PORT)")
    export.add_argument("--round", type=int, required=True, help="the round number")
    export.add_argument("--output", "-o", required=True, help="the bundle file to write")
    export.add_argument(
        "--timeout", type=positive_float, default=30.0, metavar="SECONDS",
        help="per RPC call, and for the next block (default 30)",
    )  # fmt: skip
    export.set_defaults(handler=lambda args: run(_export(args)))  # needs no Kubo daemon
