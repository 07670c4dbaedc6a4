"""A hostile member as its own OS process beside its own Kubo daemon: the equivocation.

Run from the repository root: ``python -m tests.multiprocess.equivocator --api URL ...``. For
``--seconds`` it runs :class:`~tests.adversarial.equivocator.Equivocator` on its daemon: each
honest peer (behind :class:`~tests.adversarial.equivocator.DirectedPubsub`, ``--directed-from``
of ``tests.multiprocess.peer``) gets its own roster of this round and its own ``done`` echoed,
signed with this daemon's key; what it sent is sent again every half second (gossip may lose a
first copy). Prints one JSON line, ``attacked``, with the rounds it split and the votes it echoed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys

from gradfed_ipfs.cid import parse_cid
from gradfed_ipfs.federated.agreed.config import agreed_topic
from gradfed_ipfs.kubo import KuboPubsub
from tests.adversarial.equivocator import Equivocator


async def attack(args: argparse.Namespace) -> int:
    pubsub = KuboPubsub(args.api)
    try:
        genesis = parse_cid(args.genesis)
        attacker = Equivocator(pubsub, args.session, genesis, tuple(args.members.split(",")))
        task = asyncio.create_task(attacker.run(agreed_topic(args.session, genesis)))
        repeat = asyncio.create_task(attacker.repeat(0.5))
        await asyncio.sleep(args.seconds)
        for t in (task, repeat):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        print(json.dumps({"event": "attacked", "split": attacker.split,
                          "echoed": len(attacker.echoed)}), flush=True)  # fmt: skip
    finally:
        await pubsub.aclose()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--api", required=True)
    parser.add_argument("--members", required=True, help="comma-separated peer IDs")
    parser.add_argument("--session", required=True)
    parser.add_argument("--genesis", required=True)
    parser.add_argument("--seconds", type=float, default=30.0)
    return asyncio.run(attack(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
