"""The CometBFT control plane of an agreed session: the members' chain decides each round.

Each member runs a validator whose app is the round machine
(:class:`~gradfed_ipfs.cometbft.abci.RoundMachine`, genesis from :func:`rounds_genesis`). In
round ``r`` a peer, through its own validator's RPC:

1. submits its signed **contribution** (CID, weight, base) with ``broadcast_tx_sync`` (the
   contribution is also announced on pubsub as before, so others start fetching at once);
2. fetches and verifies from IPFS, as in the pubsub plane, each contribution of the round the
   app lists (``/round``) or pubsub announces, and submits a signed **attestation** for each
   as soon as it verifies (a corrupt or oversized one is never attested, so it cannot enter
   the roster);
3. takes the **roster** the app decides (the contributions held by more than ``f`` members, at
   the block-time deadline or once every member's is held), fetches what it lacks of it, and
   builds the round's :class:`~gradfed_ipfs.formats.agreed.roster.Roster` from it (coordinator: the
   round's rank 0, so the roster block is the same on every peer);
4. after aggregating and writing its record as before, submits its **result** (record and
   model CIDs) and waits until the app has ``2f + 1`` equal results: the round is final. A
   final record other than this peer's raises :class:`~gradfed_ipfs.errors.RoundMismatch`.

With fixed members, a peer that has verified every member's contribution the chain lists
knows the roster before the chain decides it (all of them: the close once each is held by
more than ``f`` members). It then **guesses** it: aggregates at once and sends its result
naming that roster (:func:`~gradfed_ipfs.cometbft.abci.roster_digest`), so the results ride
in the block that closes the round (or the next) rather than in one after it. The chain counts
them only if it decides that roster; if it decides another (a deadline close without a
contribution, or an equivocation after the guess), the peer adopts the chain's, aggregates it
and sends its result again (:meth:`CometControl.confirm`).

With an admission policy (``AgreedConfig.admission``) the chain also decides the member set:
membership requests (join with its validator binding, approve, leave) are transactions, and a
round whose close changed the set says so in its view; every peer then builds the same
``gradfed.members`` record from it (linked to the set before), names it in the round's roster
and record, and uses it from the next round on (:mod:`~gradfed_ipfs.cometbft.abci.members`).
A joiner's validator is a full node of the chain first, and a validator once admitted.

The app answers from committed blocks only; the chain is polled every :data:`POLL_INTERVAL`
seconds, and read at once when a block holds this peer's last attestation of a round or its
result (both sent with ``broadcast_tx_commit``, which returns once its block is committed):
those are the blocks that may close the round or make it final.

A member that was down (its validator restarted: it replays its blocks into a fresh app, then
catches up by block sync) resyncs from the chain: :meth:`CometControl.final_head` waits until
its validator has caught up and returns the chain's last final round, which the session then
verifies from IPFS before adopting it (:meth:`~.session.AgreedSession.resync`).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Final, cast

import dag_cbor
from multiformats import CID

from ...._types import FloatArray
from ....cid import parse_cid
from ....cometbft.abci import (
    RosterLine,
    RoundsGenesis,
    RoundView,
    TxCode,
    attestation_tx,
    contribution_tx,
    result_tx,
    roster_digest,
    validator_binding,
)
from ....cometbft.rpc import CometRpc
from ....errors import (
    CometRpcError,
    DecodeError,
    QuorumNotReached,
    RoundMismatch,
    RoundVerificationFailed,
)
from ....formats.agreed.membership import ChangeOp, MemberChange, MemberSet
from ....formats.agreed.roster import Roster
from ....formats.statement import Signer
from ...exchange.fetcher import ContributionFetcher, is_transient
from ..config import AgreedConfig
from ..context import AdoptedRoster, RoundContext
from ..members import MemberTracker
from ..round.coordinator import Head, RoundBoard
from ..storage import FinishedRound

__all__ = ["POLL_INTERVAL", "CometControl", "rounds_genesis"]

logger = logging.getLogger("gradfed_ipfs.federated.agreed")

POLL_INTERVAL: Final = 0.1
"""Seconds between reads of the app's state of a round."""
_LATE: Final = re.compile(rf"code=({TxCode.OTHER_ROUND:d}|{TxCode.CLOSED:d}),")
"""CheckTx's refusal of a tx for a round already closed or final (its step is decided)."""
_RETRY: Final = 0.25
"""Seconds between submissions of a transaction the validator could not take yet."""
_COMMIT_WAIT: Final = 3.0
"""Longest wait for a transaction's block with ``broadcast_tx_commit`` (it holds a thread)."""


