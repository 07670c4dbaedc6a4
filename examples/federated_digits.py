"""Federated training of a softmax-regression model on scikit-learn's ``digits`` over Kubo.

Four peers (``--peers``), each beside its own Kubo daemon in a loopback :class:`KuboSwarm`,
hold a non-IID share of the training set (label proportions drawn from a seeded Dirichlet).
Every round each peer

1. starts from the global model and runs a few full-batch gradient steps on its own data;
2. commits its model delta to *its own* daemon (``DistributedGradientAccumulator.commit_local``,
   or an encoded Arrow block with ``--compress``) and announces the CID on the session's pubsub
   topic (``gradfed/v1/<session>``, :class:`~gradfed_ipfs.pubsub.Announcement`);
3. receives the other peers' announcements (checked by
   :class:`~gradfed_ipfs.pubsub.AnnouncementFilter`), fetches their deltas by CID through its own
   daemon (bitswap; every block re-hashed against its CID), and aggregates them with
   ``--method``;
4. commits a dag-cbor round record (:func:`~gradfed_ipfs.round_record.commit_round`) linking the
   contributions, the aggregate and the previous round. Honest peers aggregate the same inputs in
   the same order, so they all commit the *same* record CID; the run checks that.

Options: ``--byzantine K`` makes the last K peers send their delta sign-flipped and scaled by 10;
``--dp-noise Z`` clips each delta to ``--dp-clip`` and adds Gaussian noise N(0, (Z·C)²) before it
leaves the peer (local, client-level DP), accounted per peer with an RDP accountant;
``--secagg`` sends sample-weighted deltas masked with the Bonawitz et al. protocol (peer 0 acts
as the aggregator: it fetches the masked vectors by CID and learns only their sum; the small
key-agreement messages are passed in-process, not over pubsub).

The centralized reference trains the same model with the same number of gradient steps on the
pooled training set. Run ``python examples/federated_digits.py --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from gradfed_ipfs.arrow_ipc import load_gradient_from_arrow, store_layer_as_arrow
from gradfed_ipfs.backward_pass import BackwardPassConfig
from gradfed_ipfs.blockstore import Block, KuboBlockStore
from gradfed_ipfs.dag import fetch_gradient, put_gradient
from gradfed_ipfs.errors import GradfedError, InvalidGradient
from gradfed_ipfs.federated.accumulator import DistributedGradientAccumulator
from gradfed_ipfs.federated.privacy import DifferentialPrivacy
from gradfed_ipfs.federated.secure_aggregation import SecAggClient, SecAggServer
from gradfed_ipfs.pubsub import Announcement, AnnouncementFilter, KuboPubsub, session_topic
from gradfed_ipfs.round_record import ContributionRef, commit_round
from gradfed_ipfs.tensor.aggregation import AggregationStrategy, Contribution
from gradfed_ipfs.tensor.compression import Codec, ErrorFeedback

sys.path.insert(0, str(Path(__file__).resolve().parent))
from digits_model import (
    N_CLASSES,
    N_FEATURES,
    Array,
    DigitsData,
    accuracy,
    load_data,
    local_train,
    parse_codec,
    parse_method,
    plot_curves,
    single_threaded_blas,
    train_centralized,
)

BYZANTINE_SCALE = -10.0


class Node(Protocol):
    """A Kubo daemon as the example needs it (``KuboDaemon`` or a test provider's node)."""

    api_url: str
    peer_id: str


@dataclass(frozen=True)
class Options:
    """One training run's settings (the command-line options)."""

    method: str = "fedavg"
    compress: str | None = None
    dp_noise: float | None = None
    dp_clip: float = 1.0
    dp_delta: float = 1e-5
    dp_budget: float = 1000.0
    secagg: bool = False
    byzantine: int = 0
    rounds: int = 20
    local_steps: int = 5
    lr: float = 0.5
    alpha: float = 1.0
    peers: int = 4
    seed: int = 0
    session: str = "digits"
    timeout: float = 30.0


@dataclass
class Result:
    """What a run measured."""

    options: Options
    accuracy: list[float]
    centralized: list[float]
    peer_ids: list[str]
    samples: list[int]
    record_cids: list[str] = field(default_factory=list)
    epsilon: float | None = None
    bytes_committed: int = 0
    seconds: float = 0.0
    consistent: bool = True

    @property
    def final_accuracy(self) -> float:
        """Test accuracy of the global model after the last round."""
        return self.accuracy[-1]

    @property
    def gap(self) -> float:
        """Centralized minus federated final accuracy (a fraction; positive = worse)."""
        return self.centralized_accuracy - self.final_accuracy

    @property
    def centralized_accuracy(self) -> float:
        """Test accuracy of centralized training after the same number of steps."""
        return self.centralized[-1]


# --------------------------------------------------------------------------- peers


@dataclass
class Peer:
    """One participant: its data, its daemon, its inbox of announcements."""

    index: int
    node: Node
    rows: NDArray[np.int64]
    store: KuboBlockStore
    pubsub: KuboPubsub
    filter: AnnouncementFilter
    byzantine: bool
    inbox: dict[int, dict[str, Announcement]] = field(default_factory=dict)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    feedback: ErrorFeedback | None = None
    dp: DifferentialPrivacy | None = None

    @property
    def peer_id(self) -> str:
        """The daemon's peer ID (the peer's identity in pubsub and in contributions)."""
        return self.node.peer_id

    async def listen(self, topic: str) -> None:
        """Put every accepted announcement of ``topic`` in :attr:`inbox`, forever."""
        async for message in self.pubsub.subscribe(topic):
            announcement = self.filter.accept(message)
            if announcement is not None:
                self.inbox.setdefault(announcement.round, {})[announcement.peer_id] = announcement
                self.arrived.set()


async def wait_for(
    condition: Callable[[], bool], what: str, timeout: float, event: asyncio.Event
) -> None:
    """Wait until ``condition()`` holds, waking up whenever ``event`` is set."""
    deadline = time.monotonic() + timeout
    while not condition():
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        event.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=min(left, 1.0))


