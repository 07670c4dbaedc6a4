"""A federation of hosts (network namespaces this test creates), set up through the CLI.

``scripts/wan/setup.sh --no-kubo`` makes the hosts: each namespace has its own address on the
script's own veths behind a router namespace, and nothing else. On each host a member runs
``node start --federation`` with the deployment defaults (listening on every interface of its
namespace, TCP 4001) and ``train``. The first test: four members train to one model, a member
whose task starts from another model is refused, and a fifth host runs a plain node without
the swarm key. The second: members change while they train (a join by the allow-list, a join
by the members' approval, a Ctrl+C leave, a killed member's eviction after ``evict_after``
absent rounds) and ``history --federation`` re-checks every round's member set. All traffic
stays inside the namespaces; everything is torn down by PID at the end.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.federation.test_train_members import Gate, Trainer, all_hold, fast_timing, member_sets
from tests.federation.test_train_processes import TASK
from tests.polling import poll_until
from tests.required import skip_area

pytestmark = pytest.mark.kubo

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("gradfed-ipfs"))
TOOLS = ("ip", "tc", "iptables", "iptables-restore", "gcc", "curl", "jq", "chrt", "numfmt")
PREFIX = "gfed"
CHANGING_ROUNDS = 24  # room after the eviction (the joins take a few rounds more on a slow day)
EVICT_AFTER = 2


def _needs() -> None:
    if os.geteuid() != 0:
        skip_area("netns", "network namespaces need root")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        skip_area("netns", f"missing {', '.join(missing)} (apt-get install iproute2 iptables …)")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory, kubo_binary: Path) -> Iterator[list[str]]:
    """Six host namespaces ``gfedA..gfedF``, addresses 10.201.0.6, .10, …; torn down after."""
    _needs()
    run_dir = tmp_path_factory.mktemp("hosts")
    env = {**os.environ, "WAN_RUN_DIR": str(run_dir), "GRADFED_KUBO_BIN": str(kubo_binary)}
    script = ROOT / "scripts" / "wan"
    setup = [str(script / "setup.sh"), "-n", "6", "-r", "none", "-p", PREFIX, "--no-kubo"]
    subprocess.run(setup, env=env, check=True, capture_output=True, timeout=120)
    try:
        yield [f"{PREFIX}{letter}" for letter in "ABCDEF"]
    finally:
        subprocess.run([str(script / "teardown.sh")], env=env, check=False, timeout=120)


def _env(rounds: int = 10) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRADFED_TASK_ROUNDS": str(rounds)}
    env.pop("GRADFED_IPFS_API", None)
    return env


def _on(
    host: str, *argv: str, timeout: float = 120.0, rounds: int = 10
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", host, CLI, *argv],
        env=_env(rounds),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _member(host: str, node_dir: Path, federation: Path, gate: Gate) -> Trainer:
    """A ``train`` process on ``host`` paced by ``gate``, its output collected as it comes."""
    env = {**_env(CHANGING_ROUNDS), "GRADFED_TASK_GATE": str(gate.path)}
    argv = ["--node-dir", str(node_dir), "train", "--federation", str(federation), str(TASK)]
    return Trainer(["ip", "netns", "exec", host, CLI, *argv, "--linger", "20"], env)


def _trainer(host: str, node_dir: Path, federation: Path) -> subprocess.Popen[str]:
    argv = ["--node-dir", str(node_dir), "train", "--federation", str(federation), str(TASK)]
    return subprocess.Popen(
        ["ip", "netns", "exec", host, CLI, *argv, "--linger", "20"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _start(host: str, node_dir: Path, *argv: str) -> str:
    done = _on(host, "--node-dir", str(node_dir), "node", "start", *argv)
    assert done.returncode == 0, done.stderr
    match = re.search(r"peer (\S+)", done.stdout)
    assert match, done.stdout
    return match.group(1)


def test_four_hosts_train_to_one_model_and_a_keyless_node_gets_nothing(
    hosts: list[str], tmp_path: Path
) -> None:
    lab = tmp_path / "lab.toml"
    assert _on(hosts[0], "federation", "init", "lab", "--file", str(lab)).returncode == 0
    dirs = [tmp_path / host for host in hosts]
    members = hosts[:4]
    try:
        first = _start(members[0], dirs[0], "--federation", str(lab))  # default listen
        bootstrap = f"/ip4/10.201.0.6/tcp/4001/p2p/{first}"
        assert _on(members[0], "federation", "add-bootstrap", str(lab), bootstrap).returncode == 0
        peers = [first] + [
            _start(host, node_dir, "--federation", str(lab))
            for host, node_dir in zip(members[1:], dirs[1:4], strict=True)
        ]
        assert _on(members[0], "federation", "allow", str(lab), *peers).returncode == 0
        shown = _on(members[0], "--node-dir", str(dirs[0]), "train", "--federation", str(lab),
                    str(TASK), "--show-genesis")  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        genesis = shown.stdout.strip()
        assert _on(members[0], "federation", "genesis", str(lab), genesis).returncode == 0

        trainers = [
            _trainer(host, node_dir, lab) for host, node_dir in zip(members, dirs[:4], strict=True)
        ]
        outputs = [process.communicate(timeout=300) for process in trainers]
        models = set()
        for process, (out, err) in zip(trainers, outputs, strict=True):
            assert process.returncode == 0, err[-3000:]
            models.add(re.findall(r"done: 10 rounds, model (\S+)", out)[0])
        assert len(models) == 1, outputs  # one model CID on all four hosts

        # Host D with a task whose initial model is not the federation's genesis: refused.
        wrong = tmp_path / "wrong_task.py"
        wrong.write_text(
            TASK.read_text().replace("np.zeros(DIM, np.float32)", "np.ones(DIM, np.float32)")
        )
        refused = _on(members[3], "--node-dir", str(dirs[3]), "train", "--federation", str(lab),
                      str(wrong))  # fmt: skip
        assert refused.returncode == 11, refused.stderr
        assert "trains from" in refused.stderr
        assert genesis in refused.stderr

        # Host E: a plain node with no swarm key can neither connect nor fetch the model.
        _start(hosts[4], dirs[4])
        dial = _on(hosts[4], "--node-dir", str(dirs[4]), "node", "connect", bootstrap)
        assert dial.returncode != 0, dial.stdout
        fetched = _on(hosts[4], "--node-dir", str(dirs[4]), "--timeout", "5", "fetch",
                      models.pop(), "-o", str(tmp_path / "stolen.npy"))  # fmt: skip
        assert fetched.returncode != 0
        assert not (tmp_path / "stolen.npy").exists()
    finally:
        for host, node_dir in zip(hosts, dirs, strict=True):
            _on(host, "--node-dir", str(node_dir), "node", "stop")


def test_members_join_and_leave_across_hosts(hosts: list[str], tmp_path: Path) -> None:
    """A-D are the genesis members (policy: majority). E, on the file's allow-list, is
    approved by every member as soon as its join is heard and trains from round 4; F is
    approved by three of the five members (each runs `federation allow` on its own copy of
    the file while it trains) and trains from round 6; D leaves by Ctrl+C after round 7; C's
    process is killed (its daemon keeps running) at round 8's gate and C is out of the member
    set from round 8 + ``EVICT_AFTER`` on. A gate file paces the rounds (the example task's
    ``GRADFED_TASK_GATE``): each opens once every member waits at it and logs holding the
    requests its roster is to carry, so each change is at the round named. The survivors end
    on one model and `history --federation --task` re-checks every round's member set and
    recomputes every round."""
    lab = tmp_path / "lab.toml"
    init = _on(hosts[0], "federation", "init", "lab", "--file", str(lab), "--policy", "majority")
    assert init.returncode == 0, init.stderr
    fast_timing(lab, evict_after=EVICT_AFTER, collect=10.0)  # room for a slow live member
    dirs = [tmp_path / host for host in hosts]
    trainers: list[Trainer] = []
    try:
        first = _start(hosts[0], dirs[0], "--federation", str(lab))
        bootstrap = f"/ip4/10.201.0.6/tcp/4001/p2p/{first}"
        assert _on(hosts[0], "federation", "add-bootstrap", str(lab), bootstrap).returncode == 0
        peers = [first] + [
            _start(host, node_dir, "--federation", str(lab))
            for host, node_dir in zip(hosts[1:], dirs[1:], strict=True)
        ]
        assert _on(hosts[0], "federation", "allow", str(lab), *peers[:4]).returncode == 0
        shown = _on(hosts[0], "--node-dir", str(dirs[0]), "train", "--federation", str(lab),
                    str(TASK), "--show-genesis")  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert (
            _on(hosts[0], "federation", "genesis", str(lab), shown.stdout.strip()).returncode == 0
        )
        assert _on(hosts[0], "federation", "allow", str(lab), peers[4]).returncode == 0  # E
        copies = []  # each member's own copy of the file (its approvals are its own)
        for host in hosts:
            copy = tmp_path / f"{host}.toml"
            shutil.copy(lab, copy)
            copies.append(copy)

        gate = Gate(tmp_path / "gate")
        a, b, c, d = (_member(hosts[i], dirs[i], copies[i], gate) for i in range(4))
        trainers += [a, b, c, d]
        first_four = [a, b, c, d]
        for _ in range(2):  # rounds 1 and 2: every member is up
            gate.step(first_four)
        gate.wait(first_four)
        e = _member(hosts[4], dirs[4], copies[4], gate)  # on every member's allow-list
        trainers.append(e)
        poll_until(lambda: bool(e.out), timeout=120, what="E asking to join")
        # Round 3's roster carries E's join and the four approvals: E trains from round 4.
        e_held = [f"join of {peers[4]}", *(f"approval of {peers[4]} by {p}" for p in peers[:4])]
        gate.step(first_four, all_hold(first_four, *e_held), "E's join and approvals held")
        five = [a, b, c, d, e]
        gate.wait(five, what="E admitted")  # E resynced to the admitting head
        f = _member(hosts[5], dirs[5], copies[5], gate)  # asks; nobody approves it yet
        trainers.append(f)
        poll_until(lambda: bool(f.out), timeout=120, what="F asking to join")
        poll_until(all_hold(five, f"join of {peers[5]}"), timeout=120, what="F's join held")
        for copy in copies[:3]:  # three of the five members approve F (more than half)
            assert _on(hosts[0], "federation", "allow", str(copy), peers[5]).returncode == 0
        gate.step(first_four)  # round 4: its start already read the allow-lists; round 5's signs
        # Round 5's roster carries F's join and three approvals: F trains from round 6.
        f_held = [f"join of {peers[5]}", *(f"approval of {peers[5]} by {p}" for p in peers[:3])]
        gate.step(five, all_hold(five, *f_held), "F's join and approvals held")
        six = [a, b, c, d, e, f]
        gate.wait(six, what="F admitted")
        gate.open(6)
        gate.wait(six)
        d.process.send_signal(signal.SIGINT)  # D leaves after round 7: out from round 8
        poll_until(lambda: "leaving after" in "".join(d.err), timeout=60, what="D leaving")
        rest = [a, b, c, e, f]
        gate.step(six, all_hold(rest, f"leave of {peers[3]}"), "D's leave held")
        code, out, err = d.finish(timeout=180)
        assert code == 0, err[-3000:]
        assert "left the session" in out
        gate.wait(rest)
        c.process.kill()  # at the gate of round 8; C dies without leaving
        c.finish()
        for _ in range(EVICT_AFTER):  # absent from rounds 8 and 9: out from round 10 on
            gate.step([a, b, e, f])
        gate.open(CHANGING_ROUNDS)

        survivors = [member.finish(timeout=400) for member in (a, b, e, f)]
        models = set()
        for code, out, err in survivors:
            assert code == 0, err[-3000:]
            models.add(re.findall(r"done: \d+ rounds, model (\S+)", out)[0])
        assert len(models) == 1, survivors
        expected = {1: 4, 2: 4, 3: 4, 4: 5, 5: 5, 6: 6, 7: 6, 8: 5, 9: 5}
        expected |= dict.fromkeys(range(10, CHANGING_ROUNDS + 1), 4)
        assert a.members_by_round() == expected, a.rounds()
        assert e.members_by_round() == {r: n for r, n in expected.items() if r >= 4}
        assert f.members_by_round() == {r: n for r, n in expected.items() if r >= 6}
        head = re.findall(r"record (\S+)\)", a.rounds()[-1])[0]
        history = _on(hosts[0], "--node-dir", str(dirs[0]), "history", head,
                      "--federation", str(copies[0]), "--task", str(TASK), "--deadline", "300",
                      timeout=400, rounds=CHANGING_ROUNDS)  # fmt: skip
        text = history.stdout
        assert history.returncode == 0, text + history.stderr
        assert "rounds verified" in text
        # "member set round R": the set of agreed round R + 1, i.e. of `train`'s round R + 2
        changes = [f"2: +{peers[4]} (join)", f"4: +{peers[5]} (join)"]
        changes += [f"6: -{peers[3]} (leave)", f"8: -{peers[2]} (evict)"]
        assert member_sets(text) == changes, text
        assert f"member sets verified ({len(changes)} changes)" in text, text
    finally:
        for member in trainers:
            if member.process.poll() is None:
                member.process.kill()
            member.finish(timeout=30)
        for host, node_dir in zip(hosts, dirs, strict=True):
            _on(host, "--node-dir", str(node_dir), "node", "stop")
