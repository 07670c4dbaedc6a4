"""A validator home's settings: block timing, loopback-only networking, one shared genesis.

``cometbft init`` writes a home (``config/config.toml``, ``config/genesis.json``, keys); this
module edits those files in place. ``config.toml`` gets targeted line edits (only the keys named
here change, CometBFT's comments stay) and is then re-read with :mod:`tomllib` to check that every
value took; ``genesis.json`` is JSON, rewritten whole.
"""

from __future__ import annotations

import base64
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..errors import CometStartError

__all__ = [
    "DEFAULT_TIMING",
    "BlockTiming",
    "GenesisValidator",
    "edit_config",
    "loopback_settings",
    "write_genesis",
]

TomlValue = str | bool | int
_SECTION: Final = re.compile(r"^\[(?P<name>[A-Za-z0-9_.\-]+)\]\s*$")


def _duration(seconds: float) -> str:
    """``0.25`` -> ``"250ms"`` (CometBFT reads Go durations)."""
    return f"{round(seconds * 1000)}ms"


@dataclass(frozen=True)
class BlockTiming:
    """Consensus timeouts, empty-block and gossip settings, in seconds.

    Why these settings, for rounds: a round of the CometBFT control plane closes by block time
    (after its collect deadline), and block time only moves when a block is committed. So blocks
    must keep coming when nobody sends a transaction: ``create_empty_blocks`` is on, and
    ``idle_interval`` (CometBFT's ``create_empty_blocks_interval``) makes an empty block once a
    height has waited that long for a transaction. A round deadline of ``D`` seconds therefore
    closes within about ``D + idle_interval`` seconds when nothing else happens; the default 1 s
    is short against rounds of seconds and keeps an idle chain cheap (one block a second per
    validator, not ten). A block with transactions does not wait: CometBFT proposes as soon as
    its mempool has one, and since every accepted transaction changes the app hash, the block
    after it (the "proof" block that commits that hash) follows at once as well. So with
    ``timeout_commit`` 0 (no pause after a commit) a round's steps (contributions, attestations,
    results) each wait for one consensus instance, tens of milliseconds on loopback, not for a
    fixed interval. ``peer_gossip_sleep`` (``peer_gossip_sleep_duration``, CometBFT's default
    100 ms) is how long a validator's gossip routine sleeps when it has nothing to send a peer:
    a proposal part or vote that arrives meanwhile waits up to that long, once per consensus
    step, so 20 ms cuts a block's latency at the cost of some idle wake-ups.
    ``timeout_propose`` (CometBFT's default 3 s) is what a crashed proposer costs its height
    before the next round: 1 s keeps rounds going with one of four validators down, with room
    for a proposal's gossip on a loaded machine (each further round of a height waits
    ``timeout_propose_delta`` longer). The vote timeouts only matter once a vote is missing;
    they stay near CometBFT's defaults.

    Attributes
    ----------
    timeout_propose, timeout_propose_delta
        Wait for the proposal of a round, and its increase per further round.
    timeout_prevote, timeout_prevote_delta, timeout_precommit, timeout_precommit_delta
        Wait after +2/3 of any votes, and the increase per round.
    timeout_commit
        Pause after a commit before the next height (0: none; the app sets no
        ``next_block_delay``, so CometBFT v1 uses this deprecated setting).
    create_empty_blocks
        Make blocks with no transactions (needed for block-time deadlines, see above).
    idle_interval
        With ``create_empty_blocks``: the longest a height waits for a transaction before it
        makes an empty block (0: no wait, an empty block every ``timeout_commit``).
    peer_gossip_sleep
        A validator's gossip routine's sleep when it has nothing new for a peer.
    """

    timeout_propose: float = 1.0
    timeout_propose_delta: float = 0.5
    timeout_prevote: float = 0.5
    timeout_prevote_delta: float = 0.5
    timeout_precommit: float = 0.5
    timeout_precommit_delta: float = 0.5
    timeout_commit: float = 0.0
    create_empty_blocks: bool = True
    idle_interval: float = 1.0
    peer_gossip_sleep: float = 0.02

    @property
    def idle_block_interval(self) -> float:
        """Seconds between blocks of a healthy network that nobody sends a transaction to."""
        return self.timeout_commit + (self.idle_interval if self.create_empty_blocks else 0.0)

    def settings(self) -> dict[tuple[str, str], TomlValue]:
        """Return the ``[consensus]`` entries of ``config.toml`` for this timing."""
        durations = {
            name: _duration(getattr(self, name))
            for name in (
                "timeout_propose",
                "timeout_propose_delta",
                "timeout_prevote",
                "timeout_prevote_delta",
                "timeout_precommit",
                "timeout_precommit_delta",
                "timeout_commit",
            )
        }
        durations["create_empty_blocks_interval"] = _duration(self.idle_interval)
        durations["peer_gossip_sleep_duration"] = _duration(self.peer_gossip_sleep)
        entries: dict[tuple[str, str], TomlValue] = {
            ("consensus", key): value for key, value in durations.items()
        }
        entries["consensus", "create_empty_blocks"] = self.create_empty_blocks
        entries["consensus", "skip_timeout_commit"] = False
        return entries


DEFAULT_TIMING: Final = BlockTiming()
"""The project's block timing (see :class:`BlockTiming` for why)."""