async def exchange(
    peers: list[Peer],
    round_id: int,
    cids: dict[str, str],
    samples: dict[str, int],
    options: Options,
) -> None:
    """Announce every peer's CID and wait until each peer has everyone else's announcement.

    Announcements are re-published every second until all have arrived (pubsub has no
    delivery guarantee); receivers drop the duplicates.
    """
    topic = session_topic(options.session)
    announcements = {
        p.peer_id: Announcement.new(
            options.session,
            round_id,
            p.peer_id,
            cids[p.peer_id],
            num_samples=samples[p.peer_id],
            length=N_FEATURES * N_CLASSES,
        ).encode()
        for p in peers
    }

    def complete(peer: Peer) -> bool:
        return len(peer.inbox.get(round_id, {})) >= len(peers) - 1

    async def publish_until_done() -> None:
        while True:
            for p in peers:
                await p.pubsub.publish(topic, announcements[p.peer_id])
            await asyncio.sleep(1.0)  # retransmission interval, not a synchronisation

    publisher = asyncio.create_task(publish_until_done())
    try:
        for peer in peers:
            await wait_for(
                lambda peer=peer: complete(peer),  # type: ignore[misc]
                f"round {round_id} announcements at peer {peer.index}",
                options.timeout,
                peer.arrived,
            )
    finally:
        publisher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await publisher


