"""The federation file: one TOML file per federation, made by ``gradfed-ipfs federation init``.

It holds the private network's swarm key (32 random bytes: only holders can even open a
connection to a member), the bootstrap multiaddrs, the session's name, genesis model and
genesis members, the admission policy (who may join, when an absent member is evicted) and the
round timing. The key is a secret: the file is written with mode 0600 (atomically), the key
is never printed (:attr:`Federation.fingerprint` names it) and never put in IPFS. Share the
file with members over a private channel.

Loading bounds everything before use: the file's size, every list's length, every string's
form; a bad file raises :class:`~gradfed_ipfs.errors.FederationFileError` naming the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
import tempfile
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from ..cid import parse_cid
from ..errors import DecodeError, FederationFileError
from ..federated.agreed.membership import ADMISSION_POLICIES, Admission, AdmissionPolicy
from ..formats.statement import ed25519_key_of

__all__ = [
    "ADMISSION_POLICIES",
    "Admission",
    "Federation",
    "SessionSettings",
    "load_federation",
    "new_federation",
    "save_federation",
]

FORMAT: Final = 1
MAX_FILE_BYTES: Final = 1 << 20
MAX_BOOTSTRAP: Final = 64
MAX_ALLOWED: Final = 10_000
DEFAULT_EVICT_AFTER: Final = 3
"""Rounds a member may miss in a row before it is evicted (``[admission] evict_after``)."""
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_MULTIADDR: Final = re.compile(
    r"/(ip4|ip6|dns|dns4|dns6)/[^/\s]{1,253}/tcp/\d{1,5}(/ws)?/p2p/(?P<peer>[1-9A-HJ-NP-Za-km-z]+)"
)


@dataclass(frozen=True)
class SessionSettings:
    """The agreed session every member runs (times in seconds).

    ``members`` is round 0's member set (peer IDs; ``()``: the allow-list, until ``federation
    genesis`` fixes it); ``min_peers`` the least contributions a round needs (``0``: more than
    half of the genesis members; capped at the current members), so a member that is down
    costs a round ``collect_timeout`` rather than stalling it until ``round_timeout``.
    """

    name: str
    genesis: str | None = None
    members: tuple[str, ...] = ()
    min_peers: int = 0
    aggregation: str = "all-to-all"
    learning_rate: float = 1.0
    collect_timeout: float = 30.0
    takeover_timeout: float = 10.0
    round_timeout: float = 120.0


@dataclass(frozen=True)
class Federation:
    """A federation file's contents (see the module docstring)."""

    name: str
    swarm_key: bytes = field(repr=False)
    session: SessionSettings
    bootstrap: tuple[str, ...] = ()
    admission: Admission = field(default_factory=Admission)

    @property
    def fingerprint(self) -> str:
        """A public name of the swarm key: the first 16 hex digits of its SHA-256."""
        return hashlib.sha256(self.swarm_key).hexdigest()[:16]

    def with_bootstrap(self, *addresses: str) -> Federation:
        """Return a copy with ``addresses`` added (checked, duplicates dropped, order kept)."""
        merged = tuple(dict.fromkeys([*self.bootstrap, *addresses]))
        return _checked(replace(self, bootstrap=merged))

    @property
    def genesis_members(self) -> tuple[str, ...]:
        """Round 0's members, sorted: ``session.members``, else the allow-list."""
        return tuple(sorted(self.session.members or self.admission.allow))

    def with_genesis(self, genesis: str) -> Federation:
        """Return a copy whose session trains from the model ``genesis`` (a CID, checked).

        It also fixes the genesis members (the allow-list now) if the file names none yet:
        peers allowed later join the running session instead.
        """
        session = replace(self.session, genesis=genesis, members=self.genesis_members)
        return _checked(replace(self, session=session))

    def with_allowed(self, *peer_ids: str) -> Federation:
        """Return a copy whose allow-list also holds ``peer_ids`` (checked)."""
        allow = tuple(dict.fromkeys([*self.admission.allow, *peer_ids]))
        return _checked(replace(self, admission=replace(self.admission, allow=allow)))


def new_federation(
    name: str, *, policy: AdmissionPolicy = "allow-list", genesis: str | None = None
) -> Federation:
    """Return a new federation with a fresh random swarm key and no bootstrap peers yet."""
    session = SessionSettings(name=name, genesis=genesis)
    admission = Admission(policy=policy, evict_after=DEFAULT_EVICT_AFTER)
    return _checked(Federation(name, secrets.token_bytes(32), session, (), admission))


def _fail(where: str, why: str) -> FederationFileError:
    return FederationFileError(f"{where}: {why}")


