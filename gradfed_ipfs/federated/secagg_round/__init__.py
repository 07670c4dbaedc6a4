"""The SecAgg round over IPFS: peers run the masking protocol through pubsub and blocks.

The protocol itself (shares, masks, wire forms) is :mod:`gradfed_ipfs.federated.secagg`;
:class:`SecAggSettings` is the one settings type (encoding and phase timeouts) of every path
that runs a SecAgg round.
"""

from __future__ import annotations

from .peer import SecureRoundConfig, SecureRoundPeer, SecureRoundResult, run_secure_round
from .settings import SecAggSettings

__all__ = [
    "SecAggSettings",
    "SecureRoundConfig",
    "SecureRoundPeer",
    "SecureRoundResult",
    "run_secure_round",
]
