"""CometBFT: the pinned binary, loopback validator networks and the Python ABCI app.

The agreement engine of the CometBFT control plane (issue #36): :class:`CometNetwork` runs
``n`` validators on 127.0.0.1, each with its own :mod:`~gradfed_ipfs.cometbft.abci` app process,
a deterministic log of the project's signed statements or the round machine of agreed sessions
(``AgreedConfig(control="cometbft")``).
"""

from __future__ import annotations

from .binary import COMETBFT_VERSION, default_cometbft_path, find_cometbft_binary
from .config import DEFAULT_TIMING, BlockTiming, GenesisValidator
from .finality import Finality, FinalityBundle, export_finality, verify_finality
from .rpc import BroadcastResult, CometRpc, QueryResult, comet_call
from .session_chain import launch_session_chain
from .validator import CometNetwork, Validator, live_validator_pids

__all__ = [
    "COMETBFT_VERSION",
    "DEFAULT_TIMING",
    "BlockTiming",
    "BroadcastResult",
    "CometNetwork",
    "CometRpc",
    "Finality",
    "FinalityBundle",
    "GenesisValidator",
    "QueryResult",
    "Validator",
    "comet_call",
    "default_cometbft_path",
    "export_finality",
    "find_cometbft_binary",
    "launch_session_chain",
    "live_validator_pids",
    "verify_finality",
]
