"""Train as a member of a federation: its session, its members, this node, a task file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from multiformats import CID

from ..errors import ConfigError
from ..federated.agreed import AgreedConfig
from ..federated.exchange import encode_gradient
from ..node import Node
from ..training import History, Peer
from .file import Federation
from .task import Member, Task, load_task

__all__ = ["agreed_config", "genesis_of", "member_peer", "members_of", "train"]


def members_of(federation: Federation, peer_id: str, *, require: bool = True) -> tuple[str, ...]:
    """Return the session's members (the allow-list, sorted), checking this node is one.

    Without ``require`` a node outside the allow-list is counted in (to read a task's genesis
    before the members' nodes exist).

    Raises
    ------
    ConfigError
        If ``require`` and the allow-list does not hold ``peer_id``.
    """
    members = tuple(sorted(federation.admission.allow))
    if not require and peer_id not in members:
        return tuple(sorted({*members, peer_id}))
    if peer_id not in members:
        raise ConfigError(
            f"this node ({peer_id}) is not a member of {federation.name}: add it with "
            f"`gradfed-ipfs federation allow FILE {peer_id}` and share the file again"
        )
    return members


def agreed_config(federation: Federation, members: tuple[str, ...]) -> AgreedConfig:
    """Return the agreed-session settings the federation file fixes for every member."""
    session = federation.session
    return AgreedConfig(
        members=members,
        aggregation=session.aggregation,  # type: ignore[arg-type]  # checked on load
        learning_rate=session.learning_rate,
        collect_timeout=session.collect_timeout,
        takeover_timeout=session.takeover_timeout,
        round_timeout=session.round_timeout,
    )


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
) -> tuple[Peer[object], CID]:
    """Return this node's :class:`~gradfed_ipfs.training.Peer` and its genesis CID, checked.

    ``member=False`` accepts a node outside the allow-list (``train --show-genesis``).

    Raises
    ------
    ConfigError
        If this node is not a member, the task file is bad, or the task's initial model is not
        the federation's genesis.
    """
    peer_id = await node.peer_id()
    members = members_of(federation, peer_id, require=member)
    task: Task = load_task(task_path, Member(peer_id, members.index(peer_id), len(members)))
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
) -> History:
    """Run this node's :class:`~gradfed_ipfs.training.Peer` for the federation's session.

    ``linger`` (seconds): after its last round the peer keeps announcing its head until every
    member has finished, or for at most that long.

    Raises
    ------
    ConfigError
        As :func:`member_peer`.
    """
    peer, _ = await member_peer(federation, task_path, node, log=log)
    return await peer.run(linger=linger)
