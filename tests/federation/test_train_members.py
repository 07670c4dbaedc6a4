"""Members that change while ``gradfed-ipfs train`` runs, each member its own OS process.

All through the CLI on 127.0.0.1: three genesis members train; a fourth node, allow-listed
after the genesis was fixed, runs ``train`` while they do, is admitted and contributes; a
member leaves by Ctrl+C (a signed leave, exit 0); a member whose process is killed (its daemon
still running) is evicted by the rule: absent from server round ``s`` on, it is out of the
member set of round ``s + evict_after``; the survivors end on one model, and ``history
--federation`` re-checks every round's member set (join, leave, eviction).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.test_cli import no_env_api, own_home, run_cli
from tests.cli.test_cli_federation import LOOPBACK, _swarm_address
from tests.cli.test_cli_node import started
from tests.federation.test_train_processes import CLI, TASK
from tests.polling import poll_until

__all__ = ["Trainer", "fast_timing", "no_env_api", "own_home"]  # fixtures used here

ROUNDS = 20
EVICT_AFTER = 2


def fast_timing(path: Path, *, evict_after: int, collect: float = 3.0) -> None:
    """Edit a federation file's timing as a user would (its comments say what each is)."""
    text = path.read_text()
    text = re.sub(r"collect_timeout = \S+", f"collect_timeout = {collect}", text)
    text = re.sub(r"takeover_timeout = \S+", "takeover_timeout = 2.0", text)
    text = re.sub(r"round_timeout = \S+", "round_timeout = 90.0", text)
    text = re.sub(r"evict_after = \S+", f"evict_after = {evict_after}", text)
    path.write_text(text)


class Trainer:
    """A ``train`` process whose output lines are collected as they come (reader threads)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(stream, lines), daemon=True)
            for stream, lines in ((self.process.stdout, self.out), (self.process.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: object, lines: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.append(line)

    def rounds(self) -> list[str]:
        """The round lines printed so far."""
        return [line for line in list(self.out) if line.startswith("round ")]

    def last_round(self) -> int:
        """The server round of the last round line printed (0: none yet)."""
        lines = self.rounds()
        return int(lines[-1].split()[1].rstrip(":")) if lines else 0

    def finish(self, timeout: float = 300.0) -> tuple[int, str, str]:
        """Wait for the process; return its exit code, stdout and stderr."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for reader in self._readers:
            reader.join(timeout=30)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return self.process.returncode, "".join(self.out), "".join(self.err)


class Gate:
    """The server rounds the members may train (``GRADFED_TASK_GATE`` of the example task).

    The test opens the gate one round at a time, so joins, leaves and evictions happen at the
    rounds it chooses, however slowly a loaded machine starts the processes.
    """

    def __init__(self, path: Path) -> None:
        self.path, self.value = path, 0
        self.open(0)

    def open(self, value: int) -> None:
        """Let server rounds up to ``value`` train."""
        temporary = self.path.with_suffix(".new")
        temporary.write_text(str(value))
        os.replace(temporary, self.path)
        self.value = value

    def advance_until(
        self, leader: Trainer, condition: Callable[[], bool], what: str, most: int = 8
    ) -> None:
        """Open one round at a time (each awaited on ``leader``) until ``condition`` holds."""
        for _ in range(most):
            if condition():
                return
            self.open(self.value + 1)
            tail = lambda: "".join(leader.out[-3:] + leader.err[-30:])  # noqa: E731
            try:
                poll_until(
                    lambda: leader.last_round() >= self.value or condition(),
                    timeout=240,
                    what=f"round {self.value} on the way to {what}",
                )
            except TimeoutError as exc:
                raise TimeoutError(f"{exc}; the leader's last lines:\n{tail()}") from None
        poll_until(condition, timeout=5, what=f"{what} within {most} rounds")


def trainer(node_dir: Path, federation: Path, *extra: str, gate: Gate | None = None) -> Trainer:
    env = {
        **os.environ,
        "GRADFED_TASK_ROUNDS": str(ROUNDS),
        "PYTHONPATH": os.getcwd(),
    }
    if gate is not None:
        env["GRADFED_TASK_GATE"] = str(gate.path)
    argv = [CLI, "--node-dir", str(node_dir), "train", "--federation", str(federation)]
    return Trainer([*argv, str(TASK), "--linger", "20", *extra], env)


def _first_round_with(trainer_: Trainer, count: int) -> int:
    """The first server round whose line shows ``count`` members."""
    return next(
        int(line.split()[1].rstrip(":"))
        for line in trainer_.rounds()
        if f"({count} members)" in line
    )