async def wait_for_mesh(peers: list[Peer], topic: str, timeout: float) -> None:
    """Poll ``pubsub/peers`` until every daemon sees every other peer subscribed to ``topic``."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    for peer in peers:
        others = {p.peer_id for p in peers if p is not peer}
        while not others <= set(await peer.pubsub.peers(topic)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"pubsub mesh on {topic!r} not formed after {timeout:.0f}s")
            await asyncio.sleep(delay)  # no event exists for "a remote peer subscribed"
            delay = min(delay * 2, 0.2)


# --------------------------------------------------------------------------- one round


def local_delta(peer: Peer, weights: Array, data: DigitsData, options: Options) -> Array:
    """Train locally from ``weights``; return the delta as it leaves the peer (DP, attack)."""
    x, y = data.x_train[peer.rows], data.y_train[peer.rows]
    delta = local_train(weights, x, y, options.local_steps, options.lr) - weights
    if peer.dp is not None:
        peer.dp.apply_dp_sgd(delta, clip_norm=options.dp_clip)
    if peer.byzantine:
        delta = BYZANTINE_SCALE * delta
    return delta


async def plain_round(
    peers: list[Peer],
    deltas: dict[str, Array],
    round_id: int,
    strategy: AggregationStrategy,
    codec: Codec | None,
    options: Options,
) -> tuple[dict[str, NDArray[np.float32]], dict[str, str], int]:
    """Commit, announce, fetch and aggregate; return each peer's aggregate, the CIDs, bytes."""
    samples = {p.peer_id: len(p.rows) for p in peers}
    config = BackwardPassConfig(aggregation=strategy, timeout=options.timeout, max_peers=64)
    accumulators = {
        p.peer_id: DistributedGradientAccumulator(options.session, config, local_peer_id=p.peer_id)
        for p in peers
    }
    cids: dict[str, str] = {}
    own: dict[str, NDArray[np.float32]] = {}
    nbytes = 0
    for peer in peers:
        values = deltas[peer.peer_id].astype(np.float32)
        if codec is None or peer.feedback is None:
            acc = accumulators[peer.peer_id]
            cid = await acc.commit_local(values, peer.store, num_samples=samples[peer.peer_id])
            nbytes += len((await peer.store.get(cid)).data)
            own[peer.peer_id] = values
        else:
            block = Block.new(store_layer_as_arrow(peer.feedback.encode("delta", values)))
            cid = await peer.store.put(block)
            nbytes += len(block.data)
            own[peer.peer_id] = load_gradient_from_arrow(block.data).reshape(-1)
        cids[peer.peer_id] = str(cid)
    await exchange(peers, round_id, cids, samples, options)

    async def aggregate(peer: Peer) -> tuple[str, NDArray[np.float32]]:
        announced = peer.inbox.pop(round_id)
        acc = accumulators[peer.peer_id]
        if codec is None:
            for sender, ann in sorted(announced.items()):
                await acc.add_peer_gradient(
                    sender, ann.cid, peer.store, num_samples=ann.num_samples
                )
            return peer.peer_id, acc.aggregate()
        inputs = {peer.peer_id: Contribution(own[peer.peer_id], samples[peer.peer_id])}
        for sender, ann in sorted(announced.items()):
            block = await peer.store.get(ann.cid, timeout=options.timeout)
            inputs[sender] = Contribution(
                load_gradient_from_arrow(block.data).reshape(-1), ann.num_samples
            )
        return peer.peer_id, strategy.aggregate(inputs)

    results = dict(await asyncio.gather(*(aggregate(p) for p in peers)))
    return results, cids, nbytes


