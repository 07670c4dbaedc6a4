"""Agreed rounds from the CLI: ``verify-round``/``history`` of agreed records, and ``resync``.

``resync`` adopts a session's latest agreed head, verified back to its genesis. ``history`` and
``resync`` bound their chain walk and re-check in time (:class:`Deadline`, ``--deadline``).

An agreed round record (:class:`~gradfed_ipfs.formats.agreed.roster.AgreedRecord`) links its roster,
base model and result model. Re-verifying it fetches the roster and every listed contribution
(each block re-hashed against its CID), re-aggregates them on the base model with
:func:`~gradfed_ipfs.tensor.deterministic.deterministic_update` and the record's learning rate,
and compares the result's CID with the record's. A round written with a custom update rule
(``record.rule``, e.g. a server optimizer) cannot be recomputed from its label: everything else
is checked and the round is reported "unverifiable", never as verified.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Final, TypeVar

from multiformats import CID
from rich.table import Table

from ..block import Block
from ..cometbft.finality import FinalityBundle, verify_finality
from ..errors import (
    BadSignature,
    BlockStoreError,
    ChainDeadlineExceeded,
    DecodeError,
    FederatedError,
    FinalityNotProven,
    GradientError,
    RoundVerificationFailed,
)
from ..federated.agreed.config import UpdateRule
from ..federated.agreed.history import (
    MemberState,
    ModelState,
    check_member_sets,
    load_chain,
    load_record,
    load_round_inputs,
    verify_agreed_history,
    verify_record,
)
from ..federated.agreed.membership import Admission
from ..formats.agreed.membership import MemberSet
from ..formats.agreed.roster import (
    AgreedRecord,
    Roster,
    verify_roster_coordinator,
    verify_roster_entries,
)
from ..storage.base import BlockStore
from ..storage.dag import fetch_gradient
from ..storage.kubo import KuboBlockStore
from .common import console, err_console

__all__ = [
    "DEFAULT_DEADLINE",
    "AgreedCheck",
    "Deadline",
    "agreed_history",
    "check_agreed_round",
    "verify_agreed",
    "verify_final",
]

DEFAULT_DEADLINE: Final = 60.0
"""Default ``--deadline`` of ``history`` and ``resync``, in seconds."""

T = TypeVar("T")
_MORE_TIME: Final = "nothing was verified (allow more time with --deadline SECONDS)"


class Deadline:
    """A command's ``--deadline``: its chain walk and the re-check of its rounds end by then.

    The clock starts at the first :meth:`left` (the walk, given the whole budget); what the
    walk leaves is the re-check's.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end: float | None = None

    def left(self) -> float:
        """Seconds left (the whole budget on the first call, which starts the clock)."""
        if self._end is None:
            self._end = time.monotonic() + self.seconds
            return self.seconds
        return max(self._end - time.monotonic(), 0.0)

    async def run(
        self,
        work: Awaitable[T],
        what: str,
        done: Callable[[], int] | None = None,
        total: int = 0,
    ) -> T:
        """Await ``work`` within what is left; past it, :class:`ChainDeadlineExceeded`.

        ``what`` names the work; ``done()`` counts the records it got through of ``total``.
        """
        scope = asyncio.timeout(self.left())
        try:
            async with scope:
                return await work
        except TimeoutError:
            if not scope.expired():
                raise  # a fetch's own timeout, not the deadline
            records = 0 if done is None else done()
            how_far = "" if done is None else f" after {records} of {total} records"
            raise ChainDeadlineExceeded(
                f"{what} passed its {self.seconds:g}s deadline{how_far}; {_MORE_TIME}",
                deadline=self.seconds,
                records=records,
            ) from None

    @contextlib.contextmanager
    def hint(self) -> Iterator[None]:
        """Add the ``--deadline`` hint to a :class:`ChainDeadlineExceeded` of the library walk."""
        try:
            yield
        except ChainDeadlineExceeded as exc:
            exc.args = (f"{exc}; {_MORE_TIME}",)
            raise