def _check_bootstrap(addresses: tuple[str, ...]) -> None:
    if len(addresses) > MAX_BOOTSTRAP:
        raise _fail("network.bootstrap", f"more than {MAX_BOOTSTRAP} addresses")
    for address in addresses:
        match = _MULTIADDR.fullmatch(address) if isinstance(address, str) else None
        if match is None:
            raise _fail(
                "network.bootstrap",
                f"{address!r:.120} is not /ip4|ip6|dns…/<host>/tcp/<port>/p2p/<peer ID>",
            )
        _check_peer(match["peer"], "network.bootstrap")


def _check_peer(peer_id: str, where: str) -> None:
    try:
        ed25519_key_of(peer_id)
    except DecodeError:
        raise _fail(where, f"{peer_id!r:.80} is not an Ed25519 peer ID (12D3KooW…)") from None


def _check_session(session: SessionSettings) -> None:
    if not _NAME.fullmatch(session.name):
        raise _fail("session.name", "1..64 of A-Z a-z 0-9 . _ - (starting alphanumeric)")
    if session.genesis is not None:
        try:
            parse_cid(session.genesis)
        except DecodeError:
            raise _fail("session.genesis", f"{session.genesis!r:.80} is not a CID") from None
    if session.aggregation not in ("all-to-all", "reduce-scatter", "auto"):
        raise _fail("session.aggregation", "all-to-all, reduce-scatter or auto")
    if not math.isfinite(session.learning_rate):
        raise _fail("session.learning_rate", "must be finite")
    for key in ("collect_timeout", "takeover_timeout", "round_timeout"):
        value = getattr(session, key)
        if not (math.isfinite(value) and 0 < value <= 86_400):
            raise _fail(f"session.{key}", "seconds in (0, 86400]")
    if len(session.members) > MAX_ALLOWED or len(set(session.members)) != len(session.members):
        raise _fail("session.members", f"at most {MAX_ALLOWED} distinct peer IDs")
    for peer in session.members:
        _check_peer(peer, "session.members")
    if not 0 <= session.min_peers <= MAX_ALLOWED:
        raise _fail("session.min_peers", "0 (more than half the genesis members) or a count")


def _checked(federation: Federation) -> Federation:
    if not _NAME.fullmatch(federation.name):
        raise _fail("name", "1..64 of A-Z a-z 0-9 . _ - (starting alphanumeric)")
    if len(federation.swarm_key) != 32:
        raise _fail("network.swarm_key", "must be 32 bytes (64 hex digits)")
    _check_bootstrap(federation.bootstrap)
    _check_session(federation.session)
    admission = federation.admission
    if admission.policy not in ADMISSION_POLICIES:
        raise _fail("admission.policy", f"one of {', '.join(ADMISSION_POLICIES)}")
    if admission.evict_after is not None and not 1 <= admission.evict_after <= 10_000:
        raise _fail("admission.evict_after", "rounds in [1, 10000], or 0 for never")
    if len(admission.allow) > MAX_ALLOWED:
        raise _fail("admission.allow", f"more than {MAX_ALLOWED} peer IDs")
    for peer in admission.allow:
        _check_peer(peer, "admission.allow")
    return federation


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise _fail(key, "must be a table")
    return value


