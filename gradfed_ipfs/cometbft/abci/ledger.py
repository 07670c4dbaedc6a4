"""The deterministic state machine: an ordered log of signed statements per kind.

A transaction is one encoded signed statement (:mod:`gradfed_ipfs.formats.statement`). The
ledger checks its size, decodes it and verifies its signature; anything that fails, or a
statement already logged, is refused with a code and changes nothing. Every validator runs the
same checks on the same bytes, so all of them accept and refuse the same transactions.

State: for each statement kind, the list of statements in commit order, and a hash chain over
their CIDs (``head = SHA-256(tag || previous head || CID bytes)``), so the chain head commits to
the whole ordered log. The app hash is SHA-256 of the dag-cbor map ``{"version": 1, "logs":
{kind: [count, head]}}`` (dag-cbor sorts map keys): the same committed state gives the same
hash on every validator, any difference in any log gives another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

import dag_cbor

from ...block import Block
from ...errors import BadSignature, GradfedError
from ...formats.statement import MAX_STATEMENT_BYTES, Statement, decode_statement

__all__ = ["QUERY_PATHS", "StatementLedger", "TxCode", "Verdict"]

QUERY_PATHS: Final = ("/entry", "/size", "/statement")
"""``abci_query`` paths: ``/entry`` with ``KIND/INDEX``, ``/size`` with ``KIND`` (a decimal
count), ``/statement`` with a CID; each answers from the committed state only."""

_CHAIN_TAG: Final = b"gradfed/v1/cometbft/log\x00"


class TxCode(IntEnum):
    """CheckTx / FinalizeBlock result codes (0 accepted; the rest name why not)."""

    OK = 0
    MALFORMED = 1
    BAD_SIGNATURE = 2
    DUPLICATE = 3
    TOO_LARGE = 4
    NOT_MEMBER = 5
    OTHER_SESSION = 6
    OTHER_ROUND = 7
    CLOSED = 8
    NOT_CLOSED = 9
    WRONG_BASE = 10
    CONFLICT = 11
    NOT_ALLOWED = 12
    ALREADY_MEMBER = 13
    FULL = 14
    WRONG_ROSTER = 15


@dataclass(frozen=True)
class Verdict:
    """The ledger's answer about one transaction: a code, a reason, the statement if any."""

    code: TxCode
    log: str = ""
    statement: Statement | None = None


def _chain(head: bytes, cid: bytes) -> bytes:
    return hashlib.sha256(_CHAIN_TAG + head + cid).digest()


def _app_hash(counts: dict[str, int], heads: dict[str, bytes]) -> bytes:
    logs: dict[str, dag_cbor.IPLDKind] = {
        kind: [count, heads[kind]] for kind, count in counts.items()
    }
    return hashlib.sha256(dag_cbor.encode({"version": 1, "logs": logs})).digest()


@dataclass
class _Pending:
    """A finalized, not yet committed block: its accepted statements and the heads after it."""

    height: int
    statements: list[Statement]
    heads: dict[str, bytes]
    app_hash: bytes


