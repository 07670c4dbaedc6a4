"""Settings, update rule and outcome of regional rounds (:mod:`.regional`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from multiformats import CID

from ..._types import CIDLike, FloatArray
from ...cid import parse_cid
from ...cometbft.abci import RoundsGenesis
from ...errors import ConfigError
from ...formats.agreed.roster import Roster
from ...formats.pubsub import session_topic
from ...formats.regional import COMBINES, MAX_REGION_CHARS, MAX_REGIONS, Combine, region_session
from ...tensor.regional import combine_region_means, region_mean
from ..agreed.config import CONTROLS, AgreedConfig, Control
from ..agreed.control import rounds_genesis

__all__ = [
    "REGION_MEAN",
    "RegionMeanRule",
    "RegionalConfig",
    "RegionalRoundResult",
    "combine_regions",
    "regional_topic",
    "votes_needed",
]


class RegionMeanRule:
    """The region rounds' update rule: the new "model" is the roster's weighted mean.

    A region's agreed session holds its last aggregate as its model; each round replaces it
    by :func:`~gradfed_ipfs.tensor.regional.region_mean` of the roster's contributions (roster
    order, roster weights), whatever the model was: the round record's ``result`` is the
    region's aggregate.
    """

    LABEL: Final = "regional-mean"

    def label(self, round_number: int) -> str:
        """Return ``"regional-mean"`` (the region records' ``rule``)."""
        return self.LABEL

    def apply(
        self,
        model: FloatArray,
        roster: Roster,
        gradients: Sequence[FloatArray],
        learning_rate: float,
        state: FloatArray | None,
    ) -> tuple[FloatArray, FloatArray | None]:
        """Return ``(region_mean(gradients, roster weights), None)``; ``model`` is unused."""
        return region_mean(gradients, [entry.weight for entry in roster.entries]), None


REGION_MEAN: Final = RegionMeanRule()


def regional_topic(session: str, genesis: CIDLike) -> str:
    """Return the top-level topic: ``gradfed/v1/<session>/regional/<genesis>``."""
    return session_topic(f"{session}/regional/{parse_cid(genesis)}")


def combine_regions(
    combine: Combine,
    means: Mapping[str, FloatArray],
    weight_sums: Mapping[str, int],
    allowed: Sequence[str] = (),
) -> FloatArray:
    """Combine region aggregates as ``combine`` says (the formula is :mod:`tensor.regional`'s).

    ``hierarchical`` weighs each region 1, ``weighted`` by its weight total, ``in-regions``
    by its weight total over the ``allowed`` regions only.
    """
    if combine == "in-regions":
        means = {r: v for r, v in means.items() if r in set(allowed)}
    return combine_region_means(means, None if combine == "hierarchical" else weight_sums)


def votes_needed(members: int, min_peers: int | None = None) -> int:
    """Return the votes a region record needs: more than half of ``members``, ``min_peers`` least.

    ``min_peers`` is capped at ``members``; ``None`` means all of them (the regions' default).
    """
    quorum = members if min_peers is None else min(min_peers, members)
    return max(members // 2 + 1, quorum)


@dataclass(frozen=True)
class RegionalConfig:
    """Settings every peer of a regional session shares (times in seconds).

    Attributes
    ----------
    regions
        Peer ID → region, for every member.
    combine
        ``hierarchical`` (unweighted mean of region aggregates), ``weighted`` (by each
        region's weight total: the flat weighted mean) or ``in-regions`` (weighted, ``allowed``
        regions only; the others' data never leaves them).
    allowed
        The regions combined by ``in-regions`` (required there, refused otherwise).
    min_peers
        Least contributions a region's roster lists (capped at the region's size); default
        all of the region's members. A region record counts only with signed votes of more
        than half of its region's members and at least ``min_peers``
        (:meth:`votes_needed`).
    collect_timeout, takeover_timeout, announce_interval, max_announce_interval, fetch_timeout
        As in :class:`~gradfed_ipfs.federated.agreed.config.AgreedConfig`, per region.
    round_timeout
        Bound on each region's roster, and on hearing every combined region's record.
    control
        Where each region decides its rounds: ``"pubsub"``, or ``"cometbft"``: a chain of
        the region's members per region (:meth:`chain_genesis`; each peer passes its own
        validator to :class:`~.session.RegionalSession`). The votes and the combine stay on
        the top-level pubsub topic: with every region's record final on its chain, honest
        members of a region all vote for the same record.
    """

    regions: Mapping[str, str]
    combine: Combine = "hierarchical"
    allowed: tuple[str, ...] = ()
    min_peers: int | None = None
    collect_timeout: float = 10.0
    takeover_timeout: float = 5.0
    round_timeout: float = 60.0
    announce_interval: float = 0.25
    max_announce_interval: float = 1.0
    fetch_timeout: float = 30.0
    control: Control = "pubsub"
    _members: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        members: dict[str, list[str]] = {}
        for peer, region in self.regions.items():
            if not isinstance(region, str) or not 0 < len(region) <= MAX_REGION_CHARS:
                raise ConfigError(f"region of {peer} must be 1..{MAX_REGION_CHARS} characters")
            if "/" in region:
                raise ConfigError(f"region {region!r} must not contain '/'")
            members.setdefault(region, []).append(peer)
        if not members or len(members) > MAX_REGIONS:
            raise ConfigError(f"regions must map peers to 1..{MAX_REGIONS} regions")
        if self.combine not in COMBINES:
            raise ConfigError(f"combine must be one of {COMBINES}, got {self.combine!r}")
        allowed = tuple(sorted(set(self.allowed)))
        if (self.combine == "in-regions") != bool(allowed):
            raise ConfigError("allowed regions are given exactly when combine is 'in-regions'")
        if allowed and not set(allowed) & set(members):
            raise ConfigError(f"no peer is in an allowed region {allowed}")
        if self.min_peers is not None and self.min_peers < 1:
            raise ConfigError(f"min_peers must be >= 1, got {self.min_peers}")
        if self.control not in CONTROLS:
            raise ConfigError(f"control must be one of {CONTROLS}, got {self.control!r}")
        object.__setattr__(self, "allowed", allowed)
        object.__setattr__(self, "regions", dict(self.regions))
        object.__setattr__(self, "_members", {r: tuple(sorted(p)) for r, p in members.items()})
        self.agreed(next(iter(members)))  # checks the times once

    @property
    def region_names(self) -> tuple[str, ...]:
        """Every region with a member, sorted."""
        return tuple(sorted(self._members))

    @property
    def combined(self) -> tuple[str, ...]:
        """The regions whose aggregates enter the result, sorted."""
        if self.combine == "in-regions":
            return tuple(r for r in self.region_names if r in self.allowed)
        return self.region_names

    def members(self, region: str) -> tuple[str, ...]:
        """Return the peers of ``region``, sorted."""
        return self._members[region]

    def votes_needed(self, region: str) -> int:
        """Return the signed votes a record of ``region`` needs (:func:`votes_needed`)."""
        return votes_needed(len(self._members[region]), self.min_peers)

    def agreed(self, region: str) -> AgreedConfig:
        """Return the agreed-session settings of ``region`` (its members, the region rule)."""
        members = self._members[region]
        quorum = None if self.min_peers is None else min(self.min_peers, len(members))
        return AgreedConfig(
            members=members,
            min_peers=quorum,
            collect_timeout=self.collect_timeout,
            takeover_timeout=self.takeover_timeout,
            round_timeout=self.round_timeout,
            announce_interval=self.announce_interval,
            max_announce_interval=self.max_announce_interval,
            fetch_timeout=self.fetch_timeout,
            rule=REGION_MEAN,
            model_every=1,  # the other regions fetch each round's region mean by its CID
            control=self.control,
        )

    def chain_genesis(self, session: str, genesis: CIDLike, region: str) -> RoundsGenesis:
        """Return the genesis of ``region``'s round chain (``control="cometbft"``).

        Its validators are the region's members (bind each to its peer ID as for an agreed
        session); the chain decides the rounds of the region session
        :func:`~gradfed_ipfs.formats.regional.region_session` names.
        """
        chain = region_session(session, region)
        return rounds_genesis(chain, parse_cid(genesis), self.agreed(region))


@dataclass(frozen=True)
class RegionalRoundResult:
    """The outcome of one regional round on this peer.

    Attributes
    ----------
    round
        Round number.
    region
        This peer's region.
    region_record, region_roster, region_result
        Its region's agreed-round record CID, roster and aggregate CID.
    regions
        ``(region, record CID)`` of every combined region, sorted.
    result
        The combined aggregate's CID (the same on every honest peer).
    record
        The top-level :class:`~gradfed_ipfs.formats.regional.RegionalRecord`'s CID.
    aggregate
        The combined aggregate, float32 ``(d,)``.
    rejected
        Peer → reason, for region records refused this round.
    seconds
        Wall time of the round.
    """

    round: int
    region: str
    region_record: CID
    region_roster: Roster
    region_result: CID
    regions: tuple[tuple[str, CID], ...]
    result: CID
    record: CID
    aggregate: FloatArray
    rejected: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
