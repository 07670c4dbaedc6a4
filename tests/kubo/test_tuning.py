"""``KuboTuning``: the wide-area settings are what Kubo accepts, and daemons apply them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gradfed_ipfs.kubo import WAN_TUNING, KuboDaemon, KuboTuning


def test_window_is_sized_to_twice_the_bandwidth_delay_product() -> None:
    assert KuboTuning.for_link(100e6, 0.150).outstanding_bytes_per_peer == 3_750_000
    assert KuboTuning.for_link(1e6, 0.010).outstanding_bytes_per_peer == 1 << 20  # Kubo's floor
    assert KuboTuning.for_link(1e9, 0.1, conn_low_water=5).conn_low_water == 5


def test_config_entries_are_json_values() -> None:
    entries = dict(KuboTuning(outstanding_bytes_per_peer=123, conn_low_water=7).config())
    assert json.loads(entries["Internal.Bitswap.MaxOutstandingBytesPerPeer"]) == 123
    conn = json.loads(entries["Swarm.ConnMgr"])
    assert (conn["LowWater"], conn["HighWater"], conn["GracePeriod"]) == (7, 192, "60s")


def test_daemon_applies_tuning_before_extra_config(tmp_path: Path) -> None:
    daemon = KuboDaemon(tmp_path, binary="/bin/true", tuning=WAN_TUNING, extra_config=[("A", "1")])
    assert daemon.extra_config == [*WAN_TUNING.config(), ("A", "1")]
    assert KuboDaemon(tmp_path, binary="/bin/true").extra_config == []


@pytest.mark.kubo
def test_a_tuned_daemon_starts_with_the_settings(kubo_binary: Path) -> None:
    with KuboDaemon(binary=kubo_binary, tuning=WAN_TUNING) as daemon:
        shown = subprocess.run(
            [str(kubo_binary), "config", "show"],
            env={"IPFS_PATH": str(daemon.repo)},
            capture_output=True,
            check=True,
        )
    config = json.loads(shown.stdout)
    assert config["Internal"]["Bitswap"]["MaxOutstandingBytesPerPeer"] == 8 << 20
    assert config["Swarm"]["ConnMgr"]["LowWater"] == 64
