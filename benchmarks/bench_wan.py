"""gradfed_ipfs over an emulated wide-area network (``scripts/wan/``; root, Linux namespaces).

Measures, with every client its own OS process inside a peer namespace talking to that
namespace's daemon (only daemon-to-daemon traffic crosses the emulated link):

- ``link``: raw TCP between peers A and B (the baseline): RTT (median connect time) and bulk
  MB/s of the same bytes a fetch moves, timed until the receiver acknowledges EOF;
- ``fetch``: ``put_gradient`` of d seeded float32 values on A, ``fetch_gradient`` on B
  (bitswap), checked bit for bit; MB/s of payload and the ratio to ``link``;
- ``round``: N ``RoundRunner`` processes (one per namespace), ``min_peers = N - 1``, rounds back
  to back; seconds per round and participants.

Run (as root, from the repository)::

    scripts/wan/setup.sh -n 3 -d 75              # RTT 150 ms, 100 Mbit/s, TCP
    python -m benchmarks.bench_wan all           # link + fetch + round on that network
    scripts/wan/teardown.sh
    python -m benchmarks.bench_wan sweep         # every link setting (setup/shape/teardown itself)

Results: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gradfed_ipfs.storage.dag import DEFAULT_CONCURRENCY

ROOT = Path(__file__).resolve().parent.parent
WAN = ROOT / "scripts" / "wan"
RUN_DIR = Path(os.environ.get("WAN_RUN_DIR", f"{tempfile.gettempdir()}/gradfed-wan-run"))
MB = 1e6
PORT = 5999

# ================================================================= orchestration (host side)


def read_state() -> dict[str, Any]:
    """Return ``RUN_DIR/state.env`` (written by ``scripts/wan/setup.sh``) as a dict."""
    state: dict[str, Any] = {}
    for line in (RUN_DIR / "state.env").read_text().splitlines():
        key, _, value = line.partition("=")
        state[key] = value.strip('"')
    state["peers"] = state["NAMESPACES"].split()
    return state


def run_script(name: str, *args: str, timeout: float = 180.0) -> None:
    """Run ``scripts/wan/<name>.sh`` with ``args``; raise with its output on failure."""
    proc = subprocess.run(
        [str(WAN / f"{name}.sh"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "WAN_RUN_DIR": str(RUN_DIR)},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name}.sh {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")


@contextlib.contextmanager
def wan(*args: str) -> Iterator[dict[str, Any]]:
    """Build a WAN with ``setup.sh args``, yield its state, always tear it down."""
    try:
        run_script("setup", *args)
        yield read_state()
    finally:
        if (RUN_DIR / "state.env").exists():
            run_script("teardown")


def spawn(ns: str, *argv: str) -> subprocess.Popen[str]:
    """Start ``python -m benchmarks.bench_wan argv`` inside namespace ``ns``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "benchmarks.bench_wan", *argv]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """Wait for a worker (killing it by PID after ``timeout`` s); return its last JSON line."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return {"error": f"worker overran {timeout:.0f} s", "stderr": err[-2000:]}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"worker exited {proc.returncode}", "stderr": err[-2000:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def measure_link(state: dict[str, Any], nbytes: int) -> dict[str, Any]:
    """Raw TCP from peer A to peer B: RTT (ms) and bulk MB/s of ``nbytes``."""
    a, b = state["peers"][:2]
    sink = spawn(b, "_sink", state[f"IP_{b}"])
    assert sink.stdout is not None
    ready = sink.stdout.readline()  # the sink prints one line once it listens
    if "listening" not in ready:
        return {"error": "sink did not start", **finish(sink, 5)}
    result = finish(spawn(a, "_send", state[f"IP_{b}"], str(nbytes)), 600)
    sink.kill()
    sink.communicate()
    return result


def measure_fetch(
    state: dict[str, Any], d: int, reps: int, timeout: float, concurrency: int = DEFAULT_CONCURRENCY
) -> dict[str, Any]:
    """Best of ``reps`` fetches of d fresh seeded floats from A to B (MB/s of payload)."""
    a, b = state["peers"][:2]
    runs = []
    for _ in range(reps):
        seed = int.from_bytes(os.urandom(4), "little")
        put = finish(spawn(a, "_put", str(d), str(seed)), 600)
        if "cid" not in put:
            return put
        argv = (put["cid"], str(d), str(seed), str(timeout), str(concurrency))
        got = finish(spawn(b, "_fetch", *argv), timeout + 60)
        if "seconds" not in got:
            return got
        runs.append(got["seconds"])
    best = min(runs)
    return {"d": d, "seconds": runs, "mb_s": 4 * d / best / MB}


def measure_round(state: dict[str, Any], d: int, rounds: int, timeout: float) -> dict[str, Any]:
    """``rounds`` rounds of all peers (one process each); per-round seconds and participants."""
    session = uuid.uuid4().hex[:8]
    start = time.time() + 3.0
    ids = ",".join(state[f"PEER_{ns}"] for ns in state["peers"])
    procs = [
        spawn(ns, "_round", str(i), ids, str(d), str(rounds), f"{start:.3f}", session, str(timeout))
        for i, ns in enumerate(state["peers"])
    ]
    results = [finish(p, rounds * (timeout + 30) + 60) for p in procs]
    errors = [r for r in results if "rounds" not in r]
    if errors:
        return {"error": errors}
    per_round = list(zip(*(r["rounds"] for r in results), strict=True))
    return {
        "d": d,
        "seconds": [max(p["seconds"] for p in rnd) for rnd in per_round],
        "participants": [min(p["participants"] for p in rnd) for rnd in per_round],
        "agree": [len({p["sha256"] for p in rnd}) == 1 for rnd in per_round],
        "failures": [f for r in results for p in r["rounds"] for f in p["failures"]],
    }


# ================================================================= workers (inside a namespace)


def gradient(d: int, seed: int) -> np.ndarray:
    """Return d seeded standard-normal float32 values."""
    return np.random.default_rng(seed).standard_normal(d, dtype=np.float32)


def emit(**values: Any) -> None:
    """Print one JSON result line (the orchestrator reads the last one)."""
    print(json.dumps(values), flush=True)


def worker_sink(host: str) -> None:
    """Accept connections on ``host:PORT``; read each to EOF, answer with the byte count."""
    server = socket.create_server((host, PORT))
    print("listening", flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            total = 0
            while chunk := conn.recv(1 << 20):
                total += len(chunk)
            conn.sendall(total.to_bytes(8, "big"))


def worker_send(host: str, nbytes: int) -> None:
    """Median connect time (RTT) of 7 connects, then ``nbytes`` bulk until acknowledged."""
    rtts = []
    for _ in range(7):
        t0 = time.perf_counter()
        with socket.create_connection((host, PORT), timeout=30) as conn:
            rtts.append(time.perf_counter() - t0)
            conn.shutdown(socket.SHUT_WR)
            conn.recv(8)
    payload = os.urandom(1 << 20)
    t0 = time.perf_counter()
    with socket.create_connection((host, PORT), timeout=600) as conn:
        sent = 0
        while sent < nbytes:
            sent += conn.send(payload[: min(len(payload), nbytes - sent)])
        conn.shutdown(socket.SHUT_WR)
        assert int.from_bytes(conn.recv(8), "big") == nbytes
    seconds = time.perf_counter() - t0
    emit(
        rtt_ms=1000 * statistics.median(rtts),
        bytes=nbytes,
        seconds=seconds,
        mb_s=nbytes / seconds / MB,
    )


async def worker_put(d: int, seed: int) -> None:
    """Commit d seeded floats to this namespace's daemon; print the CID."""
    from gradfed_ipfs.storage import KuboBlockStore
    from gradfed_ipfs.storage.dag import put_gradient

    async with KuboBlockStore("http://127.0.0.1:5001") as store:
        emit(cid=str(await put_gradient(store, gradient(d, seed))))


