"""A federation: the private IPFS network and the session settings its members share.

:mod:`.file` reads and writes the federation file (TOML, holding the swarm key: a secret);
:mod:`.network` turns it into a Kubo node's private-network settings; :mod:`.task` loads a
member's task file and :mod:`.run` trains it as a member (``gradfed-ipfs train``).
"""

from __future__ import annotations

from .file import (
    ADMISSION_POLICIES,
    Admission,
    Federation,
    SessionSettings,
    load_federation,
    new_federation,
    save_federation,
)
from .network import PNET_ENV, private_network_config, swarm_key_text
from .run import (
    agreed_config,
    allowed_in,
    genesis_of,
    may_join,
    member_of,
    member_peer,
    members_of,
    task_rule,
    train,
)
from .task import Member, Task, load_task

__all__ = [
    "ADMISSION_POLICIES",
    "PNET_ENV",
    "Admission",
    "Federation",
    "Member",
    "SessionSettings",
    "Task",
    "agreed_config",
    "allowed_in",
    "genesis_of",
    "load_task",
    "load_federation",
    "may_join",
    "member_of",
    "member_peer",
    "members_of",
    "new_federation",
    "private_network_config",
    "save_federation",
    "swarm_key_text",
    "task_rule",
    "train",
]