def _typed(table: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = table.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _fail(f"{where}.{key}" if where else key, "missing or of the wrong type")
    return value


def _strings(table: dict[str, Any], key: str, where: str, cap: int) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or len(value) > cap:
        raise _fail(f"{where}.{key}", f"must be a list of at most {cap} strings")
    if not all(isinstance(item, str) for item in value):
        raise _fail(f"{where}.{key}", "must hold strings only")
    return tuple(value)


def _session_of(table: dict[str, Any], default_name: str) -> SessionSettings:
    genesis = table.get("genesis") or None
    if genesis is not None and not isinstance(genesis, str):
        raise _fail("session.genesis", "must be a CID string")
    numbers = {}
    for key in ("learning_rate", "collect_timeout", "takeover_timeout", "round_timeout"):
        if key in table:
            numbers[key] = float(_typed(table, key, (int, float), "session"))
    name = table.get("name", default_name)
    aggregation = table.get("aggregation", "all-to-all")
    if not isinstance(name, str) or not isinstance(aggregation, str):
        raise _fail("session", "name and aggregation must be strings")
    members = _strings(table, "members", "session", MAX_ALLOWED)
    min_peers = _typed(table, "min_peers", int, "session") if "min_peers" in table else 0
    return SessionSettings(
        name=name, genesis=genesis, members=members, min_peers=min_peers,
        aggregation=aggregation, **numbers,
    )  # fmt: skip


def _admission_of(table: dict[str, Any]) -> Admission:
    policy = table.get("policy", "allow-list")
    if policy not in ADMISSION_POLICIES:
        raise _fail("admission.policy", f"one of {', '.join(ADMISSION_POLICIES)}")
    evict = DEFAULT_EVICT_AFTER
    if "evict_after" in table:
        evict = _typed(table, "evict_after", int, "admission")
        if not 0 <= evict <= 10_000:
            raise _fail("admission.evict_after", "rounds in [1, 10000], or 0 for never")
    allow = _strings(table, "allow", "admission", MAX_ALLOWED)
    return Admission(policy, allow, evict or None)


def load_federation(path: str | Path) -> Federation:
    """Read and check a federation file.

    Raises
    ------
    FederationFileError
        If it is missing, too large, not TOML or not a valid federation (the message names the
        field).
    """
    source = Path(path)
    try:
        with source.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise FederationFileError(f"cannot read {source}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise FederationFileError(f"{source} is larger than {MAX_FILE_BYTES} bytes")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise FederationFileError(f"{source} is not TOML: {exc}") from None
    if data.get("format") != FORMAT:
        raise _fail("format", f"{data.get('format')!r} is not {FORMAT}")
    name = _typed(data, "name", str, "")
    network, admission = _table(data, "network"), _table(data, "admission")
    key_hex = _typed(network, "swarm_key", str, "network")
    if not re.fullmatch(r"[0-9a-f]{64}", key_hex):
        raise _fail("network.swarm_key", "must be 64 lowercase hex digits")
    return _checked(
        Federation(
            name=name,
            swarm_key=bytes.fromhex(key_hex),
            session=_session_of(_table(data, "session"), name),
            bootstrap=_strings(network, "bootstrap", "network", MAX_BOOTSTRAP),
            admission=_admission_of(admission),
        )
    )


def _toml_value(value: object) -> str:
    """TOML for a str, float or list of str (JSON's escapes are TOML's basic-string escapes)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=True)


def render_federation(federation: Federation) -> str:
    """Return the federation file's TOML text (the swarm key included)."""
    session = federation.session
    lines = [
        f"# gradfed-ipfs federation {federation.name!r}. It holds the private network's swarm",
        "# key: a secret. Share this file with members only, over a private channel; never",
        "# publish it or put it in IPFS.",
        f"format = {FORMAT}",
        f"name = {_toml_value(federation.name)}",
        "",
        "[network]",
        f"swarm_key = {_toml_value(federation.swarm_key.hex())}",
        f"bootstrap = {_toml_value(federation.bootstrap)}",
        "",
        "[session]",
        f"name = {_toml_value(session.name)}",
        f"genesis = {_toml_value(session.genesis or '')}",
        f"aggregation = {_toml_value(session.aggregation)}",
        "# round 0's members (empty: the allow-list, until `federation genesis` fixes them)",
        f"members = {_toml_value(session.members)}",
        "# least contributions a round needs (0: more than half of the genesis members)",
        f"min_peers = {session.min_peers}",
    ]
    for key in ("learning_rate", "collect_timeout", "takeover_timeout", "round_timeout"):
        lines.append(f"{key} = {_toml_value(float(getattr(session, key)))}")
    admission = federation.admission
    lines += [
        "",
        "[admission]",
        "# allow-list: the peers below may join; majority / two-thirds: a join needs the",
        "# approval of more than half / two thirds of the members (each member approves the",
        "# peers on its own copy's allow-list)",
        f"policy = {_toml_value(admission.policy)}",
        f"allow = {_toml_value(admission.allow)}",
        "# rounds a member may miss in a row before it is evicted (0: never)",
        f"evict_after = {admission.evict_after or 0}",
        "",
    ]
    return "\n".join(lines)


def save_federation(federation: Federation, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write the federation file with mode 0600, atomically; return its path.

    Raises
    ------
    FederationFileError
        If the file exists and ``overwrite`` is false, or it cannot be written.
    """
    target = Path(path)
    if target.exists() and not overwrite:
        raise FederationFileError(f"{target} exists (it would replace a swarm key)")
    text = render_federation(_checked(federation))
    try:
        handle, temporary = tempfile.mkstemp(dir=target.parent or ".", prefix=".federation-")
        try:
            os.fchmod(handle, 0o600)
            os.write(handle, text.encode("utf-8"))
            os.fsync(handle)
        finally:
            os.close(handle)
        os.replace(temporary, target)
    except OSError as exc:
        raise FederationFileError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target
