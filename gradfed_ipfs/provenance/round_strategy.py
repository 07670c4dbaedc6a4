"""Aggregation strategies in round records: ``{"method": name, "params": {...}}`` and back.

The method must be one of :class:`~gradfed_ipfs.tensor.aggregation.AggregationMethod` (its
dataclass fields are the parameters; ``NormBounded.inner`` nests, at most
``_MAX_STRATEGY_DEPTH`` deep). Parameters from a record are untrusted: each must have the kind
of the strategy's default for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from ..errors import InvalidGradient, MalformedManifest
from ..tensor.aggregation import AggregationMethod, AggregationStrategy, method_name

__all__ = ["strategy_from_ipld", "strategy_to_ipld"]

_MAX_STRATEGY_DEPTH: Final = 8


def strategy_to_ipld(strategy: AggregationStrategy) -> dict[str, Any]:
    """Describe an aggregation strategy as ``{"method": name, "params": {...}}``.

    Raises
    ------
    InvalidGradient
        If the strategy is not one of ``AggregationMethod``'s classes.
    """
    name = method_name(strategy)
    if name is None:
        raise InvalidGradient(f"cannot record aggregation strategy {strategy!r}")
    params: dict[str, Any] = {}
    for f in dataclasses.fields(strategy):  # type: ignore[arg-type]
        if not f.init:
            continue
        value = getattr(strategy, f.name)
        if isinstance(value, AggregationStrategy):
            params[f.name] = strategy_to_ipld(value)
        elif isinstance(value, Mapping):
            params[f.name] = {str(k): float(v) for k, v in value.items()}
        elif isinstance(value, list | tuple):
            params[f.name] = [float(v) for v in value]
        else:
            params[f.name] = value
    return {"method": name, "params": params}


def strategy_from_ipld(data: object, *, _depth: int = 0) -> AggregationStrategy:
    """Rebuild a strategy from :func:`strategy_to_ipld` output.

    Raises
    ------
    MalformedManifest
        If the method is unknown or its parameters are invalid.
    """
    if _depth > _MAX_STRATEGY_DEPTH:
        raise MalformedManifest(f"aggregation strategies nested over {_MAX_STRATEGY_DEPTH} deep")
    if not isinstance(data, dict) or not isinstance(data.get("params"), dict):
        raise MalformedManifest(f"aggregation must be {{method, params}}, got {data!r:.80}")
    name = data.get("method")
    cls = getattr(AggregationMethod, name, None) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, AggregationStrategy)):
        raise MalformedManifest(f"unknown aggregation method {name!r}")
    defaults = cls()
    params: dict[str, Any] = {}
    for key, value in data["params"].items():
        default = getattr(defaults, key, None) if isinstance(key, str) else None
        if not _param_fits(value, default):
            raise MalformedManifest(f"bad parameter {key!r} for {name}: {value!r:.60}")
        nested = isinstance(default, AggregationStrategy)
        params[key] = strategy_from_ipld(value, _depth=_depth + 1) if nested else value
    try:
        return cls(**params)
    except (TypeError, ValueError) as exc:
        raise MalformedManifest(f"bad parameters for {name}: {exc}") from exc


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _param_fits(value: object, default: object) -> bool:
    """Whether an untrusted parameter has the kind of the strategy's default for it."""
    if isinstance(default, AggregationStrategy):
        return isinstance(value, dict)
    if isinstance(default, bool) or default is None:
        return False  # no such parameter (or one we never record)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return _is_number(value)
    if isinstance(default, Mapping | list | tuple):
        if isinstance(value, dict):
            return all(isinstance(k, str) and _is_number(v) for k, v in value.items())
        return isinstance(value, list) and all(_is_number(v) for v in value)
    return False
