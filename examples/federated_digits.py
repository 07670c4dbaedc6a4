"""Federated training of a softmax-regression model on scikit-learn's ``digits`` over Kubo.

Four peers (``--peers``), each beside its own Kubo daemon in a loopback :class:`KuboSwarm`,
hold a non-IID share of the training set (label proportions drawn from a seeded Dirichlet).
Every round each peer

1. starts from the global model and runs a few full-batch gradient steps on its own data;
2. runs the round with its own :class:`~gradfed_ipfs.RoundRunner`: the delta is
   committed to *its own* daemon (``DistributedGradientAccumulator.commit_local``, or an encoded
   Arrow block with ``--compress``, see ``codec_accumulator.py``) and its CID announced on the
   session's pubsub topic (``gradfed/v1/<session>``) by a
   :class:`~gradfed_ipfs.federated.round.gossip.GossipModelSync` endpoint; the other peers'
   announcements are checked (authenticated sender, session, CID, duplicates), their deltas
   fetched by CID through the peer's own daemon (bitswap; every block re-hashed against its
   CID) and aggregated with ``--method``;
3. commits a dag-cbor round record (:func:`~gradfed_ipfs.commit_round`) linking the
   contributions, the aggregate and the previous round. Honest peers aggregate the same inputs in
   the same order, so they all commit the *same* record CID; the run checks that.

Peers run in one process and in lock step (round r+1 starts when every peer closed round r).

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
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from gradfed_ipfs.errors import GradfedError, InvalidGradient
from gradfed_ipfs.federated.privacy.mechanisms import DifferentialPrivacy
from gradfed_ipfs.federated.round import (
    GossipModelSync,
    GradientAccumulator,
    RoundConfig,
    RoundRunner,
)
from gradfed_ipfs.federated.secagg.protocol import SecAggClient, SecAggServer
from gradfed_ipfs.formats.announcement import Announcement
from gradfed_ipfs.kubo.pubsub import KuboPubsub
from gradfed_ipfs.provenance.round_record import ContributionRef, commit_round
from gradfed_ipfs.storage import Block, KuboBlockStore
from gradfed_ipfs.storage.dag import fetch_gradient, put_gradient
from gradfed_ipfs.tensor.aggregation import AggregationStrategy
from gradfed_ipfs.tensor.compression import Codec, ErrorFeedback

sys.path.insert(0, str(Path(__file__).resolve().parent))
from codec_accumulator import CodecAccumulator
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
N_PARAMS = N_FEATURES * N_CLASSES


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
    """One participant: its data, its daemon (store and pubsub) and its round runner."""

    index: int
    node: Node
    rows: NDArray[np.int64]
    store: KuboBlockStore
    pubsub: KuboPubsub
    gossip: GossipModelSync
    runner: RoundRunner
    byzantine: bool
    dp: DifferentialPrivacy | None = None

    @property
    def peer_id(self) -> str:
        """The daemon's peer ID (the peer's identity in pubsub and in contributions)."""
        return self.node.peer_id


def make_peer(
    index: int,
    node: Node,
    rows: NDArray[np.int64],
    strategy: AggregationStrategy,
    codec: Codec | None,
    options: Options,
) -> Peer:
    """Build a peer: a store and a pubsub client on its own daemon, a gossip endpoint, a runner."""
    store = KuboBlockStore(node.api_url, timeout=options.timeout)
    pubsub = KuboPubsub(node.api_url, timeout=options.timeout)
    gossip = GossipModelSync(node.peer_id, pubsub, session_id=options.session)
    config = RoundConfig(
        min_peers=options.peers - 1,
        collect_timeout=options.timeout,
        fetch_timeout=options.timeout,
        subscriber_timeout=options.timeout,
        republish_interval=0.5,
        aggregation=strategy,
    )
    factory: Callable[[], GradientAccumulator] | None = None
    if codec is not None:
        feedback = ErrorFeedback(codec)

        def factory() -> GradientAccumulator:
            return CodecAccumulator(node.peer_id, feedback, strategy, options.timeout)

    dp = None
    if options.dp_noise is not None:
        dp = DifferentialPrivacy(
            options.dp_budget,
            options.dp_delta,
            options.dp_clip,
            noise_multiplier=options.dp_noise,
            rng=np.random.default_rng([options.seed, index]),
        )
    runner = RoundRunner(store, gossip, config, accumulator_factory=factory)
    byzantine = index >= options.peers - options.byzantine
    return Peer(index, node, rows, store, pubsub, gossip, runner, byzantine, dp)


async def exchange(
    peers: list[Peer], round_id: int, cids: dict[str, str], options: Options
) -> dict[str, dict[str, Announcement]]:
    """Announce every peer's CID; return, per peer, the others' announcements of the round.

    Announcements are re-published until *every* peer has all of them (pubsub may lose a
    message); receivers drop the repeats.
    """
    closed = asyncio.Event()
    announcers = [
        asyncio.create_task(
            p.gossip.announce_until(
                p.gossip.make_announcement(
                    cids[p.peer_id], round_id, num_samples=len(p.rows), length=N_PARAMS
                ),
                closed,
                interval=0.5,
                max_count=10**6,
            )
        )
        for p in peers
    ]

    async def collect(peer: Peer) -> dict[str, Announcement]:
        found = await peer.gossip.collect_announcements(
            len(peers) - 1, int(options.timeout * 1000), round_id=round_id
        )
        if len(found) < len(peers) - 1:
            raise TimeoutError(f"peer {peer.index} got {len(found)} announcements of {round_id}")
        return {a.peer_id: a for a in found}

    try:
        received = await asyncio.gather(*(collect(p) for p in peers))
    finally:
        closed.set()
        await asyncio.gather(*announcers, return_exceptions=True)
    return {p.peer_id: got for p, got in zip(peers, received, strict=True)}


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
    peers: list[Peer], deltas: dict[str, Array], round_id: int
) -> tuple[dict[str, NDArray[np.float32]], dict[str, dict[str, str]], int]:
    """Every peer runs the round with its ``RoundRunner``, all at once.

    Returns each peer's aggregate, each peer's view of the contributions (peer ID → CID, its
    own included) and the bytes committed.
    """
    tasks = [
        asyncio.create_task(
            p.runner.run_round(
                round_id,
                deltas[p.peer_id],
                num_samples=len(p.rows),
                expected_peers=[q.peer_id for q in peers if q is not p],
            )
        )
        for p in peers
    ]
    # A runner stops re-publishing when its own round closes, which can be before a slower
    # peer received its announcement (pubsub may lose one). Peers that are done keep announcing
    # until every peer is done; receivers drop the repeats.
    while not all(t.done() for t in tasks):
        await asyncio.wait([t for t in tasks if not t.done()], timeout=0.5)
        for peer, task in zip(peers, tasks, strict=True):
            if task.done() and task.exception() is None and not all(t.done() for t in tasks):
                await peer.gossip.broadcast_update(
                    task.result().local_cid, round_id, num_samples=len(peer.rows), length=N_PARAMS
                )
    results = [t.result() for t in tasks]
    aggregates: dict[str, NDArray[np.float32]] = {}
    views: dict[str, dict[str, str]] = {}
    nbytes = 0
    for peer, result in zip(peers, results, strict=True):
        if result.missing or result.failures:
            raise TimeoutError(f"peer {peer.index} excluded peers: {result.failures}")
        aggregates[peer.peer_id] = np.asarray(result.aggregate, dtype=np.float32)
        views[peer.peer_id] = {
            peer.peer_id: str(result.local_cid),
            **{q: str(c) for q, c in result.contributors.items()},
        }
        nbytes += len((await peer.store.get(result.local_cid)).data)
    return aggregates, views, nbytes


async def secure_round(
    peers: list[Peer], deltas: dict[str, Array], round_id: int, options: Options
) -> tuple[dict[str, NDArray[np.float32]], int]:
    """SecAgg FedAvg: masked, sample-weighted deltas by CID; peer 0 unmasks only their sum."""
    total = sum(len(p.rows) for p in peers)
    context = f"{options.session}/{round_id}".encode()
    threshold = len(peers) // 2 + 1
    clients = {p.peer_id: SecAggClient(p.peer_id, threshold, context=context) for p in peers}
    server = SecAggServer(threshold, context=context)
    # Key agreement messages (public keys, encrypted Shamir shares) are passed in-process.
    roster = server.register(c.advertise_keys() for c in clients.values())
    routed = server.route_shares(m for c in clients.values() for m in c.share_keys(roster))
    for client_id, client in clients.items():
        client.receive_shares(routed.get(client_id, []))
    cids: dict[str, str] = {}
    nbytes = 0
    for peer in peers:
        weighted = deltas[peer.peer_id] * (len(peer.rows) / total)
        block = Block.new(clients[peer.peer_id].masked_input(weighted).astype("<u4").tobytes())
        cids[peer.peer_id] = str(await peer.store.put(block))
        nbytes += len(block.data)
    aggregator = peers[0]
    announced = (await exchange(peers, round_id, cids, options))[aggregator.peer_id]
    masked_cids = {sender: str(a.cid) for sender, a in announced.items()}
    masked_cids[aggregator.peer_id] = cids[aggregator.peer_id]
    for sender, cid in sorted(masked_cids.items()):
        block = await aggregator.store.get(cid, timeout=options.timeout)
        server.receive_masked(sender, np.frombuffer(block.data, dtype="<u4").astype(np.uint32))
    survivors, dropped = server.unmask_request()
    total_delta = server.finalize(clients[v].unmask(survivors, dropped) for v in survivors)
    aggregate_cid = await put_gradient(aggregator.store, total_delta)
    # The aggregate's CID reaches the other peers in-process; its bytes come over bitswap.
    results = {aggregator.peer_id: np.asarray(total_delta, dtype=np.float32)}
    for peer in peers[1:]:
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
    peers = [
        make_peer(i, node, data.parts[i], strategy, codec, options) for i, node in enumerate(nodes)
    ]
    result = Result(
        options, [], centralized, [p.peer_id for p in peers], [len(p.rows) for p in peers]
    )
    started = time.perf_counter()
    try:
        for p in peers:
            await p.gossip.start(timeout=options.timeout)
        for p in peers:
            await p.gossip.wait_for_peers(len(peers) - 1, timeout=options.timeout)
        weights = {p.peer_id: np.zeros(N_FEATURES * N_CLASSES) for p in peers}
        previous: dict[str, str | None] = {p.peer_id: None for p in peers}
        honest = [p for p in peers if not p.byzantine]
        stamp = int(time.time() * 1000)
        for round_id in range(options.rounds):
            deltas = {p.peer_id: local_delta(p, weights[p.peer_id], data, options) for p in peers}
            views: dict[str, dict[str, str]] = {}
            if options.secagg:
                aggregates, nbytes = await secure_round(peers, deltas, round_id, options)
            else:
                aggregates, views, nbytes = await plain_round(peers, deltas, round_id)
            result.bytes_committed += nbytes
            for p in peers:
                weights[p.peer_id] = weights[p.peer_id] + aggregates[p.peer_id]
            reference = aggregates[honest[0].peer_id]
            result.consistent &= all(
                np.array_equal(aggregates[p.peer_id], reference) for p in honest
            )
            record = ""
            if views and codec is None:
                reference_view = views[honest[0].peer_id]
                result.consistent &= all(views[p.peer_id] == reference_view for p in honest)
                record = await record_round(
                    honest, reference_view, round_id, strategy, previous, stamp, result
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
        for p in peers:
            await p.gossip.aclose()
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
