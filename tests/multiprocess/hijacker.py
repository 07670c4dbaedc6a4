"""A hostile member as its own OS process beside its own Kubo daemon: the roster hijack.

Run from the repository root: ``python -m tests.multiprocess.hijacker --api URL ...``. It puts a
made-up contribution for every member on its daemon and publishes, over and over for
``--seconds``, a round-0 roster listing them (``--weight`` for itself, ``--coordinator`` named
as coordinator): once as a plain message (what peers took before messages were signed) and
once signed with its own daemon's key (its own entry its own signed contribution, the others'
signatures made with its key: it cannot sign as them). Prints one JSON line, ``published``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time

import numpy as np
from multiformats import CID

from gradfed_ipfs.cid import parse_cid
from gradfed_ipfs.federated.agreed.config import agreed_topic
from gradfed_ipfs.formats.agreed.roster import AgreedMessage, Roster, sign_message
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore, put_gradient


async def hijack(args: argparse.Namespace) -> int:
    store, pubsub = KuboBlockStore(args.api, timeout=10.0), KuboPubsub(args.api)
    try:
        me, signer = await pubsub.local_peer_id(), await pubsub.signer()
        genesis = parse_cid(args.genesis)
        lines: dict[str, tuple[CID, int, bytes | None]] = {}
        for i, peer in enumerate(args.members.split(",")):
            fake = await put_gradient(store, np.full(args.dim, 1234.5 + i, np.float32))
            weight = args.weight if peer == me else 1
            contrib = AgreedMessage(
                "contrib", args.session, genesis, 0, peer, fake, genesis, weight
            )
            as_me = contrib if peer == me else dataclasses.replace(contrib, peer=me)
            lines[peer] = (fake, weight, (await sign_message(as_me, signer, pubsub.keys)).signature)
        members = args.members.split(",")
        roster = Roster.new(args.session, genesis, 0, genesis, args.coordinator, members, lines)
        block = roster.to_block()
        message = AgreedMessage(
            "roster", args.session, genesis, 0, me, block.cid, inline=block.data
        )
        signed = (await sign_message(message, signer, pubsub.keys)).block.data
        topic, count, end = agreed_topic(args.session, genesis), 0, time.monotonic() + args.seconds
        while time.monotonic() < end:
            for data in (message.encode(), signed):
                await pubsub.publish(topic, data)
                count += 1
            await asyncio.sleep(0.1)
        print(json.dumps({"event": "published", "count": count, "roster": str(block.cid)}))
    finally:
        await pubsub.aclose()
        await store.aclose()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--api", required=True)
    parser.add_argument("--members", required=True, help="comma-separated peer IDs")
    parser.add_argument("--session", required=True)
    parser.add_argument("--genesis", required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--dim", type=int, default=10_000)
    parser.add_argument("--weight", type=int, default=2**20)
    parser.add_argument("--seconds", type=float, default=30.0)
    return asyncio.run(hijack(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
