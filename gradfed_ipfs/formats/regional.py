"""Regional-round wire form, without I/O: the top-level record of a region-level round.

A regional round (:mod:`gradfed_ipfs.federated.regional.session`) runs one agreed round per region
(its own roster and coordinator); each region's
:class:`~gradfed_ipfs.formats.agreed.roster.AgreedRecord` names its roster and its aggregate. The
top-level combine is one dag-cbor record (keys sorted canonically, CIDs as tag-42 links):

``gradfed.regional-round`` v2
    ``{session, genesis, round, combine, allowed: [region...],
    regions: [[region, record, votes]...], result}``: ``regions`` lists the combined regions'
    records, sorted by region, one per region, each with the CID of its vote set (below);
    ``combine`` is ``hierarchical`` (each region weighs 1), ``weighted`` (each region weighs
    its roster's weight total) or ``in-regions`` (weighted, only the ``allowed`` regions: data
    residency); ``result`` is the combined aggregate's CID. (v1 had no vote sets; it is refused.)

``regional/vote`` statement body (:data:`VOTE_KIND`, signed with
:func:`~gradfed_ipfs.formats.statement.sign_statement`)
    ``{type: "gradfed.region-vote", version: 1, session, genesis, round, region, record}``: a
    region member's word that ``record`` is its region's round-``round`` record.

``gradfed.region-votes`` v1 (a vote set)
    ``{region, record, votes: [statement bytes...]}``: the encoded vote statements for
    ``record``, sorted by author, one per author. Ed25519 signatures are deterministic, so
    the vote set of the same voters is the same bytes (the same CID) on every peer.

Every peer that combines the same region records with the same voters writes byte-identical
records. There is no ``prev`` link here (a peer that missed a round would write another
chain): history is each region record's own ``prev`` chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from multiformats import CID

from ..block import Block
from ..cid import DAG_CBOR, RAW, parse_cid
from ..errors import MalformedManifest
from .agreed.roster import MAX_RECORD_BYTES, MAX_TEXT_CHARS
from .records import decode_record, encode_record, require

__all__ = [
    "COMBINES",
    "MAX_REGIONS",
    "MAX_REGION_CHARS",
    "MAX_VOTES",
    "VOTE_KIND",
    "Combine",
    "RegionVote",
    "RegionVotes",
    "RegionalRecord",
    "region_session",
]

Combine = Literal["hierarchical", "weighted", "in-regions"]
COMBINES: Final[tuple[Combine, ...]] = ("hierarchical", "weighted", "in-regions")
"""How region aggregates combine (see the module docstring)."""
MAX_REGIONS: Final = 256
"""Most regions a record may list."""
MAX_REGION_CHARS: Final = 64
"""Longest region name."""
MAX_VOTES: Final = 1024
"""Most votes a vote set may hold (one per region member)."""
VOTE_KIND: Final = "regional/vote"
"""The statement kind of a region vote."""
_TYPE: Final = "gradfed.regional-round"
_VERSION: Final = 2
_VOTE_TYPE: Final = "gradfed.region-vote"
_VOTES_TYPE: Final = "gradfed.region-votes"


def region_session(session: str, region: str) -> str:
    """Return the agreed-session name of ``region`` in regional session ``session``."""
    return f"{session}/region/{region}"


def _region(value: object, where: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_REGION_CHARS or "/" in value:
        raise MalformedManifest(f"{where}: region is not a short name without '/'")
    return value


def _link(value: object, where: str, codecs: tuple[int, ...]) -> CID:
    if not isinstance(value, CID) or value.codec.code not in codecs:
        raise MalformedManifest(f"{where}: not a CID link of the expected codec")
    return parse_cid(value)


def _sorted_unique(names: list[str], where: str, what: str) -> tuple[str, ...]:
    if names != sorted(set(names)):
        raise MalformedManifest(f"{where}: {what} are not sorted and unique")
    return tuple(names)


@dataclass(frozen=True)
class RegionalRecord:
    """The top-level record of one regional round; see the module docstring for the fields."""

    session: str
    genesis: CID
    round: int
    combine: Combine
    allowed: tuple[str, ...]
    regions: tuple[tuple[str, CID], ...]
    result: CID
    votes: tuple[CID, ...]
    """The vote set of each entry of ``regions`` (same order)."""

    def to_block(self) -> Block:
        """Encode as a dag-cbor block."""
        if len(self.votes) != len(self.regions):
            raise MalformedManifest("a regional record needs one vote set per region")
        return encode_record(
            {
                "type": _TYPE,
                "version": _VERSION,
                "session": self.session,
                "genesis": self.genesis,
                "round": self.round,
                "combine": self.combine,
                "allowed": list(self.allowed),
                "regions": [
                    [region, cid, votes]
                    for (region, cid), votes in zip(self.regions, self.votes, strict=True)
                ],
                "result": self.result,
            }
        )

    @classmethod
    def from_block(cls, block: Block) -> RegionalRecord:
        """Decode and check a regional-round record block.

        Raises
        ------
        MalformedManifest
            If it is too large, not a v1 regional-round record, or a field is out of shape:
            regions not sorted and unique, a region outside ``allowed`` when combining
            in-regions, no region, an unknown ``combine``.
        """
        where = f"regional record {block.cid}"
        if len(block.data) > MAX_RECORD_BYTES:
            raise MalformedManifest(f"{where}: {len(block.data)} bytes is too large")
        record = decode_record(block, _TYPE, _VERSION)
        session, number = _session(record, where), _round(record, where)
        combine = record.get("combine")
        if combine not in COMBINES:
            raise MalformedManifest(f"{where}: combine {combine!r} is not one of {COMBINES}")
        allowed_raw = require(record, "allowed", list, where)
        items = require(record, "regions", list, where)
        if not 0 < len(items) <= MAX_REGIONS or len(allowed_raw) > MAX_REGIONS:
            raise MalformedManifest(f"{where}: 1..{MAX_REGIONS} regions expected")
        allowed = _sorted_unique([_region(a, where) for a in allowed_raw], where, "allowed")
        regions, votes = [], []
        for item in items:
            if not isinstance(item, list) or len(item) != 3:
                raise MalformedManifest(f"{where}: a region entry is not [region, record, votes]")
            regions.append((_region(item[0], where), _link(item[1], where, (DAG_CBOR,))))
            votes.append(_link(item[2], where, (DAG_CBOR,)))
        _sorted_unique([r for r, _ in regions], where, "regions")
        if (combine == "in-regions") != bool(allowed) or (
            allowed and not {r for r, _ in regions} <= set(allowed)
        ):
            raise MalformedManifest(f"{where}: regions and allowed do not match {combine}")
        return cls(
            session=session,
            genesis=_link(record.get("genesis"), where, (RAW, DAG_CBOR)),
            round=number,
            combine=combine,
            allowed=allowed,
            regions=tuple(regions),
            result=_link(record.get("result"), where, (RAW, DAG_CBOR)),
            votes=tuple(votes),
        )


def _session(record: dict[str, Any], where: str) -> str:
    session: str = require(record, "session", str, where)
    if not 0 < len(session) <= MAX_TEXT_CHARS:
        raise MalformedManifest(f"{where}: session is not a short string")
    return session


def _round(record: dict[str, Any], where: str) -> int:
    number: int = require(record, "round", int, where)
    if not 0 <= number < 1 << 53:
        raise MalformedManifest(f"{where}: round is not a non-negative integer")
    return number


@dataclass(frozen=True)
class RegionVote:
    """A region member's vote: ``record`` is ``region``'s round-``round`` record.

    The body of a :data:`VOTE_KIND` statement (its author is the voter).
    """

    session: str
    genesis: CID
    round: int
    region: str
    record: CID

    def encode(self) -> bytes:
        """Return the dag-cbor body bytes."""
        return encode_record(
            {
                "type": _VOTE_TYPE,
                "version": 1,
                "session": self.session,
                "genesis": self.genesis,
                "round": self.round,
                "region": self.region,
                "record": self.record,
            }
        ).data

    @classmethod
    def decode(cls, body: bytes) -> RegionVote:
        """Decode a vote body (already size-bounded by its statement).

        Raises
        ------
        MalformedManifest
            If it is not a v1 region vote or a field is out of shape.
        """
        where = "region vote"
        record = decode_record(Block.new(bytes(body), "dag-cbor"), _VOTE_TYPE)
        return cls(
            session=_session(record, where),
            genesis=_link(record.get("genesis"), where, (RAW, DAG_CBOR)),
            round=_round(record, where),
            region=_region(record.get("region"), where),
            record=_link(record.get("record"), where, (DAG_CBOR,)),
        )


@dataclass(frozen=True)
class RegionVotes:
    """A vote set: the encoded vote statements for ``record``, sorted by author.

    Attributes
    ----------
    region, record
        The region and the region record voted for.
    votes
        Each vote statement's block bytes (``gradfed_ipfs.formats.statement``), in author order;
        whoever reads them decodes and checks each (this class only bounds their shape).
    """

    region: str
    record: CID
    votes: tuple[bytes, ...]

    def to_block(self) -> Block:
        """Encode as a dag-cbor block."""
        return encode_record(
            {
                "type": _VOTES_TYPE,
                "version": 1,
                "region": self.region,
                "record": self.record,
                "votes": list(self.votes),
            }
        )

    @classmethod
    def from_block(cls, block: Block) -> RegionVotes:
        """Decode a vote-set block (size bounded before decoding).

        Raises
        ------
        MalformedManifest
            If it is too large, not a v1 vote set, or holds no vote or too many.
        """
        where = f"vote set {block.cid}"
        if len(block.data) > MAX_RECORD_BYTES:
            raise MalformedManifest(f"{where}: {len(block.data)} bytes is too large")
        record = decode_record(block, _VOTES_TYPE)
        votes = require(record, "votes", list, where)
        if not 0 < len(votes) <= MAX_VOTES or not all(isinstance(v, bytes) for v in votes):
            raise MalformedManifest(f"{where}: 1..{MAX_VOTES} encoded votes expected")
        return cls(
            region=_region(record.get("region"), where),
            record=_link(record.get("record"), where, (DAG_CBOR,)),
            votes=tuple(votes),
        )
