"""The cheap checks of slice results, run by every peer once all slice records are committed.

:func:`check_slices` returns the slices whose check fails; the caller recomputes each from the
contribution blocks and proves a lie with a fraud record if the CID differs. Both checks share
one seed, the hash of all slice-record CIDs (:func:`~.slices.projection_seed`), unknown to every
reducer when it commits.

``fedavg``: random projections. Every peer publishes ``⟨z_k, g_i[k]⟩`` for every slice ``k``
(N floats) and checks ``⟨z_k, R_k⟩`` against ``⟨z_k, base_k⟩ + lr·Σ (w_i/W)⟨z_k, g_i[k]⟩``
within float32 rounding (:func:`~.slices.projection_tolerance`).

``median`` and ``trimmed_mean``: spot checks. These rules are not linear, but they are
coordinate-wise, so a slice result can be re-derived exactly at a few coordinates from the
inputs' values there. For each slice ``k`` of length ``L = d/N`` every peer takes the same
``s`` distinct coordinates (:func:`spot_indices`, :func:`spot_count`), publishes its own values
at them (``s·N`` floats in one ``proj`` message: :func:`spot_values`), recomputes the rule
there from the inputs' published values (:func:`~.slices.reduce_values`, the same formula, so
an honest slice matches bit for bit) and compares with the slice result.

Detection. A reducer that alters ``m`` of the ``L`` values of its slice escapes the ``s``
samples with probability ``C(L−m, s) / C(L, s) ≤ (1 − m/L)^s``: at ``s = 64`` about 0.1 %
when it alters a tenth of the slice, ``10⁻¹⁹`` when it alters half (altering every value, as
adding ε does, is always caught). The coordinates are the same for every checker (one seed),
so this is the round's chance, not each peer's. Caveat: the reducer that commits last knows
every other record; by re-making its lie ``G`` times (each changes the seed) it escapes with
probability about ``G·(1 − m/L)^s``, so only lies of few values can be ground past the check
(``(1 − m/L)^64 ≥ 2⁻²⁰`` needs ``m/L ≤ 20 %``). Verification afterwards
(:func:`~.agreed_history.verify_agreed_round`) catches every lie.

A peer that publishes false values at its own coordinates cannot frame an honest reducer: the
mismatch costs one slice recompute from the contribution blocks, which gives the honest CID, so
no fraud record follows. The false values differ from that peer's block at the sampled
coordinates (its projection from its slice), which is how it is told apart:
:meth:`SliceCheck.false_publishers` names it, and the round's result lists it in
``false_values``. It is not excluded from later rosters: its message is not a block anyone can
re-check, so only the peers that saw it know (on a signing board its signed values are kept
in the round's ``evidence``).

A slice's author is the one sender whose false values could hide a lie (its own rows of the
slice are held by nobody else): :class:`AuthorCheck` has another peer compute them from its
blocks, so a reducer that shifts its own check value by the projection of its lie is caught.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Final

import numpy as np
from multiformats import CID
from numpy.typing import NDArray

from ..._types import FloatArray
from ...formats.sliced.slices import Checked, SliceMessage, SliceRecord
from .plan import projection, projection_tolerance, projection_vector, reduce_values
from .transport import MemorySliceBoard

__all__ = [
    "SPOT_SAMPLES",
    "VERIFIERS",
    "AuthorCheck",
    "CheckPlan",
    "CheckWait",
    "SliceCheck",
    "check_slices",
    "spot_count",
    "spot_indices",
    "spot_values",
]

VERIFIERS: Final = 1
"""Peers that fetch a one-level slice author's rows to compute its own check values (see
:class:`AuthorCheck`): the next-ranked peer of its slice, ``d/N`` values a round for each
peer. One liar is caught; a liar colluding with its verifier is not (each verifier more costs
every peer ``d/N`` values a round)."""
SPOT_SAMPLES: Final = 64
"""Coordinates sampled per slice (fewer when ``s·N`` would exceed one message's 1024 values)."""
_MAX_VALUES: Final = 1024


def spot_count(slices: int) -> int:
    """Return ``s``, the coordinates sampled per slice for a round of ``slices`` slices."""
    return max(1, min(SPOT_SAMPLES, _MAX_VALUES // max(1, slices)))


def spot_indices(seed: bytes, k: int, length: int, count: int) -> NDArray[np.int64]:
    """Return ``min(count, length)`` distinct sorted coordinates of slice ``k`` from ``seed``."""
    rng = np.random.default_rng(
        int.from_bytes(hashlib.sha256(b"gradfed/spot\0" + seed + k.to_bytes(8, "big")).digest())
    )
    chosen = rng.choice(length, size=min(count, length), replace=False)
    return np.sort(chosen.astype(np.int64))


def spot_values(
    own: FloatArray, ranges: Sequence[tuple[int, int]], indices: Sequence[NDArray[np.int64]]
) -> tuple[float, ...]:
    """Return this peer's values at every slice's sampled coordinates, slice by slice."""
    parts = [own[offset + ix] for (offset, _), ix in zip(ranges, indices, strict=True)]
    return tuple(float(v) for v in np.concatenate(parts)) if parts else ()


async def _exchange(
    board: MemorySliceBoard,
    peer: str,
    roster_cid: CID,
    mine: tuple[float, ...],
    inputs: set[str],
    timeout: float,
    stall: float | None = None,
    checked: tuple[Checked, ...] = (),
) -> dict[str, SliceMessage]:
    """Publish this peer's check values; return every sender's first ``proj`` message.

    It returns once ``inputs``' are in; ``checked`` are the values this peer computed for
    other senders, published with its own.

    A sender gone since its commit publishes none: the wait ends after ``timeout`` s, or
    (``stall``) once another input's values arrived and then none for ``stall`` s: the values
    come in a burst once the slices are known, and a straggler's are computed from its blocks.
    """
    await board.publish(
        SliceMessage("proj", peer, roster_cid, cid=None, values=mine, checked=checked)
    )

    found: dict[str, SliceMessage] = {}
    read: tuple[list[SliceMessage], int] = ([], 0)  # the board's list, and how far it was read

    def published() -> dict[str, SliceMessage]:
        # Runs on every board message: read only what was added (forget() makes a new list).
        nonlocal read
        messages, start = board.messages, read[1]
        if messages is not read[0]:
            found.clear()
            start = 0
        for m in messages[start:]:  # a peer's first values count
            if m.kind == "proj" and m.roster == roster_cid and len(m.values) == len(mine):
                found.setdefault(m.sender, m)
        read = (messages, len(messages))
        return dict(found)

    others = inputs - {peer}

    def progress() -> tuple[int, bool]:
        """How many other inputs' values are in, and whether every input's is."""
        found = set(published())
        return len(others & found), inputs <= found

    deadline = time.monotonic() + timeout
    count, complete = progress()
    while not complete:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        window = left if stall is None or count == 0 else min(left, stall)
        last = count

        def moved(last: int = last) -> bool:
            n, done = progress()
            return n > last or done

        await board.wait_for(moved, window)
        count, complete = progress()
        if not complete and count == last and window < left:
            break  # no progress for ``stall`` s: the rest are not waited for
    return published()


@dataclass(frozen=True)
class SliceCheck:
    """What :func:`check_slices` found: failed slices, and every sender's published values."""

    suspects: list[int]
    """Slices whose check failed (the caller recomputes them)."""
    published: Mapping[str, tuple[float, ...]]
    zs: Sequence[NDArray[np.float64]]
    """Fedavg: each slice's projection vector (empty for the robust rules)."""
    indices: Sequence[NDArray[np.int64]]
    """Robust rules: each slice's sampled coordinates (empty for fedavg)."""
    starts: Sequence[int]
    """Robust rules: where each slice's values begin in a sender's published values."""
    false: frozenset[str] = frozenset()
    """Authors whose own check values of a slice they wrote were false (their blocks say
    otherwise; ``published`` holds the true ones), and verifiers whose values were."""

    def false_publishers(self, k: int, rows: Mapping[str, FloatArray]) -> list[str]:
        """Senders whose published values for slice ``k`` are not those of their slice ``rows``.

        ``rows`` are the inputs' slice-``k`` values as fetched from their contribution blocks
        (a recompute's). A projection is compared within float64 summation slack, a spot value
        exactly.
        """
        false = []
        for peer, row in rows.items():
            said = self.published.get(peer)
            if said is None:
                continue
            if self.zs:
                z = self.zs[k]
                slack = 2.0**-40 * projection(np.abs(z), np.abs(row)) + 1e-12
                if abs(said[k] - projection(z, row)) > slack:
                    false.append(peer)
                continue
            ix, start = self.indices[k], self.starts[k]
            values = np.asarray(said[start : start + len(ix)], np.float32)
            if values.tobytes() != np.ascontiguousarray(row[ix], np.float32).tobytes():
                false.append(peer)
        return sorted(false)


@dataclass(frozen=True)
class CheckPlan:
    """What :func:`check_slices` checks: one round's slices and how they were reduced.

    ``ranges`` are the slices' ``(offset, length)``; ``rule`` is the round's (not the
    records': a lying record may name another); ``weights`` the roster's; ``seed`` the
    round's check seed (:func:`~.slices.projection_seed`).
    """

    roster_cid: CID
    weights: Mapping[str, int]
    base: FloatArray
    ranges: Sequence[tuple[int, int]]
    seed: bytes
    rule: str
    learning_rate: float


@dataclass(frozen=True)
class CheckWait:
    """How long :func:`check_slices` waits for the inputs' values, and what it does without.

    Waits at most ``timeout`` s. An input that published no values (gone since its commit, or
    withholding them so that a colluding reducer's slice goes unchecked) is fetched whole with
    ``fetch_absent`` (names → d float32 values each; fetches that fail are left out) and its
    values computed here. Inputs in ``silent`` (reducers whose slice another peer had to take
    over: likely gone) are not waited for when ``fetch_absent`` is given, nor, with ``stall``,
    inputs still silent ``stall`` s after the last other input's values arrived (a peer dead
    since it announced its slice).
    """

    timeout: float
    fetch_absent: Callable[[set[str]], Awaitable[dict[str, FloatArray]]] | None = None
    silent: frozenset[str] = frozenset()
    stall: float | None = None


Projector = Callable[[int, FloatArray], float]
"""``project(k, v)``: ``⟨z_k, v⟩`` of a ``length``-value vector of slice ``k`` (fedavg)."""


@dataclass(frozen=True)
class AuthorCheck:
    """The check of the check values of each slice's authors, which they cannot tune.

    A sender's check values are its own word. For the members that wrote a slice (its
    record's and, chained, its partial sums' announcers) that word would let a lie through:
    the author shifts its own value of the slice by the projection of its lie, and nobody
    else holds its rows of that slice. So another member computes the author's values of the
    slice from its rows: one level, the next :data:`VERIFIERS` peers of the slice's ranking
    fetch them from its contribution blocks (``d/N`` values; each peer verifies about one
    author a round); chained, the announcer of the step that reads the author's group already
    holds them (and when that is the author itself, the step's next-ranked peer fetches
    ``d/S``). The verifier publishes what it computes with its own check values. Every peer
    compares: when a verifier's values and the author's differ, it fetches the author's rows
    itself and uses the values they give, so the slice's check fails and its recompute proves
    the lie; the one of the two whose values were false is reported
    (:attr:`SliceCheck.false`). A verifier's lie costs a fetch, never an honest author's
    slice.

    Attributes
    ----------
    verifiers
        ``(k, author)`` → the peers whose computed values count for that pair.
    rows
        ``(k, author)`` → the author's slice-``k`` values (float32) this peer fetched: the
        pairs it verifies.
    fetch_row
        Fetches an author's slice-``k`` values when a pair is disputed (``None``: failed).
    alter
        A fault hook: the check values this peer publishes instead of its true ones, given
        the slices' :data:`Projector` (:meth:`~.faults.SliceFaults.check_values`).
    """

    verifiers: Mapping[tuple[int, str], frozenset[str]]
    rows: Mapping[tuple[int, str], FloatArray]
    fetch_row: Callable[[int, str], Awaitable[FloatArray | None]]
    alter: Callable[[tuple[float, ...], Projector], tuple[float, ...]] | None = None


def _same(a: Sequence[float], b: Sequence[float]) -> bool:
    """Return whether two honest computations of check values agree.

    The same code and inputs give the same bits; the slack is for another platform's float64
    summation order.
    """
    return len(a) == len(b) and all(
        abs(x - y) <= 2.0**-30 * (abs(x) + abs(y)) + 1e-12 for x, y in zip(a, b, strict=True)
    )


@dataclass(frozen=True)
class _Samples:
    """Each slice's projection vector (fedavg) or sampled coordinates (robust rules)."""

    zs: list[NDArray[np.float64]]
    indices: list[NDArray[np.int64]]
    starts: list[int]

    @classmethod
    def of(cls, plan: CheckPlan) -> _Samples:
        ranges = plan.ranges
        if plan.rule == "fedavg":
            zs = [projection_vector(plan.seed, k, n) for k, (_, n) in enumerate(ranges)]
            return cls(zs, [], [])
        count = spot_count(len(ranges))
        indices = [spot_indices(plan.seed, k, n, count) for k, (_, n) in enumerate(ranges)]
        return cls([], indices, [int(x) for x in np.cumsum([0, *(len(ix) for ix in indices)])])

    def span(self, k: int) -> slice:
        """Return where slice ``k``'s values are in a sender's check values."""
        return slice(k, k + 1) if self.zs else slice(self.starts[k], self.starts[k + 1])

    def slice_values(self, k: int, row: FloatArray) -> tuple[float, ...]:
        """Return the check values of slice ``k`` of an honest sender whose slice is ``row``."""
        if self.zs:
            return (projection(self.zs[k], row),)
        return tuple(float(v) for v in row[self.indices[k]])

    def project(self, k: int, values: FloatArray) -> float:
        """Return ``⟨z_k, values⟩`` (fedavg; 0.0 for the robust rules)."""
        return projection(self.zs[k], values) if self.zs else 0.0

    def values_of(self, plan: CheckPlan, vector: FloatArray) -> tuple[float, ...]:
        """Return the check values an honest sender of ``vector`` (d values) publishes."""
        if plan.rule == "fedavg":
            return tuple(
                projection(z, vector[o : o + n])
                for z, (o, n) in zip(self.zs, plan.ranges, strict=True)
            )
        return spot_values(vector, plan.ranges, self.indices)

    @staticmethod
    def weighted_means(
        plan: CheckPlan, names: list[str], seen: Mapping[str, tuple[float, ...]], ks: list[int]
    ) -> NDArray[np.float64]:
        """Return ``Σ (w_i / W) · seen[i][k]`` over ``names`` for each slice of ``ks`` (fedavg).

        One matrix-vector product for every slice of a set of inputs, not a Python sum per
        slice (N·S terms a peer); the check's tolerance dwarfs the summation order's rounding.
        """
        weights = np.array([plan.weights[name] for name in names], np.float64)
        values = np.array([seen[name] for name in names], np.float64)  # (inputs, slices)
        means: NDArray[np.float64] = np.einsum(
            "i,ij->j", weights / weights.sum(), values.reshape(len(names), -1)[:, ks]
        )
        return means

    def fails(
        self,
        plan: CheckPlan,
        k: int,
        names: list[str],
        seen: Mapping[str, tuple[float, ...]],
        result: FloatArray,
        mean: float = 0.0,
    ) -> bool:
        """Return whether slice ``k``'s ``result`` fails the check against ``seen`` values.

        ``mean``: fedavg's :meth:`weighted_means` of slice ``k`` (the robust rules ignore it).
        """
        (lo, n), weights = plan.ranges[k], plan.weights
        base = plan.base
        if plan.rule == "fedavg":
            z = self.zs[k]
            expected = projection(z, base[lo : lo + n]) + plan.learning_rate * mean
            got = projection(z, result)
            return bool(abs(got - expected) > projection_tolerance(z, result, base[lo : lo + n]))
        ix, a, b = self.indices[k], self.starts[k], self.starts[k + 1]
        rows = [np.asarray(seen[name][a:b], np.float32) for name in names]
        want = reduce_values(
            plan.rule, base[lo + ix], rows, [weights[name] for name in names], plan.learning_rate
        )
        return want.tobytes() != np.ascontiguousarray(result[ix]).tobytes()


async def check_slices(
    board: MemorySliceBoard,
    peer: str,
    plan: CheckPlan,
    own: FloatArray,
    records: Sequence[SliceRecord],
    results: Sequence[FloatArray],
    wait: CheckWait,
    authors: AuthorCheck | None = None,
) -> SliceCheck:
    """Publish this peer's check values, wait for the inputs', return the slices that fail.

    ``records`` and ``results`` are the slices' chosen slice records and result values
    (float32, ``length`` each); ``own`` this peer's gradient. A slice an input still has no
    values for (see :class:`CheckWait`) is not checked. ``authors``: the check of the slice
    authors' own values (``None``: every sender's values taken on its word).
    """
    samples = _Samples.of(plan)
    inputs = {name for record in records for name in map(itemgetter(0), record.inputs)}
    fetch_absent = wait.fetch_absent
    awaited = inputs - wait.silent if fetch_absent is not None else inputs
    stall = wait.stall if fetch_absent is not None else None  # else waiting is the only way
    mine = samples.values_of(plan, own)
    checked: tuple[Checked, ...] = ()
    if authors is not None:
        if authors.alter is not None:
            mine = authors.alter(mine, samples.project)
        checked = tuple(
            (k, name, samples.slice_values(k, row))
            for (k, name), row in sorted(authors.rows.items())
        )
    messages = await _exchange(
        board, peer, plan.roster_cid, mine, awaited, wait.timeout, stall, checked
    )
    seen = {name: m.values for name, m in messages.items()}
    absent = inputs - set(seen)
    computed: set[str] = set()  # values computed here from blocks: nothing to dispute
    if absent and fetch_absent is not None:
        fetched = await fetch_absent(absent)
        seen = {**seen, **{name: samples.values_of(plan, v) for name, v in fetched.items()}}
        computed = set(fetched)
    false: set[str] = set()
    if authors is not None:
        false = await _check_authors(samples, seen, messages, authors, computed, peer)
    suspects = _suspects(plan, samples, records, results, seen)
    return SliceCheck(suspects, seen, samples.zs, samples.indices, samples.starts, frozenset(false))


def _suspects(
    plan: CheckPlan,
    samples: _Samples,
    records: Sequence[SliceRecord],
    results: Sequence[FloatArray],
    seen: Mapping[str, tuple[float, ...]],
) -> list[int]:
    """Return the slices whose result fails its check (those with every input's values)."""
    by_inputs: dict[tuple[str, ...], list[int]] = {}
    heard = seen.keys()
    for k, record in enumerate(records):
        inputs = tuple(map(itemgetter(0), record.inputs))
        if heard >= set(inputs):  # else unverifiable: kept as announced
            by_inputs.setdefault(inputs, []).append(k)
    suspects = []
    for key, ks in by_inputs.items():  # slices of one exclusion set share their inputs
        names = list(key)
        means = samples.weighted_means(plan, names, seen, ks) if samples.zs else np.zeros(len(ks))
        for k, mean in zip(ks, means.tolist(), strict=True):
            if samples.fails(plan, k, names, seen, results[k], mean):
                suspects.append(k)
    return sorted(suspects)


async def _check_authors(
    samples: _Samples,
    seen: dict[str, tuple[float, ...]],
    messages: Mapping[str, SliceMessage],
    authors: AuthorCheck,
    computed: set[str],
    peer: str,
) -> set[str]:
    """Settle the authors' disputed check values (see :class:`AuthorCheck`) in ``seen``.

    Returns the peers whose values were false: an author whose own values its blocks
    contradict (``seen`` then holds the true ones), or a verifier whose did.
    """
    claims: dict[tuple[int, str], dict[str, tuple[float, ...]]] = {}
    for sender, message in messages.items():
        for k, name, values in message.checked:
            if sender in authors.verifiers.get((k, name), ()):
                claims.setdefault((k, name), {}).setdefault(sender, values)
    false: set[str] = set()
    for (k, name), heard in sorted(claims.items()):
        said = seen.get(name)
        if said is None or name in computed or name == peer:
            continue  # not an input, or its values come from its blocks already
        span = samples.span(k)
        if all(_same(values, said[span]) for values in heard.values()):
            continue
        row = authors.rows.get((k, name))
        if row is None:
            row = await authors.fetch_row(k, name)
        if row is None:
            continue  # its blocks are gone: the pair stays as published
        true = samples.slice_values(k, row)
        if not _same(true, said[span]):
            false.add(name)
            seen[name] = said[: span.start] + true + said[span.stop :]
        false.update(v for v, values in heard.items() if not _same(values, true))
    return false
