"""A 3-peer FedAvg round against running Kubo daemons, by default docker-compose.yml's three.

Run it as ``scripts/compose-round`` (after ``docker compose up -d``). It connects every pair of
daemons (``swarm/connect`` to each peer's non-loopback swarm addresses, i.e. the container
addresses on the compose network), then every peer commits a gradient to its own daemon,
announces the CID on pubsub, fetches the others' gradients by CID through its own daemon
(bitswap), checks them and aggregates. Every aggregate is compared with a NumPy reference; the
exit status is 1 if any differs (2 if the round cannot run at all).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import httpx
import numpy as np

from gradfed_ipfs import KuboBlockStore
from gradfed_ipfs.federated.besteffort import GossipModelSync, RoundConfig, RoundRunner
from gradfed_ipfs.kubo import KuboPubsub

DEFAULT_APIS = ["http://127.0.0.1:5001", "http://127.0.0.1:5002", "http://127.0.0.1:5003"]


def rpc(api: str, endpoint: str, **params: str) -> Any:
    """POST ``/api/v0/<endpoint>`` and return the decoded JSON answer."""
    response = httpx.post(f"{api}/api/v0/{endpoint}", params=params, timeout=30.0)
    response.raise_for_status()
    return response.json()


def wait_until(condition: Any, timeout: float, what: str) -> None:
    """Poll ``condition`` with a growing interval; ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def connect_all(apis: list[str], timeout: float) -> list[str]:
    """Connect every pair of daemons; return their peer IDs (in ``apis`` order)."""
    ids: list[dict[str, Any]] = []

    def answering(api: str) -> bool:
        try:
            ids.append(rpc(api, "id"))
        except httpx.HTTPError:
            return False
        return True

    for api in apis:
        wait_until(lambda api=api: answering(api), timeout, f"the Kubo API at {api}")
    peers = [str(info["ID"]) for info in ids]
    for i, api in enumerate(apis):
        for info in ids[i + 1 :]:
            addresses = [
                a
                for a in info.get("Addresses") or []
                if a.startswith("/ip4/") and "/tcp/" in a and not a.startswith("/ip4/127.")
            ]
            if not addresses:
                raise RuntimeError(f"peer {info['ID']} has no non-loopback TCP address to dial")
            rpc(api, "swarm/connect", arg=addresses[0])

    def connected(i: int) -> bool:
        seen = {str(p["Peer"]) for p in rpc(apis[i], "swarm/peers").get("Peers") or []}
        return set(peers) - {peers[i]} <= seen

    for i in range(len(apis)):
        wait_until(lambda i=i: connected(i), timeout, f"{apis[i]} connected to every other peer")
    return peers


async def run_round(apis: list[str], peers: list[str], dim: int, seed: int) -> bool:
    """Run one round with a runner per daemon; print and check every aggregate."""
    rng = np.random.default_rng(seed)
    grads = [rng.standard_normal(dim, dtype=np.float32) for _ in apis]
    samples = [100 * (i + 1) for i in range(len(apis))]
    session = f"compose-round-{seed}-{time.time_ns()}"
    config = RoundConfig(
        min_peers=len(apis) - 1, collect_timeout=60.0, fetch_timeout=60.0, subscriber_timeout=30.0
    )
    stores = [KuboBlockStore(api, timeout=60.0) for api in apis]
    transports = [KuboPubsub(api) for api in apis]
    gossips = [
        GossipModelSync(peer, transport, session_id=session)
        for peer, transport in zip(peers, transports, strict=True)
    ]
    try:
        started = time.monotonic()
        results = await asyncio.gather(
            *(
                RoundRunner(store, gossip, config).run_round(0, grad, num_samples=count)
                for store, gossip, grad, count in zip(stores, gossips, grads, samples, strict=True)
            )
        )
        elapsed = time.monotonic() - started
    finally:
        for gossip in gossips:
            await gossip.aclose()
        for store in stores:
            await store.aclose()
        for transport in transports:
            await transport.aclose()
    total = np.zeros(dim, dtype=np.float64)
    for grad, count in zip(grads, samples, strict=True):
        total += grad.astype(np.float64) * count
    reference = (total / sum(samples)).astype(np.float32)
    ok = True
    for i, (api, result) in enumerate(zip(apis, results, strict=True)):
        error = float(np.max(np.abs(result.aggregate - reference)))
        good = len(result.contributors) == len(apis) - 1 and error <= 1e-5
        ok = ok and good
        print(
            f"peer-{i} ({api}) committed {dim} floats as {result.local_cid}; "
            f"took in {len(result.contributors)} peer gradients; "
            f"max |aggregate - reference| = {error:.2e}{'' if good else '  <-- WRONG'}"
        )
    print(f"round time {elapsed:.2f}s")
    return ok


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--api",
        action="append",
        dest="apis",
        metavar="URL",
        help="a daemon's RPC API (repeat; default: 127.0.0.1:5001, 5002, 5003)",
    )
    parser.add_argument("--dim", type=int, default=200_000, help="floats per gradient")
    parser.add_argument("--seed", type=int, default=0, help="RNG seed")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for APIs")
    args = parser.parse_args(argv)
    apis = args.apis or DEFAULT_APIS
    try:
        peers = connect_all(apis, args.timeout)
        print(f"connected {len(apis)} Kubo daemons: " + ", ".join(p[-8:] for p in peers))
        ok = asyncio.run(run_round(apis, peers, args.dim, args.seed))
    except (httpx.HTTPError, TimeoutError, RuntimeError) as exc:
        print(f"compose-round: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print("OK: every peer's aggregate equals the NumPy reference" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
