"""Three members, each its own federation node and its own ``gradfed-ipfs train`` process.

All set up through the CLI, as a member would (on 127.0.0.1): ``federation init``, ``node
start --federation``, ``add-bootstrap``, ``allow``, ``genesis``, then ``train`` in separate
OS processes that agree on one model CID every round.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_cli import no_env_api, own_home, run_cli
from tests.cli.test_cli_federation import LOOPBACK, _swarm_address
from tests.cli.test_cli_node import started

__all__ = ["no_env_api", "own_home"]  # fixtures used here

TASK = Path(__file__).resolve().parents[2] / "examples" / "federation_task.py"
CLI = str(Path(sys.executable).with_name("gradfed-ipfs"))


def _train(node_dir: Path, federation: Path, *extra: str, rounds: int = 6) -> subprocess.Popen[str]:
    env = {**os.environ, "GRADFED_TASK_ROUNDS": str(rounds), "PYTHONPATH": os.getcwd()}
    argv = [CLI, "--node-dir", str(node_dir), "train", "--federation", str(federation)]
    return subprocess.Popen(
        [*argv, str(TASK), "--linger", "20", *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str], timeout: float = 240.0) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    return process.returncode, out, err


@pytest.mark.kubo
def test_members_train_in_separate_processes_to_one_model(
    no_env_api: None, kubo_binary: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lab = tmp_path / "lab.toml"
    assert run_cli(capsys, "federation", "init", "lab", "--file", str(lab))[0] == 0
    dirs = [tmp_path / name for name in ("a", "b", "c")]
    peers = []
    try:
        for index, node_dir in enumerate(dirs):
            argv = ["--node-dir", str(node_dir), "node", "start", "--federation", str(lab)]
            code, out, err = run_cli(capsys, *argv, *LOOPBACK)
            assert code == 0, err
            api, peer = started(out)
            peers.append(peer)
            if index == 0:
                bootstrap = _swarm_address(api)
                assert run_cli(capsys, "federation", "add-bootstrap", str(lab), bootstrap)[0] == 0
        assert run_cli(capsys, "federation", "allow", str(lab), *peers)[0] == 0

        code, genesis, err = _finish(_train(dirs[0], lab, "--show-genesis"))
        assert code == 0, err
        assert run_cli(capsys, "federation", "genesis", str(lab), genesis.strip())[0] == 0

        members = [_train(node_dir, lab) for node_dir in dirs]
        results = [_finish(process) for process in members]
        models = set()
        for code, out, err in results:
            assert code == 0, err[-3000:]
            models.add(re.findall(r"done: 6 rounds, model (\S+)", out)[0])
            assert len(re.findall(r"^round", out, re.MULTILINE)) >= 6, out
        assert len(models) == 1  # one model CID on every member

        # A member whose task has another initial model is refused with the two genesis CIDs.
        env_seed = {"GRADFED_TASK_SEED": "0"}
        wrong = tmp_path / "wrong_task.py"
        wrong.write_text(
            TASK.read_text().replace("np.zeros(DIM, np.float32)", "np.ones(DIM, np.float32)")
        )
        process = subprocess.run(
            [CLI, "--node-dir", str(dirs[0]), "train", "--federation", str(lab), str(wrong)],
            env={**os.environ, **env_seed, "PYTHONPATH": os.getcwd()},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert process.returncode == 11, process.stderr
        assert "trains from" in process.stderr
        assert genesis.strip() in process.stderr
    finally:
        for node_dir in reversed(dirs):
            run_cli(capsys, "--node-dir", str(node_dir), "node", "stop")
