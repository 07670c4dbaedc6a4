"""Settings of a gradient accumulator: how many peers, which rule, how long to wait."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import InvalidGradient
from ...tensor.aggregation import AggregationStrategy, FedAvg

__all__ = ["AccumulatorConfig"]


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
    """

    max_peers: int = 8
    aggregation: AggregationStrategy = field(default_factory=FedAvg)
    timeout: float = 60.0
    gradient_clipping: float | None = None

    def __post_init__(self) -> None:
        if self.max_peers < 1:
            raise InvalidGradient(f"max_peers must be >= 1, got {self.max_peers}")
        if not self.timeout > 0:
            raise InvalidGradient(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.gradient_clipping is not None and not self.gradient_clipping >= 0:
            raise InvalidGradient(f"gradient_clipping must be >= 0, got {self.gradient_clipping}")
        if not isinstance(self.aggregation, AggregationStrategy):
            raise InvalidGradient(
                f"aggregation must be an AggregationMethod, got {self.aggregation!r}"
            )