def _phase(r: int, phase: str) -> None:
    """Log a step of round ``r`` at debug level, with ``phase`` and ``round`` on the record."""
    logger.debug("round %d: %s", r, phase, extra={"phase": phase, "round": r})


@dataclass
class _Attesting:
    """One round's attestations: peers done with, fetches under way, a wake-up for the loop.

    ``committed`` is set by a block with this peer's last attestation, or (when the roster may
    be guessed) once no attestation is under way.
    """

    settled: set[str]  # attested, or refused for good
    running: dict[str, asyncio.Task[None]]
    committed: asyncio.Event
    guessing: bool = False
    verified: dict[str, str] = field(default_factory=dict)  # peer -> the CID that verified


def _digest(lines: Iterable[RosterLine]) -> bytes:
    return roster_digest((line.peer, line.cid, line.weight) for line in lines)


def rounds_genesis(session: str, genesis: CID | str, config: AgreedConfig) -> RoundsGenesis:
    """Return the round chain's genesis for a session: its members, quorum and deadline.

    ``min_peers`` is the session's quorum, the deadline ``collect_timeout`` (in block time),
    ``max_weight`` the session's; with ``config.admission`` its policy, allow-list (admitted
    on their signed join alone, under any policy) and ``evict_after``.
    """
    admission = config.admission
    return RoundsGenesis(
        session, str(genesis), config.members, config.quorum,
        round(config.collect_timeout * 1000), config.max_weight,
        admission=admission.policy if admission is not None else "",
        allow=admission.allow if admission is not None else (),
        evict_after=(admission.evict_after or 0) if admission is not None else 0,
    )  # fmt: skip