async def secure_round(
    peers: list[Peer], deltas: dict[str, Array], round_id: int, options: Options
) -> tuple[dict[str, NDArray[np.float32]], int]:
    """SecAgg FedAvg: masked, sample-weighted deltas by CID; peer 0 unmasks only their sum."""
    samples = {p.peer_id: len(p.rows) for p in peers}
    total = sum(samples.values())
    context = f"{options.session}/{round_id}".encode()
    threshold = len(peers) // 2 + 1
    clients = {
        p.peer_id: SecAggClient(p.peer_id, threshold, context=context, clip_range=8.0)
        for p in peers
    }
    server = SecAggServer(threshold, context=context, clip_range=8.0)
    # Key agreement messages (public keys, encrypted Shamir shares) are passed in-process.
    roster = server.register(c.advertise_keys() for c in clients.values())
    routed = server.route_shares(m for c in clients.values() for m in c.share_keys(roster))
    for client_id, client in clients.items():
        client.receive_shares(routed.get(client_id, []))
    cids: dict[str, str] = {}
    nbytes = 0
    for peer in peers:
        weighted = deltas[peer.peer_id] * (samples[peer.peer_id] / total)
        masked = clients[peer.peer_id].masked_input(weighted)
        block = Block.new(masked.astype("<u4").tobytes())
        cids[peer.peer_id] = str(await peer.store.put(block))
        nbytes += len(block.data)
    await exchange(peers, round_id, cids, samples, options)
    aggregator = peers[0]
    announced = {a.peer_id: str(a.cid) for a in aggregator.inbox.pop(round_id).values()}
    announced[aggregator.peer_id] = cids[aggregator.peer_id]
    for sender, cid in sorted(announced.items()):
        block = await aggregator.store.get(cid, timeout=options.timeout)
        server.receive_masked(sender, np.frombuffer(block.data, dtype="<u4").astype(np.uint32))
    survivors, dropped = server.unmask_request()
    total_delta = server.finalize(clients[v].unmask(survivors, dropped) for v in survivors)
    aggregate_cid = await put_gradient(aggregator.store, total_delta)
    results = {aggregator.peer_id: np.asarray(total_delta, dtype=np.float32)}
    for peer in peers[1:]:
        peer.inbox.pop(round_id, None)
        fetched = await fetch_gradient(peer.store, aggregate_cid, timeout=options.timeout)
        results[peer.peer_id] = np.asarray(fetched, dtype=np.float32).reshape(-1)
    return results, nbytes


# --------------------------------------------------------------------------- the run


def check_options(options: Options, n_nodes: int) -> None:
    """Refuse contradictory settings before any daemon work."""
    if n_nodes < 2 or n_nodes != options.peers:
        raise InvalidGradient(f"need --peers >= 2 daemons, got {n_nodes} for {options.peers}")
    if not 0 <= options.byzantine < options.peers:
        raise InvalidGradient(f"--byzantine must be in [0, {options.peers - 1}]")
    if options.rounds < 1 or options.local_steps < 1:
        raise InvalidGradient("--rounds and --local-steps must be >= 1")
    if options.secagg and (options.compress or options.method.lower() != "fedavg"):
        raise InvalidGradient(
            "--secagg reveals only the sum: it needs --method fedavg, no --compress"
        )


async def run_federated(
    options: Options, nodes: Sequence[Node], log: Callable[[str], None] = print
) -> Result:
    """Train federatedly with one peer per node (running, connected daemons); see module doc."""
    check_options(options, len(nodes))
    with single_threaded_blas():  # tiny matrices: BLAS threads only add overhead
        return await _run(options, nodes, log)


