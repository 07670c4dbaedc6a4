"""Reduce-scatter inside agreed rounds (issue 14): the mode, the root checks, the step, the proof.

An :class:`~gradfed_ipfs.federated.agreed.session.AgreedSession` whose ``aggregation`` is
``"reduce-scatter"`` or ``"auto"`` decides once, at :meth:`start`, with :func:`choose_slicing`:

* ``all-to-all``: every peer fetches every contribution and aggregates the roster itself;
* ``reduce-scatter``: while contributions are collected, peers (the coordinator first) fetch
  only each contribution's **root** (:class:`RootFetcher`: the dag-cbor manifest, checked to
  describe ``d`` values; a small gradient's single raw block whole), so a roster lists only
  contributions whose DAG exists and has the right length. After the roster is adopted,
  :class:`SliceStep` runs :class:`~.reduce_scatter.ReduceScatterPeer` among the roster peers
  (slices fetched chunk by chunk; a chunk that never arrives makes its sender ``missing`` from
  every slice) and the model is the concatenation of the slice results.
* ``auto`` slices only when :func:`~.slices.can_slice` holds for the rule, ``d`` and the
  members and there are at least :data:`AUTO_MIN_MEMBERS` members (else all-to-all, the
  reason logged and reported in each round's result): Krum, Multi-Krum, Bulyan and custom
  rules need whole vectors; small gradients and small sessions are not worth it.
  ``reduce-scatter`` slices any coordinate-wise rule whatever ``d`` (falling back likewise for
  a whole-vector rule).

The round record then also links the slice records (``AgreedRecord.slices``), the fraud
records of lies proven in the round (``frauds``) and every peer proven a liar so far
(``excluded``, permanent within the session: no later roster may list them; see
:func:`proven_liars` for what a fraud record proves);
:func:`sliced_roster` and :func:`check_slice_results` let a verifier re-check them: every slice
record names this round's roster, base, rule and learning rate, the slices tile ``0 … d``,
all exclude the same ``missing`` senders and list every other roster entry in roster order,
and each slice result equals the same values of the recomputed model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypedDict

import numpy as np
from multiformats import CID

from ..._types import FloatArray
from ...cid import RAW, parse_cid
from ...errors import (
    BlockStoreError,
    DecodeError,
    DimensionMismatch,
    InsufficientPeers,
    InvalidGradient,
    RoundVerificationFailed,
)
from ...formats.agreed.roster import AgreedRecord, Roster
from ...formats.pubsub import session_topic
from ...formats.sliced.partials import PartialRecord
from ...formats.sliced.slices import FraudRecord, SliceRecord, split_slice_rule
from ...kubo.pubsub import PubsubTransport
from ...storage.base import BlockStore
from ...storage.dag import fetch_gradient, fetch_manifest
from ...storage.retention import GcGate
from ...tensor.aggregation import AggregationStrategy, Contribution, Median, TrimmedMean
from ..exchange.announcer import Reannouncer
from ..exchange.fetcher import ContributionFetcher
from ..sliced.faults import SliceFaults
from ..sliced.peer import ReduceScatterConfig, ReduceScatterPeer, ReduceScatterResult
from ..sliced.plan import reduce_values, slice_refusal
from ..sliced.proofs import claimed_record, partial_fraud_fits
from ..sliced.retention import SliceBlocks, UnpinnedPuts, keep_slice_blocks
from ..sliced.transport import PubsubSliceBoard
from .config import AgreedConfig, UpdateRule

__all__ = [
    "AUTO_MIN_MEMBERS",
    "RobustRule",
    "RootFetcher",
    "SliceStep",
    "check_slice_results",
    "choose_slicing",
    "proven_liars",
    "slice_report",
    "slice_rule_of",
    "sliced_roster",
    "slices_topic",
]

logger = logging.getLogger("gradfed_ipfs.federated.agreed")

AUTO_MIN_MEMBERS: Final = 8
"""Fewest members for which ``aggregation="auto"`` slices. Measured across processes
(``benchmarks/bench_rounds.py --aggregation``, d = 1M, 2 cores, 2026-12-01): at 3 peers a sliced
round took 1.76x an all-to-all one (three more pubsub steps, N more blocks to put, for 4/3·d
instead of 2·d downloaded), at 8 peers the same (p50 1.22 / 1.20 s); from there on each peer's
download stays ~2·d while all-to-all's grows as (N-1)·d (``bench_load.py``: 5.7x at 16)."""

_NOTHING: Final = np.zeros(0, np.float32)


