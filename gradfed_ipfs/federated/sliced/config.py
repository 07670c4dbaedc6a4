"""Reduce-scatter settings, a peer's work on one slice, and its result (:mod:`.reduce_scatter`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import overload

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
    backups: int = 16
    """Ranks of a slice (or chained step) that wait for their turn from the phase's start. A
    peer ranked lower for a step joins only if the step has no record ``backups ·
    reducer_timeout`` into the phase: every peer is ranked for each of about N steps, and N
    waiting steps a peer were O(N) work a peer a phase (O(N²) in one process)."""
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


class Rotation(Sequence[str]):
    """One slice's reducer ranking: a shared peer order read from position ``shift`` on.

    Every slice's ranking is a rotation of one hashed order
    (:func:`~.plan.reducer_rankings`), so one order and one position map serve all of a
    round's ``S·G ≈ N`` steps: copying the order and inverting it for each step was O(N²)
    memory and time a peer a round (N³ in a process of N members: gigabytes at N = 1,024).
    Compares equal to a list of the same peers.
    """

    __slots__ = ("_order", "_positions", "_shift")

    def __init__(self, order: tuple[str, ...], positions: Mapping[str, int], shift: int) -> None:
        self._order, self._positions = order, positions
        self._shift = shift % len(order) if order else 0

    def __len__(self) -> int:
        return len(self._order)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        n = len(self._order)
        if isinstance(index, slice):
            return [self._order[(i + self._shift) % n] for i in range(*index.indices(n))]
        if not -n <= index < n:
            raise IndexError("ranking index out of range")
        return self._order[(index % n + self._shift) % n]

    def __iter__(self) -> Iterator[str]:
        order, shift = self._order, self._shift
        return chain(islice(order, shift, None), islice(order, 0, shift))

    def __contains__(self, peer: object) -> bool:
        return peer in self._positions

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=False))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Rotation({list(self)!r})"

    def ranks(self) -> Ranks:
        """Return the ranking inverted (peer -> rank), computed on look-up."""
        return Ranks(self._order, self._positions, self._shift)


class Ranks(Mapping[str, int]):
    """A :class:`Rotation` inverted: ``ranks[peer]`` is the peer's rank, O(1), nothing copied."""

    __slots__ = ("_order", "_positions", "_shift")

    def __init__(self, order: tuple[str, ...], positions: Mapping[str, int], shift: int) -> None:
        self._order, self._positions, self._shift = order, positions, shift

    def __getitem__(self, peer: str) -> int:
        return (self._positions[peer] - self._shift) % len(self._order)

    def __contains__(self, peer: object) -> bool:
        return peer in self._positions

    def __iter__(self) -> Iterator[str]:
        return iter(Rotation(self._order, self._positions, self._shift))

    def __len__(self) -> int:
        return len(self._order)


@dataclass
class SliceWork:
    """One slice as a peer works on it: its place, reducer ranking, and the rows fetched."""

    k: int
    offset: int
    length: int
    ranking: Sequence[str]
    """Reducers of this slice, best first (a :class:`Rotation`, or any sequence)."""
    rows: dict[str, FloatArray] = field(default_factory=dict)
    """Input values of this slice by sender (``length`` float32 each)."""
    failed: set[str] = field(default_factory=set)
    """Senders whose slice could not be fetched."""
    rank: Mapping[str, int] = field(default_factory=dict)
    """``ranking`` inverted (peer -> rank): an O(1) look-up per board message."""
    senders: frozenset[str] | None = None
    """A chained step's group of senders (``None``: every roster peer)."""
    step: int | None = None
    """A chained step's board index ``k·G + j`` when it writes a partial sum (``None``: the
    step writes the slice record)."""
    j: int = 0
    """A chained step's place in its slice's chain."""

    def __post_init__(self) -> None:
        if isinstance(self.ranking, Rotation):
            self.rank = self.ranking.ranks()
        else:
            self.rank = {peer: r for r, peer in enumerate(self.ranking)}
