"""ABCI 2.0 requests to a state machine's calls, and its answers to ABCI responses.

One :class:`LedgerApp` serves all four of a validator's ABCI connections (consensus, mempool,
query, snapshot); the server calls :meth:`LedgerApp.handle` for one request at a time, so the
state machine needs no locks. Which machine runs is the chain's choice: ``InitChain``'s
``app_state`` naming :data:`~.rounds.APP_STATE_TAG` starts a :class:`~.rounds.RoundMachine`
(agreed rounds), anything else a :class:`~.ledger.StatementLedger`. Snapshots are not offered
(state sync is off: a validator that falls behind catches up by block sync and replays blocks
into its app).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from ...errors import DecodeError
from .bindings import check_bindings
from .ledger import QUERY_PATHS, StatementLedger, Verdict
from .pb.cometbft.abci.v1 import types_pb2 as abci
from .rounds import RoundMachine, RoundsGenesis

__all__ = ["APP_VERSION", "QUERY_PATHS", "LedgerApp", "StateMachine"]

APP_VERSION: Final = 1
"""The state machine's version (``InfoResponse.app_version``)."""
_NOT_FOUND: Final = 1
_BAD_QUERY: Final = 2


class StateMachine(Protocol):
    """What :class:`LedgerApp` drives: a deterministic machine over transactions."""

    height: int
    app_hash: bytes

    def check(self, tx: bytes) -> Verdict:
        """Judge ``tx`` against the committed state."""
        ...

    def prepare(self, txs: list[bytes]) -> list[bytes]:
        """Keep the transactions a proposal should hold."""
        ...

    def finalize(
        self, height: int, txs: list[bytes], time_ns: int = 0
    ) -> tuple[list[Verdict], bytes]:
        """Execute a decided block (held until :meth:`commit`)."""
        ...

    def commit(self) -> None:
        """Make the finalized block the committed state."""
        ...

    def validator_updates(self) -> list[tuple[bytes, int]]:
        """Return the finalized block's validator updates ``(Ed25519 key, power)``."""
        ...

    def query(self, path: str, data: bytes) -> tuple[bytes | None, str]:
        """``(value, "")``, ``(None, "")`` (not found) or ``(None, reason)``."""
        ...


