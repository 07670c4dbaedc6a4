"""One training-API peer of the digits task as its own OS process, beside its own Kubo daemon.

Run from the repository root: ``python -m tests.training.digits_peer --api URL --index I ...``.
Writes its :class:`~gradfed_ipfs.training.History` to ``--history`` and prints one JSON line
``{"event": "final", "model": CID, "record": CID}`` before exiting 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from gradfed_ipfs import AgreedConfig
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore
from gradfed_ipfs.training import Peer, VectorAdapter
from tests.training import digits_task as task
from tests.training.strategies import make_strategy

KUBO_TIMING = {
    "collect_timeout": 20.0,
    "takeover_timeout": 10.0,
    "round_timeout": 120.0,
    "done_timeout": 5.0,
    "announce_interval": 0.2,
    "max_announce_interval": 2.0,
    "fetch_timeout": 20.0,
}
"""Agreed-round timing over loopback Kubo daemons (seconds), generous for a loaded machine."""


async def run(args: argparse.Namespace) -> int:
    data = task.data()
    async with KuboBlockStore(args.api, timeout=20.0) as store:
        peer = Peer(
            store=store,
            pubsub=KuboPubsub(args.api),
            client=task.make_client(data, args.index),
            adapter=VectorAdapter(),
            initial_model=task.initial_model(),
            config=task.federation(data, rounds=args.rounds),
            agreed=AgreedConfig(members=tuple(args.members.split(",")), **KUBO_TIMING),
            strategy=make_strategy(args.strategy),
            session=args.session,
            log=lambda line: print(json.dumps({"event": "round", "line": line}), flush=True),
        )
        history = await peer.run()
        assert peer.session is not None
        await peer.session.linger(timeout=30.0, grace=1.0)  # let slower members hear our head
    history.save(args.history)
    last = history.entries[-1]
    print(json.dumps({"event": "final", "model": last.model, "record": last.record}), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--members", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--rounds", type=int, default=task.ROUNDS)
    parser.add_argument("--strategy", default="fedavg")
    parser.add_argument("--history", required=True)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
