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
  with ``2f + 1`` equal results, and the next round becomes current. A result that names the
  digest of the roster it aggregated (:func:`~.txs.roster_digest`) may come while the round is
  still open: it is held (one per author) and counts at the close if that roster is the one
  decided, else it is dropped (its author may send another), so the block that closes a round
  can also make it final. After the close a named digest must be the roster's.

The current round *opens* at the first block that sees one of its contributions, and *closes*
at the end of the first block in which every member (but equivocators) has a held contribution,
or whose block time is at least ``collect_ms`` after the opening and which has ``min_peers``
held contributions: its roster is then the held contributions, sorted by peer.

With an admission policy in the genesis the member set changes (:mod:`.members`): joins,
approvals and leaves are transactions too, and at each close the machine decides the member set
of the rounds after it (leaves, evictions after ``evict_after`` absent rosters or on the round's
evidence, admitted joins) and hands CometBFT the validator updates of that change. Each round's
``f``, quorum and expected contributors are its own member set's.

Anything else (a bad signature, a non-member, another session, a decided or far-ahead round, a
duplicate, a contribution after the close, a result before it, a second attestation of another
CID) is refused with a :class:`~.ledger.TxCode` and changes nothing. The app hash is SHA-256 of
the dag-cbor map ``{version: 2, genesis, log, decided, current, finals}`` (:func:`state_summary`):
``genesis`` is SHA-256 of the genesis ``app_state`` as dag-cbor (the member set, bindings and
timing), ``log`` a hash chain over every accepted statement's CID in order, ``decided`` one over
every roster, member-set change (members, changes, validator updates), final result and
evidence as decided, ``current`` the first round not final, and
``finals`` the Merkle root (:mod:`~gradfed_ipfs.cometbft.merkle`, CometBFT's tree) over one leaf
per final round, ``dag-cbor [round, record CID, model CID]`` (:func:`final_leaf`), round ``r`` at
index ``r`` of ``current`` leaves. So a final record is shown to be in an app hash by the summary
map (about 200 bytes) and ``⌈log2 current⌉`` aunts: the ``/final`` query's answer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any, Final

import dag_cbor
from multiformats import CID

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
from .members import MEMBERSHIP_KINDS, ChainRules, MemberRequests, SetChange, decide, judge_request
from .txs import Attestation, Contribution, Result, decode_body, roster_digest

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
dag-cbor :meth:`RoundView.to_dict`), ``/members`` (dag-cbor: the genesis ``app_state`` with the
current round's ``members``, and ``f``, ``current``, ``next``, ``joined``, ``pending``: see
:meth:`RoundMachine.members_info`), ``/final`` with a decimal round number (the proof that the
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
_POLICIES: Final = ("", "allow-list", "majority", "two-thirds")


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
        Each member's signed ``comet/validator`` statement naming its validator's key and
        round 0 (:func:`~.txs.validator_binding`; checked against the genesis validators at
        ``InitChain`` by :func:`~.bindings.check_bindings`); empty: validators not bound.
    admission
        ``""``: the members are fixed; ``"allow-list"``, ``"majority"`` or ``"two-thirds"``:
        the member set changes by signed requests (:mod:`.members`).
    allow
        Peers admitted on their signed join alone (any policy but ``""``).
    evict_after
        A member absent from this many rosters in a row is evicted (0: never).
    """

    session: str
    genesis: str
    members: tuple[str, ...]
    min_peers: int
    collect_ms: int
    max_weight: int = 2**53
    bindings: tuple[bytes, ...] = ()
    admission: str = ""
    allow: tuple[str, ...] = ()
    evict_after: int = 0

    def __post_init__(self) -> None:
        members = tuple(sorted(set(self.members)))
        object.__setattr__(self, "members", members)
        object.__setattr__(self, "allow", tuple(sorted(set(self.allow))))
        if self.admission not in _POLICIES or len(self.allow) > _MAX_MEMBERS:
            raise MalformedManifest(f"admission {self.admission!r:.40} not one of {_POLICIES}")
        if not 0 <= self.evict_after <= 2**20:
            raise MalformedManifest(f"evict_after {self.evict_after} not in [0, 2**20]")
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
        admission = {"policy": self.admission, "allow": list(self.allow),
                     "evict_after": self.evict_after}  # fmt: skip
        return {
            "app": APP_STATE_TAG,
            "session": self.session,
            "genesis": self.genesis,
            "members": list(self.members),
            "min_peers": self.min_peers,
            "collect_ms": self.collect_ms,
            "max_weight": self.max_weight,
            "bindings": [b.hex() for b in self.bindings],
            # Only with an admission policy: a chain of fixed members keeps its genesis bytes.
            **({"admission": admission} if self.admission else {}),
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
            admission = state.get("admission") or {"policy": ""}
            return cls(
                str(state["session"]), str(state["genesis"]),
                tuple(str(m) for m in state["members"]), int(state["min_peers"]),
                int(state["collect_ms"]), int(state.get("max_weight", 2**53)),
                tuple(bytes.fromhex(str(b)) for b in state.get("bindings", ())),
                str(admission["policy"]), tuple(str(p) for p in admission.get("allow", ())),
                int(admission.get("evict_after", 0)),
            )  # fmt: skip
        except (AttributeError, KeyError, TypeError, ValueError, DecodeError) as exc:
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
    early: dict[str, tuple[bytes, str, str]] = field(default_factory=dict)  # before the close

    def copy(self) -> _Round:
        return _Round(
            self.number, self.base, self.opened_ns, set(self.seen), dict(self.contributions),
            {k: set(v) for k, v in self.holders.items()}, dict(self.attested),
            set(self.equivocators), self.roster, dict(self.results), dict(self.early),
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
    members
        The member set of the rounds after this one, when its close changed it (else
        ``None``).
    changes
        That change's ``(op, peer, statements)``, sorted by peer (see :class:`.SetChange`).
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
    members: tuple[str, ...] | None = None
    changes: tuple[tuple[str, str, tuple[bytes, ...]], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the dag-cbor map of the ``/round`` answer."""
        return {
            "round": self.round, "status": self.status, "base": self.base,
            "roster": None if self.roster is None
            else [[e.peer, e.cid, e.weight, e.signature] for e in self.roster],
            "record": self.record, "model": self.model, "results": self.results,
            "evidence": list(self.evidence),
            "contributions": [[e.peer, e.cid, e.weight, e.signature] for e in self.contributions],
            "members": None if self.members is None else list(self.members),
            "changes": [[op, peer, list(data)] for op, peer, data in self.changes],
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
            roster, members = value["roster"], value.get("members")
            return cls(
                int(value["round"]), str(value["status"]), value["base"],
                None if roster is None else _lines(roster), value["record"], value["model"],
                int(value["results"]), tuple(str(p) for p in value["evidence"]),
                _lines(value["contributions"]),
                None if members is None else tuple(str(p) for p in members),
                tuple(
                    (str(op), str(peer), tuple(bytes(d) for d in data))
                    for op, peer, data in value.get("changes", ())
                ),
            )  # fmt: skip
        except (AssertionError, KeyError, TypeError, ValueError) as exc:
            raise MalformedManifest(f"not a /round answer: {exc!r:.200}") from exc


def _lines(value: Any) -> tuple[RosterLine, ...]:
    return tuple(RosterLine(str(p), str(c), int(w), bytes(s)) for p, c, w, s in value)


_Decided = tuple[tuple[RosterLine, ...], tuple[str, str], tuple[str, ...], SetChange | None]


@dataclass
class _State:
    """Committed (or pending) state; :meth:`copy` forks it for a block being finalized."""

    current: int
    rounds: dict[int, _Round]  # the current round and the next (created on demand)
    decided: dict[int, _Decided]  # roster, (record, model), evidence, member change
    log: bytes = b""
    decided_head: bytes = b""
    finals: tuple[bytes, ...] = ()  # final_leaf of rounds 0 .. current - 1
    finals_root: bytes = field(default_factory=lambda: merkle_root(()))
    members: tuple[str, ...] = ()  # the current round's, sorted
    keys: dict[str, bytes] = field(default_factory=dict)  # member -> its validator key
    joined: dict[str, int] = field(default_factory=dict)  # member -> its first round
    streaks: dict[str, int] = field(default_factory=dict)  # member -> rosters missed in a row
    requests: MemberRequests = field(default_factory=MemberRequests)
    next: SetChange | None = None  # the change the current round's close decided
    updates: list[tuple[bytes, int]] = field(default_factory=list)  # this block's

    def copy(self) -> _State:
        rounds = {r: state.copy() for r, state in self.rounds.items()}
        return _State(
            self.current, rounds, dict(self.decided), self.log, self.decided_head,
            self.finals, self.finals_root, self.members, dict(self.keys), dict(self.joined),
            dict(self.streaks), self.requests.copy(), self.next, list(self.updates),
        )  # fmt: skip

    def members_of(self, r: int) -> tuple[str, ...]:
        """Return the members of round ``r`` (the current one or the next)."""
        if r == self.current + 1 and self.next is not None:
            return self.next.members
        return self.members

    def round(self, r: int, genesis: str) -> _Round:
        state = self.rounds.get(r)
        if state is None:
            base = genesis if r == 0 else None
            state = self.rounds[r] = _Round(r, base)
        return state


def _decided_item(*parts: object) -> bytes:
    return dag_cbor.encode(list(parts))  # type: ignore[arg-type]


def _faults(members: int) -> int:
    return (members - 1) // 3


def _digest(roster: tuple[RosterLine, ...]) -> bytes:
    return roster_digest((e.peer, e.cid, e.weight) for e in roster)


class RoundMachine:
    """The round machine of one validator (see the module docstring).

    Parameters
    ----------
    genesis
        The chain's session, members and timing.
    keys
        Where statement authors' keys are found (default: in their Ed25519 peer IDs).
    chain_id
        The chain's ID (``InitChain``'s): a joiner's validator binding must name it.
    validator_keys
        The genesis members' validator keys (:func:`~.bindings.check_bindings`), so that a
        member that goes gets a validator update of power 0.
    """

    def __init__(
        self,
        genesis: RoundsGenesis,
        *,
        keys: KeyBook = PEER_ID_KEYS,
        chain_id: str = "",
        validator_keys: Mapping[str, bytes] | None = None,
    ) -> None:
        self.genesis = genesis
        self._keys = keys
        self._rules = ChainRules(
            genesis.session, genesis.genesis, chain_id, genesis.admission,
            frozenset(genesis.allow), genesis.evict_after,
        )  # fmt: skip
        self._committed = _State(
            0, {}, {}, members=genesis.members, keys=dict(validator_keys or {}),
            joined=dict.fromkeys(genesis.members, 0),
        )  # fmt: skip
        self._genesis_digest = genesis_digest(genesis)
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
        work.updates = []
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

    def validator_updates(self) -> list[tuple[bytes, int]]:
        """Return the finalized block's validator updates ``(Ed25519 key, power)``, in order."""
        return [] if self._pending is None else list(self._pending[1].updates)

    # ------------------------------------------------------------------ reading

    def view(self, r: int) -> RoundView:
        """Return what the committed state says about round ``r``."""
        state = self._committed
        decided = state.decided.get(r)
        if decided is not None:
            roster, (record, model), evidence, change = decided
            return RoundView(
                r, "final", None, roster, record, model, 0, evidence, (),
                *_change_fields(change),
            )  # fmt: skip
        known = state.rounds.get(r)
        if known is None:
            base = self.genesis.genesis if r == 0 else None
            return RoundView(r, "waiting" if r > state.current else "open", base, None, None, None)
        status = "waiting" if r > state.current else "open" if known.roster is None else "closed"
        contributions = tuple(
            RosterLine(p, c.cid, c.weight, c.signature)
            for p, c in sorted(known.contributions.items())
        )
        change = state.next if r == state.current and known.roster is not None else None
        return RoundView(
            r, status, known.base, known.roster, None, None, len(known.results),
            tuple(sorted(known.equivocators)), contributions, *_change_fields(change),
        )  # fmt: skip

    @property
    def current(self) -> int:
        """The committed state's current round (the first not final)."""
        return self._committed.current

    @property
    def members(self) -> tuple[str, ...]:
        """The committed state's members of the current round, sorted."""
        return self._committed.members

    def members_info(self) -> dict[str, Any]:
        """Return the ``/members`` answer: the genesis, and the current, next and pending members.

        ``members`` the current round's, ``f`` theirs, ``next`` the set the current round's
        close decided (``None``: none yet), ``joined`` each member's first round, ``pending``
        ``[peer, join statement CID]`` of the held joins.
        """
        state = self._committed
        return {
            **self.genesis.to_dict(), "members": list(state.members),
            "f": _faults(len(state.members)), "current": state.current,
            "next": None if state.next is None else list(state.next.members),
            "joined": {
                **state.joined, **({} if state.next is None
                                   else dict.fromkeys(dict(state.next.keys), state.current + 1))
            },
            "pending": [
                [p, str(CID.decode(cid))] for p, (cid, _) in sorted(state.requests.joins.items())
            ],
        }  # fmt: skip

    def query(self, path: str, data: bytes) -> tuple[bytes | None, str]:
        """Answer ``abci_query``: ``(value, "")`` or ``(None, reason)``."""
        if path == "/members":
            return dag_cbor.encode(self.members_info()), ""
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

    def _statement(self, tx: bytes) -> Statement | Verdict:
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
        return statement

    def _apply(self, work: _State, tx: bytes) -> Verdict:
        statement = self._statement(tx)
        if isinstance(statement, Verdict):
            return statement
        if statement.kind in MEMBERSHIP_KINDS:
            verdict = judge_request(
                self._rules, work.members, work.keys, work.requests, statement, work.current
            )
        else:
            verdict = self._round_tx(work, statement)
        if verdict.code == TxCode.OK:
            work.log = _chain(_LOG_TAG, work.log, bytes(statement.block.cid))
            return Verdict(verdict.code, verdict.log, statement)
        return verdict

    def _round_tx(self, work: _State, statement: Statement) -> Verdict:
        try:
            body = decode_body(statement.kind, statement.body)
        except DecodeError as exc:
            return Verdict(TxCode.MALFORMED, str(exc))
        if body.session != self.genesis.session:
            return Verdict(TxCode.OTHER_SESSION, f"session {body.session!r:.60}")
        r = body.round
        if r < work.current or r > work.current + 1:
            return Verdict(TxCode.OTHER_ROUND, f"round {r}; current is {work.current}")
        members = work.members_of(r)
        if statement.author not in members:
            return Verdict(TxCode.NOT_MEMBER, f"{statement.author:.60} is not a member")
        state = work.round(r, self.genesis.genesis)
        cid = str(statement.block.cid)
        if cid in state.seen:
            return Verdict(TxCode.DUPLICATE, f"statement {cid} is already logged")
        if isinstance(body, Contribution):
            signed = replace(body, signature=statement.signature)  # what its roster line carries
            verdict = self._contribute(work, state, statement.author, signed)
        elif isinstance(body, Attestation):
            verdict = self._attest(state, members, statement.author, body)
        else:
            verdict = self._result(work, state, statement.author, body)
        if verdict.code == TxCode.OK:
            state.seen.add(cid)
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

    def _attest(
        self, state: _Round, members: tuple[str, ...], author: str, body: Attestation
    ) -> Verdict:
        if state.roster is not None:
            return Verdict(TxCode.CLOSED, f"round {state.number} is closed")
        if body.peer not in members:
            return Verdict(TxCode.NOT_MEMBER, f"attests non-member {body.peer:.60}")
        known = state.attested.get((author, body.peer))
        if known is not None:  # one attestation per attester and contributor: state is bounded
            return Verdict(TxCode.CONFLICT, f"already attested {known} of {body.peer:.60}")
        state.attested[author, body.peer] = body.cid
        state.holders.setdefault((body.peer, body.cid), set()).add(author)
        return Verdict(TxCode.OK)

    def _result(self, work: _State, state: _Round, author: str, body: Result) -> Verdict:
        if state.number != work.current or (state.roster is None and not body.roster):
            return Verdict(TxCode.NOT_CLOSED, f"round {state.number} has no roster yet")
        if author in state.results or author in state.early:
            return Verdict(TxCode.CONFLICT, f"{author:.60} already sent a result")
        if state.roster is None:  # held until the close: counted if it names that roster
            state.early[author] = (body.roster, body.record, body.model)
            return Verdict(TxCode.OK)
        if body.roster and body.roster != _digest(state.roster):
            return Verdict(TxCode.WRONG_ROSTER, f"names another roster than round {state.number}'s")
        state.results[author] = (body.record, body.model)
        self._maybe_final(work, state, (body.record, body.model))
        return Verdict(TxCode.OK)

    def _maybe_final(self, work: _State, state: _Round, result: tuple[str, str]) -> None:
        """Finish round ``state`` if ``2f + 1`` of its results are ``result``."""
        equal = sum(1 for v in state.results.values() if v == result)
        if equal >= 2 * _faults(len(work.members)) + 1:
            self._finish(work, state, result)

    def _take_early(self, work: _State, state: _Round) -> None:
        """At the close: count the held results that name the decided roster, drop the rest."""
        assert state.roster is not None  # noqa: S101 - called right after the close
        digest, early = _digest(state.roster), state.early
        state.early = {}
        for author, (named, record, model) in sorted(early.items()):
            if named == digest and work.current == state.number:
                state.results[author] = (record, model)
                self._maybe_final(work, state, (record, model))

    # ------------------------------------------------------------------ round steps

    def _finish(self, work: _State, state: _Round, final: tuple[str, str]) -> None:
        """Round ``state`` is final: record it and make the next round current."""
        assert state.roster is not None  # noqa: S101 - only closed rounds get results
        r, change = state.number, work.next
        work.decided[r] = (state.roster, final, tuple(sorted(state.equivocators)), change)
        item = _decided_item(r, "final", final[0], final[1])
        work.decided_head = _chain(_DECIDED_TAG, work.decided_head, item)
        work.finals = (*work.finals, final_leaf(r, *final))
        work.finals_root = merkle_root(work.finals)
        del work.rounds[r]
        work.current, work.next = r + 1, None
        if change is not None:
            _take_change(work, change)
        following = work.round(r + 1, self.genesis.genesis)
        following.base = final[1]
        for peer, contribution in list(following.contributions.items()):
            # Made on another model, or by a member gone: not this round's.
            if contribution.base != final[1] or peer not in work.members:
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
        members = set(work.members)
        f = _faults(len(members))
        held = {
            peer: c for peer, c in state.contributions.items()
            if len((state.holders.get((peer, c.cid), set()) | {peer}) & members) > f
        }  # fmt: skip
        everyone = set(held) == members - state.equivocators
        due = time_ns - state.opened_ns >= self.genesis.collect_ms * 1_000_000
        if everyone or (due and len(held) >= min(self.genesis.min_peers, len(members))):
            state.roster = tuple(
                RosterLine(p, held[p].cid, held[p].weight, held[p].signature) for p in sorted(held)
            )
            lines = [[e.peer, e.cid, e.weight] for e in state.roster]
            item = _decided_item(state.number, "roster", lines)
            work.decided_head = _chain(_DECIDED_TAG, work.decided_head, item)
            self._decide_members(work, state)
            self._take_early(work, state)

    def _decide_members(self, work: _State, state: _Round) -> None:
        """At round ``state``'s close: the member set of the rounds after it (see :mod:`.members`).

        The change is committed in the ``decided`` chain (so in the app hash) with the
        validator updates it makes, which this block hands to CometBFT.
        """
        if not self._rules.policy or state.roster is None:
            return
        peers = {line.peer for line in state.roster}
        for member in work.members:
            work.streaks[member] = 0 if member in peers else work.streaks.get(member, 0) + 1
        after = self._rules.evict_after
        gone = {
            m: "evict" for m in work.members
            if m in state.equivocators or (after and work.streaks[m] >= after)
        }  # fmt: skip
        change = decide(self._rules, state.number, work.members, work.keys, work.requests, gone)
        if change is None:
            return
        work.next = change
        work.updates.extend(change.updates)
        item = _decided_item(
            state.number, "members", list(change.members),
            [[op, peer] for op, peer, _ in change.changes],
            [[key, power] for key, power in change.updates],
        )  # fmt: skip
        work.decided_head = _chain(_DECIDED_TAG, work.decided_head, item)

    def _summary(self, state: _State) -> bytes:
        return state_summary(
            self._genesis_digest, state.log, state.decided_head, state.current, state.finals_root
        )

    def _hash(self, state: _State) -> bytes:
        return hashlib.sha256(self._summary(state)).digest()


def _change_fields(
    change: SetChange | None,
) -> tuple[tuple[str, ...] | None, tuple[tuple[str, str, tuple[bytes, ...]], ...]]:
    return (None, ()) if change is None else (change.members, change.changes)


def _take_change(work: _State, change: SetChange) -> None:
    """Make ``change``'s set the current members (the round after its close has begun)."""
    work.members = change.members
    kept = set(change.members)
    work.keys = {p: k for p, k in work.keys.items() if p in kept} | dict(change.keys)
    work.joined = {p: r for p, r in work.joined.items() if p in kept}
    work.joined.update(dict.fromkeys(dict(change.keys), change.round))
    work.streaks = {p: n for p, n in work.streaks.items() if p in kept}
