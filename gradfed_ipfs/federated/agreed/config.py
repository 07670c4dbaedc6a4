"""Settings and outcomes of agreed rounds (:mod:`gradfed_ipfs.federated.agreed.session`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

import numpy as np
from multiformats import CID

from ..._types import CIDLike, FloatArray
from ...cid import parse_cid
from ...errors import InvalidGradient
from ...formats.agreed.roster import Roster
from ...formats.pubsub import session_topic
from ...storage.dag import DEFAULT_CHUNK_BYTES, values_per_chunk
from ...tensor.codecs import Codec
from ...tensor.packing import PackSpec
from ..accumulate.config import DEFAULT_MAX_WEIGHT
from .membership import Admission

__all__ = [
    "AGGREGATIONS",
    "CONTROLS",
    "DEFAULT_MAX_VALUE",
    "AgreedConfig",
    "AgreedRoundResult",
    "Aggregation",
    "Control",
    "ResyncResult",
    "UpdateRule",
    "agreed_topic",
]

Aggregation = Literal["all-to-all", "reduce-scatter", "auto"]
Control = Literal["pubsub", "cometbft"]
CONTROLS: tuple[Control, ...] = ("pubsub", "cometbft")
"""Who decides a round's roster and final record (``AgreedConfig.control``)."""
AGGREGATIONS: tuple[Aggregation, ...] = ("all-to-all", "reduce-scatter", "auto")
"""How an agreed round computes its model (see :mod:`.agreed_slicing`)."""

DEFAULT_MAX_VALUE: float = 2.0**64
"""Default bound on a contribution's values (``AgreedConfig.max_value``): about 1.8e19."""


class UpdateRule(Protocol):
    """A replacement for the default rule ``M + lr · Σ (w_i/W) g_i`` (e.g. a server optimizer).

    It must be a deterministic function of its arguments (bit-identical on every peer): its
    state after each round is stored as a gradient block whose CID the round record names, so
    every peer applies the same update and a resynced peer resumes from the record.
    """

    def label(self, round_number: int) -> str:
        """Return the text recorded as the round record's ``rule`` (1..256 characters)."""
        ...

    def apply(
        self,
        model: FloatArray,
        roster: Roster,
        gradients: Sequence[FloatArray],
        learning_rate: float,
        state: FloatArray | None,
    ) -> tuple[FloatArray, FloatArray | None]:
        """Return the new float32 model ``(d,)`` and state (``None``: none) from the roster.

        ``gradients`` are the roster entries' blocks in roster order; ``state`` is the previous
        round's (``None`` at the first round). Raising fails the round on every peer alike.
        """
        ...


def agreed_topic(session: str, genesis: CIDLike) -> str:
    """Return the pubsub topic of an agreed session: ``gradfed/v1/<session>/agreed/<genesis>``."""
    return session_topic(f"{session}/agreed/{parse_cid(genesis)}")


