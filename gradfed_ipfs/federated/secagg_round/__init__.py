"""The SecAgg round over IPFS: peers run the masking protocol through pubsub and blocks.

The protocol itself (shares, masks, wire forms) is :mod:`gradfed_ipfs.federated.secagg`.
"""

from __future__ import annotations

from .peer import SecureRoundConfig, SecureRoundPeer, SecureRoundResult, run_secure_round

__all__ = ["SecureRoundConfig", "SecureRoundPeer", "SecureRoundResult", "run_secure_round"]
