"""An ABCI 2.0 application in Python: a deterministic log of signed statements per kind.

:class:`StatementLedger` is the state machine (pure); :class:`LedgerApp` maps ABCI requests to
it; :class:`AbciServer` speaks the socket ABCI protocol to one CometBFT node. The protobuf
messages are generated from CometBFT's own ``.proto`` files (``pb/``, ``scripts/gen-abci-proto``).
"""

from __future__ import annotations

from .handler import APP_VERSION, QUERY_PATHS, LedgerApp
from .ledger import StatementLedger, TxCode, Verdict
from .server import MAX_FRAME_BYTES, AbciServer, encode_frame, read_frame

__all__ = [
    "APP_VERSION",
    "MAX_FRAME_BYTES",
    "QUERY_PATHS",
    "AbciServer",
    "LedgerApp",
    "StatementLedger",
    "TxCode",
    "Verdict",
    "encode_frame",
    "read_frame",
]
