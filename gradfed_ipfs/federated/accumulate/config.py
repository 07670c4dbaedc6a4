"""What one gradient accumulator needs: :class:`AccumulatorConfig` and the default weight cap.

A best-effort round builds it from its :class:`~gradfed_ipfs.federated.besteffort.RoundConfig`
(:meth:`~gradfed_ipfs.federated.besteffort.RoundConfig.accumulator_config`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import ConfigError
from ...tensor.aggregation import AggregationStrategy, SampleWeightedMean

__all__ = ["DEFAULT_MAX_WEIGHT", "AccumulatorConfig"]

DEFAULT_MAX_WEIGHT = 2**20
"""Default cap on one contribution's self-reported sample count (its FedAvg weight), ~1M samples.

A peer's ``num_samples`` is its own claim; without a cap, ``2**62`` makes one peer the whole
FedAvg average. Flower's SecAgg+ has the same ``max_weight`` setting.
"""


@dataclass
class AccumulatorConfig:
    """Settings of a gradient accumulator (the seed calls it ``BackwardPassConfig``).

    Attributes
    ----------
    max_peers
        Most peers whose gradients are accepted (default 8); further peers are refused.
    aggregation
        The aggregation rule (default ``AggregationMethod.FedAvg()``).
    timeout
        Seconds to wait for peers' gradients (default 60.0); fetches and steps are bounded by it.
    gradient_clipping
        L2 max norm applied to the aggregate, or ``None`` for no clipping.
    max_weight
        Largest sample count (FedAvg weight) taken from one contribution (default
        :data:`DEFAULT_MAX_WEIGHT`); larger claims are clipped to it and reported. ``None``: no cap.
    """

    max_peers: int = 8
    aggregation: AggregationStrategy = field(default_factory=SampleWeightedMean)
    timeout: float = 60.0
    gradient_clipping: float | None = None
    max_weight: int | None = DEFAULT_MAX_WEIGHT

    def __post_init__(self) -> None:
        if self.max_peers < 1:
            raise ConfigError(f"max_peers must be >= 1, got {self.max_peers}")
        if not self.timeout > 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.gradient_clipping is not None and not self.gradient_clipping >= 0:
            raise ConfigError(f"gradient_clipping must be >= 0, got {self.gradient_clipping}")
        if self.max_weight is not None and self.max_weight < 1:
            raise ConfigError(f"max_weight must be >= 1, got {self.max_weight}")
        if not isinstance(self.aggregation, AggregationStrategy):
            raise ConfigError(f"aggregation must be an AggregationMethod, got {self.aggregation!r}")