@dataclass(frozen=True)
class RobustRule:
    """An agreed round's update rule from an aggregation strategy: ``M + lr · strategy(roster)``.

    :class:`~gradfed_ipfs.tensor.aggregation.Median` and
    :class:`~gradfed_ipfs.tensor.aggregation.TrimmedMean` are coordinate-wise: their
    :attr:`slice_rule` lets a round reduce them per slice (:func:`~.slices.reduce_values`, the
    same bits whole or sliced). Other strategies (Krum, Multi-Krum, Bulyan) are applied to whole
    vectors in float64 and force all-to-all rounds. Weights are the roster's; the rule is
    stateless.
    """

    strategy: AggregationStrategy

    @property
    def slice_rule(self) -> str | None:
        """The slice rule this strategy equals (``median``, ``trimmed_mean:<beta>``), or None."""
        if type(self.strategy) is Median:
            return "median"
        if type(self.strategy) is TrimmedMean:
            return f"trimmed_mean:{float(self.strategy.beta)!r}"
        return None

    def label(self, round_number: int) -> str:
        """Return the slice rule, else the strategy's ``repr`` (at most 256 characters)."""
        return self.slice_rule or repr(self.strategy)[:256]

    def apply(
        self,
        model: FloatArray,
        roster: Roster,
        gradients: Sequence[FloatArray],
        learning_rate: float,
        state: FloatArray | None,
    ) -> tuple[FloatArray, FloatArray | None]:
        """Return ``float32(model + lr · strategy(gradients))`` and no state."""
        weights = [e.weight for e in roster.entries]
        sliced = self.slice_rule
        if sliced is not None:
            return reduce_values(sliced, model, gradients, weights, learning_rate), None
        pairs = zip(roster.entries, gradients, strict=True)
        step = self.strategy.aggregate({e.peer: Contribution.of(g, e.weight) for e, g in pairs})
        wide = model.astype(np.float64) + float(learning_rate) * step.astype(np.float64)
        return np.asarray(wide, np.float32).reshape(-1), None


def slice_rule_of(rule: UpdateRule | None, round_number: int = 0) -> str:
    """Return the slice-rule name of an update rule: ``fedavg`` for the default, else its label.

    A rule with a string ``slice_rule`` attribute (:class:`RobustRule`) names it; any other
    rule's label is returned, which :func:`~.slices.can_slice` refuses.
    """
    if rule is None:
        return "fedavg"
    named = getattr(rule, "slice_rule", None)
    return named if isinstance(named, str) else rule.label(round_number)


def choose_slicing(config: AgreedConfig, d: int) -> tuple[str | None, str]:
    """Return ``(slice rule or None for all-to-all, reason)`` for a session on ``d`` values."""
    n = len(config.members)
    if config.aggregation == "all-to-all":
        return None, "all-to-all configured"
    rule = slice_rule_of(config.rule)
    refusal = slice_refusal(rule, d, n)
    if refusal is None and config.aggregation == "auto" and n < AUTO_MIN_MEMBERS:
        refusal = f"{n} members < {AUTO_MIN_MEMBERS}: all-to-all is as fast or faster"
    if split_slice_rule(rule) is None or d < n:
        return None, f"{config.aggregation} falls back to all-to-all: {refusal}"
    if config.aggregation == "auto" and refusal is not None:
        return None, f"auto falls back to all-to-all: {refusal}"
    return rule, f"{config.aggregation}: rule {rule} sliced among up to {n} peers"


class SliceReport(TypedDict):
    """The reduce-scatter fields of an :class:`~.agreed_config.AgreedRoundResult`."""

    aggregation: str
    aggregation_reason: str
    slices: tuple[CID, ...]
    missing: tuple[str, ...]
    liars: tuple[str, ...]


def slice_report(sliced: ReduceScatterResult | None, reason: str) -> SliceReport:
    """Return how a round's model was computed, for its result (``None``: all-to-all)."""
    if sliced is None:
        return SliceReport(
            aggregation="all-to-all", aggregation_reason=reason, slices=(), missing=(), liars=()
        )
    return SliceReport(
        aggregation="reduce-scatter",
        aggregation_reason=reason,
        slices=tuple(sliced.records),
        missing=sliced.missing,
        liars=tuple(sorted(sliced.liars)),
    )


def slices_topic(session: str, genesis: CID) -> str:
    """Return the slice-board topic of an agreed session."""
    return session_topic(f"{session}/slices/{genesis}")


class RootFetcher(ContributionFetcher):
    """A :class:`ContributionFetcher` that checks only a contribution's root.

    A chunked contribution's manifest must describe ``length`` values (its chunks are fetched
    later, slice by slice, by the reducers); a raw block is the whole gradient and is fetched
    and checked like any contribution. The task's value is empty for a manifest.
    """

    async def _fetch(self, cid: CID, length: int) -> FloatArray:
        parsed = parse_cid(cid)
        if parsed.codec.code == RAW:
            return await super()._fetch(parsed, length)
        manifest = await fetch_manifest(self.store, parsed, timeout=self.timeout, max_length=length)
        if manifest.length != length:
            raise DimensionMismatch([length], [manifest.length])
        return _NOTHING


