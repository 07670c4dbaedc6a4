"""The one configuration of a round, and the accumulator's own small settings built from it.

A round is configured by one :class:`RoundConfig`. Differential privacy and secure aggregation
are *options* of the one runner, the way Flower wraps a strategy (``DifferentialPrivacy…``
around ``FedAvg``; SecAgg+ as a mod) rather than a second runner::

    RoundConfig(min_peers=2, aggregation=SampleWeightedMean())                       # plain FedAvg
    RoundConfig(min_peers=2, dp=DifferentialPrivacy(...))                # + client-level DP
    RoundConfig(secure=SecureOptions(clients=ids, aggregator=ids[0], threshold=2))  # SecAgg
    RoundConfig(secure=SecureOptions(...), dp=DifferentialPrivacy(...))  # central DP on SecAgg

:class:`AccumulatorConfig` (the seed's ``BackwardPassConfig``) is what one accumulator needs;
:meth:`RoundConfig.accumulator_config` is the one place that builds it from a round's settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...errors import ConfigError
from ...tensor.aggregation import AggregationStrategy, SampleWeightedMean
from ..accumulate.config import DEFAULT_MAX_WEIGHT, AccumulatorConfig
from ..privacy.mechanisms import DifferentialPrivacy
from ..secagg_round.settings import SecAggSettings

__all__ = ["RoundConfig", "SecureOptions"]


@dataclass(frozen=True)
class SecureOptions:
    """Secure aggregation (Bonawitz et al. 2017, as Flower's SecAgg+) as an option of a round.

    The round's session, id and vector length, and the runner's ``fetch_timeout``,
    ``republish_interval`` and ``subscriber_timeout``, complete the protocol's parameters
    (:class:`~gradfed_ipfs.federated.secagg_round.peer.SecureRoundConfig`, built in one place:
    :func:`~gradfed_ipfs.federated.besteffort.secure.protocol_config`).

    Attributes
    ----------
    clients
        Peer IDs of the round's clients (the fixed roster); the runner's node must be one.
    aggregator
        Peer ID of the aggregator (it may also be a client).
    threshold
        Shamir threshold t: the fewest survivors (and unmasking answers) that yield a sum.
    settings
        The encoding and the phase timeouts
        (:class:`~gradfed_ipfs.federated.secagg_round.SecAggSettings`).
    """

    clients: tuple[str, ...]
    aggregator: str
    threshold: int
    settings: SecAggSettings = field(default_factory=SecAggSettings)


@dataclass(frozen=True)
class RoundConfig:
    """The one configuration of a round: timing, sizes, rule, and the DP / SecAgg options.

    Attributes
    ----------
    min_peers
        Peer contributions (besides the local one) a round needs; a round that has fewer by
        its deadline raises :class:`~gradfed_ipfs.errors.InsufficientPeers`.
    collect_timeout
        The round's deadline, in seconds after the commit: announcements are taken until then.
        A fetch that has received nothing by then is cut off (``dropped``); one whose blocks
        are arriving goes on within its own bounds below (slow is not missing), and once
        ``min_peers`` and every expected peer are in, no fetch outlives the deadline.
    fetch_timeout
        Fixed part of a peer's fetch deadline (latency, connection set-up), in seconds; see
        :meth:`fetch_deadline`. A peer over its deadline is reported ``slow`` if some of its
        blocks arrived, ``dropped`` if none did.
    min_throughput
        Slowest per-peer transfer rate a round waits for, in bytes/s (default 100 kB/s, about
        the 2 %-loss WAN link measured in ``benchmarks/bench_wan.py``); it scales each peer's
        fetch deadline with the announced size. It is the floor: a measured rate never shortens
        a deadline.
    measure_throughput
        Measure each peer's transfer rate and, for a peer measured slower than
        ``min_throughput`` in earlier rounds, plan its deadline with the measured rate instead
        (half of it, by default; see :mod:`~gradfed_ipfs.federated.besteffort.throughput`).
    max_fetch_deadline
        Seconds a measured rate may extend a fetch deadline to (default 600); a deadline the
        configured rate gives is never shortened by it.
    stall_timeout
        Seconds without any block arriving after which a fetch is cut off (stalled), whatever
        its deadline.
    subscriber_timeout
        Seconds to wait until pubsub shows ``min_peers`` subscribers before announcing.
    republish_interval
        Seconds between re-publications of the local announcement.
    max_republish
        Most publications of the local announcement per round.
    max_peers
        Most peer gradients taken in (further announcers are ignored).
    aggregation
        The rule (default FedAvg); with ``streaming`` a linear one (Sum, Mean, FedAvg,
        WeightedMean by peer ID).
    streaming
        Fold gradients into one running sum as their chunks arrive (constant memory in the
        number of peers) instead of holding every gradient; not with ``dp``.
    max_weight
        Cap on one contribution's announced sample count (default :data:`DEFAULT_MAX_WEIGHT`);
        clipped claims are reported in ``RoundResult.clipped_weights``. ``None``: no cap.
    dp
        Client-level DP-FedAvg for every round (see :mod:`gradfed_ipfs.federated.besteffort.dp`):
        each contribution clipped to ``dp.sensitivity``, equal weights, Gaussian noise, charged
        to ``dp``'s accountant (cumulative over the rounds that share this ``dp``). With
        ``secure``: central DP on the secure sum (:mod:`gradfed_ipfs.federated.besteffort.secure`).
    secure
        Run rounds with secure aggregation over this roster instead of plain exchange.
    """

    min_peers: int = 1
    collect_timeout: float = 60.0
    fetch_timeout: float = 60.0
    min_throughput: float = 100_000.0
    measure_throughput: bool = True
    max_fetch_deadline: float = 600.0
    stall_timeout: float = 30.0
    subscriber_timeout: float = 10.0
    republish_interval: float = 1.0
    max_republish: int = 120
    max_peers: int = 64
    aggregation: AggregationStrategy = field(default_factory=SampleWeightedMean)
    streaming: bool = False
    max_weight: int | None = DEFAULT_MAX_WEIGHT
    dp: DifferentialPrivacy | None = None
    secure: SecureOptions | None = None

    def __post_init__(self) -> None:
        if self.min_peers < 0 or self.max_peers < 1 or self.max_republish < 1:
            raise ConfigError("min_peers must be >= 0, max_peers and max_republish >= 1")
        if self.min_peers > self.max_peers:
            raise ConfigError(f"min_peers {self.min_peers} > max_peers {self.max_peers}")
        for name in (
            "collect_timeout",
            "fetch_timeout",
            "stall_timeout",
            "republish_interval",
            "min_throughput",
            "max_fetch_deadline",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0")
        if self.streaming and self.dp is not None:
            raise ConfigError("DP rounds clip each contribution: they cannot be streaming")
        self.accumulator_config()  # validates the shared settings once, here

    def fetch_deadline(self, nbytes: int, rate: float | None = None) -> float:
        """Seconds a gradient of ``nbytes`` may take: ``fetch_timeout + nbytes / min_throughput``.

        With a measured ``rate`` (bytes/s) below ``min_throughput`` the deadline is
        ``fetch_timeout + nbytes / rate`` instead, capped at ``max_fetch_deadline``; it is never
        shorter than the configured one.

        >>> config = RoundConfig(fetch_timeout=10.0, min_throughput=1e6)
        >>> config.fetch_deadline(40_000_000), config.fetch_deadline(40_000_000, rate=0.5e6)
        (50.0, 90.0)
        """
        size = max(0, nbytes)
        floor = self.fetch_timeout + size / self.min_throughput
        if rate is None:
            return floor
        measured = self.fetch_timeout + size / rate if rate > 0 else math.inf
        return max(floor, min(measured, self.max_fetch_deadline))

    def accumulator_config(self) -> AccumulatorConfig:
        """Return the settings of this round's accumulator (the one place they are built)."""
        return AccumulatorConfig(
            max_peers=self.max_peers,
            aggregation=self.aggregation,
            timeout=self.fetch_timeout,
            max_weight=self.max_weight,
        )