@dataclass(frozen=True)
class AgreedCheck:
    """The outcome of re-checking one agreed round record.

    ``ok`` only when the roster re-aggregates to the recorded result; ``unverifiable`` when it
    could not be recomputed, but nothing contradicted it: a custom rule, or an input block that
    cannot be fetched (unpinned by retention, or never served).
    """

    cid: str
    record: AgreedRecord | None
    roster: Roster | None
    status: str
    ok: bool
    unverifiable: bool = False


async def check_agreed_round(
    store: BlockStore, cid: CID, models: dict[bytes, ModelState] | None = None
) -> AgreedCheck:
    """Re-check one agreed round record; never raises for what the record's blocks contain.

    ``models`` (model CID bytes → model and rule state) gives bases already recomputed (a
    base that was not stored is rebuilt otherwise); a verified model replaces its content
    (one model held: a history checks its rounds oldest first).
    """
    text = str(cid)
    try:
        record = await load_record(store, cid)
    except (BlockStoreError, DecodeError) as exc:
        return AgreedCheck(text, None, None, f"mismatch: {exc}", ok=False)
    roster, block = None, None
    with contextlib.suppress(BlockStoreError, DecodeError):
        block = await store.get(record.roster)
        roster = Roster.from_block(block)
    try:
        if record.rule is None:
            known = None if models is None else models.get(bytes(record.base))
            _, model, state = await verify_record(store, record, None, known)
            if models is not None:
                models.clear()
                models[bytes(record.result)] = (model, state)
            unsigned = _unsigned(record, roster, block)
            if unsigned:  # it re-aggregates, but lists what its owners did not sign
                return AgreedCheck(text, record, roster, f"mismatch: {unsigned}", ok=False)
            return AgreedCheck(text, record, roster, "verified", ok=True)
        prev = None if record.prev is None else await load_record(store, record.prev)
        if prev is not None and not prev.model_stored and prev.rule is not None:
            status = f"unverifiable: its base was not stored; rebuilding it needs rule {prev.rule}"
            return AgreedCheck(text, record, roster, status, ok=False, unverifiable=True)
        _, model, gradients = await load_round_inputs(store, record)
        if record.model_stored:  # else (model_every) there is no result block to check
            await fetch_gradient(store, record.result, expected_length=model.size)
    except (RoundVerificationFailed, GradientError) as exc:
        reason = str(exc).removeprefix(f"round {record.round}: ")
        if isinstance(exc.__cause__, BlockStoreError):  # an input is gone (retention) or unserved
            return AgreedCheck(
                text, record, roster, f"unverifiable: {reason}", ok=False, unverifiable=True
            )
        return AgreedCheck(text, record, roster, f"mismatch: {reason}", ok=False)
    except BlockStoreError as exc:  # the result model
        status = f"unverifiable: result: {exc}"
        return AgreedCheck(text, record, roster, status, ok=False, unverifiable=True)
    except DecodeError as exc:
        return AgreedCheck(text, record, roster, f"mismatch: result: {exc}", ok=False)
    fetched = "base and result" if record.model_stored else "base (the result was not stored)"
    status = (
        f"unverifiable: rule {record.rule}: not re-computable here (roster, "
        f"{len(gradients)} contributions, {fetched} fetched and hash-checked; verify it with "
        "the training API and its rule)"
    )
    return AgreedCheck(text, record, roster, status, ok=False, unverifiable=True)


def _unsigned(record: AgreedRecord, roster: Roster | None, block: Block | None) -> str:
    """Why ``roster``'s entries are not its owners' signed contributions (``""``: they are).

    Or, when it leaves an expected peer out, why it is not its coordinator's (the record's
    ``roster_signature``). The CLI reads Kubo peers' records: their authors' keys are their
    peer IDs.
    """
    if roster is None or block is None:
        return "roster: not fetched"
    try:
        verify_roster_entries(roster)
        verify_roster_coordinator(roster, block, record.roster_signature)
    except BadSignature as exc:
        return str(exc)
    return ""