@dataclass(frozen=True)
class AgreedConfig:
    """Settings of an agreed session (times in seconds).

    Attributes
    ----------
    members
        Peer IDs of the session's peers, this one included: the roster's ``expected``.
    min_peers
        Least number of contributions (this peer's included) a roster must list; default all.
    learning_rate
        Factor of the update rule ``M_{r+1} = M_r + learning_rate · weighted mean``.
    collect_timeout
        After the round starts, the coordinator closes the roster with what it has.
    takeover_timeout
        Delay per coordinator rank before the next one publishes a roster itself.
    takeover_skew
        Clock margin of the coordinator schedule, in seconds: a roster from rank ``k ≥ 1`` is
        taken only from ``collect_timeout + k · takeover_timeout - takeover_skew`` after the
        round started by the receiver's clock (rank 0's at once; one heard earlier is kept
        and taken when its time comes), and only if it names its sender as coordinator.
        ``None`` (the default): half a ``takeover_timeout``, so rank ``k``'s time stays after
        rank ``k - 1``'s publication. It covers peers starting a round at different times.
    round_timeout
        No adopted roster by then raises ``QuorumNotReached``.
    done_timeout
        How long ``run_round`` waits for the other roster peers' ``done`` before returning.
        With ``0`` (the default) it does not wait: the next round starts at once, and the
        ``done`` messages of the last round are checked when the next round starts (a
        disagreement raises ``RoundMismatch`` there) and by :meth:`AgreedSession.linger`.
    announce_interval
        Delay before a message is first re-announced; it doubles after each re-announcement.
    max_announce_interval
        Longest delay between re-announcements of one message.
    fetch_timeout
        Bound on fetching one contribution or record.
    rule
        A custom :class:`UpdateRule`; ``None`` for the deterministic weighted mean.
    aggregation
        ``"all-to-all"`` (every peer fetches every contribution), ``"reduce-scatter"`` (each
        roster peer reduces one slice of every contribution; any coordinate-wise rule) or
        ``"auto"`` (reduce-scatter when :func:`~.slices.can_slice` holds for the rule, d and
        the members, from 8 members on: ``AUTO_MIN_MEMBERS``). Every member must use the same
        setting.
    chunk_bytes
        Chunk size of the contributions (slice boundaries follow it; the same on every member).
    reducer_timeout
        Reduce-scatter: delay per reducer rank before the next takes over a silent reducer.
    model_replicas
        How many roster peers put (and pin) a stored round's model and rule state: the first ones
        of the round's coordinator ranking that are in the roster
        (:func:`~.coordinator.model_holders`); ``None`` for every roster peer. Every peer
        holds the model in memory either way; the others fetch it by CID from a holder when
        they resync or verify. Each put costs ``4·d`` bytes of repo and write per peer and
        round (at d = 10M and 100 peers, 4 GB a round with ``None``); 2 copies survive one
        lost holder, and a durability provider (:class:`~gradfed_ipfs.storage.RetentionKeeper`'s
        ``durable``) keeps them longer.
    model_every
        The holders put the model (and rule state) of every ``model_every``-th round: rounds
        ``model_every - 1``, ``2·model_every - 1``, …; every round when 1. A record says whether
        its model was stored (``AgreedRecord.model_stored``); a model that was not is rebuilt
        from the last stored one by re-aggregating the rounds since
        (:func:`~.agreed_history.load_result`, used by resync and verification), so their
        contributions must still be served: keep ``Retention.keep_rounds`` ≥ ``model_every``
        (a :class:`~gradfed_ipfs.storage.RetentionKeeper` keeps the rounds back to a stored
        model anyway). The same on every member (it is in the records).
    chained
        Reduce-scatter with ``fedavg``: reduce each slice in about √N steps along the roster
        (:mod:`~.reduce_chain`): N^1.5 blocks a round instead of 2·N², which is what makes a
        round's time grow linearly in N at d = 1M. The same model and records; every member
        must use the same setting. Median and trimmed-mean rounds stay one-level.
    chain_groups
        A chained round's number of steps per slice ``G`` (``None``: ``chain_groups(N)`` of the
        roster, ≈ √N with at least 5 slices; one group runs one-level); the same on every member.
    max_weight
        Largest weight one roster entry may have (default :data:`DEFAULT_MAX_WEIGHT`, 2**20).
        Refused, not clipped: a coordinator does not list a contribution announced with a larger
        weight (its peer is named in ``rejected``), a roster listing one is not adopted (its
        coordinator is named in ``rejected`` and the next-ranked coordinator takes over), and
        :meth:`AgreedSession.run_round` refuses a larger own weight (``InvalidGradient``).
        Records are unchanged: a verifier recomputes the roster's weights as listed.
    max_value
        Largest magnitude a contribution's values may have (default :data:`DEFAULT_MAX_VALUE`,
        2**64; ``None``: only finite). Checked on a contribution's bytes when it is fetched, the
        same on every peer: one with a larger value is refused like a corrupt one (its peer is
        named in ``rejected``, and a roster listing it is not adopted), and ``run_round``
        refuses a larger own value. One round then moves a value by at most
        ``|learning_rate| · max_value``, so the default rule's model stays finite in float32
        (about 2**64 rounds at learning rate 1 before it could leave float32's range).
        In a reduce-scatter round a chunked contribution's slices are checked by their
        reducers: a sender with a larger value is recorded missing, as for a non-finite one.
        Every member must use the same ``max_weight`` and ``max_value``.
    compression
        A codec for the contributions (:class:`~gradfed_ipfs.tensor.Int8`, ``Int4``, ``Int2``,
        ``TopK``, ``TopKInt8``, ``TopKInt2``), sent as packed blocks
        (:mod:`~gradfed_ipfs.formats.packed`) over the same chunks; ``None`` (the default):
        dense float32, records and CIDs as without it. Every member must use the same one: a
        contribution of another encoding is refused like a corrupt one, and each round record
        names the encoding (``AgreedRecord.encoding``) so a verifier decodes alike.
    error_feedback
        With ``compression``: what this peer's contribution did not send (or all of it, when
        the round left it out) is added to its next one
        (``residual ← error_decay·residual + update − decoded(sent)``), kept in the session.
    error_decay
        Factor of the residual carried into the next round, in ``[0, 1]``.
    exact_tail
        With ``compression``: the last ``exact_tail`` values of every contribution are sent
        exact (a training session's metrics tail: :class:`~gradfed_ipfs.training.Peer` sets it).
    control
        The control plane: ``"pubsub"`` (the default: a ranked coordinator's roster, ``done``
        messages) or ``"cometbft"`` (a CometBFT chain of the members decides each round's
        roster and final record: :mod:`~.control.comet`; the session then needs its own
        validator's RPC, ``AgreedSession(validator_rpc=...)``; all-to-all rounds only). The
        same on every member.
    admission
        Who may join a running session and when an absent member is evicted
        (:class:`~.membership.Admission`). ``None`` (the default): ``members`` is fixed, and
        rosters and records keep their bytes. Set: ``members`` is round 0's member set; each
        round uses its base record's (all-to-all rounds only).
    """

    members: tuple[str, ...]
    min_peers: int | None = None
    learning_rate: float = 1.0
    collect_timeout: float = 10.0
    takeover_timeout: float = 5.0
    takeover_skew: float | None = None
    round_timeout: float = 60.0
    done_timeout: float = 0.0
    announce_interval: float = 0.25
    max_announce_interval: float = 1.0
    fetch_timeout: float = 30.0
    rule: UpdateRule | None = None
    aggregation: Aggregation = "all-to-all"
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    reducer_timeout: float = 5.0
    model_replicas: int | None = 2
    model_every: int = 4
    chained: bool = False
    chain_groups: int | None = None
    max_weight: int = DEFAULT_MAX_WEIGHT
    max_value: float | None = DEFAULT_MAX_VALUE
    compression: Codec | None = None
    error_feedback: bool = True
    error_decay: float = 1.0
    exact_tail: int = 0
    control: Control = "pubsub"
    admission: Admission | None = None

    def __post_init__(self) -> None:
        if not self.members or len(set(self.members)) != len(self.members):
            raise InvalidGradient("members must be a non-empty list of distinct peer IDs")
        if self.min_peers is not None and not 1 <= self.min_peers <= len(self.members):
            raise InvalidGradient(f"min_peers must be in [1, {len(self.members)}]")
        if not np.isfinite(self.learning_rate):
            raise InvalidGradient("learning_rate must be finite")
        if self.aggregation not in AGGREGATIONS:
            raise InvalidGradient(f"aggregation must be one of {AGGREGATIONS}")
        if self.control not in CONTROLS:
            raise InvalidGradient(f"control must be one of {CONTROLS}")
        values_per_chunk(self.chunk_bytes)  # checks its range
        self._check_timing()
        if self.model_replicas is not None and self.model_replicas < 1:
            raise InvalidGradient("model_replicas must be >= 1 or None (every roster peer)")
        if self.model_every < 1:
            raise InvalidGradient("model_every must be >= 1 (1: every round's model is stored)")
        if self.chain_groups is not None and self.chain_groups < 1:
            raise InvalidGradient("chain_groups must be >= 1 or None (about √N)")
        self._check_bounds()
        self._check_compression()

    def _check_timing(self) -> None:
        """Check every timeout and interval is positive, and the skew and done wait not negative."""
        for name in ("collect_timeout", "takeover_timeout", "round_timeout", "reducer_timeout",
                     "announce_interval", "max_announce_interval", "fetch_timeout"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise InvalidGradient(f"{name} must be > 0 seconds")
        if self.takeover_skew is not None and not 0 <= self.takeover_skew < float("inf"):
            raise InvalidGradient("takeover_skew must be >= 0 seconds (or None)")
        if not self.done_timeout >= 0:
            raise InvalidGradient("done_timeout must be >= 0 seconds")

    def _check_compression(self) -> None:
        """Check the codec has a packed form, ``error_decay`` and ``exact_tail``."""
        if self.compression is not None:
            self.compression.packing(self.exact_tail)  # raises ConfigError for Dense, RandomK...
        if not 0.0 <= self.error_decay <= 1.0:
            raise InvalidGradient(f"error_decay must be in [0, 1], got {self.error_decay}")
        if self.exact_tail < 0:
            raise InvalidGradient(f"exact_tail must be >= 0, got {self.exact_tail}")

    def for_members(self, members: tuple[str, ...]) -> AgreedConfig:
        """Return these settings for a round of ``members`` (``min_peers`` capped at theirs)."""
        if members == self.members:
            return self
        cap = None if self.min_peers is None else min(self.min_peers, len(members))
        return replace(self, members=members, min_peers=cap)

    def takeover_at(self, rank: int) -> float:
        """Seconds after a round's start from which coordinator ``rank``'s roster is taken."""
        if rank == 0:
            return 0.0
        skew = self.takeover_timeout / 2 if self.takeover_skew is None else self.takeover_skew
        return max(0.0, self.collect_timeout + rank * self.takeover_timeout - skew)

    @property
    def packing(self) -> PackSpec | None:
        """The contributions' encoding (``None``: dense float32)."""
        if self.compression is None:
            return None
        return self.compression.packing(self.exact_tail)

    def _check_bounds(self) -> None:
        """Check ``max_weight`` (an int ≥ 1) and ``max_value`` (``None`` or in (0, FLT_MAX])."""
        weight = self.max_weight
        if not isinstance(weight, int) or isinstance(weight, bool) or weight < 1:
            raise InvalidGradient(f"max_weight must be an integer >= 1, got {weight!r}")
        limit = float(np.finfo(np.float32).max)
        if self.max_value is not None and not 0 < self.max_value <= limit:
            raise InvalidGradient(
                f"max_value must be in (0, {limit:g}] or None, got {self.max_value}"
            )

    def stores_model(self, r: int) -> bool:
        """Whether the holders put round ``r``'s model (see ``model_every``)."""
        return (r + 1) % self.model_every == 0

    @property
    def quorum(self) -> int:
        """The effective ``min_peers``."""
        return len(self.members) if self.min_peers is None else self.min_peers


@dataclass(frozen=True)
class AgreedRoundResult:
    """The outcome of one agreed round on this peer.

    Attributes
    ----------
    round
        Round number.
    base, model
        Model CIDs before and after the round.
    record, roster_cid
        The round record's and the roster's CIDs.
    roster
        The agreed roster (its ``entries`` are the participants, in aggregation order).
    included
        Whether this peer's contribution is in the roster.
    absent
        Members that are not in the roster (typed "expected and absent").
    confirmed
        Peers whose ``done`` named the same record.
    unconfirmed
        Roster peers whose ``done`` had not arrived when ``run_round`` returned.
    matched
        Whether every other roster peer had confirmed the same record by then.
    rejected
        Peer → reason, for contributions or rosters refused this round.
    seconds
        Wall time of the round.
    aggregation
        ``"all-to-all"`` or ``"reduce-scatter"``: how this round's model was computed.
    aggregation_reason
        Why (e.g. the reason ``auto`` fell back to all-to-all).
    slices
        Reduce-scatter: the slice record CIDs the round record links.
    missing
        Reduce-scatter: roster peers whose slices did not arrive, excluded from every slice.
    liars
        Reduce-scatter: reducers proven to have lied in this round (the round record's
        ``excluded`` keeps them, and every proven liar before, out of every later roster).
    model_stored
        Whether the holders put ``model`` (``model_every``); if not, fetching it by CID finds
        nothing (``session.model`` holds it; :func:`~.agreed_history.load_result` rebuilds it).
    sent_bytes
        Bytes of this peer's own contribution blocks this round (chunks and manifest; dense:
        ``4·d`` plus the framing), whether or not the roster included it.
    """

    round: int
    base: CID
    model: CID
    record: CID
    roster_cid: CID
    roster: Roster
    included: bool
    absent: tuple[str, ...]
    confirmed: tuple[str, ...]
    unconfirmed: tuple[str, ...]
    matched: bool
    rejected: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    aggregation: str = "all-to-all"
    aggregation_reason: str = ""
    slices: tuple[CID, ...] = ()
    missing: tuple[str, ...] = ()
    liars: tuple[str, ...] = ()
    model_stored: bool = True
    sent_bytes: int = 0


@dataclass(frozen=True)
class ResyncResult:
    """What :meth:`AgreedSession.resync` did: the adopted head and the records it followed.

    ``refused`` maps each member whose head was not adopted to why (its record is missing or
    of another session, too few of its roster voted for it, or its chain did not verify);
    ``recomputed`` is how many of the new records' rounds were re-aggregated.
    """

    changed: bool
    round: int
    model: CID
    head: CID | None
    records: tuple[CID, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)
    recomputed: int = 0
