"""Regional rounds: agreed rounds inside each region, then one agreed mean of the regions."""

from __future__ import annotations

from .config import RegionalConfig, RegionalRoundResult, votes_needed
from .session import RegionalSession, verify_regional_round
from .votes import Vote, VoteBoard, check_vote_set, decode_vote, sign_vote, vote_quorum, vote_set

__all__ = [
    "RegionalConfig",
    "RegionalRoundResult",
    "RegionalSession",
    "Vote",
    "VoteBoard",
    "check_vote_set",
    "decode_vote",
    "sign_vote",
    "verify_regional_round",
    "vote_quorum",
    "vote_set",
    "votes_needed",
]
