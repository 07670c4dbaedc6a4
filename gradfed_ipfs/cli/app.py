"""The ``gradfed-ipfs`` command line.

This module and its helper package the modules beside it are the only code that
prints or imports ``rich``; nothing in the library imports them. User mistakes and library
errors end with a one-line message and the error family's exit code, never a traceback
(``--debug`` shows it). Exit codes: 0 success; 1 a failed check (``verify-round``, ``history``,
``node status`` of a stopped node; an unverifiable DP round or a custom-rule agreed round
included) or a usage mistake; 2 bad arguments (argparse, or a CID that is not a round record);
otherwise the ``exit_code`` of the error's family (3 gradient, 4 decode, 5 block store, 6 Kubo,
7 federated (``resync`` heard no head, or none verified), 8 coordination, 9 computation graph,
10 pubsub, 11 a bad setting; see :mod:`gradfed_ipfs.errors`); 130 interrupted. Non-finite
gradients are never written (exit 4), and a decode that runs out of memory or recursion also
ends with one line and exit 4.

The daemon is chosen by ``--api URL``, else ``$GRADFED_IPFS_API``, else the managed node
(``gradfed-ipfs node start``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from ..errors import DecodeError, GradfedError
from .comet import add_comet_parser
from .common import API_ENV, HOME_ENV, UsageError, console, err_console, positive_float
from .data import add_data_parsers
from .federation import add_federation_parser
from .node import add_node_parser
from .records import add_record_parsers
from .resync import add_resync_parser
from .rounds import add_round_parser
from .train import add_train_parser

__all__ = ["build_parser", "console", "err_console", "main"]


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.best_effort:
        from .demo.besteffort import cmd_best_effort_demo

        args.dim = 200_000 if args.dim is None else args.dim
        return cmd_best_effort_demo(args)
    if args.dim is not None:
        raise UsageError("--dim goes with --best-effort (the agreed demo trains 9 parameters)")
    from .demo.run import cmd_demo

    return cmd_demo(args)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``gradfed-ipfs``."""
    parser = argparse.ArgumentParser(
        prog="gradfed-ipfs",
        description="Exchange and aggregate federated-learning gradients through IPFS (Kubo).",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument(
        "--api",
        default=os.environ.get(API_ENV),
        metavar="URL",
        help=f"Kubo RPC URL of the daemon to use (default: ${API_ENV}, else the managed node)",
    )
    parser.add_argument(
        "--node-dir",
        default=None,
        metavar="DIR",
        help=f"directory of the managed node (default: ${HOME_ENV}, else "
        "~/.local/share/gradfed-ipfs/node)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="how long a block fetch or RPC call may take (default 30)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="run agreed training rounds between peer processes over local Kubo daemons",
        description="Start N loopback Kubo daemons and one peer process beside each; the "
        "peers train a tiny linear regression over agreed rounds and must all end on the same "
        "model CID (exit 0 only then). --best-effort runs the older single-process demo: one "
        "best-effort FedAvg round, checked against NumPy.",
    )
    demo.add_argument("--peers", type=int, default=3, help="number of peers/daemons (default 3)")
    demo.add_argument("--rounds", type=int, default=5, help="agreed rounds (default 5)")
    demo.add_argument("--seed", type=int, default=0, help="RNG seed of the data (default 0)")
    demo.add_argument(
        "--deadline",
        type=positive_float,
        default=120.0,
        metavar="SECONDS",
        help="how long each peer process may take (default 120)",
    )
    demo.add_argument(
        "--best-effort",
        action="store_true",
        help="instead, one best-effort FedAvg round in this process (see --dim)",
    )
    demo.add_argument(
        "--dim",
        type=int,
        default=None,
        help="--best-effort: gradient length in floats (default 200000)",
    )
    demo.set_defaults(handler=_cmd_demo)
    add_node_parser(commands)
    add_federation_parser(commands)
    add_data_parsers(commands)
    add_record_parsers(commands)
    add_comet_parser(commands)
    add_round_parser(commands)
    add_resync_parser(commands)
    add_train_parser(commands)
    return parser


def _one_line(message: str) -> None:
    """Print ``error <message>`` as one line: no wrapping, inner newlines collapsed."""
    err_console.print(
        "[red]error[/] " + " ".join(message.split()), soft_wrap=True, markup=True, highlight=False
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING)
    try:
        code: int = args.handler(args)
    except GradfedError as exc:
        if args.debug:
            raise
        _one_line(f"({type(exc).__name__}): {exc}")
        return exc.exit_code
    except (MemoryError, RecursionError) as exc:
        # Decoders check sizes and nesting first; this is the last line of defence.
        if args.debug:
            raise
        _one_line(f"({type(exc).__name__}): input too large or too deep")
        return DecodeError.exit_code
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
