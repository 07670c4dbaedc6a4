"""An ABCI 2.0 application in Python: deterministic state machines over signed statements.

:class:`StatementLedger` (a log of statements per kind) and :class:`RoundMachine` (agreed
rounds: contributions, attestations, rosters, final results; transactions in :mod:`.txs`) are
the state machines (pure); :class:`LedgerApp` maps ABCI requests to the one the chain's
genesis names; :class:`AbciServer` speaks the socket ABCI protocol to one CometBFT node. The
protobuf messages are generated from CometBFT's own ``.proto`` files (``pb/``,
``scripts/gen-abci-proto``).
"""

from __future__ import annotations

from .bindings import check_bindings
from .handler import APP_VERSION, QUERY_PATHS, LedgerApp, StateMachine
from .ledger import StatementLedger, TxCode, Verdict
from .rounds import (
    APP_HASH_VERSION,
    APP_STATE_TAG,
    ROUND_QUERY_PATHS,
    RosterLine,
    RoundMachine,
    RoundsGenesis,
    RoundView,
    final_leaf,
    genesis_digest,
    state_summary,
)
from .server import MAX_FRAME_BYTES, AbciServer, encode_frame, read_frame
from .txs import (
    ATTESTATION,
    CONTRIBUTION,
    RESULT,
    VALIDATOR,
    attestation_tx,
    contribution_tx,
    result_tx,
    roster_digest,
    validator_binding,
)

__all__ = [
    "APP_HASH_VERSION",
    "APP_STATE_TAG",
    "APP_VERSION",
    "ATTESTATION",
    "CONTRIBUTION",
    "RESULT",
    "VALIDATOR",
    "ROUND_QUERY_PATHS",
    "RosterLine",
    "RoundMachine",
    "RoundView",
    "RoundsGenesis",
    "StateMachine",
    "attestation_tx",
    "check_bindings",
    "contribution_tx",
    "final_leaf",
    "genesis_digest",
    "result_tx",
    "roster_digest",
    "state_summary",
    "validator_binding",
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