def _table(title: str, checks: list[AgreedCheck]) -> Table:
    table = Table(title=title)
    for column in ("round", "record CID", "roster", "roster CID", "result CID", "update", "status"):
        table.add_column(column, overflow="fold")
    for check in checks:
        record, roster = check.record, check.roster
        colour = "green" if check.ok else "yellow" if check.unverifiable else "red"
        update = "?" if record is None else record.rule or f"lr {record.learning_rate:g}"
        table.add_row(
            "?" if record is None else str(record.round),
            check.cid,
            "?" if roster is None else f"{len(roster.entries)}/{len(roster.expected)}",
            "?" if record is None else str(record.roster),
            "?" if record is None else str(record.result),
            update,
            f"[{colour}]{check.status}[/]",
        )
    return table


async def verify_agreed(store: KuboBlockStore, cid: CID) -> int:
    """``verify-round`` of an agreed record: print a one-row table; 0 only if it verifies."""
    check = await check_agreed_round(store, cid)
    console.print(_table("agreed round record", [check]))
    if not check.ok:
        round_text = "?" if check.record is None else str(check.record.round)
        err_console.print(f"round {round_text}: {check.status}", soft_wrap=True)
    return 0 if check.ok else 1


async def verify_final(store: KuboBlockStore, cid: CID, bundle: FinalityBundle) -> int:
    """``verify-round --commits``: prove the record final from the bundle, then re-check it."""
    try:
        finality = verify_finality(bundle)
    except FinalityNotProven as exc:
        err_console.print(f"not proven final: {type(exc).__name__}: {exc}", soft_wrap=True)
        return 1
    if finality.record != str(cid):
        err_console.print(
            f"not proven final: the bundle proves round {finality.round}'s {finality.record}",
            soft_wrap=True,
        )
        return 1
    record = await load_record(store, cid)
    named = (record.session, str(record.genesis), record.round, str(record.result))
    if named != (finality.session, finality.genesis, finality.round, finality.model):
        err_console.print(
            f"not proven final: record {cid} is round {record.round} of {record.session!r} with "
            f"result {record.result}; the chain finalized round {finality.round} of "
            f"{finality.session!r} with model {finality.model}",
            soft_wrap=True,
        )
        return 1
    console.print(
        f"final: round {finality.round} of chain {finality.chain_id!r} at height "
        f"{finality.height}, signed by power {finality.power[0]} of {finality.power[1]} "
        f"({len(finality.members)} genesis members, {finality.hops} validator-set changes)",
        soft_wrap=True,
    )
    return await verify_agreed(store, cid)


@dataclass(frozen=True)
class MemberPolicy:
    """What ``history --federation`` checks against: round 0's members, the policy, the rule.

    With ``rule`` (``--task``: a training session's rule) every round is recomputed with it.
    """

    members: tuple[str, ...]
    admission: Admission
    rule: UpdateRule | None = None


async def member_changes(
    store: KuboBlockStore, chain: list[tuple[CID, AgreedRecord]], policy: MemberPolicy
) -> tuple[list[str], str]:
    """Check every record's member set (oldest first); return the changes and a problem.

    Each change is ``round R: +peer (join)`` or ``-peer (leave|evict)`` with the set's size
    after it; the problem is ``""`` when every set is the one its round calls for.
    """
    first = chain[0][1]
    start = MemberState.genesis(first.session, first.genesis, policy.members)
    try:
        await check_member_sets(store, chain, start, policy.admission)
    except (RoundVerificationFailed, FederatedError) as exc:
        return [], str(exc)
    lines = []
    for _, record in chain:
        if record.members is None:
            continue
        members = MemberSet.from_block(await store.get(record.members))
        signs = {"join": "+"}
        changes = ", ".join(f"{signs.get(c.op, '-')}{c.peer} ({c.op})" for c in members.changes)
        lines.append(f"round {record.round}: {changes}; {len(members.members)} members after")
    return lines, ""


