"""``gradfed-ipfs round``: three peers run it concurrently, each beside its own real daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import KuboNode
from tests.test_cli import run_cli, save

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "import sys; from gradfed_ipfs.cli import main; sys.exit(main())"]


def start_round(node: KuboNode, argv: list[str], home: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), GRADFED_IPFS_HOME=str(home))
    return subprocess.Popen(
        [*CLI, "--api", node.api_url, "round", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(processes: list[subprocess.Popen[str]], timeout: float) -> list[tuple[int, str, str]]:
    results = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=timeout)
            results.append((process.returncode, out, err))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    return results


@pytest.mark.kubo
def test_three_peers_run_a_round_from_the_cli_and_agree(
    kubo_swarm3: list[KuboNode], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grads = np.random.default_rng(11).standard_normal((3, 4, 25)).astype(np.float32)
    samples = [100, 300, 600]
    session = "cli-round"
    processes = []
    for i, node in enumerate(kubo_swarm3):
        argv = [str(save(tmp_path / f"g{i}.npy", grads[i])), "--session", session]
        argv += ["--samples", str(samples[i]), "--min-peers", "2", "--collect", "90"]
        argv += ["--linger", "10", "-o", str(tmp_path / f"agg{i}.npy")]
        processes.append(start_round(node, argv, tmp_path / f"home{i}"))
    results = finish(processes, timeout=150)

    records = set()
    for code, out, err in results:
        assert code == 0, err
        assert "Received 3 results and 0 failures" in out
        for node, count in zip(kubo_swarm3, samples, strict=True):
            assert f"{node.peer_id}  bafkrei" in out
            assert f"samples {count}" in out
        records.add(out.strip().splitlines()[-1])
    assert len(records) == 1  # every peer committed the same record
    record = records.pop()
    assert record.startswith("record bafyrei")

    expected = np.tensordot(np.array(samples, np.float64) / sum(samples), grads, axes=1)
    aggregates = [np.load(tmp_path / f"agg{i}.npy") for i in range(3)]
    for aggregate in aggregates:
        assert aggregate.shape == (4, 25)  # the input's shape
        np.testing.assert_array_equal(aggregate, aggregates[0])  # bit for bit on every peer
        np.testing.assert_allclose(aggregate, expected, rtol=1e-5, atol=1e-6)

    # anyone can re-check the record through any daemon
    code, out, _ = run_cli(
        capsys, "--api", kubo_swarm3[1].api_url, "verify-round", record.split()[-1]
    )
    assert code == 0
    assert "verified" in out


@pytest.mark.kubo
def test_a_round_without_enough_peers_says_who_was_missing(
    kubo_swarm3: list[KuboNode], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(save(tmp_path / "g.npy", np.ones(5, np.float32)))
    ghost = "12D3KooWGhostGhostGhostGhostGhostGhostGhostGhost"
    code, _, err = run_cli(
        capsys,
        "--api",
        kubo_swarm3[0].api_url,
        "round",
        path,
        "--session",
        "cli-round-alone",
        "--expect",
        ghost,
        "--collect",
        "1",
        "--linger",
        "0",
        "-o",
        str(tmp_path / "agg.npy"),
    )
    assert code == 7  # the federated family
    flat = " ".join(err.split())
    assert "InsufficientPeers" in flat
    assert ghost in flat
    assert not (tmp_path / "agg.npy").exists()