class LedgerApp:
    """The ABCI application of a validator: its state machine behind ABCI 2.0."""

    def __init__(self, ledger: StateMachine | None = None) -> None:
        self.ledger: StateMachine = ledger if ledger is not None else StatementLedger()

    def handle(self, request: abci.Request) -> abci.Response:
        """Answer one request (``Flush`` and ``Echo`` included).

        Raises
        ------
        DecodeError
            If the request names no method this app knows (the server closes that connection).
        """
        method = request.WhichOneof("value")
        handler = _HANDLERS.get(method or "")
        if handler is None:
            raise DecodeError(f"ABCI request of unknown type {method!r}")
        return handler(self, request)

    def _info(self, request: abci.Request) -> abci.Response:
        ledger = self.ledger
        answer = abci.InfoResponse(
            data="gradfed-ipfs statement ledger",
            version=str(APP_VERSION),
            app_version=APP_VERSION,
            last_block_height=ledger.height,
            # At height 0 CometBFT calls InitChain next; it takes the hash from there.
            last_block_app_hash=ledger.app_hash if ledger.height else b"",
        )
        return abci.Response(info=answer)

    def _init_chain(self, request: abci.Request) -> abci.Response:
        # The genesis validators stay as they are (no updates); the app hash is the empty state's.
        # A MalformedManifest here (a round chain's broken app_state) stops the node: no app.
        init = request.init_chain
        rounds = RoundsGenesis.from_app_state(init.app_state_bytes)
        if rounds is not None:
            bound: dict[str, bytes] = {}
            if rounds.bindings:
                validators = [(v.pub_key_type, v.pub_key_bytes) for v in init.validators]
                bound = check_bindings(rounds, init.chain_id, validators)
            self.ledger = RoundMachine(rounds, chain_id=init.chain_id, validator_keys=bound)
        return abci.Response(init_chain=abci.InitChainResponse(app_hash=self.ledger.app_hash))

    def _check_tx(self, request: abci.Request) -> abci.Response:
        verdict = self.ledger.check(request.check_tx.tx)
        return abci.Response(check_tx=abci.CheckTxResponse(code=verdict.code, log=verdict.log))

    def _prepare_proposal(self, request: abci.Request) -> abci.Response:
        # Propose only what would be accepted: a block of refused transactions is dead weight.
        # Dropping transactions keeps the list within max_tx_bytes, as CometBFT handed it over.
        txs = self.ledger.prepare(list(request.prepare_proposal.txs))
        return abci.Response(prepare_proposal=abci.PrepareProposalResponse(txs=txs))

    def _process_proposal(self, request: abci.Request) -> abci.Response:
        # Accept any proposal: FinalizeBlock ignores refused transactions deterministically, so a
        # proposer that includes some wastes its block's space but cannot change the state.
        status = abci.PROCESS_PROPOSAL_STATUS_ACCEPT
        return abci.Response(process_proposal=abci.ProcessProposalResponse(status=status))

    def _finalize_block(self, request: abci.Request) -> abci.Response:
        block = request.finalize_block
        time_ns = block.time.seconds * 1_000_000_000 + block.time.nanos
        verdicts, app_hash = self.ledger.finalize(block.height, list(block.txs), time_ns)
        results = [abci.ExecTxResult(code=v.code, log=v.log) for v in verdicts]
        updates = [  # a member set's change: its validators' too (effective two blocks later)
            abci.ValidatorUpdate(power=power, pub_key_bytes=key, pub_key_type="ed25519")
            for key, power in self.ledger.validator_updates()
        ]
        answer = abci.FinalizeBlockResponse(
            tx_results=results, app_hash=app_hash, validator_updates=updates
        )
        return abci.Response(finalize_block=answer)

    def _commit(self, request: abci.Request) -> abci.Response:
        self.ledger.commit()
        return abci.Response(commit=abci.CommitResponse(retain_height=0))

    def _query(self, request: abci.Request) -> abci.Response:
        asked = request.query
        ledger = self.ledger
        answer = abci.QueryResponse(height=ledger.height, key=asked.data)
        if asked.height not in (0, ledger.height):
            answer.code, answer.log = _BAD_QUERY, f"only the latest height ({ledger.height})"
            return abci.Response(query=answer)
        value, log = ledger.query(asked.path, asked.data)
        if value is None:
            answer.code, answer.log = _NOT_FOUND if not log else _BAD_QUERY, log or "not found"
        else:
            answer.value = value
        return abci.Response(query=answer)

    def _extend_vote(self, request: abci.Request) -> abci.Response:
        return abci.Response(extend_vote=abci.ExtendVoteResponse())

    def _verify_vote_extension(self, request: abci.Request) -> abci.Response:
        status = abci.VERIFY_VOTE_EXTENSION_STATUS_ACCEPT
        answer = abci.VerifyVoteExtensionResponse(status=status)
        return abci.Response(verify_vote_extension=answer)

    def _echo(self, request: abci.Request) -> abci.Response:
        return abci.Response(echo=abci.EchoResponse(message=request.echo.message))

    def _flush(self, request: abci.Request) -> abci.Response:
        return abci.Response(flush=abci.FlushResponse())

    def _list_snapshots(self, request: abci.Request) -> abci.Response:
        return abci.Response(list_snapshots=abci.ListSnapshotsResponse())

    def _offer_snapshot(self, request: abci.Request) -> abci.Response:
        result = abci.OFFER_SNAPSHOT_RESULT_REJECT
        return abci.Response(offer_snapshot=abci.OfferSnapshotResponse(result=result))

    def _load_snapshot_chunk(self, request: abci.Request) -> abci.Response:
        return abci.Response(load_snapshot_chunk=abci.LoadSnapshotChunkResponse())

    def _apply_snapshot_chunk(self, request: abci.Request) -> abci.Response:
        result = abci.APPLY_SNAPSHOT_CHUNK_RESULT_ABORT
        return abci.Response(apply_snapshot_chunk=abci.ApplySnapshotChunkResponse(result=result))


_Handler = Callable[[LedgerApp, abci.Request], abci.Response]
# One ``_<method>`` per field of the Request oneof: a CometBFT with a method this app lacks
# fails here, at import, not mid-chain.
_HANDLERS: Final[dict[str, _Handler]] = {
    field.name: getattr(LedgerApp, "_" + field.name)
    for field in abci.Request.DESCRIPTOR.oneofs_by_name["value"].fields
}
