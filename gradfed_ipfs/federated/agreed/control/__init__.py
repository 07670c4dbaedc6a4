"""Control planes of an agreed session: who decides a round's roster and its final record.

:class:`PubsubControl` (the ranked coordinators' rosters over pubsub) or :class:`CometControl`
(a CometBFT chain of the members); :func:`verify_final_record` checks a record of the chain's
plane from its commits alone (member sets judged by :func:`check_chain_member_sets`).
"""

from __future__ import annotations

from .comet import CometControl, rounds_genesis
from .finality import check_chain_member_sets, verify_final_record
from .pubsub import PubsubControl, RoundControl

__all__ = [
    "CometControl",
    "PubsubControl",
    "RoundControl",
    "check_chain_member_sets",
    "rounds_genesis",
    "verify_final_record",
]