async def agreed_history(
    store: KuboBlockStore, head: CID, deadline: Deadline, policy: MemberPolicy | None = None
) -> int:
    """``history`` of an agreed head: walk ``prev`` links, re-check every round, print rows.

    The walk and the re-check end by ``deadline`` (:class:`ChainDeadlineExceeded` past it).
    With ``policy`` (``--federation``) every round's member set is checked too, and the
    changes printed; without it a chain whose members change is reported as such.
    """
    record = await load_record(store, head)
    try:
        with deadline.hint():
            chain = await load_chain(
                store, head, session=record.session, genesis=record.genesis,
                deadline=deadline.left(),
            )  # fmt: skip
    except ChainDeadlineExceeded:
        raise  # not a broken chain: one not walked to its end
    except (FederatedError, BlockStoreError, DecodeError) as exc:
        err_console.print(f"the chain from {head} is broken: {exc}", soft_wrap=True)
        return 1
    checks: list[AgreedCheck] = []

    async def check_all() -> None:
        models: dict[bytes, ModelState] = {}  # oldest first: each result is the next base
        for cid, _ in chain:
            check = await check_agreed_round(store, cid, models)
            if check.ok and checks and not checks[-1].ok and check.record is not None:
                # recomputed, but from a base whose own round did not verify: say so
                status = f"verified from round {check.record.round - 1}'s unverified result"
                check = replace(check, status=status)
            checks.append(check)

    with err_console.status("verifying every round…"):
        what = f"the re-check of the chain from {head}"
        await deadline.run(check_all(), what, lambda: len(checks), len(chain))
    changes: list[str] = []
    problem = ""
    if policy is not None:
        changes, problem = await member_changes(store, chain, policy)
        if not problem and policy.rule is not None:
            problem = await recompute(store, record, head, policy, deadline)
            checks = checks if problem else [_recomputed(c) for c in checks]
    title = f"history of session {record.session!r} (genesis {record.genesis}), newest first"
    console.print(_table(title, checks[::-1]))
    failed = sum(not c.ok for c in checks)
    if policy is not None:
        failed += _print_members(changes, problem)
    elif any(r.members is not None for _, r in chain):
        console.print("the chain changes its members: check them with --federation FILE")
    return history_summary(len(checks), failed, sum(c.unverifiable for c in checks))


async def recompute(
    store: KuboBlockStore, record: AgreedRecord, head: CID, policy: MemberPolicy, deadline: Deadline
) -> str:
    """Recompute every round with ``policy.rule`` (and its member sets); return the problem."""
    work = verify_agreed_history(
        store, head, session=record.session, genesis=record.genesis, rule=policy.rule,
        admission=policy.admission, members=policy.members,
    )  # fmt: skip
    try:
        with err_console.status("recomputing every round with the task's rule…"):
            await deadline.run(work, f"the recompute of the chain from {head}")
    except ChainDeadlineExceeded:
        raise
    except (FederatedError, BlockStoreError, DecodeError) as exc:
        return str(exc)
    return ""


def _recomputed(check: AgreedCheck) -> AgreedCheck:
    """Mark a round the task's rule recomputed as verified (it was unverifiable without it)."""
    if not check.unverifiable:
        return check
    status = "verified (recomputed with the task's rule)"
    return replace(check, status=status, ok=True, unverifiable=False)


def _print_members(changes: list[str], problem: str) -> int:
    """Print the member-set changes and the outcome; return 1 if something failed."""
    for line in changes:
        console.print(f"member set {line}", markup=False, highlight=False, soft_wrap=True)
    if problem:
        err_console.print(f"member sets or rounds: {problem}", markup=False, soft_wrap=True)
        return 1
    console.print(f"member sets verified ({len(changes)} changes)")
    return 0


def history_summary(rounds: int, failed: int, unverifiable: int) -> int:
    """Print ``history``'s last line; return its exit code (1 if any round failed)."""
    note = f" ({unverifiable} unverifiable)" if unverifiable else ""
    console.print(
        f"{rounds} rounds, {failed} failed{note}" if failed else f"{rounds} rounds verified"
    )
    return 0 if not failed else 1
