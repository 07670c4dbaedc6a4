"""Control planes of an agreed session: who decides a round's roster and its final record.

:class:`PubsubControl` (the ranked coordinators' rosters over pubsub) or :class:`CometControl`
(a CometBFT chain of the members); :func:`verify_final_record` checks a record of the chain's
plane from its commits alone.
"""

from __future__ import annotations

from .comet import CometControl, rounds_genesis
from .finality import verify_final_record
from .pubsub import PubsubControl, RoundControl

__all__ = ["CometControl", "PubsubControl", "RoundControl", "rounds_genesis", "verify_final_record"]
