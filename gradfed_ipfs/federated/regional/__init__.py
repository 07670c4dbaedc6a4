"""Regional rounds: agreed rounds inside each region, then one agreed mean of the regions."""

from __future__ import annotations

from .config import RegionalConfig, RegionalRoundResult
from .session import RegionalSession, verify_regional_round

__all__ = ["RegionalConfig", "RegionalRoundResult", "RegionalSession", "verify_regional_round"]