class StatementLedger:
    """Committed statements and the block being finalized; no I/O, no clock, no randomness."""

    def __init__(self) -> None:
        self._logs: dict[str, list[str]] = {}  # kind -> CIDs in commit order
        self._heads: dict[str, bytes] = {}  # kind -> hash-chain head over those CIDs
        self._blocks: dict[str, bytes] = {}  # CID -> encoded statement
        self._pending: _Pending | None = None
        self.height = 0
        """Height of the last committed block (0 before the first)."""
        self.app_hash = _app_hash({}, {})
        """App hash of the committed state."""

    def check(self, tx: bytes, *, also_seen: AbstractSet[str] = frozenset()) -> Verdict:
        """Judge one transaction against the committed state (and CIDs in ``also_seen``)."""
        if not tx:
            return Verdict(TxCode.MALFORMED, "empty transaction")
        if len(tx) > MAX_STATEMENT_BYTES:
            return Verdict(TxCode.TOO_LARGE, f"{len(tx)} bytes > {MAX_STATEMENT_BYTES}")
        try:
            statement = decode_statement(Block.new(bytes(tx), "dag-cbor"))
        except BadSignature as exc:
            return Verdict(TxCode.BAD_SIGNATURE, str(exc))
        except GradfedError as exc:  # DecodeError, or a Block refused
            return Verdict(TxCode.MALFORMED, str(exc))
        cid = str(statement.block.cid)
        if cid in self._blocks or cid in also_seen:
            return Verdict(TxCode.DUPLICATE, f"statement {cid} is already logged")
        return Verdict(TxCode.OK, "", statement)

    def prepare(self, txs: list[bytes]) -> list[bytes]:
        """Return the transactions of a proposal that would be accepted, in order."""
        seen: set[str] = set()
        kept: list[bytes] = []
        for tx in txs:
            verdict = self.check(tx, also_seen=seen)
            if verdict.statement is not None:
                seen.add(str(verdict.statement.block.cid))
                kept.append(tx)
        return kept

    def finalize(
        self, height: int, txs: list[bytes], time_ns: int = 0
    ) -> tuple[list[Verdict], bytes]:
        """Execute a decided block: return each transaction's verdict and the new app hash.

        The result is held until :meth:`commit`; queries still see the committed state. The
        block time ``time_ns`` does not matter to a log.
        """
        verdicts: list[Verdict] = []
        accepted: list[Statement] = []
        seen: set[str] = set()
        for tx in txs:
            verdict = self.check(tx, also_seen=seen)
            verdicts.append(verdict)
            if verdict.statement is not None:
                accepted.append(verdict.statement)
                seen.add(str(verdict.statement.block.cid))
        heads = dict(self._heads)
        counts = {kind: len(cids) for kind, cids in self._logs.items()}
        for statement in accepted:
            heads[statement.kind] = _chain(
                heads.get(statement.kind, b""), bytes(statement.block.cid)
            )
            counts[statement.kind] = counts.get(statement.kind, 0) + 1
        self._pending = _Pending(height, accepted, heads, _app_hash(counts, heads))
        return verdicts, self._pending.app_hash

    def commit(self) -> None:
        """Make the finalized block the committed state (a no-op without one)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        for statement in pending.statements:
            cid = str(statement.block.cid)
            self._logs.setdefault(statement.kind, []).append(cid)
            self._blocks[cid] = statement.block.data
        self._heads = pending.heads
        self.height = pending.height
        self.app_hash = pending.app_hash

    def validator_updates(self) -> list[tuple[bytes, int]]:
        """None: a statement log never changes its validators."""
        return []

    def size(self, kind: str) -> int:
        """Return the number of committed statements of ``kind``."""
        return len(self._logs.get(kind, ()))

    def entry(self, kind: str, index: int) -> bytes | None:
        """Return the committed statement at ``index`` of ``kind``'s log (encoded), or ``None``."""
        cids = self._logs.get(kind, [])
        return self._blocks[cids[index]] if 0 <= index < len(cids) else None

    def statement(self, cid: str) -> bytes | None:
        """Return the committed statement with this CID (encoded), or ``None``."""
        return self._blocks.get(cid)

    def kinds(self) -> list[str]:
        """Return the kinds with at least one committed statement, sorted."""
        return sorted(self._logs)

    def query(self, path: str, data: bytes) -> tuple[bytes | None, str]:
        """``(value, "")``, ``(None, "")`` for not found, or ``(None, reason)`` for a bad query."""
        try:
            key = data.decode("ascii")
        except UnicodeDecodeError:
            return None, "query data must be ASCII"
        if path == "/size":
            return str(self.size(key)).encode(), ""
        if path == "/statement":
            return self.statement(key), ""
        if path == "/entry":
            kind, _, index = key.rpartition("/")
            if not kind or not index.isdigit() or len(index) > 18:
                return None, "/entry data must be KIND/INDEX"
            return self.entry(kind, int(index)), ""
        return None, f"unknown query path {path!r} (known: {', '.join(QUERY_PATHS)})"
