"""Agreed rounds: every honest peer ends each round on the same model CID.

:class:`AgreedSession` runs rounds whose roster a ranked coordinator fixes and whose record
chains to the previous one; :func:`verify_agreed_history` re-verifies a session from its head.
Custom update rules: :class:`RobustRule` (a robust aggregation) and :class:`OptimizerRule` (a
server optimizer such as DiLoCo's ``ServerNesterov``, its state stored by CID in each record).
"""

from __future__ import annotations

from .config import AgreedConfig, AgreedRoundResult, ResyncResult, UpdateRule
from .history import verify_agreed_history, verify_agreed_round
from .membership import Admission
from .optimizer import OptimizerRule
from .session import AgreedSession
from .slicing import RobustRule

__all__ = [
    "Admission",
    "AgreedConfig",
    "AgreedRoundResult",
    "AgreedSession",
    "OptimizerRule",
    "ResyncResult",
    "RobustRule",
    "UpdateRule",
    "verify_agreed_history",
    "verify_agreed_round",
]