async def worker_fetch(cid: str, d: int, seed: int, timeout: float, concurrency: int) -> None:
    """Fetch ``cid`` through this namespace's daemon, check it bit for bit, print seconds."""
    from gradfed_ipfs.storage import KuboBlockStore
    from gradfed_ipfs.storage.dag import fetch_gradient

    async with KuboBlockStore("http://127.0.0.1:5001", timeout=timeout) as store:
        t0 = time.perf_counter()
        fetch = fetch_gradient(store, cid, concurrency=concurrency)
        values = await asyncio.wait_for(fetch, timeout)
        seconds = time.perf_counter() - t0
    assert np.array_equal(values.ravel(), gradient(d, seed)), "fetched gradient differs"
    emit(seconds=seconds, mb_s=4 * d / seconds / MB)


async def worker_round(
    index: int, ids: list[str], d: int, rounds: int, start: float, session: str, timeout: float
) -> None:
    """Run ``rounds`` rounds as peer ``index`` of ``ids``; print per-round seconds and peers."""
    from gradfed_ipfs.federated.besteffort import GossipModelSync, RoundConfig, RoundRunner
    from gradfed_ipfs.kubo.pubsub import KuboPubsub
    from gradfed_ipfs.storage import KuboBlockStore

    me = ids[index]
    store = KuboBlockStore("http://127.0.0.1:5001", timeout=timeout)
    pubsub = KuboPubsub("http://127.0.0.1:5001", timeout=timeout)
    gossip = GossipModelSync(me, pubsub, session_id=session)
    # the project's default deadlines (scaled by the announced size), as a deployment has them
    config = RoundConfig(min_peers=len(ids) - 1, subscriber_timeout=timeout, republish_interval=0.5)
    runner = RoundRunner(store, gossip, config)
    await asyncio.sleep(max(0.0, start - time.time()))  # common start instant of all peers
    out = []
    for round_id in range(rounds):
        seed = hashlib.sha256(f"{session}/{round_id}/{index}".encode()).digest()
        values = gradient(d, int.from_bytes(seed[:8], "little"))
        t0 = time.perf_counter()
        result = await runner.run_round(round_id, values, num_samples=1, expected_peers=ids)
        out.append(
            {
                "seconds": time.perf_counter() - t0,
                "participants": len(result.participants),
                "failures": list(result.failures.values()),
                "sha256": hashlib.sha256(result.aggregate.tobytes()).hexdigest()[:16],
            }
        )
    done = RUN_DIR / f"round-{session}-{index}.done"
    done.touch()  # keep re-publishing the last announcement until every peer is done
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all((RUN_DIR / f"round-{session}-{i}.done").exists() for i in range(len(ids))):
            break
        await asyncio.sleep(0.2)  # polling sibling processes' marker files, with a deadline
    await runner.aclose()
    await gossip.aclose()
    await store.aclose()
    emit(rounds=out)


