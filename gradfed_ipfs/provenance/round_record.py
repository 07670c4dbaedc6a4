"""Verifiable round records: a hash-linked training history that anyone can re-check.

After each round the round runner commits a dag-cbor :class:`RoundRecord` that links every
contribution's gradient CID with its weight (sample count), records the aggregation method and
its parameters (plus free-form compression and differential-privacy parameters, such as the ε
spent), links the aggregate's CID and the previous round's record. A third party holding only
the last record's CID can re-fetch everything (over bitswap, on Kubo), recompute each aggregate
and compare it with the recorded one: :func:`verify_round` and :func:`verify_history`.

Record (dag-cbor)::

    {"type": "gradfed/round", "version": 1, "session": str, "round": int,
     "contributions": [{"peer": str, "gradient": link, "weight": int|null}, ...],  # by peer
     "aggregation": {"method": "FedAvg", "params": {...}},
     "compression": {...}, "privacy": {...},
     "aggregate": link, "previous": link|null, "timestamp_ms": int}

The aggregation method must be one of :class:`~gradfed_ipfs.tensor.aggregation.AggregationMethod`
(its dataclass fields are the parameters; ``NormBounded.inner`` nests). Recomputation is
bit-exact: the same library aggregates the same float32 inputs in sorted peer-ID order.
An aggregate that had DP noise added (``privacy["noise"]`` true) cannot be recomputed: such a
round is never "verified" but "unverifiable", and a mismatch when its residual is more than the
claimed noise explains (:mod:`~gradfed_ipfs.provenance.round_dp`).
Records are untrusted: a peer listed twice is refused on decode, and :func:`verify_round`
reports every failure (including decode bombs) instead of raising.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from multiformats import CID

from .._types import CIDLike, FloatArray
from ..cid import parse_cid
from ..errors import GradfedError, InvalidGradient, MalformedManifest
from ..formats.records import decode_record, encode_record, require
from ..storage.base import BlockStore
from ..storage.dag import fetch_gradient, put_gradient
from ..tensor.aggregation import AggregationStrategy, Contribution, method_name
from .round_dp import check_dp_claim, dp_claim_problems
from .round_strategy import strategy_from_ipld, strategy_to_ipld

__all__ = [
    "ROUND_RECORD_TYPE",
    "ContributionRef",
    "RoundRecord",
    "RoundVerification",
    "commit_round",
    "strategy_from_ipld",
    "strategy_to_ipld",
    "verify_history",
    "verify_round",
]

ROUND_RECORD_TYPE: Final = "gradfed/round"
"""``type`` field of a round record."""
_VERSION: Final = 1


# --------------------------------------------------------------------------- record


@dataclass(frozen=True)
class ContributionRef:
    """A contribution as recorded: who, which gradient block, with what weight.

    Attributes
    ----------
    peer_id
        The contributing peer.
    gradient_cid
        The gradient's CID (a raw Arrow block, or a chunk manifest).
    weight
        Sample count used as the FedAvg weight, or ``None``.
    """

    peer_id: str
    gradient_cid: str
    weight: int | None = None


@dataclass
class RoundRecord:
    """One round's provenance.

    Attributes
    ----------
    session
        The training session.
    round
        The round number (0 for the first).
    contributions
        The contributions, one per peer.
    aggregation
        The aggregation strategy used.
    aggregate_cid
        The aggregate's CID.
    previous
        The previous round's record CID, ``None`` for round 0.
    compression
        Compression parameters (free-form, dag-cbor-encodable).
    privacy
        Differential-privacy parameters, e.g. ``{"epsilon_spent": 0.4, "delta": 1e-5}``; a
        true ``"noise"`` marks an aggregate that cannot be recomputed.
    timestamp_ms
        Unix milliseconds when the record was made.
    """

    session: str
    round: int
    contributions: list[ContributionRef]
    aggregation: AggregationStrategy
    aggregate_cid: str
    previous: str | None = None
    compression: dict[str, Any] = field(default_factory=dict)
    privacy: dict[str, Any] = field(default_factory=dict)
    timestamp_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    def to_ipld(self) -> dict[str, Any]:
        """Return the dag-cbor record (contributions sorted by peer ID).

        Raises
        ------
        InvalidGradient
            If a peer appears twice or the strategy cannot be recorded.
        """
        peers = [c.peer_id for c in self.contributions]
        if len(set(peers)) != len(peers):
            raise InvalidGradient("a peer appears twice in the round record")
        return {
            "type": ROUND_RECORD_TYPE,
            "version": _VERSION,
            "session": self.session,
            "round": self.round,
            "contributions": [
                {"peer": c.peer_id, "gradient": parse_cid(c.gradient_cid), "weight": c.weight}
                for c in sorted(self.contributions, key=lambda c: c.peer_id)
            ],
            "aggregation": strategy_to_ipld(self.aggregation),
            "compression": dict(self.compression),
            "privacy": dict(self.privacy),
            "aggregate": parse_cid(self.aggregate_cid),
            "previous": None if self.previous is None else parse_cid(self.previous),
            "timestamp_ms": self.timestamp_ms,
        }

    @classmethod
    def from_ipld(cls, record: dict[str, Any], where: str = "round record") -> RoundRecord:
        """Parse a decoded record (see :meth:`to_ipld`).

        Raises
        ------
        MalformedManifest
            If a field is missing or has the wrong type, or a peer appears twice.
        """
        items = require(record, "contributions", list, where)
        contributions: list[ContributionRef] = []
        for item in items:
            if (
                not isinstance(item, dict)
                or not isinstance(item.get("peer"), str)
                or not isinstance(item.get("gradient"), CID)
                or "weight" not in item  # written as null when absent; missing is malformed
                or not (item["weight"] is None or _is_uint(item["weight"]))
            ):
                raise MalformedManifest(f"{where}: bad contribution {item!r:.80}")
            contributions.append(
                ContributionRef(item["peer"], str(parse_cid(item["gradient"])), item["weight"])
            )
        if len({c.peer_id for c in contributions}) != len(contributions):
            # to_ipld refuses it too; verification keys contributions by peer.
            raise MalformedManifest(f"{where}: a peer appears twice in the contributions")
        previous = record.get("previous")
        if previous is not None and not isinstance(previous, CID):
            raise MalformedManifest(f"{where}: previous must be a link or null")
        round_ = require(record, "round", int, where)
        if round_ < 0:
            raise MalformedManifest(f"{where}: negative round")
        return cls(
            session=require(record, "session", str, where),
            round=round_,
            contributions=contributions,
            aggregation=strategy_from_ipld(record.get("aggregation")),
            aggregate_cid=str(parse_cid(require(record, "aggregate", CID, where))),
            previous=None if previous is None else str(parse_cid(previous)),
            compression=require(record, "compression", dict, where),
            privacy=require(record, "privacy", dict, where),
            timestamp_ms=require(record, "timestamp_ms", int, where),
        )

    async def commit(self, store: BlockStore, *, pin: bool = True) -> CID:
        """Store the record as a dag-cbor block and return its CID."""
        return await store.put(encode_record(self.to_ipld()), pin=pin)

    @classmethod
    async def load(cls, cid: CIDLike, store: BlockStore) -> RoundRecord:
        """Fetch, verify and parse a record.

        Raises
        ------
        MalformedManifest
            If the block is not a round record.
        """
        parsed = parse_cid(cid)
        block = await store.get(parsed)
        return cls.from_ipld(decode_record(block, ROUND_RECORD_TYPE, _VERSION), f"round {parsed}")


def _is_uint(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


async def commit_round(  # noqa: PLR0913 - public face: keyword-only round fields
    store: BlockStore,
    *,
    session: str,
    round: int,
    contributions: Mapping[str, ContributionRef | CIDLike],
    aggregation: AggregationStrategy,
    previous: CIDLike | None = None,
    compression: Mapping[str, Any] | None = None,
    privacy: Mapping[str, Any] | None = None,
    timestamp_ms: int | None = None,
) -> tuple[CID, FloatArray]:
    """Run one round: fetch the contributions, aggregate, store the aggregate and the record.

    Parameters
    ----------
    store
        Where gradients are fetched from and the aggregate and record are stored.
    session
        The training session.
    round
        The round number.
    contributions
        Peer ID → :class:`ContributionRef` (with a weight) or just the gradient's CID.
    aggregation
        The strategy.
    previous
        The previous round's record CID.
    compression, privacy
        Parameters to record (see :class:`RoundRecord`).
    timestamp_ms
        Record time; defaults to now.

    Returns
    -------
    tuple[CID, FloatArray]
        The record's CID and the aggregate.
    """
    refs = [
        c if isinstance(c, ContributionRef) else ContributionRef(peer, str(parse_cid(c)))
        for peer, c in contributions.items()
    ]
    aggregate = await _recompute(store, refs, aggregation)
    aggregate_cid = await put_gradient(store, aggregate)
    record = RoundRecord(
        session,
        round,
        refs,
        aggregation,
        str(aggregate_cid),
        None if previous is None else str(parse_cid(previous)),
        dict(compression or {}),
        dict(privacy or {}),
        int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
    )
    return await record.commit(store), aggregate


async def _recompute(
    store: BlockStore, refs: list[ContributionRef], aggregation: AggregationStrategy
) -> FloatArray:
    inputs: dict[str, Contribution] = {}
    for ref in sorted(refs, key=lambda r: r.peer_id):
        values = await fetch_gradient(store, ref.gradient_cid)
        inputs[ref.peer_id] = Contribution.of(values, ref.weight)
    result = aggregation.aggregate(inputs)
    return np.asarray(result, dtype=np.float32)


# --------------------------------------------------------------------------- verification


@dataclass(frozen=True)
class RoundVerification:
    """The outcome of verifying one round record.

    Attributes
    ----------
    record_cid
        The record checked.
    round
        Its round number (``-1`` if the record itself could not be read).
    ok
        Whether everything checked out.
    mismatch
        The first problem found, naming the peer or field; ``None`` when ``ok``.
    recomputed
        Whether the aggregate was recomputed (false for DP-noised aggregates).
    unverifiable
        Why the aggregate could not be checked (a DP noise claim), or ``None``; such a round
        is not ``ok``, but nothing contradicts it either.
    """

    record_cid: str
    round: int
    ok: bool
    mismatch: str | None = None
    recomputed: bool = True
    unverifiable: str | None = None

    @property
    def status(self) -> str:
        """``"verified"``, ``"unverifiable: …"`` or ``"mismatch: …"``."""
        if self.ok:
            return "verified"
        if self.unverifiable is not None:
            return f"unverifiable: {self.unverifiable}"
        return f"mismatch: {self.mismatch}"


async def verify_round(cid: CIDLike, store: BlockStore) -> RoundVerification:
    """Re-fetch a round's contributions and aggregate and recompute the aggregate.

    Every block is re-hashed against its CID by the store. The first problem is reported
    (never raised, whatever the blocks hold): an unreadable record, a contribution that cannot
    be fetched or decoded (naming its peer), an aggregate that cannot be fetched, or a
    recomputed aggregate that differs from the recorded one (with the first differing index).
    A DP-noised aggregate is at best unverifiable (see :mod:`.round_dp`).
    """
    parsed = parse_cid(cid)
    try:
        record = await RoundRecord.load(parsed, store)
    except (GradfedError, RecursionError, MemoryError, OverflowError) as exc:
        return RoundVerification(str(parsed), -1, False, f"record {parsed}: {_reason(exc)}")
    try:
        return await _verify_record(str(parsed), record, store)
    except (GradfedError, RecursionError, MemoryError, OverflowError) as exc:
        return RoundVerification(str(parsed), record.round, False, _reason(exc))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, GradfedError):
        return str(exc)
    return f"{type(exc).__name__} while decoding: {exc!s:.120}"


async def _verify_record(
    record_cid: str, record: RoundRecord, store: BlockStore
) -> RoundVerification:
    def fail(message: str, recomputed: bool = True) -> RoundVerification:
        return RoundVerification(record_cid, record.round, False, message, recomputed)

    keys = {(ref.peer_id, ref.gradient_cid) for ref in record.contributions}
    if len({peer for peer, _ in keys}) != len(record.contributions):
        return fail("a peer appears twice in the contributions (only one would be aggregated)")
    dp_pre_noise = record.privacy.get("pre_noise") if record.privacy.get("noise") else None
    inputs: dict[str, Contribution] = {}
    length: int | None = None
    for ref in [] if dp_pre_noise is not None else record.contributions:
        try:
            values = await fetch_gradient(store, ref.gradient_cid, expected_length=length)
        except GradfedError as exc:
            return fail(f"contribution of peer {ref.peer_id} ({ref.gradient_cid}): {exc}")
        length = values.size
        inputs[ref.peer_id] = Contribution.of(values, ref.weight)
    try:
        aggregate = await fetch_gradient(store, record.aggregate_cid, expected_length=length)
        recorded = np.asarray(aggregate).reshape(-1)
    except GradfedError as exc:
        return fail(f"aggregate {record.aggregate_cid}: {exc}")
    if record.privacy.get("noise"):
        return await _verify_dp_claim(record_cid, record, inputs, recorded, store)
    try:
        expected = np.asarray(record.aggregation.aggregate(inputs), dtype=np.float32)
    except (GradfedError, ValueError, TypeError, ArithmeticError) as exc:
        # The record is untrusted: any failure to recompute is a mismatch, not a crash.
        return fail(f"contributions cannot be aggregated with {record.aggregation!r}: {exc}")
    if expected.size != recorded.size:
        return fail(
            f"aggregate {record.aggregate_cid} has {recorded.size} values, contributions "
            f"aggregate to {expected.size}"
        )
    different = np.flatnonzero(expected.view(np.uint32) != recorded.view(np.uint32))
    if different.size:
        i = int(different[0])
        rule = method_name(record.aggregation) or type(record.aggregation).__name__
        return fail(
            f"aggregate {record.aggregate_cid} differs from the recomputed "
            f"{rule} of peers {sorted(inputs)} at {different.size} "
            f"indices (first {i}: recorded {recorded[i]!r}, recomputed {expected[i]!r})"
        )
    return RoundVerification(record_cid, record.round, True)


async def _verify_dp_claim(
    record_cid: str,
    record: RoundRecord,
    inputs: dict[str, Contribution],
    recorded: FloatArray,
    store: BlockStore,
) -> RoundVerification:
    """Bound a DP noise claim: unverifiable at best, a mismatch if the residual refutes it."""
    link = record.privacy.get("pre_noise")
    pre_noise = None
    if link is not None and not dp_claim_problems(record.privacy):
        try:
            pre_noise = await fetch_gradient(store, parse_cid(link), expected_length=recorded.size)
        except GradfedError as exc:
            return RoundVerification(record_cid, record.round, False, f"pre-noise: {exc}", False)
    mismatch, message = check_dp_claim(
        record.privacy, record.aggregation, inputs, recorded, pre_noise
    )
    if mismatch:
        return RoundVerification(record_cid, record.round, False, message, recomputed=False)
    return RoundVerification(
        record_cid, record.round, False, recomputed=False, unverifiable=message
    )


async def verify_history(
    cid: CIDLike, store: BlockStore, *, stop_at_first_failure: bool = False
) -> list[RoundVerification]:
    """Verify a record and every previous one, back to round 0.

    Besides :func:`verify_round` for each record, the chain itself is checked: the previous
    record must be of the same session and of the round before. Results are newest first.

    Parameters
    ----------
    cid
        The last round's record CID.
    store
        Where to fetch everything.
    stop_at_first_failure
        Stop walking at the first failed round (the walk always stops at an unreadable record).
    """
    results: list[RoundVerification] = []
    current: CIDLike | None = cid
    seen: set[bytes] = set()
    newer: RoundRecord | None = None
    while current is not None:
        parsed = parse_cid(current)
        if bytes(parsed) in seen:  # impossible with hashes, but never loop on a forged store
            results.append(RoundVerification(str(parsed), -1, False, "record chain loops"))
            break
        seen.add(bytes(parsed))
        result = await verify_round(parsed, store)
        if result.round < 0:
            results.append(result)
            break
        try:
            record = await RoundRecord.load(parsed, store)
        except GradfedError as exc:  # read a moment ago; a flaky store must not raise here
            results.append(RoundVerification(str(parsed), -1, False, str(exc)))
            break
        if newer is not None and (
            record.session != newer.session or record.round != newer.round - 1
        ):
            result = RoundVerification(
                str(parsed),
                record.round,
                False,
                f"chain break: round {newer.round} of session {newer.session!r} links round "
                f"{record.round} of session {record.session!r}",
            )
        results.append(result)
        if stop_at_first_failure and not result.ok:
            break
        if record.previous is None and record.round != 0:
            results.append(
                RoundVerification(str(parsed), record.round, False, "history ends before round 0")
            )
            break
        newer, current = record, record.previous
    return results
