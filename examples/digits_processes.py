"""The digits task with one OS process per peer, each beside its own loopback Kubo daemon.

:func:`run_processes` starts ``python examples/digits_processes.py peer ...`` once per daemon.
Each process talks only to its own daemon (a ``KuboBlockStore`` and a ``KuboPubsub`` on its API
URL), runs every agreed round of the :class:`~digits_training.Task` with a training-API
``Peer`` (members: the daemons' peer IDs), writes its ``History`` as JSON and prints one line
``{"event": "final", "model": CID, "record": CID, "accuracy": A}``. Agreed rounds are
bit-reproducible, so every process ends on the same model CID, and (when every roster holds
every peer) on the CID the in-process run of ``digits_training.simulate`` ends on.
``python examples/federated_digits.py --processes`` is the command line around it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))
from digits_training import Task, final_accuracy, initial_model, make_client
from digits_training import federation as task_federation

from gradfed_ipfs import AgreedConfig
from gradfed_ipfs.cli.children import environment
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore
from gradfed_ipfs.training import History, Peer, VectorAdapter

KUBO_TIMING = AgreedConfig(
    members=("timing",), collect_timeout=20.0, takeover_timeout=10.0, round_timeout=120.0,
    done_timeout=5.0, announce_interval=0.2, max_announce_interval=2.0, fetch_timeout=20.0,
)  # fmt: skip
"""Agreed-round timing over loopback Kubo daemons (seconds), generous for a loaded machine."""


class Node(Protocol):
    """A running Kubo daemon (``KuboDaemon`` or a test provider's node)."""

    api_url: str
    peer_id: str


@dataclass(frozen=True)
class PeerRun:
    """One peer process's outcome."""

    index: int
    pid: int
    api_url: str
    history: History

    @property
    def model(self) -> str:
        """CID of the final global model."""
        return self.history.entries[-1].model

    @property
    def accuracy(self) -> float:
        """Held-out test accuracy of the final model (as this process measured it)."""
        return final_accuracy(self.history)


# --------------------------------------------------------------------------- one peer process


async def run_peer(
    api: str,
    index: int,
    members: Sequence[str],
    session: str,
    task: Task,
    log: Callable[[str], None] = print,
) -> History:
    """Run peer ``index`` of ``task`` against the daemon at ``api``; return its history."""
    data = task.data()
    async with KuboBlockStore(api, timeout=KUBO_TIMING.fetch_timeout) as store:
        pubsub = KuboPubsub(api)
        try:
            peer = Peer(
                store=store,
                pubsub=pubsub,
                client=make_client(data, index, task),
                adapter=VectorAdapter(),
                initial_model=initial_model(),
                config=task_federation(data, task),
                agreed=dataclasses.replace(
                    KUBO_TIMING, members=tuple(members), compression=task.compression()
                ),
                strategy=task.strategy(),
                session=session,
                log=log,
            )
            history = await peer.run(linger=30.0)  # slower members still hear our last head
        finally:
            await pubsub.aclose()
    return history


def peer_main(argv: Sequence[str]) -> int:
    """Entry point of one peer process (``digits_processes.py peer --api URL ...``)."""
    parser = argparse.ArgumentParser(prog="digits_processes.py peer")
    add = parser.add_argument
    add("--api", required=True, help="this peer's own Kubo daemon")
    add("--index", type=int, required=True, help="this peer's part of the data")
    add("--members", required=True, help="comma-separated peer IDs of every member")
    add("--session", required=True)
    add("--history", required=True, help="where to write the History (JSON)")
    d = Task()
    add("--peers", type=int, default=d.peers)
    add("--rounds", type=int, default=d.rounds)
    add("--local-steps", type=int, default=d.local_steps)
    add("--lr", type=float, default=d.lr)
    add("--alpha", type=float, default=d.alpha)
    add("--seed", type=int, default=d.seed)
    add("--method", default=d.method)
    add("--diloco", action="store_true", help="DiLoCo's outer Nesterov step (H = --local-steps)")
    add("--compress", default=d.compress, help="the agreed rounds' codec (digits_model)")
    args = parser.parse_args(argv)
    task = Task(
        args.peers, args.rounds, args.local_steps, args.lr, args.alpha, args.seed, args.method,
        args.diloco, args.compress,
    )  # fmt: skip
    members = args.members.split(",")
    history = asyncio.run(
        run_peer(
            args.api, args.index, members, args.session, task, log=lambda s: print(s, flush=True)
        )
    )
    history.save(args.history)
    last = history.entries[-1]
    final = {"model": last.model, "record": last.record, "accuracy": final_accuracy(history)}
    print(json.dumps({"event": "final", **final}), flush=True)
    return 0


# --------------------------------------------------------------------------- the launcher


def run_processes(
    task: Task,
    nodes: Sequence[Node],
    workdir: Path,
    *,
    session: str | None = None,
    timeout: float = 900.0,
    log: Callable[[str], None] = print,
) -> list[PeerRun]:
    """Run ``task`` as one process per node (running, connected daemons); wait for all.

    Peer logs and histories go to ``workdir``; peer 0's round lines are passed to ``log`` as
    they come. Raises ``ChildProcessError`` (with its log) if a peer fails and
    ``TimeoutError`` after ``timeout`` seconds; every process started is ended by its PID.
    """
    if len(nodes) != task.peers:
        raise ValueError(f"{task.peers} peers need {task.peers} daemons, got {len(nodes)}")
    members = ",".join(node.peer_id for node in nodes)
    session = session or f"digits-processes-{os.getpid()}-{time.time_ns()}"
    env = environment()  # one BLAS thread: a 65 x 10 model gains nothing from more
    workdir.mkdir(parents=True, exist_ok=True)
    started: list[tuple[subprocess.Popen[str], IO[str]]] = []
    try:
        for i, node in enumerate(nodes):
            args = [
                "peer", "--api", node.api_url, "--index", str(i), "--members", members,
                "--session", session, "--history", str(workdir / f"peer{i}.json"), *task.flags(),
            ]  # fmt: skip
            out: IO[str] = (workdir / f"peer{i}.log").open("w")
            proc = subprocess.Popen(
                [sys.executable, __file__, *args],
                env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            started.append((proc, out))
        _wait([p for p, _ in started], workdir, timeout, log)
    finally:
        for proc, out in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            out.close()
    return [
        PeerRun(i, proc.pid, node.api_url, History.load(workdir / f"peer{i}.json"))
        for i, ((proc, _), node) in enumerate(zip(started, nodes, strict=True))
    ]


def _wait(
    procs: list[subprocess.Popen[str]], workdir: Path, timeout: float, log: Callable[[str], None]
) -> None:
    """Block until every process exits 0; forward peer 0's round lines to ``log``."""
    deadline = time.monotonic() + timeout
    pending = ""
    with (workdir / "peer0.log").open() as tail:
        while True:
            *lines, pending = (pending + tail.read()).split("\n")
            for line in lines:
                if not line.startswith("{"):
                    log(f"peer 0: {line}")
            codes = [proc.poll() for proc in procs]
            for i, code in enumerate(codes):
                if code not in (None, 0):
                    text = (workdir / f"peer{i}.log").read_text()
                    raise ChildProcessError(f"peer {i} exited with {code}:\n{text[-4000:]}")
            if all(code == 0 for code in codes):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"peer processes still running after {timeout:.0f} s")
            with contextlib.suppress(subprocess.TimeoutExpired):  # at most 0.5 s, then look again
                procs[codes.index(None)].wait(timeout=0.5)


if __name__ == "__main__":
    if sys.argv[1:2] != ["peer"]:
        sys.exit("usage: python examples/digits_processes.py peer --api URL ... (see --help)")
    sys.exit(peer_main(sys.argv[2:]))
