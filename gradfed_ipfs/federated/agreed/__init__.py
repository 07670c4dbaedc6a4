"""Agreed rounds: every honest peer ends each round on the same model CID.

:class:`AgreedSession` runs rounds whose roster a ranked coordinator fixes and whose record
chains to the previous one; :func:`verify_agreed_history` re-verifies a session from its head.
A resync adopts a head only with the ``done`` votes of more than half of its roster
(:func:`count_votes`, :func:`has_majority`) and once it verifies.
Custom update rules: :class:`RobustRule` (a robust aggregation) and :class:`OptimizerRule` (a
server optimizer such as DiLoCo's ``ServerNesterov``, its state stored by CID in each record).
Control planes (``AgreedConfig.control``): pubsub, or a CometBFT chain of the members
(:class:`CometControl`; its chain's genesis from :func:`rounds_genesis`).
"""

from __future__ import annotations

from .config import AgreedConfig, AgreedRoundResult, ResyncResult, UpdateRule
from .control import CometControl, PubsubControl, RoundControl, rounds_genesis, verify_final_record
from .heads import count_votes, has_majority
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
    "CometControl",
    "OptimizerRule",
    "PubsubControl",
    "ResyncResult",
    "RobustRule",
    "RoundControl",
    "UpdateRule",
    "rounds_genesis",
    "count_votes",
    "has_majority",
    "verify_agreed_history",
    "verify_final_record",
    "verify_agreed_round",
]