async def _run(options: Options, nodes: Sequence[Node], log: Callable[[str], None]) -> Result:
    strategy = parse_method(options.method, len(nodes))
    codec = parse_codec(options.compress)
    data = load_data(options.peers, options.alpha, options.seed)
    centralized = train_centralized(data, options.rounds, options.local_steps, options.lr)
    topic = session_topic(options.session)
    peers: list[Peer] = []
    for i, node in enumerate(nodes):
        dp = None
        if options.dp_noise is not None:
            dp = DifferentialPrivacy(
                options.dp_budget,
                options.dp_delta,
                options.dp_clip,
                noise_multiplier=options.dp_noise,
                rng=np.random.default_rng([options.seed, i]),
            )
        peers.append(
            Peer(
                i,
                node,
                data.parts[i],
                KuboBlockStore(node.api_url, timeout=options.timeout),
                KuboPubsub(node.api_url, timeout=options.timeout),
                AnnouncementFilter(options.session, node.peer_id),
                byzantine=i >= options.peers - options.byzantine,
                feedback=ErrorFeedback(codec) if codec is not None else None,
                dp=dp,
            )
        )
    result = Result(
        options, [], centralized, [p.peer_id for p in peers], [len(p.rows) for p in peers]
    )
    listeners = [asyncio.create_task(p.listen(topic)) for p in peers]
    started = time.perf_counter()
    try:
        await wait_for_mesh(peers, topic, options.timeout)
        weights = {p.peer_id: np.zeros(N_FEATURES * N_CLASSES) for p in peers}
        previous: dict[str, str | None] = {p.peer_id: None for p in peers}
        honest = [p for p in peers if not p.byzantine]
        stamp = int(time.time() * 1000)
        for round_id in range(options.rounds):
            deltas = {p.peer_id: local_delta(p, weights[p.peer_id], data, options) for p in peers}
            if options.secagg:
                aggregates, nbytes = await secure_round(peers, deltas, round_id, options)
                cids: dict[str, str] = {}
            else:
                aggregates, cids, nbytes = await plain_round(
                    peers, deltas, round_id, strategy, codec, options
                )
            result.bytes_committed += nbytes
            for p in peers:
                weights[p.peer_id] = weights[p.peer_id] + aggregates[p.peer_id]
            reference = aggregates[honest[0].peer_id]
            result.consistent &= all(
                np.array_equal(aggregates[p.peer_id], reference) for p in honest
            )
            record = ""
            if cids and codec is None:
                record = await record_round(
                    honest, cids, round_id, strategy, previous, stamp, result
                )
            if peers[0].dp is not None:
                result.epsilon = max(p.dp.spent()[0] for p in peers if p.dp is not None)
            result.accuracy.append(accuracy(weights[honest[0].peer_id], data.x_test, data.y_test))
            eps = f"  ε={result.epsilon:.2f}" if result.epsilon is not None else ""
            log(
                f"round {round_id + 1:>3}: accuracy {result.accuracy[-1]:.4f}  "
                f"(centralized {centralized[round_id]:.4f}){eps}"
                + (f"  record {record}" if record else "")
            )
    finally:
        for task in listeners:
            task.cancel()
        await asyncio.gather(*listeners, return_exceptions=True)
        for p in peers:
            await p.pubsub.aclose()
            await p.store.aclose()
    result.seconds = time.perf_counter() - started
    return result


async def record_round(
    honest: list[Peer],
    cids: dict[str, str],
    round_id: int,
    strategy: AggregationStrategy,
    previous: dict[str, str | None],
    stamp: int,
    result: Result,
) -> str:
    """Every honest peer commits the round record to its own daemon; all CIDs must agree."""
    contributions = {
        p: ContributionRef(p, cid, result.samples[result.peer_ids.index(p)])
        for p, cid in cids.items()
    }
    privacy: dict[str, Any] = {}
    options = result.options
    if options.dp_noise is not None:
        privacy = {
            "mechanism": "gaussian, local (each delta clipped and noised by its peer)",
            "noise_multiplier": options.dp_noise,
            "clip_norm": options.dp_clip,
            "delta": options.dp_delta,
            "epsilon_spent": max(p.dp.spent()[0] for p in honest if p.dp is not None),
        }
    records = set()
    for peer in honest:
        cid, _ = await commit_round(
            peer.store,
            session=options.session,
            round=round_id,
            contributions=contributions,
            aggregation=strategy,
            previous=previous[peer.peer_id],
            privacy=privacy,
            timestamp_ms=stamp + round_id,
        )
        previous[peer.peer_id] = str(cid)
        records.add(str(cid))
    result.consistent &= len(records) == 1
    result.record_cids.append(min(records))
    return min(records)


def run(options: Options, log: Callable[[str], None] = print) -> Result:
    """Start ``options.peers`` loopback Kubo daemons, train, and stop them."""
    from gradfed_ipfs.kubo import KuboSwarm

    with KuboSwarm(options.peers) as swarm:
        return asyncio.run(run_federated(options, list(swarm), log))