class CometControl:
    """The CometBFT control plane of one peer (see the module docstring).

    Parameters
    ----------
    rpc
        This member's own validator.
    signer
        This member's identity (its daemon's key: ``await pubsub.signer()``).
    session
        The session's name.
    genesis
        The session's genesis model CID.
    fetcher
        The session's contribution fetcher (fetches and verifies by CID).
    members
        The session's member sets (the current one is what a changed set links to).
    board
        What the session heard on pubsub: contributions there are attested once they verify,
        before the chain lists them (``None``: only the chain's are attested).
    sliced
        Reduce-scatter rounds: ``fetcher`` checks roots only (a chunked contribution's
        manifest), so an attestation says its root verified and is served; the reducers fetch
        the slices after the chain's roster, as on the pubsub plane. The roster is never
        guessed (a sliced run on a guess the chain overrules would have to be run again).
    """

    def __init__(
        self,
        rpc: CometRpc,
        signer: Signer,
        session: str,
        genesis: CID,
        fetcher: ContributionFetcher,
        members: MemberTracker | None = None,
        *,
        board: RoundBoard | None = None,
        sliced: bool = False,
    ) -> None:
        self.rpc, self._signer, self._fetcher, self._board = rpc, signer, fetcher, board
        self._sliced = sliced
        self._session, self._genesis = session, genesis
        self._members = members
        self._guessed: dict[int, bytes] = {}  # round -> digest of the roster guessed
        self._early: dict[int, tuple[str, asyncio.Future[None]]] = {}  # round -> record, its tx

    async def members_info(self) -> dict[str, Any]:
        """Read the chain's ``/members`` (current, next and pending members; see the app).

        Raises
        ------
        CometRpcError
            If the validator does not answer with such a map.
        """
        answer = await self.rpc.abci_query("/members", b"")
        try:
            info = dag_cbor.decode(answer.value) if answer.code == 0 else None
        except ValueError as exc:  # dag_cbor's errors are ValueErrors
            raise CometRpcError(f"/members: {exc}") from exc
        if not isinstance(info, dict):
            raise CometRpcError(f"/members: code {answer.code}: {answer.log:.200}")
        return info

    async def submit(self, tx: bytes, what: str, timeout: float) -> None:
        """Hand a signed statement (a membership request) to this member's validator."""
        await self._submit(tx, what, time.monotonic() + timeout)

    async def bind(self, round_number: int, timeout: float) -> None:
        """Bind this peer's validator (its node's key, from ``/status``) to it: a transaction.

        ``round_number`` is the round of the join it goes with (the chain refuses a binding
        dated before this peer's last leave or eviction, and holds a later one in place of an
        earlier).
        """
        status = await self.rpc.status()
        chain_id = str((status.get("node_info") or {}).get("network", ""))
        key = ((status.get("validator_info") or {}).get("pub_key") or {}).get("value", "")
        pub_key = base64.b64decode(str(key))
        tx = await validator_binding(self._signer, self._session, chain_id, pub_key, round_number)
        await self.submit(tx, "validator binding", timeout)

    async def admitted(self, peer: str, timeout: float) -> int:
        """Wait until the chain admits ``peer``; return its first round as a member.

        Raises
        ------
        QuorumNotReached
            If it is not admitted within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            with_info = await self._try(self.members_info(), deadline)
            joined = {} if with_info is None else with_info.get("joined") or {}
            if isinstance(joined, dict) and isinstance(joined.get(peer), int):
                return int(joined[peer])
            if time.monotonic() >= deadline:
                raise QuorumNotReached(-1, 0, 1)
            await asyncio.sleep(POLL_INTERVAL)  # the app's state changes only with blocks

    async def final(self, r: int, timeout: float) -> RoundView:
        """Wait until round ``r`` is final on the chain; return its view."""
        deadline = time.monotonic() + timeout
        while True:
            view = await self._look(r, deadline)
            if view is not None and view.status == "final":
                return view
            if time.monotonic() >= deadline:
                raise QuorumNotReached(r, 0 if view is None else view.results, 1)
            await asyncio.sleep(POLL_INTERVAL)  # the app's state changes only with blocks

    async def _try(self, call: Any, deadline: float) -> Any:
        try:
            return await call
        except CometRpcError:
            if time.monotonic() >= deadline:
                raise
            return None

    async def view(self, r: int) -> RoundView:
        """Read round ``r`` from the validator's app.

        Raises
        ------
        CometRpcError
            If the validator does not answer, or answers with something that is not a view.
        """
        answer = await self.rpc.abci_query("/round", str(r).encode())
        if answer.code != 0:
            raise CometRpcError(f"/round {r}: code {answer.code}: {answer.log:.200}")
        try:
            return RoundView.from_dict(dag_cbor.decode(answer.value))
        except (DecodeError, ValueError) as exc:  # dag_cbor's errors are ValueErrors
            raise CometRpcError(f"/round {r}: {exc}") from exc

    async def final_head(self, timeout: float) -> Head | None:
        """Return the chain's last final round as a head, once this validator has caught up.

        ``None`` while no round is final. The validator is this member's own: it checked every
        block it synced (the commits' signatures), so its app's answer is the chain's.

        Raises
        ------
        CometRpcError
            If the validator does not answer, or is still catching up, after ``timeout`` s.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = await self.rpc.status()
                if not (status.get("sync_info") or {}).get("catching_up", True):
                    return await self._last_final()
                why = "catching up"
            except CometRpcError as exc:
                why = str(exc)
            if time.monotonic() >= deadline:
                raise CometRpcError(f"{self.rpc.rpc_url}: no caught-up answer ({why:.200})")
            await asyncio.sleep(POLL_INTERVAL)  # catching up is not an event we can await

    async def _last_final(self) -> Head | None:
        answer = await self.rpc.abci_query("/members", b"")
        try:
            info = dag_cbor.decode(answer.value) if answer.code == 0 else None
            current = int(info["current"]) if isinstance(info, dict) else -1  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError) as exc:
            raise CometRpcError(f"/members: {exc!r:.200}") from exc
        if current < 0:
            raise CometRpcError(f"/members: code {answer.code}: {answer.log:.200}")
        if current == 0:
            return None
        view = await self.view(current - 1)
        if view.status != "final" or view.record is None or view.model is None:
            raise CometRpcError(f"round {current - 1} is not final in the app's own answer")
        return Head(current - 1, parse_cid(view.model), parse_cid(view.record))

    async def take(self, ctx: RoundContext) -> AdoptedRoster:
        """Contribute, attest what verifies, and adopt the roster the chain decides.

        Each contribution, listed by the chain or heard on pubsub, is fetched and attested as
        soon as it verifies, each on its own (:meth:`_attest_one`). The app is read every
        :data:`POLL_INTERVAL` seconds, and at once when this peer's last attestation is in a
        block (the block that may close the round).

        Raises
        ------
        QuorumNotReached
            If the chain decided no roster by ``round_timeout``.
        CometRpcError
            If this member's validator does not answer by then (the chain goes on without it).
        """
        r, own = ctx.number, ctx.own
        tx = await contribution_tx(self._signer, self._session, r, own.cid, own.weight, ctx.base)
        deadline = ctx.started + ctx.config.round_timeout
        await self._submit(tx, f"round {r} contribution", deadline)
        _phase(r, "contribution sent")
        guessing = ctx.config.admission is None and not self._sliced
        attesting = _Attesting({ctx.peer}, {}, asyncio.Event(), guessing)
        self._forget_before(r)
        try:
            seen, next_look = 0, 0.0
            while True:
                if attesting.committed.is_set() or time.monotonic() >= next_look:
                    attesting.committed.clear()
                    view = await self._look(r, deadline)
                    next_look = time.monotonic() + POLL_INTERVAL
                    if view is not None and view.roster is not None:
                        _phase(r, "roster closed")
                        return await self._adopt(ctx, view, deadline)
                    if view is not None and view.status == "open":
                        seen = len(view.contributions)
                        self._attest(ctx, view.contributions, attesting, deadline)
                        if _can_guess(ctx, view, attesting):
                            _phase(r, "roster guessed")
                            self._guessed[r] = _digest(view.contributions)
                            guess = replace(view, roster=view.contributions)
                            return await self._adopt(ctx, guess, deadline)
                self._attest(ctx, self._heard(ctx), attesting, deadline)
                if time.monotonic() >= deadline:
                    raise QuorumNotReached(r, seen, ctx.config.quorum)
                await self._wake(attesting.committed, next_look)
        finally:
            for task in attesting.running.values():
                task.cancel()

    def _forget_before(self, r: int) -> None:
        """Drop what earlier rounds left of guesses (a round that failed between its steps)."""
        for old in [k for k in self._guessed if k < r]:
            del self._guessed[old]
        for old in [k for k in self._early if k < r]:
            self._early.pop(old)[1].cancel()

    def guessed(self, r: int) -> bool:
        """Whether :meth:`take` returned a guessed roster for round ``r`` (see the module)."""
        return r in self._guessed

    async def confirm(self, ctx: RoundContext, record: CID, model: CID) -> AdoptedRoster | None:
        """Send this peer's result on its guessed roster; wait until the chain decides a roster.

        Returns ``None`` if the chain decided the guessed roster (:meth:`settle` then waits for
        finality; the result is already on its way), else the chain's roster, adopted: the
        session aggregates it and settles as without a guess.

        Raises
        ------
        QuorumNotReached
            If the chain decided no roster by ``round_timeout``.
        """
        r = ctx.number
        digest = self._guessed.pop(r)
        tx = await result_tx(self._signer, self._session, r, record, model, digest)
        deadline = ctx.started + ctx.config.round_timeout
        _phase(r, "result sent")
        sent = asyncio.ensure_future(self._submit(tx, f"round {r} result", deadline, commit=True))
        self._early[r] = (str(record), sent)
        while True:
            view = await self._look(r, deadline)
            if view is not None and view.roster is not None:
                _phase(r, "roster closed")
                if _digest(view.roster) == digest:
                    return None
                logger.info("round %d: the chain decided another roster than guessed", r)
                return await self._adopt(ctx, view, deadline)
            if time.monotonic() >= deadline:
                seen = 0 if view is None else len(view.contributions)
                raise QuorumNotReached(r, seen, ctx.config.quorum)
            await asyncio.wait([sent], timeout=POLL_INTERVAL)  # its block may close the round

    async def _wake(self, committed: asyncio.Event, until: float) -> None:
        """Wait until ``until`` (the next read), a block with this peer's tx, or pubsub news."""
        waits = [asyncio.ensure_future(committed.wait())]
        if self._board is not None:
            waits.append(asyncio.ensure_future(self._board.changed.wait()))
        try:
            timeout = max(0.0, until - time.monotonic())
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def settle(self, ctx: RoundContext, finished: FinishedRound) -> None:
        """Submit this peer's result and wait until the round is final.

        The result is submitted with ``broadcast_tx_commit``: its block may be the one that
        makes the round final, which this peer then reads at once (the app is polled
        meanwhile: a round made final by others' results never commits this one).

        Raises
        ------
        RoundMismatch
            If the chain finalized another record (this peer must resync).
        QuorumNotReached
            If no ``2f + 1`` equal results arrived within ``round_timeout``.
        """
        r, record = ctx.number, str(finished.record.cid)
        deadline = time.monotonic() + ctx.config.round_timeout
        early, early_sent = self._early.pop(r, ("", None))
        if early == record and early_sent is not None:  # sent on the guessed roster
            sent = early_sent
        else:
            if early_sent is not None:
                early_sent.cancel()  # a result on another roster than the chain's: useless
            tx = await result_tx(self._signer, self._session, r, record, finished.model)
            _phase(r, "result sent")
            coroutine = self._submit(tx, f"round {r} result", deadline, commit=True)
            sent = asyncio.ensure_future(coroutine)
        try:
            while True:
                view = await self._look(r, deadline)
                if view is not None and view.status == "final":
                    _phase(r, "finalized")
                    if view.record != record:
                        raise RoundMismatch(r, record, {"cometbft": str(view.record)})
                    return
                if time.monotonic() >= deadline:
                    results = 0 if view is None else view.results
                    raise QuorumNotReached(r, results, len(ctx.config.members))
                if sent.done():  # a round final without this result: its tx is never committed
                    await asyncio.sleep(POLL_INTERVAL)  # the app's state changes only with blocks
                else:  # read again once the block with this result is committed
                    await asyncio.wait([sent], timeout=POLL_INTERVAL)
        finally:
            sent.cancel()

    async def _look(self, r: int, deadline: float) -> RoundView | None:
        """Read round ``r``; ``None`` while the validator does not answer, until ``deadline``.

        A member's validator may be restarting (its app replays the chain) or catching up: the
        round waits for it rather than failing.
        """
        try:
            return await self.view(r)
        except CometRpcError as exc:
            if time.monotonic() >= deadline:
                raise
            logger.debug("round %d: validator not answering (%s)", r, exc)
            return None

    async def _submit(self, tx: bytes, what: str, deadline: float, *, commit: bool = False) -> None:
        """Hand ``tx`` to the validator, retrying until ``deadline`` while it cannot take it.

        The app's refusal (CheckTx's code) is logged and final: the chain decides without it.
        A validator still catching up, unreachable or with a full mempool is asked again.
        ``commit``: return once the transaction is in a committed block, or after
        :data:`_COMMIT_WAIT` seconds (the caller reads the app anyway; a transaction the
        chain's decision made useless is never proposed); on an error, submit it as above.
        """
        while True:
            try:
                if not commit:
                    await self.rpc.broadcast_tx_sync(tx)
                    return
                result = await self.rpc.broadcast_tx_commit(tx, timeout=_COMMIT_WAIT)
                if result.code == 0:
                    return
                text = f"code={result.code}, log={result.log}"
                if result.code in (TxCode.OTHER_ROUND, TxCode.CLOSED):
                    logger.debug("%s too late for the chain: %s", what, text)
                else:
                    logger.warning("%s refused by the validator: %s", what, text)
                return
            except CometRpcError as exc:
                text = str(exc)
                if "already exists in cache" in text:  # submitted before: it is in the mempool
                    return
                if _LATE.search(text):  # the chain decided that step without this tx: normal
                    logger.debug("%s too late for the chain: %s", what, exc)
                    return
                if commit:  # timed out in the mempool, or not taken: make sure it is there
                    logger.debug("%s: not committed (%s); submitted again", what, exc)
                    commit = False
                    continue
                if "code=" in text or time.monotonic() >= deadline:
                    logger.warning("%s refused by the validator: %s", what, exc)
                    return
                logger.debug("%s: validator busy (%s); again", what, exc)
            await asyncio.sleep(_RETRY)  # a validator's readiness is not an event we can await

    def _heard(self, ctx: RoundContext) -> list[RosterLine]:
        """Return the round's contributions heard on pubsub from members, on its base.

        Attesting one that the chain never lists is harmless (it holds nothing); one per
        attester and peer is taken, so a peer that announces one CID and submits another gets
        no attestation from this member for the second.
        """
        heard = None if self._board is None else self._board.rounds.get(ctx.number)
        if heard is None:
            return []
        return [
            RosterLine(peer, str(c.cid), c.weight)
            for peer, c in list(heard.contributions.items())
            if bytes(c.base) == bytes(ctx.base) and peer in ctx.config.members
        ]

    def _attest(
        self,
        ctx: RoundContext,
        lines: Iterable[RosterLine],
        attesting: _Attesting,
        deadline: float,
    ) -> None:
        """Start fetching and attesting each contribution not yet started (once per peer)."""
        for line in lines:
            if line.peer in attesting.settled or line.peer in attesting.running:
                continue
            if line.weight > ctx.config.max_weight or line.peer in ctx.excluded:
                attesting.settled.add(line.peer)
                ctx.rejected[line.peer] = f"weight {line.weight} or excluded: not attested"
                continue
            attesting.running[line.peer] = asyncio.create_task(
                self._attest_one(ctx, line, attesting, deadline)
            )

    async def _attest_one(
        self, ctx: RoundContext, line: RosterLine, attesting: _Attesting, deadline: float
    ) -> None:
        """Fetch one contribution and attest it as soon as it verifies.

        A transient failure ends this task unsettled: the next pass starts it again. This
        peer's last attestation of the round's members waits for its block
        (``broadcast_tx_commit``), then wakes the round's loop to read the app at once.
        """
        try:
            task = self._fetcher.fetch(parse_cid(line.cid), ctx.d)
            await asyncio.wait([task])
            if task.cancelled() or task.exception() is not None:
                if not is_transient(task):
                    attesting.settled.add(line.peer)
                    ctx.rejected[line.peer] = f"contribution {line.cid}: {task.exception()}"
                return
            attesting.settled.add(line.peer)
            attesting.verified[line.peer] = line.cid
            # The last one waits for its block, the one that may close the round, unless the
            # roster may be guessed: then the round's loop reads the app once none is under way.
            last = attesting.settled >= set(ctx.config.members) and not attesting.guessing
            tx = await attestation_tx(self._signer, self._session, ctx.number, line.peer, line.cid)
            what = f"round {ctx.number} attestation of {line.peer}"
            await self._submit(tx, what, deadline, commit=last)
            if last:
                attesting.committed.set()
        finally:
            attesting.running.pop(line.peer, None)
            if attesting.guessing and not attesting.running:
                attesting.committed.set()

    async def _adopt(self, ctx: RoundContext, view: RoundView, deadline: float) -> AdoptedRoster:
        """Fetch the decided roster's contributions (retrying until ``deadline``); adopt it.

        Reduce-scatter: their roots, checked; the slices are the aggregate step's.
        """
        lines: tuple[RosterLine, ...] = view.roster or ()
        gradients = [await self._values(ctx, line, deadline) for line in lines]
        entries = {  # each entry signed by its owner's contribution transaction
            line.peer: (parse_cid(line.cid), line.weight, line.signature or None) for line in lines
        }
        member_set = self._member_set(view)
        roster = Roster.new(
            self._session, self._genesis, ctx.number, ctx.base, ctx.ranking[0],
            ctx.config.members, entries, None if member_set is None else member_set[1],
        )  # fmt: skip
        block = roster.to_block()
        logger.debug("round %d: chain roster %s (%d entries)", ctx.number, block.cid, len(lines))
        values = None if self._sliced else tuple(gradients)
        return AdoptedRoster(block.cid, roster, block, values, member_set)

    def _member_set(self, view: RoundView) -> tuple[MemberSet, CID] | None:
        """Return the ``gradfed.members`` record of the change the round's close made, if any.

        The same bytes on every member: the chain's members and changes, linked to the set
        this peer (like every member that followed the chain) holds now.
        """
        if view.members is None or self._members is None:
            return None
        changes = tuple(
            MemberChange(cast("ChangeOp", op), peer, statements)
            for op, peer, statements in view.changes
        )
        member_set = MemberSet(
            self._session, self._genesis, view.round + 1, view.members,
            self._members.current_cid, changes,
        )  # fmt: skip
        return member_set, member_set.to_block().cid

    async def _values(self, ctx: RoundContext, line: RosterLine, deadline: float) -> FloatArray:
        """Return a roster entry's values: more than ``f`` members hold it, so one serves it."""
        cid = parse_cid(line.cid)
        while True:
            task = self._fetcher.fetch(cid, ctx.d)
            await asyncio.wait([task], timeout=max(0.0, deadline - time.monotonic()))
            if task.done() and not (task.cancelled() or task.exception() is not None):
                return task.result()
            if task.done() and not is_transient(task):
                raise RoundVerificationFailed(
                    f"round {ctx.number}: the chain's roster lists {line.cid} of {line.peer}, "
                    f"which does not verify ({task.exception()}): more than f members attested it"
                )
            if time.monotonic() >= deadline:
                raise QuorumNotReached(ctx.number, 0, len(ctx.config.members))


def _can_guess(ctx: RoundContext, view: RoundView, attesting: _Attesting) -> bool:
    """Whether the roster the chain will decide is known here: every member's contribution.

    That is the close once each listed contribution is held by more than ``f`` members, which
    the honest members' attestations bring: every member listed, no evidence, each
    contribution verified here (the CID the chain lists) and attested (none under way). Only
    with fixed members: a close may change the member set, which the record names.
    """
    if not attesting.guessing or attesting.running or view.evidence:
        return False
    listed = {line.peer: line.cid for line in view.contributions}
    if set(listed) != set(ctx.config.members):
        return False
    verified = attesting.verified
    return all(p == ctx.peer or verified.get(p) == cid for p, cid in listed.items())
