"""Reduce-scatter settings, a peer's work on one slice, and its result (:mod:`.reduce_scatter`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from multiformats import CID

from ..._types import FloatArray
from ...block import Block
from ...storage.dag import DEFAULT_CONCURRENCY
from ...tensor.packing import PackSpec

__all__ = ["ReduceScatterConfig", "ReduceScatterResult", "SliceWork"]


@dataclass(frozen=True)
class ReduceScatterConfig:
    """Settings every roster peer must share (slicing, rule) and local timeouts (seconds)."""

    chunk_bytes: int = 65_536
    """The contributions' chunk size: slice boundaries follow its grid."""
    rule: str = "fedavg"
    learning_rate: float = 1.0
    fetch_timeout: float = 10.0
    """Seconds one input slice may take before its sender is recorded missing; also the wait
    for every input's projections."""
    reducer_timeout: float = 10.0
    """Seconds before the next-ranked peer takes over a silent reducer's slice."""
    phase_timeout: float = 120.0
    """Longest wait for any one step (all slice records, all projections)."""
    concurrency: int = DEFAULT_CONCURRENCY
    chained: bool = False
    """Reduce each slice in :func:`~.slices.chain_groups` steps along the roster
    (:mod:`.reduce_chain`; N^1.5 blocks a round instead of 2·N², the same model and records).
    ``fedavg`` only (other rules, and rosters of one group, run one-level)."""
    chain_groups: int | None = None
    """A chained round's ``G`` (every peer the same); ``None``: :func:`~.slices.chain_groups`
    of the roster's size."""
    max_value: float | None = None
    """Largest magnitude an input slice's value may have (every peer the same); a sender whose
    slice has a larger one is recorded missing, as for a non-finite one. ``None``: any finite."""
    packing: PackSpec | None = None
    """The contributions' encoding when compressed (every peer the same): an input slice is
    the decoded chunks of its range (a sparse chunk: the entries whose index falls in it); a
    chunk of another encoding makes its sender missing. ``None``: dense contributions."""


@dataclass
class ReduceScatterResult:
    """What one peer ends a reduce-scatter round with."""

    model: FloatArray
    model_cid: CID
    records: list[CID]
    missing: tuple[str, ...]
    liars: set[str] = field(default_factory=set)
    frauds: list[CID] = field(default_factory=list)
    recomputed: list[int] = field(default_factory=list)
    false_values: set[str] = field(default_factory=set)
    """Senders whose published check values contradicted their own contribution blocks: each
    cost a slice recompute (logged; they are not excluded, since only this peer saw it)."""
    garbage: dict[str, str] = field(default_factory=dict)
    """Reducers whose announced partial sum or slice record this peer refused (not one of this
    round, unreadable), with why: each cost a recompute; not excluded (only this peer saw it)."""
    evidence: dict[str, CID] = field(default_factory=dict)
    """Members whose signed board statement this peer showed false, and its CID (put in the
    store): the announcement of a record a fraud record proves wrong, check values that the
    author's blocks contradict, a record whose ``missing`` claim the sender's blocks
    contradict, a record or partial sum refused as garbage. Anyone can check its signature and
    re-check it against the blocks. Empty on
    boards that do not sign (:class:`~.transport.MemorySliceBoard`)."""
    downloaded: int = 0
    seconds: float = 0.0
    record_blocks: dict[bytes, Block] = field(default_factory=dict, repr=False)
    """The final slice records' blocks as read (from their announcements, or fetched), by CID
    bytes: a keeper stores them locally instead of fetching them again."""


@dataclass
class SliceWork:
    """One slice as a peer works on it: its place, reducer ranking, and the rows fetched."""

    k: int
    offset: int
    length: int
    ranking: list[str]
    rows: dict[str, FloatArray] = field(default_factory=dict)
    """Input values of this slice by sender (``length`` float32 each)."""
    failed: set[str] = field(default_factory=set)
    """Senders whose slice could not be fetched."""
    rank: dict[str, int] = field(default_factory=dict)
    """``ranking`` inverted (peer -> rank): an O(1) look-up per board message."""
    senders: frozenset[str] | None = None
    """A chained step's group of senders (``None``: every roster peer)."""
    step: int | None = None
    """A chained step's board index ``k·G + j`` when it writes a partial sum (``None``: the
    step writes the slice record)."""
    j: int = 0
    """A chained step's place in its slice's chain."""

    def __post_init__(self) -> None:
        self.rank = {peer: r for r, peer in enumerate(self.ranking)}