def plot(result: Result, path: str | Path) -> Path:
    """Write a PNG of test accuracy against rounds, with the centralized reference line."""
    title = f"digits, softmax regression, {result.options.peers} peers over Kubo"
    return plot_curves(
        result.accuracy, result.centralized, describe(result.options), title, Path(path)
    )


def describe(options: Options) -> str:
    """A short label of a run's settings."""
    parts = [options.method]
    if options.compress:
        parts.append(f"compress {options.compress}")
    if options.dp_noise is not None:
        parts.append(f"DP z={options.dp_noise}")
    if options.secagg:
        parts.append("SecAgg")
    if options.byzantine:
        parts.append(f"{options.byzantine} Byzantine")
    return "federated: " + ", ".join(parts)


def build_parser() -> argparse.ArgumentParser:
    """The example's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = Options()
    add = parser.add_argument
    add("--method", default=d.method, help="fedavg | median | trimmed:B | krum:F | multikrum:F[:M]")
    add("--compress", default=None, help="codec for deltas: topk:R | int8 | int4 | topk:R,int8")
    add("--dp-noise", type=float, default=None, help="Gaussian noise multiplier z (local DP)")
    add("--dp-clip", type=float, default=d.dp_clip, help="L2 clip norm C of a delta (with DP)")
    add("--dp-delta", type=float, default=d.dp_delta, help="δ at which ε is reported")
    add("--secagg", action="store_true", help="secure aggregation (FedAvg only)")
    add("--byzantine", type=int, default=0, help="last K peers send -10x their delta")
    add("--rounds", type=int, default=d.rounds, help=f"federated rounds (default {d.rounds})")
    add("--local-steps", type=int, default=d.local_steps, help="local gradient steps per round")
    add("--lr", type=float, default=d.lr, help="learning rate")
    add("--alpha", type=float, default=d.alpha, help="Dirichlet α of the label split (non-IID)")
    add("--peers", type=int, default=d.peers, help="peers, one Kubo daemon each")
    add("--seed", type=int, default=d.seed, help="seed of the data split")
    add("--plot", default="federated_digits.png", help="PNG path ('' for none)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example; return the exit code."""
    args = build_parser().parse_args(argv)
    options = Options(
        method=args.method,
        compress=args.compress,
        dp_noise=args.dp_noise,
        dp_clip=args.dp_clip,
        dp_delta=args.dp_delta,
        secagg=args.secagg,
        byzantine=args.byzantine,
        rounds=args.rounds,
        local_steps=args.local_steps,
        lr=args.lr,
        alpha=args.alpha,
        peers=args.peers,
        seed=args.seed,
    )
    try:
        result = run(options)
    except GradfedError as exc:
        print(f"error ({type(exc).__name__}): {exc}", file=sys.stderr)
        return exc.exit_code
    except TimeoutError as exc:  # a peer's announcement never arrived
        print(f"error (TimeoutError): {exc}", file=sys.stderr)
        return 1
    print(
        f"final accuracy {result.final_accuracy:.4f} vs centralized "
        f"{result.centralized_accuracy:.4f} (gap {100 * result.gap:+.2f} points)"
    )
    print(
        f"peer samples {result.samples}; {result.bytes_committed:,} bytes committed in "
        f"{result.seconds:.1f}s; honest peers agree: {result.consistent}"
    )
    if result.epsilon is not None:
        print(f"privacy: ε = {result.epsilon:.3f} at δ = {options.dp_delta:g} per peer (RDP)")
    if result.record_cids:
        print(
            f"last round record: {result.record_cids[-1]} "
            f"(gradfed-ipfs history {result.record_cids[-1]})"
        )
    if args.plot:
        print(f"plot: {plot(result, args.plot)}")
    return 0 if result.consistent and math.isfinite(result.final_accuracy) else 1


if __name__ == "__main__":
    sys.exit(main())