def _with_members(trainer_: Trainer, count: int, since: int = 0) -> bool:
    """Whether a round line after the first ``since`` shows ``count`` members."""
    return any(f"({count} members)" in line for line in trainer_.rounds()[since:])


@pytest.mark.kubo
def test_a_member_joins_one_leaves_by_ctrl_c_and_a_killed_one_is_evicted(
    no_env_api: None,
    kubo_binary: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lab = tmp_path / "lab.toml"
    assert run_cli(capsys, "federation", "init", "lab", "--file", str(lab))[0] == 0
    fast_timing(lab, evict_after=EVICT_AFTER)
    dirs = [tmp_path / name for name in "abcd"]
    peers = []
    trainers: list[Trainer] = []
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
        assert run_cli(capsys, "federation", "allow", str(lab), *peers[:3])[0] == 0
        shown = trainer(dirs[0], lab, "--show-genesis")
        code, genesis, err = shown.finish()
        assert code == 0, err
        # `genesis` fixes the members (a, b, c); d, allowed after it, joins the running session.
        assert run_cli(capsys, "federation", "genesis", str(lab), genesis.strip())[0] == 0
        assert run_cli(capsys, "federation", "allow", str(lab), peers[3])[0] == 0

        gate = Gate(tmp_path / "gate")
        gate.open(2)
        a, b, c = (trainer(node_dir, lab, gate=gate) for node_dir in dirs[:3])
        trainers += [a, b, c]
        poll_until(lambda: a.last_round() >= 2, timeout=240, what="two rounds of a, b, c")
        assert all("(3 members)" in line for line in a.rounds()), a.out
        d = trainer(dirs[3], lab, gate=gate)
        trainers.append(d)
        poll_until(lambda: bool(d.out), timeout=120, what="d asking to join")
        assert "asks to join" in d.out[0]
        gate.advance_until(a, lambda: _with_members(d, 4), "d admitted and contributing")

        c.process.send_signal(signal.SIGINT)  # Ctrl+C: a signed leave, then exit 0
        poll_until(lambda: "leaving after this round" in "".join(c.err), timeout=60, what="c")
        gate.advance_until(a, lambda: c.process.poll() is not None, "c gone")
        code, out, err = c.finish(timeout=120)
        assert code == 0, err[-3000:]
        assert "left the session" in out, out
        since = len(a.rounds())
        gate.advance_until(a, lambda: _with_members(a, 3, since), "rounds without c")

        killed = gate.value  # b waits at the gate for the next server round: absent from it on
        b.process.kill()  # dies without leaving (its daemon still runs): evicted by the rule
        b.finish()
        gate.advance_until(a, lambda: _with_members(a, 2), "b evicted", EVICT_AFTER + 1)
        gate.open(ROUNDS)
        assert _first_round_with(a, 2) <= killed + 1 + EVICT_AFTER, a.rounds()

        finished = [member.finish() for member in (a, d)]
        models = set()
        for code, out, err in finished:
            assert code == 0, err[-3000:]
            models.add(re.findall(r"done: \d+ rounds, model (\S+)", out)[0])
        assert len(models) == 1, finished  # the survivors agree
        head = re.findall(r"record (\S+)\)", a.rounds()[-1])[0]

        argv = ["--node-dir", str(dirs[0]), "history", head, "--federation", str(lab)]
        code, out, err = run_cli(capsys, *argv)
        assert f"+{peers[3]} (join)" in out, out
        assert f"-{peers[2]} (leave)" in out, out
        assert f"-{peers[1]} (evict)" in out, out
        assert "member sets verified (3 changes)" in out, out
        assert code == 1, out  # the training rule's rounds: unverifiable without the task
        assert "unverifiable" in out
        # With the task file, its training rule recomputes every round (and the member sets).
        monkeypatch.setenv("GRADFED_TASK_ROUNDS", str(ROUNDS))
        code, out, err = run_cli(capsys, *argv, "--task", str(TASK), "--deadline", "300")
        assert code == 0, out + err
        assert "unverifiable" not in out
        assert f"{len(a.rounds())} rounds verified" in out
        monkeypatch.setenv("GRADFED_TASK_ROUNDS", str(ROUNDS - 1))  # another task: refused
        code, out, err = run_cli(capsys, *argv, "--task", str(TASK), "--deadline", "300")
        assert code == 1, out
        assert "member sets or rounds:" in err
    finally:
        for member in trainers:
            if member.process.poll() is None:
                member.process.kill()
            member.finish(timeout=30)
        for node_dir in reversed(dirs):
            run_cli(capsys, "--node-dir", str(node_dir), "node", "stop")
