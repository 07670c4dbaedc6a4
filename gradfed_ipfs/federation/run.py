"""Train as a member of a federation: its session, its members, this node, a task file."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
from multiformats import CID

from ..errors import ConfigError, FederationFileError
from ..federated.agreed import AgreedConfig
from ..federated.agreed.members import HeldRequest
from ..federated.exchange import encode_gradient
from ..node import Node
from ..training import (
    FedAvg,
    History,
    Peer,
    SecAgg,
    TrainingRule,
    VectorLayout,
    training_rule,
)
from ..training.metrics import MAX_SAMPLES
from .file import Federation, load_federation
from .task import Member, Task, load_task

__all__ = [
    "agreed_config",
    "allowed_in",
    "genesis_of",
    "may_join",
    "member_of",
    "member_peer",
    "members_of",
    "task_rule",
    "train",
]

logger = logging.getLogger("gradfed_ipfs.federation")


def members_of(federation: Federation, peer_id: str, *, require: bool = True) -> tuple[str, ...]:
    """Return the session's genesis members (sorted), checking this node may take part.

    A node outside them joins the running session (:func:`may_join` says whether it may ask).
    Without ``require`` nothing is checked, and a federation that names no member yet counts
    this node in (to read a task's genesis before the members' nodes exist).

    Raises
    ------
    ConfigError
        If ``require`` and this node is neither a genesis member nor may join.
    """
    members = federation.genesis_members
    if not require:
        return members or (peer_id,)
    if peer_id not in members and not may_join(federation, peer_id):
        raise ConfigError(
            f"this node ({peer_id}) is not a member of {federation.name}: add it with "
            f"`gradfed-ipfs federation allow FILE {peer_id}` and share the file again"
        )
    if not members:
        raise ConfigError(f"federation {federation.name} names no members yet (`allow` them)")
    return members


def may_join(federation: Federation, peer_id: str) -> bool:
    """Whether ``peer_id`` may ask to join: allow-listed, or any peer under approval policies."""
    admission = federation.admission
    return admission.policy != "allow-list" or peer_id in admission.allow


def member_of(federation: Federation, peer_id: str) -> Member:
    """Return the task's :class:`Member` of this node.

    ``index`` is its place among every peer the file names (genesis members and allow-list,
    this node included, sorted), ``members`` their count: the same on every holder of the
    same file, so each member's shard differs.
    """
    named = sorted({*federation.genesis_members, *federation.admission.allow, peer_id})
    return Member(peer_id, named.index(peer_id), len(named))


def agreed_config(federation: Federation, members: tuple[str, ...]) -> AgreedConfig:
    """Return the agreed-session settings the federation file fixes for every member.

    ``members`` are round 0's; the admission policy lets the set change from round to round.
    The quorum is ``session.min_peers``, or more than half of ``members`` (``0``), capped at
    them: a member that is down then costs each round ``collect_timeout``, and is evicted
    after ``admission.evict_after`` such rounds.
    """
    session = federation.session
    quorum = session.min_peers or len(members) // 2 + 1
    return AgreedConfig(
        members=members,
        min_peers=min(quorum, len(members)),
        aggregation=session.aggregation,  # type: ignore[arg-type]  # checked on load
        learning_rate=session.learning_rate,
        collect_timeout=session.collect_timeout,
        takeover_timeout=session.takeover_timeout,
        round_timeout=session.round_timeout,
        admission=federation.admission,
    )


def allowed_in(path: str | Path) -> Callable[[], tuple[str, ...]]:
    """Return a reader of the allow-list in the federation file at ``path``, read each call.

    A member approves the joins of these peers (``Peer(approvals=...)``): ``federation allow
    FILE PEER_ID`` on a member's own copy approves that peer while it trains. A file that
    cannot be read now keeps the last list read (a warning is logged).
    """
    last: list[tuple[str, ...]] = [()]

    def read() -> tuple[str, ...]:
        try:
            last[0] = load_federation(path).admission.allow
        except FederationFileError as exc:
            logger.warning("approvals: %s (keeping the last allow-list read)", exc)
        return last[0]

    return read


def task_rule(federation: Federation, task_path: str | Path) -> TrainingRule:
    """Return the training rule the federation's members apply, rebuilt from the task file.

    For a verifier (``history --federation F --task T``): the rule is the task's strategy,
    sampling and client config, so the same task file recomputes every round's model.

    Raises
    ------
    ConfigError
        If the task file is bad, or its strategy is SecAgg (a secure sum cannot be recomputed).
    """
    members = members_of(federation, "", require=False)
    task = load_task(task_path, member_of(federation, members[0]))
    strategy = task.strategy if task.strategy is not None else FedAvg()
    if isinstance(strategy, SecAgg):
        raise ConfigError("a SecAgg session's rounds cannot be recomputed from the task file")
    size = np.asarray(task.adapter.to_vector(task.initial_model)).size
    agreed = agreed_config(federation, members)
    layout = VectorLayout(
        size, task.config.fit_metrics, task.config.eval_metrics,
        max_samples=min(agreed.max_weight, MAX_SAMPLES),
    )  # fmt: skip
    return training_rule(strategy, layout, members, task.config)


async def genesis_of(peer: Peer[object]) -> CID:
    """Return the genesis CID a :class:`~gradfed_ipfs.training.Peer` starts from (no I/O)."""
    initial = np.asarray(peer.model_vector, np.float32)
    return (await encode_gradient(peer.layout.genesis(initial))).cid


async def member_peer(
    federation: Federation,
    task_path: str | Path,
    node: Node,
    *,
    log: Callable[[str], None] | None = None,
    member: bool = True,
    source: str | Path | None = None,
    on_request: Callable[[HeldRequest], None] | None = None,
) -> tuple[Peer[object], CID]:
    """Return this node's :class:`~gradfed_ipfs.training.Peer` and its genesis CID, checked.

    ``member=False`` accepts a node outside the allow-list (``train --show-genesis``).
    ``source``: the federation file's path, whose allow-list is read again before each round
    (the joins this member approves: :func:`allowed_in`). ``on_request``: told each join,
    approval or leave the peer newly holds (:class:`~gradfed_ipfs.training.Peer`).

    Raises
    ------
    ConfigError
        If this node is not a member, the task file is bad, or the task's initial model is not
        the federation's genesis.
    """
    peer_id = await node.peer_id()
    members = members_of(federation, peer_id, require=member)
    task: Task = load_task(task_path, member_of(federation, peer_id))
    peer: Peer[object] = Peer(
        node=node,
        client=task.client,
        adapter=task.adapter,
        initial_model=task.initial_model,
        config=task.config,
        agreed=agreed_config(federation, members),
        strategy=task.strategy,
        session=federation.session.name,
        log=log,
        approvals=None if source is None else allowed_in(source),
        on_request=on_request,
    )
    genesis, expected = await genesis_of(peer), federation.session.genesis
    if expected is not None and str(genesis) != expected:
        raise ConfigError(
            f"the task's initial model has genesis {genesis}, but federation "
            f"{federation.name} trains from {expected}: wrong task file or model"
        )
    return peer, genesis


async def train(
    federation: Federation,
    task_path: str | Path,
    node: Node,
    *,
    log: Callable[[str], None] | None = None,
    linger: float = 30.0,
    join_timeout: float = 600.0,
    resume: bool = False,
) -> History:
    """Run this node's :class:`~gradfed_ipfs.training.Peer` for the federation's session.

    A node that is not a genesis member joins the running session (waiting at most
    ``join_timeout`` seconds to be admitted). ``resume``: a genesis member that restarts adopts
    the members' head first, and asks to join again if it left or was evicted
    (:meth:`~gradfed_ipfs.training.Peer.run`). ``linger`` (seconds): after its last round the
    peer keeps announcing its head until every member has finished, or for at most that long.

    Raises
    ------
    ConfigError
        As :func:`member_peer`.
    NotAdmitted
        If a joining node is not admitted in time.
    """
    peer, _ = await member_peer(federation, task_path, node, log=log)
    joining = await node.peer_id() not in federation.genesis_members
    return await peer.run(
        linger=linger, join=joining, join_timeout=join_timeout, resume=resume and not joining
    )
