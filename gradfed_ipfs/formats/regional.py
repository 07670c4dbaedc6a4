"""Regional-round wire form, without I/O: the top-level record of a region-level round.

A regional round (:mod:`gradfed_ipfs.federated.regional.session`) runs one agreed round per region
(its own roster and coordinator); each region's
:class:`~gradfed_ipfs.formats.roster.AgreedRecord` names its roster and its aggregate. The
top-level combine is one dag-cbor record (keys sorted canonically, CIDs as tag-42 links):

``gradfed.regional-round`` v1
    ``{session, genesis, round, combine, allowed: [region...], regions: [[region, record]...],
    result}``: ``regions`` lists the combined regions' records,
    sorted by region, one per region; ``combine`` is ``hierarchical`` (each region weighs 1),
    ``weighted`` (each region weighs its roster's weight total) or ``in-regions`` (weighted,
    only the ``allowed`` regions: data residency); ``result`` is the combined aggregate's CID.

Every peer that combines the same region records writes byte-identical records. There is no
``prev`` link here (a peer that missed a round would write another chain): history is each
region record's own ``prev`` chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from multiformats import CID

from ..block import Block
from ..cid import DAG_CBOR, RAW, parse_cid
from ..errors import MalformedManifest
from .records import decode_record, encode_record, require
from .roster import MAX_RECORD_BYTES, MAX_TEXT_CHARS

__all__ = [
    "COMBINES",
    "MAX_REGIONS",
    "MAX_REGION_CHARS",
    "Combine",
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
_TYPE: Final = "gradfed.regional-round"


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

    def to_block(self) -> Block:
        """Encode as a dag-cbor block."""
        return encode_record(
            {
                "type": _TYPE,
                "version": 1,
                "session": self.session,
                "genesis": self.genesis,
                "round": self.round,
                "combine": self.combine,
                "allowed": list(self.allowed),
                "regions": [[region, cid] for region, cid in self.regions],
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
        record = decode_record(block, _TYPE)
        session = require(record, "session", str, where)
        if not 0 < len(session) <= MAX_TEXT_CHARS:
            raise MalformedManifest(f"{where}: session is not a short string")
        number = require(record, "round", int, where)
        if not 0 <= number < 1 << 53:
            raise MalformedManifest(f"{where}: round is not a non-negative integer")
        combine = record.get("combine")
        if combine not in COMBINES:
            raise MalformedManifest(f"{where}: combine {combine!r} is not one of {COMBINES}")
        allowed_raw = require(record, "allowed", list, where)
        items = require(record, "regions", list, where)
        if not 0 < len(items) <= MAX_REGIONS or len(allowed_raw) > MAX_REGIONS:
            raise MalformedManifest(f"{where}: 1..{MAX_REGIONS} regions expected")
        allowed = _sorted_unique([_region(a, where) for a in allowed_raw], where, "allowed")
        regions = []
        for item in items:
            if not isinstance(item, list) or len(item) != 2:
                raise MalformedManifest(f"{where}: a region entry is not [region, record]")
            regions.append((_region(item[0], where), _link(item[1], where, (DAG_CBOR,))))
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
        )
