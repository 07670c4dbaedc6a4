"""``RoundResult``: the one result of a round, plain, DP or SecAgg."""

from __future__ import annotations

from dataclasses import dataclass, field

from multiformats import CID

from ..._types import FloatArray
from ..exchange.stats import RoundStats

__all__ = ["RoundResult"]


@dataclass
class RoundResult:
    """What one node's round produced, and who was in it.

    Attributes
    ----------
    round_id
        The round.
    local_cid
        CID of this node's committed gradient (in a SecAgg round: of its *masked* block).
    aggregate
        The aggregate (float32, length d, finite). In a SecAgg round only the aggregator has it
        (the survivors' mean); a pure client gets an *empty* float32 array (length 0): the
        protocol publishes no sum to clients.
    participants
        Peer IDs whose contributions are in the aggregate, this node included, sorted (SecAgg:
        the survivors on the aggregator; on a pure client itself if its vector was summed).
    contributors
        Peer ID → CID of every *other* peer's contribution taken in (SecAgg, on the aggregator:
        every other survivor's masked block).
    expected
        The roster this node expected (``expected_peers``, or SecAgg's clients), sorted.
    absent
        Expected peers that never announced a contribution, sorted.
    dropped
        Peers that announced (SecAgg: shared keys) but whose contribution never arrived (no
        block of it by the deadline, not found, a daemon error), sorted.
    slow
        Peers cut off while their blocks were arriving (too slow for the announced size,
        stalled, or still in flight when the round closed), sorted: alive, but excluded.
    rejected
        Peer ID → why its contribution was refused (corrupt, undecodable, wrong length,
        non-finite: its bytes were bad).
    rejections
        The refusals counted by reason (the error's class name, e.g. ``BlockCorrupt``).
    failures
        Peer ID → why for every dropped or rejected peer.
    clipped_weights
        Peer ID → announced sample count, for claims above ``max_weight`` (their weight was
        clipped to it).
    epsilon, delta
        The (ε, δ) spent so far by the round's DP option, or ``None`` without DP (or on a
        SecAgg client, which releases nothing).
    duration_ms
        Time the round took on this node, in milliseconds.
    drops
        Announcements dropped, by reason (see :class:`~gradfed_ipfs.formats.AnnouncementFilter`).
    throughput
        Peer ID → rate of its fetch this round in bytes/s (received bytes over the fetch's
        time, latency included), for fetches that completed or were cut off while sending;
        the runner's :class:`~gradfed_ipfs.federated.besteffort.throughput.ThroughputMeter` smooths
        them over rounds into the next deadlines.
    """

    round_id: int
    local_cid: CID
    aggregate: FloatArray
    participants: list[str]
    contributors: dict[str, CID] = field(default_factory=dict)
    expected: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    rejections: dict[str, int] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    clipped_weights: dict[str, int] = field(default_factory=dict)
    epsilon: float | None = None
    delta: float | None = None
    duration_ms: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    throughput: dict[str, float] = field(default_factory=dict)

    @property
    def missing(self) -> list[str]:
        """Peers without a contribution in the aggregate: absent, dropped or slow, sorted."""
        return sorted(set(self.absent) | set(self.dropped) | set(self.slow))

    @property
    def stats(self) -> RoundStats:
        """The round as the seed's JSON record :class:`~.exchange.RoundStats`."""
        return RoundStats(
            round_id=self.round_id,
            participants=len(self.participants),
            missing_clients=self.missing,
            duration_ms=self.duration_ms,
            epsilon_spent=self.epsilon,
            delta_spent=self.delta,
            dropped_clients=sorted({*self.dropped, *self.slow}),
            rejected_contributions=len(self.rejected),
        )