# ================================================================= command line


def main(argv: list[str] | None = None) -> None:
    """Orchestrator commands (``link``, ``fetch``, ``round``, ``all``, ``sweep``) and workers."""
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "all"
    if command == "_sink":
        worker_sink(args[1])
    elif command == "_send":
        worker_send(args[1], int(args[2]))
    elif command == "_put":
        asyncio.run(worker_put(int(args[1]), int(args[2])))
    elif command == "_fetch":
        cid, d, seed, timeout, concurrency = args[1:6]
        asyncio.run(worker_fetch(cid, int(d), int(seed), float(timeout), int(concurrency)))
    elif command == "_round":
        i, ids, d, rounds, start, session, timeout = args[1:8]
        asyncio.run(
            worker_round(
                int(i), ids.split(","), int(d), int(rounds), float(start), session, float(timeout)
            )
        )
    else:
        orchestrate(args)


def orchestrate(argv: list[str]) -> None:
    """Parse the orchestrator's arguments and print JSON lines of results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["link", "fetch", "round", "all", "sweep"])
    parser.add_argument("--d", type=int, default=10_000_000, help="floats fetched")
    parser.add_argument("--round-d", type=int, default=1_000_000, help="floats per peer a round")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="chunks in flight (fetch)"
    )
    options = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `wan()` still tears down
    if options.command == "sweep":
        sweep(options)
        return
    state = read_state()
    report(state, options, options.command)


def report(state: dict[str, Any], options: argparse.Namespace, command: str) -> dict[str, Any]:
    """Run ``command`` on the current network; print and return one JSON record."""
    record: dict[str, Any] = {
        k: state.get(k) for k in ("DELAY_MS", "RATE", "LOSS_PCT", "TRANSPORT", "CC", "KUBO_CONFIG")
    }
    if command in ("link", "fetch", "all"):
        record["link"] = measure_link(state, 4 * options.d)
    if command in ("fetch", "all"):
        record["fetch"] = measure_fetch(
            state, options.d, options.reps, options.timeout, options.concurrency
        )
        record["concurrency"] = options.concurrency
        with contextlib.suppress(KeyError, TypeError):
            record["ratio"] = record["fetch"]["mb_s"] / record["link"]["mb_s"]
    if command in ("round", "all"):
        record["round"] = measure_round(state, options.round_d, options.rounds, options.timeout)
    print(json.dumps(record), flush=True)
    return record


def sweep(options: argparse.Namespace) -> None:
    """The matrix: Kubo default or ``WAN_TUNING``, TCP or QUIC, x RTT 0/50/150 ms and 2 % loss."""
    from gradfed_ipfs.kubo import WAN_TUNING

    tuned = [arg for key, value in WAN_TUNING.config() for arg in ("-K", f"{key}={value}")]
    variants = [("tcp",), ("tcp", *tuned), ("quic",), ("quic", *tuned)]
    links = [("0", "0"), ("25", "0"), ("75", "0"), ("25", "2")]
    lossy = argparse.Namespace(**{**vars(options), "d": options.d // 4})  # 2 % loss: ~0.2 MB/s
    for transport, *extra in variants:
        with wan("-n", "3", "-t", transport, *extra):
            for delay, loss in links:
                run_script("shape", "-d", delay, "-l", loss)
                report(read_state(), lossy if loss != "0" else options, "all")


if __name__ == "__main__":
    main()
