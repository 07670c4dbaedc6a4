"""Agreed rounds: every honest peer ends each round on the same model CID.

:class:`AgreedSession` runs rounds whose roster a ranked coordinator fixes and whose record
chains to the previous one; :func:`verify_agreed_history` re-verifies a session from its head.
"""

from __future__ import annotations

from .config import AgreedConfig, AgreedRoundResult, ResyncResult, UpdateRule
from .history import verify_agreed_history, verify_agreed_round
from .session import AgreedSession
from .slicing import RobustRule

__all__ = [
    "AgreedConfig",
    "AgreedRoundResult",
    "AgreedSession",
    "ResyncResult",
    "RobustRule",
    "UpdateRule",
    "verify_agreed_history",
    "verify_agreed_round",
]
