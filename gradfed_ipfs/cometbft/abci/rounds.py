"""The state machine of agreed rounds: which contributions are in a round, which result is final.

Pure and deterministic (no I/O, no clock but the block time CometBFT hands in, no randomness):
every validator that executes the same blocks reaches the same state and app hash.

The members, the session and its genesis model are fixed by the chain's genesis
(:class:`RoundsGenesis`, the ``app_state`` of ``genesis.json``). With ``n`` members,
``f = ⌊(n − 1)/3⌋``. Rounds are decided one after the other; round ``r`` is *current* once
round ``r − 1`` is final (round 0 from the start), and its base is round ``r − 1``'s final model
(the genesis model for round 0). Transactions (:mod:`.txs`), each a member's signed statement:

- a **contribution** to the current round or the next one (held until its base is known; one
  with another base is then dropped). A second, different contribution of one peer to one round
  is **evidence** of equivocation: both are dropped and the peer is out of that round;
- an **attestation**: a member holds and verified a contribution. A contribution is *held* by
  its author and by every member that attested it; it can enter the roster once more than ``f``
  members hold it, so at least one honest member can serve it;
- a **result** of a closed round: the author's record and model CIDs; the round is **final**
  with ``2f + 1`` equal results, and the next round becomes current.

The current round *opens* at the first block that sees one of its contributions, and *closes*
at the end of the first block in which every member (but equivocators) has a held contribution,
or whose block time is at least ``collect_ms`` after the opening and which has ``min_peers``
held contributions: its roster is then the held contributions, sorted by peer.

Anything else (a bad signature, a non-member, another session, a decided or far-ahead round, a
duplicate, a contribution after the close, a result before it, a second attestation of another
CID) is refused with a :class:`~.ledger.TxCode` and changes nothing. The app hash is SHA-256 of
the dag-cbor map ``{version: 2, genesis, log, decided, current, finals}`` (:func:`state_summary`):
``genesis`` is SHA-256 of the genesis ``app_state`` as dag-cbor (the member set, bindings and
timing), ``log`` a hash chain over every accepted statement's CID in order, ``decided`` one over
every roster, final result and evidence as decided, ``current`` the first round not final, and
``finals`` the Merkle root (:mod:`~gradfed_ipfs.cometbft.merkle`, CometBFT's tree) over one leaf
per final round, ``dag-cbor [round, record CID, model CID]`` (:func:`final_leaf`), round ``r`` at
index ``r`` of ``current`` leaves. So a final record is shown to be in an app hash by the summary
map (about 200 bytes) and ``⌈log2 current⌉`` aunts: the ``/final`` query's answer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any, Final

import dag_cbor

from ...block import Block
from ...cid import parse_cid
from ...errors import BadSignature, DecodeError, GradfedError, MalformedManifest
from ...formats.statement import (
    MAX_STATEMENT_BYTES,
    PEER_ID_KEYS,
    KeyBook,
    Statement,
    decode_statement,
)
from ..merkle import merkle_aunts, merkle_root
from .ledger import TxCode, Verdict
from .txs import Attestation, Contribution, Result, RoundTx, decode_body

__all__ = [
    "APP_HASH_VERSION",
    "APP_STATE_TAG",
    "ROUND_QUERY_PATHS",
    "RosterLine",
    "RoundMachine",
    "RoundsGenesis",
    "RoundView",
    "final_leaf",
    "genesis_digest",
    "state_summary",
]

ROUND_QUERY_PATHS: Final = ("/round", "/members", "/final")
"""``abci_query`` paths of the round machine: ``/round`` with a decimal round number (a
dag-cbor :meth:`RoundView.to_dict`), ``/members`` (dag-cbor ``{session, genesis, members, f,
min_peers, collect_ms, current}``), ``/final`` with a decimal round number (the proof that the
round's record is final in the committed app hash: dag-cbor ``{round, record, model, index,
total, aunts, state}``, ``state`` the encoded :func:`state_summary`; not found before it is
final)."""
APP_HASH_VERSION: Final = 2
"""``version`` of the app-hash summary map (2: genesis hashed, final rounds' Merkle root)."""
APP_STATE_TAG: Final = "gradfed/agreed-rounds"
"""``app_state.app`` of a genesis that runs the round machine."""
_LOG_TAG: Final = b"gradfed/v1/cometbft/rounds/log\x00"
_DECIDED_TAG: Final = b"gradfed/v1/cometbft/rounds/decided\x00"
_MAX_MEMBERS: Final = 1024


def _chain(tag: bytes, head: bytes, item: bytes) -> bytes:
    return hashlib.sha256(tag + head + item).digest()


def final_leaf(r: int, record: str, model: str) -> bytes:
    """Return the ``finals`` Merkle leaf of final round ``r``: dag-cbor ``[r, record, model]``."""
    return dag_cbor.encode([r, record, model])


def state_summary(genesis: bytes, log: bytes, decided: bytes, current: int, finals: bytes) -> bytes:
    """Return the encoded map whose SHA-256 is the app hash (see the module docstring)."""
    summary: dict[str, dag_cbor.IPLDKind] = {
        "version": APP_HASH_VERSION,
        "genesis": genesis,
        "log": log,
        "decided": decided,
        "current": current,
        "finals": finals,
    }
    return dag_cbor.encode(summary)


@dataclass(frozen=True)
class RoundsGenesis:
    """What a chain of agreed rounds is about: fixed at genesis, committed in every app hash.

    Attributes
    ----------
    session
        The session's name (every transaction names it).
    genesis
        CID of the initial model: round 0's base.
    members
        The members' Ed25519 peer IDs, sorted (the validators' owners).
    min_peers
        Least held contributions a round closes with at its deadline.
    collect_ms
        Block-time milliseconds from a round's opening to its deadline.
    max_weight
        Largest contribution weight accepted (the session's ``max_weight``).
    bindings
        Each member's signed ``comet/validator`` statement naming its validator's key
        (:func:`~.txs.validator_binding`; checked against the genesis validators at
        ``InitChain`` by :func:`~.bindings.check_bindings`); empty: validators not bound.
    """

    session: str
    genesis: str
    members: tuple[str, ...]
    min_peers: int
    collect_ms: int
    max_weight: int = 2**53
    bindings: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        members = tuple(sorted(set(self.members)))
        object.__setattr__(self, "members", members)
        object.__setattr__(self, "genesis", str(parse_cid(self.genesis)))
        if not 1 <= len(members) <= _MAX_MEMBERS:
            raise MalformedManifest(f"a round chain needs 1..{_MAX_MEMBERS} members")
        if not 1 <= self.min_peers <= len(members):
            raise MalformedManifest(f"min_peers {self.min_peers} not in [1, {len(members)}]")
        if not 0 <= self.collect_ms <= 10**9:
            raise MalformedManifest(f"collect_ms {self.collect_ms} not in [0, 1e9]")
        if not 1 <= self.max_weight <= 2**53:
            raise MalformedManifest(f"max_weight {self.max_weight} not in [1, 2**53]")

    @property
    def f(self) -> int:
        """Faults tolerated: ``⌊(n − 1)/3⌋``."""
        return (len(self.members) - 1) // 3

    def to_dict(self) -> dict[str, Any]:
        """Return the genesis ``app_state`` (JSON- and dag-cbor-encodable)."""
        return {
            "app": APP_STATE_TAG,
            "session": self.session,
            "genesis": self.genesis,
            "members": list(self.members),
            "min_peers": self.min_peers,
            "collect_ms": self.collect_ms,
            "max_weight": self.max_weight,
            "bindings": [b.hex() for b in self.bindings],
        }

    @classmethod
    def from_app_state(cls, raw: bytes) -> RoundsGenesis | None:
        """Parse ``InitChain``'s ``app_state_bytes``; ``None`` if it is not a round chain's.

        Raises
        ------
        MalformedManifest
            If it names the round machine but a field is missing or wrong.
        """
        try:
            state = json.loads(raw) if raw.strip() else None
        except ValueError:
            return None
        if not isinstance(state, dict) or state.get("app") != APP_STATE_TAG:
            return None
        try:
            return cls(
                str(state["session"]), str(state["genesis"]),
                tuple(str(m) for m in state["members"]), int(state["min_peers"]),
                int(state["collect_ms"]), int(state.get("max_weight", 2**53)),
                tuple(bytes.fromhex(str(b)) for b in state.get("bindings", ())),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError, DecodeError) as exc:
            raise MalformedManifest(f"round chain app_state: {exc}") from exc


def genesis_digest(genesis: RoundsGenesis) -> bytes:
    """SHA-256 of the genesis ``app_state`` as dag-cbor: the app hash's ``genesis`` part."""
    return hashlib.sha256(dag_cbor.encode(genesis.to_dict())).digest()


@dataclass(frozen=True)
class RosterLine:
    """One decided roster entry: a peer's contribution CID, weight and its tx's signature."""

    peer: str
    cid: str
    weight: int
    signature: bytes = b""


@dataclass
class _Round:
    """The mutable state of an undecided round (the current one or the next)."""

    number: int
    base: str | None
    opened_ns: int | None = None
    seen: set[str] = field(default_factory=set)  # accepted statements' CIDs
    contributions: dict[str, Contribution] = field(default_factory=dict)
    holders: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    attested: dict[tuple[str, str], str] = field(default_factory=dict)  # (attester, peer) -> cid
    equivocators: set[str] = field(default_factory=set)
    roster: tuple[RosterLine, ...] | None = None
    results: dict[str, tuple[str, str]] = field(default_factory=dict)

    def copy(self) -> _Round:
        return _Round(
            self.number, self.base, self.opened_ns, set(self.seen), dict(self.contributions),
            {k: set(v) for k, v in self.holders.items()}, dict(self.attested),
            set(self.equivocators), self.roster, dict(self.results),
        )  # fmt: skip


@dataclass(frozen=True)
class RoundView:
    """What the app says about one round (the ``/round`` query's answer).

    Attributes
    ----------
    round
        The round number.
    status
        ``"waiting"`` (a later round: not current yet), ``"open"``, ``"closed"`` (roster
        decided, not final) or ``"final"``.
    base
        Its base model CID (``None`` while not known).
    roster
        The decided roster (``None`` before the close).
    record, model
        The final record and model CIDs (``None`` before finality).
    results
        Results submitted so far (distinct authors).
    evidence
        Peers that equivocated in this round.
    contributions
        The contributions accepted so far, sorted by peer (until the round is final; a held
        next round's may still be dropped when its base is decided).
    """

    round: int
    status: str
    base: str | None
    roster: tuple[RosterLine, ...] | None
    record: str | None
    model: str | None
    results: int = 0
    evidence: tuple[str, ...] = ()
    contributions: tuple[RosterLine, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the dag-cbor map of the ``/round`` answer."""
        return {
            "round": self.round, "status": self.status, "base": self.base,
            "roster": None if self.roster is None
            else [[e.peer, e.cid, e.weight, e.signature] for e in self.roster],
            "record": self.record, "model": self.model, "results": self.results,
            "evidence": list(self.evidence),
            "contributions": [[e.peer, e.cid, e.weight, e.signature] for e in self.contributions],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, value: object) -> RoundView:
        """Decode a ``/round`` answer (from a validator; bounded by the RPC's answer size).

        Raises
        ------
        MalformedManifest
            If it is not such a map.
        """
        try:
            assert isinstance(value, dict)  # noqa: S101 - turned into MalformedManifest below
            roster = value["roster"]
            return cls(
                int(value["round"]), str(value["status"]), value["base"],
                None if roster is None else _lines(roster), value["record"], value["model"],
                int(value["results"]), tuple(str(p) for p in value["evidence"]),
                _lines(value["contributions"]),
            )  # fmt: skip
        except (AssertionError, KeyError, TypeError, ValueError) as exc:
            raise MalformedManifest(f"not a /round answer: {exc!r:.200}") from exc


def _lines(value: Any) -> tuple[RosterLine, ...]:
    return tuple(RosterLine(str(p), str(c), int(w), bytes(s)) for p, c, w, s in value)


@dataclass
class _State:
    """Committed (or pending) state; :meth:`copy` forks it for a block being finalized."""

    current: int
    rounds: dict[int, _Round]  # the current round and the next (created on demand)
    decided: dict[int, tuple[tuple[RosterLine, ...], tuple[str, str], tuple[str, ...]]]
    log: bytes = b""
    decided_head: bytes = b""
    finals: tuple[bytes, ...] = ()  # final_leaf of rounds 0 .. current - 1
    finals_root: bytes = field(default_factory=lambda: merkle_root(()))

    def copy(self) -> _State:
        rounds = {r: state.copy() for r, state in self.rounds.items()}
        return _State(
            self.current, rounds, dict(self.decided), self.log, self.decided_head,
            self.finals, self.finals_root,
        )  # fmt: skip

    def round(self, r: int, genesis: str) -> _Round:
        state = self.rounds.get(r)
        if state is None:
            base = genesis if r == 0 else None
            state = self.rounds[r] = _Round(r, base)
        return state


def _decided_item(*parts: object) -> bytes:
    return dag_cbor.encode(list(parts))  # type: ignore[arg-type]


class RoundMachine:
    """The round machine of one validator (see the module docstring).

    Parameters
    ----------
    genesis
        The chain's session, members and timing.
    keys
        Where statement authors' keys are found (default: in their Ed25519 peer IDs).
    """

    def __init__(self, genesis: RoundsGenesis, *, keys: KeyBook = PEER_ID_KEYS) -> None:
        self.genesis = genesis
        self._keys = keys
        self._members = frozenset(genesis.members)
        self._genesis_digest = genesis_digest(genesis)
        self._committed = _State(0, {}, {})
        self._pending: tuple[int, _State, bytes] | None = None
        self.height = 0
        """Height of the last committed block (0 before the first)."""
        self.app_hash = self._hash(self._committed)
        """App hash of the committed state."""

    # ------------------------------------------------------------------ ABCI steps

    def check(self, tx: bytes, *, also_seen: AbstractSet[str] = frozenset()) -> Verdict:
        """Judge ``tx`` against the committed state (CheckTx); changes nothing."""
        return self._apply(self._committed.copy(), tx)

    def prepare(self, txs: list[bytes]) -> list[bytes]:
        """Return the transactions of a proposal that would be accepted, in order."""
        work = self._committed.copy()
        return [tx for tx in txs if self._apply(work, tx).code == TxCode.OK]

    def finalize(
        self, height: int, txs: list[bytes], time_ns: int = 0
    ) -> tuple[list[Verdict], bytes]:
        """Execute a decided block at block time ``time_ns`` (ns since the Unix epoch).

        Returns each transaction's verdict and the new app hash; held until :meth:`commit`.
        """
        work = self._committed.copy()
        verdicts = [self._apply(work, tx) for tx in txs]
        self._end_block(work, time_ns)
        app_hash = self._hash(work)
        self._pending = (height, work, app_hash)
        return verdicts, app_hash

    def commit(self) -> None:
        """Make the finalized block the committed state (a no-op without one)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self.height, self._committed, self.app_hash = pending

    # ------------------------------------------------------------------ reading

    def view(self, r: int) -> RoundView:
        """Return what the committed state says about round ``r``."""
        state = self._committed
        decided = state.decided.get(r)
        if decided is not None:
            roster, (record, model), evidence = decided
            return RoundView(r, "final", None, roster, record, model, 0, evidence)
        known = state.rounds.get(r)
        if known is None:
            base = self.genesis.genesis if r == 0 else None
            return RoundView(r, "waiting" if r > state.current else "open", base, None, None, None)
        status = "waiting" if r > state.current else "open" if known.roster is None else "closed"
        contributions = tuple(
            RosterLine(p, c.cid, c.weight, c.signature)
            for p, c in sorted(known.contributions.items())
        )
        return RoundView(
            r, status, known.base, known.roster, None, None, len(known.results),
            tuple(sorted(known.equivocators)), contributions,
        )  # fmt: skip

    @property
    def current(self) -> int:
        """The committed state's current round (the first not final)."""
        return self._committed.current

    def query(self, path: str, data: bytes) -> tuple[bytes | None, str]:
        """Answer ``abci_query``: ``(value, "")`` or ``(None, reason)``."""
        if path == "/members":
            info = {**self.genesis.to_dict(), "f": self.genesis.f, "current": self.current}
            return dag_cbor.encode(info), ""
        if path == "/round":
            text = data.decode("ascii", "replace")
            if not text.isdigit() or len(text) > 13:
                return None, "/round data must be a decimal round number"
            return dag_cbor.encode(self.view(int(text)).to_dict()), ""
        if path == "/final":
            text = data.decode("ascii", "replace")
            if not text.isdigit() or len(text) > 13:
                return None, "/final data must be a decimal round number"
            return self._final_proof(int(text)), ""
        return None, f"unknown query path {path!r} (known: {', '.join(ROUND_QUERY_PATHS)})"

    def _final_proof(self, r: int) -> bytes | None:
        """Return the ``/final`` answer for round ``r`` (``None`` while it is not final)."""
        state = self._committed
        decided = state.decided.get(r)
        if decided is None:
            return None
        record, model = decided[1]  # (roster, (record, model), evidence, ...)
        proof: dict[str, dag_cbor.IPLDKind] = {
            "round": r, "record": record, "model": model, "index": r, "total": state.current,
            "aunts": list(merkle_aunts(state.finals, r)), "state": self._summary(state),
        }  # fmt: skip
        return dag_cbor.encode(proof)

    # ------------------------------------------------------------------ transactions

    def _decode(self, tx: bytes) -> tuple[Statement, RoundTx] | Verdict:
        if not tx:
            return Verdict(TxCode.MALFORMED, "empty transaction")
        if len(tx) > MAX_STATEMENT_BYTES:
            return Verdict(TxCode.TOO_LARGE, f"{len(tx)} bytes > {MAX_STATEMENT_BYTES}")
        try:
            statement = decode_statement(Block.new(bytes(tx), "dag-cbor"), keys=self._keys)
        except BadSignature as exc:
            return Verdict(TxCode.BAD_SIGNATURE, str(exc))
        except GradfedError as exc:
            return Verdict(TxCode.MALFORMED, str(exc))
        if statement.author not in self._members:
            return Verdict(TxCode.NOT_MEMBER, f"{statement.author:.60} is not a member")
        try:
            body = decode_body(statement.kind, statement.body)
        except DecodeError as exc:
            return Verdict(TxCode.MALFORMED, str(exc))
        if body.session != self.genesis.session:
            return Verdict(TxCode.OTHER_SESSION, f"session {body.session!r:.60}")
        return statement, body

    def _apply(self, work: _State, tx: bytes) -> Verdict:
        decoded = self._decode(tx)
        if isinstance(decoded, Verdict):
            return decoded
        statement, body = decoded
        r = body.round
        if r < work.current or r > work.current + 1:
            return Verdict(TxCode.OTHER_ROUND, f"round {r}; current is {work.current}")
        state = work.round(r, self.genesis.genesis)
        cid = str(statement.block.cid)
        if cid in state.seen:
            return Verdict(TxCode.DUPLICATE, f"statement {cid} is already logged")
        if isinstance(body, Contribution):
            signed = replace(body, signature=statement.signature)  # what its roster line carries
            verdict = self._contribute(work, state, statement.author, signed)
        elif isinstance(body, Attestation):
            verdict = self._attest(state, statement.author, body)
        else:
            verdict = self._result(work, state, statement.author, body)
        if verdict.code == TxCode.OK:
            state.seen.add(cid)
            work.log = _chain(_LOG_TAG, work.log, bytes(statement.block.cid))
            return Verdict(verdict.code, verdict.log, statement)
        return verdict

    def _contribute(self, work: _State, state: _Round, peer: str, body: Contribution) -> Verdict:
        if state.roster is not None:
            return Verdict(TxCode.CLOSED, f"round {state.number} is closed")
        if peer in state.equivocators:
            return Verdict(TxCode.CONFLICT, f"{peer:.60} equivocated in round {state.number}")
        if body.weight > self.genesis.max_weight:
            return Verdict(TxCode.MALFORMED, f"weight {body.weight} > {self.genesis.max_weight}")
        if state.base is not None and body.base != state.base:
            return Verdict(TxCode.WRONG_BASE, f"base {body.base}, not {state.base}")
        if peer in state.contributions:
            # Two different signed contributions of one peer to one round: proof it lied.
            first = state.contributions.pop(peer)
            state.equivocators.add(peer)
            item = _decided_item(state.number, "evidence", peer, first.cid, body.cid)
            work.decided_head = _chain(_DECIDED_TAG, work.decided_head, item)
            # Accepted (code 0, so CheckTx lets it through): the evidence changes the state.
            return Verdict(TxCode.OK, f"evidence: {peer:.60} equivocated: {first.cid}, {body.cid}")
        state.contributions[peer] = body
        return Verdict(TxCode.OK)

    def _attest(self, state: _Round, author: str, body: Attestation) -> Verdict:
        if state.roster is not None:
            return Verdict(TxCode.CLOSED, f"round {state.number} is closed")
        if body.peer not in self._members:
            return Verdict(TxCode.NOT_MEMBER, f"attests non-member {body.peer:.60}")
        known = state.attested.get((author, body.peer))
        if known is not None:  # one attestation per attester and contributor: state is bounded
            return Verdict(TxCode.CONFLICT, f"already attested {known} of {body.peer:.60}")
        state.attested[author, body.peer] = body.cid
        state.holders.setdefault((body.peer, body.cid), set()).add(author)
        return Verdict(TxCode.OK)

    def _result(self, work: _State, state: _Round, author: str, body: Result) -> Verdict:
        if state.number != work.current or state.roster is None:
            return Verdict(TxCode.NOT_CLOSED, f"round {state.number} has no roster yet")
        if author in state.results:
            return Verdict(TxCode.CONFLICT, f"{author:.60} already sent a result")
        state.results[author] = (body.record, body.model)
        equal = sum(1 for v in state.results.values() if v == (body.record, body.model))
        if equal >= 2 * self.genesis.f + 1:
            self._finish(work, state, (body.record, body.model))
        return Verdict(TxCode.OK)

    # ------------------------------------------------------------------ round steps

    def _finish(self, work: _State, state: _Round, final: tuple[str, str]) -> None:
        """Round ``state`` is final: record it and make the next round current."""
        assert state.roster is not None  # noqa: S101 - only closed rounds get results
        r = state.number
        work.decided[r] = (state.roster, final, tuple(sorted(state.equivocators)))
        item = _decided_item(r, "final", final[0], final[1])
        work.decided_head = _chain(_DECIDED_TAG, work.decided_head, item)
        work.finals = (*work.finals, final_leaf(r, *final))
        work.finals_root = merkle_root(work.finals)
        del work.rounds[r]
        work.current = r + 1
        following = work.round(r + 1, self.genesis.genesis)
        following.base = final[1]
        for peer, contribution in list(following.contributions.items()):
            if contribution.base != final[1]:  # made on another model: not this round's
                del following.contributions[peer]

    def _end_block(self, work: _State, time_ns: int) -> None:
        """Open and maybe close the current round at this block's time."""
        state = work.rounds.get(work.current)
        if state is None or state.roster is not None:
            return
        if state.opened_ns is None:
            if not state.contributions:
                return
            state.opened_ns = time_ns
        f = self.genesis.f
        held = {
            peer: c for peer, c in state.contributions.items()
            if len(state.holders.get((peer, c.cid), set()) | {peer}) > f
        }  # fmt: skip
        everyone = set(held) == self._members - state.equivocators
        due = time_ns - state.opened_ns >= self.genesis.collect_ms * 1_000_000
        if everyone or (due and len(held) >= self.genesis.min_peers):
            state.roster = tuple(
                RosterLine(p, held[p].cid, held[p].weight, held[p].signature) for p in sorted(held)
            )
            lines = [[e.peer, e.cid, e.weight] for e in state.roster]
            item = _decided_item(state.number, "roster", lines)
            work.decided_head = _chain(_DECIDED_TAG, work.decided_head, item)

    def _summary(self, state: _State) -> bytes:
        return state_summary(
            self._genesis_digest, state.log, state.decided_head, state.current, state.finals_root
        )

    def _hash(self, state: _State) -> bytes:
        return hashlib.sha256(self._summary(state)).digest()
