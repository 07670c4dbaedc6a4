"""A member's task file: the Python file that defines its client and model (Flower's ClientApp).

``gradfed-ipfs train --federation F task.py`` runs it. The file defines ``task``: a
:class:`Task`, or a function of a :class:`Member` that returns one (so each member can load its
own share of the data). It is the member's own code, run in its own process; nothing in it
comes from other members.

Example::

    from gradfed_ipfs.federation import Member, Task
    from gradfed_ipfs.training import Client, FederationConfig, VectorAdapter

    def task(member: Member) -> Task:
        data = load_my_shard(member.index, member.members)
        return Task(Client(train=...), VectorAdapter(), initial_model, FederationConfig(rounds=10))
"""

from __future__ import annotations

import runpy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..training import Client, FederationConfig, ModelAdapter, Strategy

__all__ = ["Member", "Task", "load_task"]


@dataclass(frozen=True)
class Member:
    """Who runs the task: this node's peer ID and its place among the members.

    Attributes
    ----------
    peer_id
        This node's peer ID.
    index
        Its position in the sorted member list, ``0 <= index < members``.
    members
        How many members the session has.
    """

    peer_id: str
    index: int
    members: int


@dataclass(frozen=True)
class Task:
    """What a member trains: the arguments of :class:`~gradfed_ipfs.training.Peer`."""

    client: Client[Any]
    adapter: ModelAdapter[Any]
    initial_model: Any
    config: FederationConfig[Any]
    strategy: Strategy | None = None


def load_task(path: str | Path, member: Member) -> Task:
    """Run the task file and return its :class:`Task` for ``member``.

    Raises
    ------
    ConfigError
        If the file cannot be run, defines no ``task``, or ``task`` gives no :class:`Task`.
    """
    source = Path(path)
    if not source.is_file():
        raise ConfigError(f"task file {source} does not exist")
    try:
        namespace = runpy.run_path(str(source), run_name="gradfed_task")
    except Exception as exc:  # the user's code: any error is reported as a bad task file
        raise ConfigError(f"task file {source} failed: {type(exc).__name__}: {exc}") from exc
    found = namespace.get("task")
    if found is None:
        raise ConfigError(f"task file {source} defines no `task` (a Task, or member -> Task)")
    task = found(member) if callable(found) and not isinstance(found, Task) else found
    if not isinstance(task, Task):
        raise ConfigError(f"`task` in {source} gave a {type(task).__name__}, not a Task")
    return task
