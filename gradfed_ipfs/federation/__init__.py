"""A federation: the private IPFS network and the session settings its members share.

:mod:`.file` reads and writes the federation file (TOML, holding the swarm key: a secret);
:mod:`.network` turns it into a Kubo node's private-network settings.
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

__all__ = [
    "ADMISSION_POLICIES",
    "PNET_ENV",
    "Admission",
    "Federation",
    "SessionSettings",
    "load_federation",
    "new_federation",
    "private_network_config",
    "save_federation",
    "swarm_key_text",
]
