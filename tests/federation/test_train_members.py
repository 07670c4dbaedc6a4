"""Members that change while ``gradfed-ipfs train`` runs, each member its own OS process.

All through the CLI on 127.0.0.1: three genesis members train; a fourth node, allow-listed
after the genesis was fixed, runs ``train`` while they do, is admitted and contributes from
round 3; a member leaves by Ctrl+C (a signed leave, exit 0) and is out from round 4; a member
whose process is killed (its daemon still running) is evicted by the rule: absent from server
round ``s`` on, it is out of the member set of round ``s + evict_after`` (here 4 + 2). The
test paces the rounds with the example task's gate and opens each round only once every
member waits at it and logs holding the request that round's roster is to carry, so every
change happens at the round the test names. The survivors end on one model, and ``history
--federation`` re-checks every round's member set (join, leave, eviction).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
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

    def members_by_round(self) -> dict[int, int]:
        """Server round -> the member count its round line shows."""
        found = (re.match(r"round (\d+):.*\((\d+) members\)", line) for line in self.rounds())
        return {int(m.group(1)): int(m.group(2)) for m in found if m}

    def at_gate(self, server_round: int) -> bool:
        """Whether the task's training of ``server_round`` has reached the gate."""
        return f"task: round {server_round} at the gate\n" in list(self.err)

    def holds(self, request: str) -> bool:
        """Whether ``train`` logged holding ``request`` (``join of P``, ``leave of P``, …)."""
        return any(line.startswith(f"holds {request}") for line in list(self.out))

    def tail(self) -> str:
        """The last lines printed (for a failure's message)."""
        return "".join(self.out[-3:] + self.err[-30:])

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

    The test opens the gate one round at a time, and only once every member's training of
    the next round waits at it (and, for a join, leave or approval, once every member logs
    holding it): the coordinator of that round, whoever it is, then holds the request when it
    makes the roster, so the change is in that round's record, at the round the test chose.
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

    def wait(
        self,
        members: Sequence[Trainer],
        ready: Callable[[], bool] = lambda: True,
        what: str = "",
    ) -> None:
        """Wait until each of ``members`` waits at the gate for the next round, and ``ready``."""
        server_round = self.value + 1

        def there() -> bool:
            return all(member.at_gate(server_round) for member in members) and ready()

        try:
            poll_until(there, timeout=240, what=f"round {server_round} at every gate {what}")
        except TimeoutError as exc:
            lasts = [(m.rounds() or ["no round yet"])[-1] for m in members]
            late = [m.tail() for m in members if not m.at_gate(server_round)]
            raise TimeoutError(
                f"{exc}; the members' last rounds: {lasts}; {len(late)} late, their last "
                f"lines:\n{late}"
            ) from None

    def step(
        self,
        members: Sequence[Trainer],
        ready: Callable[[], bool] = lambda: True,
        what: str = "",
    ) -> None:
        """Open the next round once :meth:`wait` returns."""
        self.wait(members, ready, what)
        self.open(self.value + 1)


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


def all_hold(members: Sequence[Trainer], *requests: str) -> Callable[[], bool]:
    """Whether every one of ``members`` logged holding each of ``requests``."""
    return lambda: all(member.holds(request) for member in members for request in requests)


def member_sets(history: str) -> list[str]:
    """The member-set changes ``history --federation`` printed (``round R: +peer (join)``)."""
    return re.findall(r"^member set round (\d+: \S+ \(\w+\))", history, re.MULTILINE)


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
    fast_timing(lab, evict_after=EVICT_AFTER, collect=6.0)  # room for a slow live member
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
        a, b, c = (trainer(node_dir, lab, gate=gate) for node_dir in dirs[:3])
        trainers += [a, b, c]
        gate.step([a, b, c])  # round 1 (agreed round 0): every member is up
        gate.wait([a, b, c])
        d = trainer(dirs[3], lab, gate=gate)
        trainers.append(d)
        poll_until(lambda: bool(d.out), timeout=120, what="d asking to join")
        assert "asks to join" in d.out[0]
        # Round 2's roster carries d's join: d is a member from round 3 on.
        gate.step([a, b, c], all_hold([a, b, c], f"join of {peers[3]}"), "d's join held")
        gate.wait([a, b, c, d], what="d admitted")  # d resynced to the admitting head

        c.process.send_signal(signal.SIGINT)  # Ctrl+C: a signed leave, then exit 0
        poll_until(lambda: "leaving after this round" in "".join(c.err), timeout=60, what="c")
        # Round 3's roster carries c's leave (after round 3): c is out from round 4 on.
        gate.step([a, b, c], all_hold([a, b, d], f"leave of {peers[2]}"), "c's leave held")
        code, out, err = c.finish(timeout=120)
        assert code == 0, err[-3000:]
        assert "left the session" in out, out

        gate.wait([a, b, d])
        b.process.kill()  # at the gate of round 4; dies without leaving (its daemon still runs)
        b.finish()
        for _ in range(EVICT_AFTER):  # absent from rounds 4 and 5: out from round 6 on
            gate.step([a, d])
        gate.open(ROUNDS)

        finished = [member.finish() for member in (a, d)]
        models = set()
        for code, out, err in finished:
            assert code == 0, err[-3000:]
            models.add(re.findall(r"done: \d+ rounds, model (\S+)", out)[0])
        assert len(models) == 1, finished  # the survivors agree
        expected = {1: 3, 2: 3, 3: 4, 4: 3, 5: 3} | dict.fromkeys(range(6, ROUNDS + 1), 2)
        assert a.members_by_round() == expected, a.rounds()
        assert d.members_by_round() == {r: n for r, n in expected.items() if r >= 3}, d.rounds()
        head = re.findall(r"record (\S+)\)", a.rounds()[-1])[0]

        argv = ["--node-dir", str(dirs[0]), "history", head, "--federation", str(lab)]
        code, out, err = run_cli(capsys, *argv)
        # "member set round R": the set of agreed round R + 1, i.e. of `train`'s round R + 2
        changes = [f"1: +{peers[3]} (join)", f"2: -{peers[2]} (leave)", f"4: -{peers[1]} (evict)"]
        assert member_sets(out) == changes, out
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
