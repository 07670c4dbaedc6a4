"""The single-process run of ``federated_digits.py``: one ``RoundRunner`` per peer, over Kubo.

Each peer sits beside its own Kubo daemon (a loopback :class:`KuboSwarm`) and holds a non-IID
share of the training set. Every round each peer

1. starts from the global model and runs a few full-batch gradient steps on its own data;
2. runs the round with its own :class:`~gradfed_ipfs.federated.besteffort.RoundRunner`: the delta is
   committed to *its own* daemon (``DistributedGradientAccumulator.commit_local``, or an encoded
   Arrow block with ``--compress``, see ``codec_accumulator.py``) and its CID announced on the
   session's pubsub topic (``gradfed/v1/<session>``) by a
   :class:`~gradfed_ipfs.federated.besteffort.gossip.GossipModelSync` endpoint; the other peers'
   announcements are checked (authenticated sender, session, CID, duplicates), their deltas
   fetched by CID through the peer's own daemon (bitswap; every block re-hashed against its
   CID) and aggregated with ``--method``;
3. commits a dag-cbor round record (:func:`~gradfed_ipfs.provenance.commit_round`) linking the
   contributions, the aggregate and the previous round. Honest peers aggregate the same inputs in
   the same order, so they all commit the *same* record CID; the run checks that.

Peers run in one process and in lock step (round r+1 starts when every peer closed round r).
``--byzantine``, ``--dp-noise`` and ``--secagg`` change what a peer sends (see
``federated_digits.py``).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from gradfed_ipfs.errors import InvalidGradient
from gradfed_ipfs.federated.accumulate import GradientAccumulator
from gradfed_ipfs.federated.besteffort import GossipModelSync, RoundConfig, RoundRunner
from gradfed_ipfs.federated.privacy.mechanisms import DifferentialPrivacy
from gradfed_ipfs.federated.secagg.protocol import SecAggClient, SecAggServer
from gradfed_ipfs.formats.announcement import Announcement
from gradfed_ipfs.kubo.pubsub import KuboPubsub
from gradfed_ipfs.provenance.round_record import ContributionRef, commit_round, verify_history
from gradfed_ipfs.storage import Block, KuboBlockStore
from gradfed_ipfs.storage.dag import fetch_gradient, put_gradient
from gradfed_ipfs.tensor.aggregation import AggregationStrategy
from gradfed_ipfs.tensor.codecs import Codec, ErrorFeedback

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
    verified: list[bool] = field(default_factory=list)
    verified_on: str = ""

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
        if result.record_cids:  # while the daemons run: re-check the chain from another one
            checker = peers[-1]
            verdicts = await verify_history(result.record_cids[-1], checker.store)
            result.verified = [v.ok for v in verdicts]
            result.verified_on = checker.node.api_url
    finally:
        for p in peers:
            await p.runner.aclose()  # its last announcement's re-publisher, before pubsub closes
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
