"""The federation file: a secret key at mode 0600, bounded and checked on load."""

from __future__ import annotations

import stat
from dataclasses import replace
from pathlib import Path

import pytest

from gradfed_ipfs.errors import ConfigError, FederationFileError
from gradfed_ipfs.federation import (
    agreed_config,
    load_federation,
    may_join,
    member_of,
    members_of,
    new_federation,
    private_network_config,
    save_federation,
    swarm_key_text,
)
from gradfed_ipfs.federation.file import DEFAULT_EVICT_AFTER
from gradfed_ipfs.formats import LocalSigner

MEMBER = LocalSigner.from_seed(bytes(32)).peer_id
ADDRESS = f"/ip4/203.0.113.7/tcp/4001/p2p/{MEMBER}"
GENESIS_CID = "bafyreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"


def test_a_new_federation_round_trips_through_its_file_at_mode_600(tmp_path: Path) -> None:
    federation = new_federation("lab-x", policy="two-thirds").with_bootstrap(ADDRESS)
    federation = federation.with_allowed(MEMBER, MEMBER)
    path = save_federation(federation, tmp_path / "lab.toml")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = load_federation(path)
    assert loaded == federation
    assert loaded.admission.allow == (MEMBER,)  # duplicates dropped
    assert federation.swarm_key.hex() not in repr(federation)  # the key is not in its repr
    assert new_federation("lab-x").swarm_key != federation.swarm_key
    with pytest.raises(FederationFileError, match="exists"):
        save_federation(federation, path)


def test_the_swarm_key_file_is_libp2p_psk_v1(tmp_path: Path) -> None:
    federation = new_federation("lab")
    lines = swarm_key_text(federation).splitlines()
    assert lines == ["/key/swarm/psk/1.0.0/", "/base16/", federation.swarm_key.hex()]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "f.toml"
    path.write_text(text)
    return path


GOOD = f"""format = 1
name = "lab"
[network]
swarm_key = "{"ab" * 32}"
bootstrap = []
[admission]
policy = "majority"
"""


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (("format = 1", "format = 2"), "format"),
        (('name = "lab"', 'name = "../etc"'), "name"),
        (("ab" * 32, "ab" * 31), "network.swarm_key"),
        (("bootstrap = []", 'bootstrap = ["/ip4/1.2.3.4/tcp/1"]'), "network.bootstrap"),
        (("bootstrap = []", f'bootstrap = ["/ip4/1.2.3.4/tcp/1/p2p/{"Qm" + "a" * 44}"]'), "boot"),
        (("bootstrap = []", "bootstrap = " + str([ADDRESS] * 65)), "network.bootstrap"),
        (('policy = "majority"', 'policy = "anyone"'), "admission.policy"),
        (('policy = "majority"', 'policy = "majority"\nallow = ["peer-a"]'), "admission.allow"),
        (("[admission]", '[session]\ngenesis = "not-a-cid"\n[admission]'), "session.genesis"),
        (("[admission]", "[session]\nround_timeout = -1\n[admission]"), "round_timeout"),
        (("[admission]", "[session]\nlearning_rate = nan\n[admission]"), "learning_rate"),
        (("[network]", "network = 3\n[x]"), "network"),
        (('policy = "majority"', 'policy = "majority"\nevict_after = -1'), "admission.evict_after"),
        (('policy = "majority"', 'policy = "majority"\nevict_after = "3"'), "evict_after"),
        (("[admission]", '[session]\nmembers = ["peer-a"]\n[admission]'), "session.members"),
        (("[admission]", f'[session]\nmembers = ["{MEMBER}", "{MEMBER}"]\n[admission]'), "members"),
        (("[admission]", "[session]\nmin_peers = -1\n[admission]"), "session.min_peers"),
        (("[admission]", "[session]\nmin_peers = true\n[admission]"), "session.min_peers"),
    ],
)
def test_a_bad_field_is_a_typed_error_naming_it(
    tmp_path: Path, edit: tuple[str, str], field: str
) -> None:
    assert load_federation(_write(tmp_path, GOOD)).admission.policy == "majority"
    with pytest.raises(FederationFileError, match=field):
        load_federation(_write(tmp_path, GOOD.replace(*edit)))


def test_genesis_fixes_the_members_and_later_peers_join_by_the_policy(tmp_path: Path) -> None:
    others = [LocalSigner.from_seed(bytes([i]) * 32).peer_id for i in range(1, 5)]
    federation = new_federation("lab").with_allowed(MEMBER, *others[:2])
    assert federation.admission.evict_after == DEFAULT_EVICT_AFTER
    assert federation.genesis_members == tuple(sorted([MEMBER, *others[:2]]))  # until genesis
    fixed = federation.with_genesis(GENESIS_CID).with_allowed(others[2])
    path = save_federation(fixed, tmp_path / "lab.toml")
    loaded = load_federation(path)
    assert loaded.genesis_members == federation.genesis_members  # the later peer is not one
    assert may_join(loaded, others[2])
    assert not may_join(loaded, others[3])  # allow-list: only the listed may ask
    assert may_join(
        replace(loaded, admission=replace(loaded.admission, policy="majority")), others[3]
    )
    config = agreed_config(loaded, loaded.genesis_members)
    assert config.admission == loaded.admission
    assert config.min_peers == 2  # more than half of three
    assert agreed_config(loaded, (MEMBER,)).min_peers == 1
    with pytest.raises(ConfigError, match="not a member"):
        members_of(loaded, others[3])
    assert members_of(loaded, others[2]) == loaded.genesis_members  # it joins
    named = member_of(loaded, others[2])
    assert (named.members, named.index) == (4, sorted([MEMBER, *others[:3]]).index(others[2]))


def test_unreadable_oversized_and_non_toml_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FederationFileError, match="cannot read"):
        load_federation(tmp_path / "missing.toml")
    with pytest.raises(FederationFileError, match="not TOML"):
        load_federation(_write(tmp_path, "format = = 1"))
    with pytest.raises(FederationFileError, match="larger than"):
        load_federation(_write(tmp_path, "#" * (1 << 20) + "\n"))


def test_a_loopback_node_reaches_nothing_beyond_loopback() -> None:
    federation = new_federation("lab").with_bootstrap(ADDRESS)
    local = dict(private_network_config(federation, listen=["/ip4/127.0.0.1/tcp/0"]))
    assert local["Swarm.DisableNatPortMap"] == "true"
    assert local["Swarm.RelayClient.Enabled"] == "false"
    assert local["Addresses.API"] == '"/ip4/127.0.0.1/tcp/0"'
    assert local["Addresses.Gateway"] == "[]"
    assert local["Bootstrap"] == f'["{ADDRESS}"]'
    wide = dict(private_network_config(federation))  # the deployment default: every interface
    assert wide["Addresses.Swarm"] == '["/ip4/0.0.0.0/tcp/4001", "/ip6/::/tcp/4001"]'
    assert wide["Swarm.DisableNatPortMap"] == "false"
    assert wide["Addresses.API"] == '"/ip4/127.0.0.1/tcp/0"'  # the API stays on loopback
    with pytest.raises(FederationFileError, match="listen address"):
        private_network_config(federation, listen=["/dns4/example.org/tcp/1"])