class SliceStep:
    """The reduce-scatter step of one session's peer: its slice board and each round's run.

    Parameters
    ----------
    store
        The peer's (gated) block store.
    pubsub
        Its transport; the board listens on :func:`slices_topic` from :meth:`start` on.
    topic
        The slice-board topic.
    config
        The session's settings.
    rule
        The slice rule (from :func:`choose_slicing`).
    gate
        Under retention, the keeper's gate, held for each whole run (see
        :mod:`.slice_retention`); ``store`` is then the session's own (ungated) store.
    faults
        Test and benchmark hooks passed to each round's
        :class:`~.reduce_scatter.ReduceScatterPeer` (a lying or a dead reducer).
    """

    def __init__(
        self,
        store: BlockStore,
        pubsub: PubsubTransport,
        topic: str,
        config: AgreedConfig,
        rule: str,
        *,
        gate: GcGate | None = None,
        faults: SliceFaults | None = None,
    ) -> None:
        self.store = store
        self.rule = rule
        self.config = config
        self.gate = gate
        self._faults = faults
        self.held: dict[bytes, SliceBlocks] = {}  # roster CID -> what the round left to keep
        self._announcer = Reannouncer(
            pubsub, topic, config.announce_interval, config.max_announce_interval
        )
        self._pubsub = pubsub
        self._topic = topic
        self._board: PubsubSliceBoard | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, peer: str) -> None:
        """Subscribe to the slice board as ``peer`` and start re-announcing."""
        self._board = PubsubSliceBoard(
            self._pubsub,
            self._topic,
            peer,
            members=self.config.members,
            announcer=self._announcer,
        )
        await self._board.__aenter__()
        self._task = asyncio.create_task(self._announcer.run())

    def heard(self, roster_cid: CID) -> bool:
        """Return whether a slice message of ``roster_cid`` has reached this peer's board."""
        return self._board is not None and self._board.filled(roster_cid, 0) > 0

    async def aclose(self) -> None:
        """Stop listening and re-announcing."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._board is not None:
            await self._board.__aexit__(None, None, None)

    async def run(
        self, r: int, roster: Roster, roster_cid: CID, base: FloatArray, own: FloatArray
    ) -> ReduceScatterResult:
        """Reduce-scatter the adopted roster; return this peer's result (model not stored).

        Under retention the round's blocks to keep are left in :attr:`held` (by roster CID).

        Raises
        ------
        InsufficientPeers
            If some slice got no record in time, or every input of a slice is missing.
        """
        if self.gate is None:
            return await self._run(r, roster, roster_cid, base, own, self.store)
        async with self.gate.transfer():  # no collection while the step's blocks are unpinned
            puts = UnpinnedPuts(self.store)
            sliced = await self._run(r, roster, roster_cid, base, own, puts)
            self.held[bytes(roster_cid)] = await keep_slice_blocks(
                self.store, puts, sliced, timeout=self.config.fetch_timeout
            )
        return sliced

    async def _run(
        self,
        r: int,
        roster: Roster,
        roster_cid: CID,
        base: FloatArray,
        own: FloatArray,
        store: BlockStore,
    ) -> ReduceScatterResult:
        if self._board is None:
            raise RuntimeError("SliceStep.start() has not been called")
        self._board.forget(roster_cid)
        config = self.config
        peer = ReduceScatterPeer(
            self._board.peer,
            store,
            self._board,
            ReduceScatterConfig(
                chunk_bytes=config.chunk_bytes,
                rule=self.rule,
                learning_rate=float(config.learning_rate),
                fetch_timeout=config.fetch_timeout,
                reducer_timeout=config.reducer_timeout,
                phase_timeout=config.round_timeout,
                chained=config.chained,
                chain_groups=config.chain_groups,
                max_value=config.max_value,
                packing=config.packing,
            ),
            faults=self._faults,
        )
        try:
            return await peer.run(roster, roster_cid, base, own, put_model=False)
        except (TimeoutError, InvalidGradient) as exc:
            failed = InsufficientPeers(r, len(roster.entries), 0, failures={"slices": str(exc)})
            failed.args = (f"round {r}: reduce-scatter of roster {roster_cid} failed: {exc}",)
            raise failed from exc


async def sliced_roster(store: BlockStore, record: AgreedRecord, roster: Roster) -> Roster:
    """Check a sliced round's slice records against its roster; return the roster they used.

    That is the roster without the senders every slice lists ``missing``.

    Raises
    ------
    RoundVerificationFailed
        If a slice record cannot be fetched, or does not fit the record and roster.
    """
    slices = record.slices or ()
    try:
        loaded = [SliceRecord.from_block(await store.get(cid)) for cid in slices]
    except (BlockStoreError, DecodeError) as exc:
        raise RoundVerificationFailed(f"round {record.round}: {exc}") from exc
    rule = "fedavg" if record.rule is None else record.rule
    missing = loaded[0].missing if loaded else ()
    kept = tuple(e for e in roster.entries if e.peer not in missing)
    inputs = tuple((e.peer, e.contribution) for e in kept)
    offset = 0
    for k, s in enumerate(loaded):
        if (
            bytes(s.roster) != bytes(record.roster)
            or bytes(s.base) != bytes(record.base)
            or (s.k, s.offset) != (k, offset)
            or s.rule != rule
            or s.learning_rate != record.learning_rate
            or s.missing != missing
            or s.inputs != inputs
            or s.weight_sum != sum(e.weight for e in kept)
        ):
            raise RoundVerificationFailed(
                f"round {record.round}: slice record {slices[k]} does not fit its roster"
            )
        offset += s.length
    if not kept or not set(missing) <= set(roster.peers):
        raise RoundVerificationFailed(f"round {record.round}: slices drop unknown or all peers")
    return dataclasses.replace(roster, entries=kept)


async def check_slice_results(store: BlockStore, record: AgreedRecord, model: FloatArray) -> None:
    """Check that each slice record's result is its range of the recomputed ``model``.

    Raises
    ------
    RoundVerificationFailed
        If a result cannot be fetched, or differs, or the slices do not cover ``model``.
    """
    covered = 0
    for cid in record.slices or ():
        try:
            s = SliceRecord.from_block(await store.get(cid))
            values = await fetch_gradient(store, s.result, expected_length=s.length)
        except (BlockStoreError, DecodeError, DimensionMismatch) as exc:
            raise RoundVerificationFailed(f"round {record.round}: slice {cid}: {exc}") from exc
        want = model[s.offset : s.offset + s.length]
        if np.asarray(values, np.float32).reshape(-1).tobytes() != want.tobytes():
            raise RoundVerificationFailed(
                f"round {record.round}: slice record {cid} (slice {s.k}) has a wrong result"
            )
        covered = s.offset + s.length
    if covered != model.size:
        raise RoundVerificationFailed(f"round {record.round}: slices do not cover the model")


async def proven_liars(store: BlockStore, record: AgreedRecord, roster: Roster) -> frozenset[str]:
    """Check a record's fraud records against it; return the reducers they name.

    Each fraud record must name the record's roster, a slice ``k`` whose recorded slice record
    is its ``correct`` one, a roster peer as reducer, and a ``claimed`` slice record of the same
    roster, slice, range and ``missing`` senders with other bytes. An honest reducer of that
    slice writes exactly ``correct`` (which :func:`check_slice_results` re-checks against the
    recomputed model), so ``claimed`` is a lie. In a chained round ``claimed`` may instead be a
    :class:`~gradfed_ipfs.formats.sliced.partials.PartialRecord` of that slice
    (:func:`~.chain_proof.partial_fraud_fits`) whose values
    :func:`~.chain_proof.check_partial_frauds` re-checks from the contributions when the round
    is recomputed (they are not kept under retention). Who announced ``claimed`` is what the peers
    that wrote the record heard (pubsub's authenticated ``from``): blocks cannot prove it, so
    the exclusion is exactly as agreed as the record itself.

    Raises
    ------
    RoundVerificationFailed
        If a fraud record cannot be fetched or decoded, or proves nothing about this round.
    """
    frauds, slices = record.frauds or (), record.slices or ()
    liars = set()

    def place(s: SliceRecord) -> tuple[bytes, int, int, int, tuple[str, ...]]:
        return bytes(s.roster), s.k, s.offset, s.length, s.missing

    for cid in frauds:
        try:
            fraud = FraudRecord.from_block(await store.get(cid))
            block = await store.get(fraud.claimed)
            correct = SliceRecord.from_block(await store.get(fraud.correct))
            claimed = claimed_record(block)  # a chained round's lie may be a partial sum
            if isinstance(claimed, PartialRecord):
                fits = partial_fraud_fits(claimed, correct, roster)
            else:
                fits = place(claimed) == place(correct)
        except (BlockStoreError, DecodeError) as exc:
            raise RoundVerificationFailed(f"round {record.round}: fraud {cid}: {exc}") from exc
        if (
            bytes(fraud.roster) != bytes(record.roster)
            or fraud.k >= len(slices)
            or bytes(slices[fraud.k]) != bytes(fraud.correct)
            or fraud.reducer not in roster.peers
            or correct.k != fraud.k
            or not fits
        ):
            raise RoundVerificationFailed(
                f"round {record.round}: fraud record {cid} does not prove a lie in this round"
            )
        liars.add(fraud.reducer)
    return frozenset(liars)