def loopback_settings(
    *,
    moniker: str,
    proxy_app: str,
    p2p_port: int,
    rpc_port: int,
    persistent_peers: Sequence[str],
) -> dict[tuple[str, str], TomlValue]:
    """Return the ``config.toml`` entries of a validator that talks to its own session only.

    Parameters
    ----------
    moniker
        The validator's name in logs and ``/status``.
    proxy_app
        Its ABCI app's address (``unix:///…/app.sock``).
    p2p_port, rpc_port
        Its ports on 127.0.0.1.
    persistent_peers
        ``node_id@127.0.0.1:port`` of the other validators: the only peers it dials or keeps.
    """
    return {
        ("", "moniker"): moniker,
        ("", "proxy_app"): proxy_app,
        ("", "abci"): "socket",
        ("", "log_level"): "info",
        ("rpc", "laddr"): f"tcp://127.0.0.1:{rpc_port}",
        ("rpc", "pprof_laddr"): "",
        ("grpc", "laddr"): "",
        ("grpc.privileged", "laddr"): "",
        ("p2p", "laddr"): f"tcp://127.0.0.1:{p2p_port}",
        ("p2p", "external_address"): "",
        ("p2p", "seeds"): "",
        ("p2p", "persistent_peers"): ",".join(persistent_peers),
        ("p2p", "pex"): False,
        # Loopback addresses are "non-routable" to a strict address book, and every peer shares
        # the IP 127.0.0.1: both guards are for the public internet, not a session's own peers.
        ("p2p", "addr_book_strict"): False,
        ("p2p", "allow_duplicate_ip"): True,
        ("statesync", "enable"): False,
        ("instrumentation", "prometheus"): False,
    }


def _toml(value: TomlValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)  # a TOML basic string is a JSON string for these ASCII values


def edit_config(path: Path, entries: Mapping[tuple[str, str], TomlValue]) -> None:
    """Set ``(section, key)`` entries of an existing ``config.toml`` (``""``: the top table).

    Raises
    ------
    CometStartError
        If a key is not in the file (a CometBFT version whose config differs) or does not read
        back as set.
    """
    section = ""
    seen: set[tuple[str, str]] = set()
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines):
        header = _SECTION.match(line)
        if header:
            section = header["name"]
            continue
        key = line.split("=", 1)[0].strip() if "=" in line and not line.startswith("#") else ""
        if (section, key) in entries:
            lines[number] = f"{key} = {_toml(entries[section, key])}"
            seen.add((section, key))
    missing = sorted(set(entries) - seen)
    if missing:
        raise CometStartError(f"{path}: no such settings {missing}")
    path.write_text("\n".join(lines) + "\n")
    parsed = tomllib.loads(path.read_text())
    for (where, key), value in entries.items():
        table: Any = parsed
        for part in [p for p in where.split(".") if p]:
            table = table[part]
        if table.get(key) != value:
            raise CometStartError(
                f"{path}: [{where}] {key} reads {table.get(key)!r}, not {value!r}"
            )


@dataclass(frozen=True)
class GenesisValidator:
    """One validator of a genesis: its consensus key and voting power.

    Attributes
    ----------
    address
        Upper-case hex of the first 20 bytes of SHA-256 of the public key (CometBFT's).
    pub_key
        ``{"type": "tendermint/PubKeyEd25519", "value": base64}`` as in
        ``priv_validator_key.json``.
    power
        Voting power (every member has the same: 1).
    name
        The validator's moniker.
    """

    address: str
    pub_key: Mapping[str, str]
    power: int
    name: str

    @property
    def key_bytes(self) -> bytes:
        """The raw 32-byte Ed25519 public key (what a member's binding statement names)."""
        return base64.b64decode(self.pub_key["value"])

    @classmethod
    def of_home(cls, home: Path, *, power: int = 1, name: str = "") -> GenesisValidator:
        """Read the key that ``cometbft init`` wrote into ``home``."""
        key = json.loads((home / "config" / "priv_validator_key.json").read_text())
        return cls(str(key["address"]), dict(key["pub_key"]), power, name)


def write_genesis(
    homes: Sequence[Path],
    validators: Sequence[GenesisValidator],
    *,
    chain_id: str,
    genesis_time: str,
    app_state: Mapping[str, Any] | None = None,
) -> None:
    """Write one genesis (``validators``, ``chain_id``, RFC 3339 ``genesis_time``) to each home.

    ``app_state`` (JSON) is what the ABCI app gets at ``InitChain`` (e.g. a round chain's
    members, :class:`~gradfed_ipfs.cometbft.abci.RoundsGenesis`); none by default.

    The consensus parameters are the first home's (``cometbft init``'s defaults): 4 MiB blocks,
    Ed25519 keys, vote extensions and PBTS off.
    """
    genesis = json.loads((homes[0] / "config" / "genesis.json").read_text())
    genesis["chain_id"] = chain_id
    genesis["genesis_time"] = genesis_time
    genesis["initial_height"] = "1"
    genesis["app_hash"] = ""
    if app_state is not None:
        genesis["app_state"] = dict(app_state)
    genesis["validators"] = [
        {"address": v.address, "pub_key": dict(v.pub_key), "power": str(v.power), "name": v.name}
        for v in validators
    ]
    text = json.dumps(genesis, indent=2, sort_keys=True) + "\n"
    for home in homes:
        (home / "config" / "genesis.json").write_text(text)
