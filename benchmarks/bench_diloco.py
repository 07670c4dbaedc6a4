"""DiLoCo over agreed rounds on real Kubo daemons vs averaging after every step, at equal tokens.

The model is ``examples/stdlib_lm.py``'s byte-level transformer (4 layers, d_model 128, context
128: 842,496 parameters) on the Python standard library's sources, split across ``--peers``
peers by file, held-out files for the evaluation loss. Every variant trains on the same tokens:
peer ``i``'s ``k``-th step uses batch ``batch_of(part_i, config, i, k)`` for ``k < --steps``.

``a``  every peer's gradient averaged after every step (the DDP update, in one process; AdamW)
``b``  DiLoCo: ``--h`` inner AdamW steps per peer, then an agreed round over Kubo whose rule is
       outer Nesterov SGD (lr 0.7, momentum 0.9) on the mean pseudo-gradient; float32
``c``  ``b`` with every contribution int8 (``AgreedConfig(compression=Int8())``, per-block
       absmax scales, error feedback on as by default)
``d``  SparseLoCo: top-``--ratio`` entries at 2 bits (``TopKInt2``) with error feedback, outer
       SGD lr 1.0

``b``–``d`` run one Kubo daemon per peer (127.0.0.1, a ``KuboSwarm`` started and stopped here),
every peer in this process, training in threads (``a`` computes every peer's gradient in turn
in one thread: wall times compare the whole run's cost, not a deployment's). "Bytes per peer"
is what one peer's contributions put on the wire per exchange (``AgreedRoundResult.sent_bytes``,
summed); ``a`` sends a float32 contribution each step, so its total is ``--steps`` float32
exchanges of the same size as ``b``'s. "Wire out" is each daemon's libp2p bytes out
(``stats/bw``), which also counts bitswap serving a contribution to every other peer, the model
copies and pubsub. Goals (issue 34): ``b`` within 2 % of ``a``'s eval loss with ≥ 100× fewer
bytes, ``c`` 2 % and ≥ 400×, ``d`` 3 % and ≥ 5,000×.

Run::

    python benchmarks/bench_diloco.py                 # 4 peers, 1,000 steps, H = 100
    python benchmarks/bench_diloco.py --quick         # a 2-minute smoke run (2 peers)
    python benchmarks/bench_diloco.py --variants a,d --ratio 0.01
    python benchmarks/bench_diloco.py --warm-start 500  # all start from 500 averaged steps

``--warm-start K`` gives every variant the same start: the model after ``K`` every-step-averaged
steps (DiLoCo's experiments start from a pretrained model); the variants then train steps
``K … K + --steps`` and the warm start's bytes count in none of them.

A full run trains 4 × 4 × 1,000 steps of 16 × 128 bytes; at about 0.2 CPU seconds a step,
an estimated 35 minutes on 2 idle cores ((a) runs in one thread: about 13 of them).
The table and plot (``--plot``, default ``docs/img/diloco.png``): ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from stdlib_lm import (  # noqa: E402
    UNTRAINED_LOSS,
    Corpus,
    LMConfig,
    Vector,
    federation,
    final_loss,
    initial_vector,
    load_corpus,
    make_client,
    parameter_count,
    torch_module,
    train_synchronous,
)

from gradfed_ipfs import AgreedConfig  # noqa: E402
from gradfed_ipfs.federated.exchange import encode_gradient  # noqa: E402
from gradfed_ipfs.kubo import KuboDaemon, KuboPubsub, KuboSwarm  # noqa: E402
from gradfed_ipfs.storage import KuboBlockStore  # noqa: E402
from gradfed_ipfs.tensor import Int8, TopKInt2  # noqa: E402
from gradfed_ipfs.training import (  # noqa: E402
    DiLoCo,
    History,
    Peer,
    SparseLoCo,
    Strategy,
    VectorAdapter,
    VectorLayout,
)

DEFAULT_PLOT = ROOT / "docs" / "img" / "diloco.png"
LABELS = {
    "a": "every-step averaging (DDP)",
    "b": "DiLoCo, float32",
    "c": "DiLoCo, int8",
    "d": "SparseLoCo, top-k 2-bit + EF",
}
GOALS = {"b": (0.02, 100.0), "c": (0.02, 400.0), "d": (0.03, 5000.0)}
"""Variant -> (largest eval-loss excess over ``a``, least bytes reduction vs ``a``)."""
KUBO_TIMING = {
    "collect_timeout": 600.0,  # a round waits for every peer's H inner steps
    "takeover_timeout": 30.0,
    "round_timeout": 1800.0,
    "done_timeout": 5.0,
    "announce_interval": 0.2,
    "max_announce_interval": 2.0,
    "fetch_timeout": 60.0,
}


@dataclass
class Outcome:
    """One variant's result: final eval loss, its curve against bytes, bytes and time."""

    key: str
    loss: float
    curve: list[tuple[float, float]]  # (bytes sent per peer so far, eval loss)
    sent: float  # bytes per peer over the run
    seconds: float
    wire: float | None = None  # libp2p bytes out per daemon (mean)
    agreed: bool = True  # every peer on one model CID


# --------------------------------------------------------------------------- variants


def strategy_of(key: str) -> Callable[[], Strategy]:
    """The outer optimizer of a DiLoCo variant (a factory: one instance per peer)."""
    if key == "d":
        return lambda: SparseLoCo(outer_lr=1.0)
    return lambda: DiLoCo(outer_lr=0.7, momentum=0.9)


def compression_of(key: str, ratio: float) -> dict[str, Any]:
    """``AgreedConfig`` fields of a variant's contributions (float32 for ``b``)."""
    if key == "c":
        return {"compression": Int8()}
    if key == "d":
        return {"compression": TopKInt2(ratio=ratio), "error_feedback": True, "error_decay": 1.0}
    return {}


def run_every_step(
    corpus: Corpus, config: LMConfig, args: Any, dense: int, initial: Vector
) -> Outcome:
    """Variant ``a``: each step one float32 exchange of ``dense`` bytes per peer."""
    run = train_synchronous(corpus, config, args.steps, eval_every=args.h, initial=initial)
    steps = args.steps
    curve = [(float(step * dense), loss) for step, loss in run.losses]
    return Outcome("a", run.losses[-1][1], curve, float(steps * dense), run.seconds)


async def wire_out(api: str) -> float:
    """The daemon's libp2p bytes out so far (``stats/bw`` TotalOut)."""
    async with httpx.AsyncClient(timeout=30.0) as client:
        response = await client.post(f"{api}/api/v0/stats/bw")
        response.raise_for_status()
        return float(response.json()["TotalOut"])


async def run_diloco(
    key: str,
    nodes: Sequence[KuboDaemon],
    corpus: Corpus,
    config: LMConfig,
    args: Any,
    initial: Vector,
) -> Outcome:
    """Variants ``b``–``d``: one :class:`Peer` per daemon, ``steps / h`` agreed rounds."""
    rounds = args.steps // args.h
    members = tuple(node.peer_id for node in nodes)
    agreed = AgreedConfig(members=members, **KUBO_TIMING, **compression_of(key, args.ratio))
    make_strategy = strategy_of(key)
    stores = [KuboBlockStore(node.api_url, timeout=KUBO_TIMING["fetch_timeout"]) for node in nodes]
    pubsubs = [KuboPubsub(node.api_url) for node in nodes]
    before = [await wire_out(node.api_url) for node in nodes]
    started = time.monotonic()
    try:
        peers = [
            Peer(
                store=store,
                pubsub=pubsub,
                client=make_client(corpus, i, config),
                adapter=VectorAdapter(),
                initial_model=initial,
                config=federation(
                    corpus, config, rounds, args.h, **({} if i == 0 else {"evaluate_fn": None})
                ),
                agreed=agreed,
                strategy=make_strategy(),
                session=f"diloco-{key}-{os.getpid()}",
                log=(lambda line: print(f"  {key}: {line}", flush=True)) if i == 0 else None,
            )
            for i, (store, pubsub) in enumerate(zip(stores, pubsubs, strict=True))
        ]
        histories = await asyncio.gather(*(peer.run(linger=30.0) for peer in peers))
    finally:
        for store, pubsub in zip(stores, pubsubs, strict=True):
            await pubsub.aclose()
            await store.aclose()
    seconds = time.monotonic() - started
    after = [await wire_out(node.api_url) for node in nodes]
    return outcome_of(key, histories, seconds, sum(after) / len(nodes) - sum(before) / len(nodes))


def outcome_of(key: str, histories: Sequence[History], seconds: float, wire: float) -> Outcome:
    """Peer 0's eval-loss curve against its cumulative sent bytes; bytes averaged over peers."""
    totals = [sum(e.sent_bytes for e in h.entries) for h in histories]
    curve, sent = [], 0
    for entry in histories[0].entries:
        sent += entry.sent_bytes
        if entry.local_loss is not None:
            curve.append((float(sent), float(entry.local_loss)))
    agreed = len({h.entries[-1].model for h in histories}) == 1
    total = sum(totals) / len(totals)
    return Outcome(key, final_loss(histories[0]), curve, total, seconds, wire, agreed)


# --------------------------------------------------------------------------- report


def table(outcomes: Sequence[Outcome]) -> str:
    """The side-by-side table (Markdown), ratios to ``a`` when it ran."""
    base = next((o for o in outcomes if o.key == "a"), None)
    rows = [
        "| variant | eval loss | loss / (a) | bytes per peer | bytes (a) / this | wire out "
        "per daemon | wall time | one model CID |",
        "|---|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for o in outcomes:
        ratio = f"{o.loss / base.loss:.4f}" if base else "–"
        fewer = f"{base.sent / o.sent:,.0f}×" if base and o.sent else "–"
        wire = "–" if o.wire is None else human(o.wire)
        rows.append(
            f"| ({o.key}) {LABELS[o.key]} | {o.loss:.4f} | {ratio} | {human(o.sent)} | {fewer} "
            f"| {wire} | {o.seconds:,.0f} s | {'yes' if o.agreed else 'NO'} |"
        )
    return "\n".join(rows)


def human(n: float) -> str:
    """Bytes with an SI suffix (kB, MB, GB: powers of 1,000)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} B"


def goal_lines(outcomes: Sequence[Outcome], h: int, ratio: float) -> list[str]:
    """Whether each goal is met; by how much it is missed otherwise, and what would meet it.

    The bytes a run sends scale as 1/H (and, for ``d``, about as the density ``ratio``).
    """
    base = next((o for o in outcomes if o.key == "a"), None)
    if base is None:
        return ["goals: need variant (a) as the reference"]
    lines = []
    for o in outcomes:
        if o.key not in GOALS:
            continue
        excess, fewer = GOALS[o.key]
        got_excess, got_fewer = o.loss / base.loss - 1.0, base.sent / o.sent
        loss_ok, bytes_ok = got_excess <= excess, got_fewer >= fewer
        verdict = "met" if loss_ok and bytes_ok else "MISSED"
        parts = [f"loss {100 * got_excess:+.2f} % (goal ≤ {100 * excess:.0f} %)"]
        parts.append(f"bytes {got_fewer:,.0f}× fewer (goal ≥ {fewer:,.0f}×)")
        if not loss_ok:
            missed = 100 * (got_excess - excess)
            hint = "more outer rounds: lower H or more --steps"
            parts.append(f"loss missed by {missed:.2f} points ({hint})")
        if not bytes_ok:
            need = f"H ≥ {math.ceil(h * fewer / got_fewer)}"
            if o.key == "d":
                need += f" or --ratio ≤ {ratio * got_fewer / fewer:.4f}"
            short = 100 * (1 - got_fewer / fewer)
            parts.append(f"bytes missed by {short:.1f} % of the goal ({need} would meet it)")
        lines.append(f"goal ({o.key}) {verdict}: " + "; ".join(parts))
    return lines


def plot(outcomes: Sequence[Outcome], path: Path, title: str) -> Path:
    """Eval loss against bytes sent per peer (log x), one line per variant (PNG, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    base = next((o for o in outcomes if o.key == "a"), None)
    if base is not None:
        axes.axhline(base.loss, linestyle="--", color="gray", linewidth=0.8, label="(a) final")
    for o in outcomes:
        xs, ys = zip(*o.curve, strict=True) if o.curve else ((), ())
        axes.plot(xs, ys, marker="o", markersize=3, label=f"({o.key}) {LABELS[o.key]}")
    axes.set_xscale("log")
    axes.set_xlabel("bytes sent per peer")
    axes.set_ylabel("held-out loss (nats per byte)")
    axes.grid(alpha=0.3, which="both")
    axes.legend(loc="upper right")
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


# --------------------------------------------------------------------------- main


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (``--quick``: 2 peers, 40 steps, H = 20, batch 8)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--peers", type=int, default=4)
    add("--steps", type=int, default=1000, help="inner steps per peer (= steps of (a))")
    add("--h", type=int, default=100, help="inner steps per outer round (DiLoCo's H)")
    add("--variants", default="a,b,c,d", help="comma-separated subset of a,b,c,d")
    add("--ratio", type=float, default=0.02, help="fraction of entries (d) sends (0.01-0.03)")
    add("--batch", type=int, default=LMConfig.batch, help="windows per step and peer")
    add("--seed", type=int, default=0)
    add(
        "--warm-start",
        type=int,
        default=0,
        help="every variant starts from K every-step-averaged steps (DiLoCo's pretrained start)",
    )
    add("--plot", default=str(DEFAULT_PLOT), help="PNG path ('' for none)")
    add("--quick", action="store_true", help="a smoke run: 2 peers, 40 steps, H = 20, batch 8")
    args = parser.parse_args(argv)
    if args.quick:
        args.peers, args.steps, args.h, args.batch = 2, 40, 20, 8
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(args.variants) - set(LABELS))
    if unknown or args.h < 1 or args.steps < args.h or args.steps % args.h or args.peers < 2:
        parser.error(f"need variants in a,b,c,d (not {unknown}), --peers ≥ 2, H | --steps")
    return args


def dense_bytes(config: LMConfig) -> int:
    """Bytes of one float32 contribution of the LM session (``b``'s ``sent_bytes`` a round)."""
    layout = VectorLayout(parameter_count(config), ("train_loss",), ())
    encoded = asyncio.run(encode_gradient(np.zeros(layout.size, np.float32)))
    return encoded.nbytes


def main(argv: Sequence[str] | None = None) -> int:
    """Run the variants; print the table and the goals; save the plot."""
    args = parse(argv)
    torch_module().set_num_threads(1)  # one per peer thread; 2 cores are shared by the peers
    config = LMConfig(batch=args.batch, total_steps=args.warm_start + args.steps, seed=args.seed)
    corpus = load_corpus(args.peers, config)
    initial = initial_vector(config)
    if args.warm_start:  # every variant starts from this model, at global step warm_start
        initial = train_synchronous(corpus, config, args.warm_start, args.warm_start).vector
        config = replace(config, first_step=args.warm_start)
    d = parameter_count(config)
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(
        f"{datetime.date.today()} commit {commit}; {args.peers} peers, {args.steps} steps of "
        f"{config.batch} x {config.context} bytes per peer, H = {args.h}; d = {d:,}; "
        f"{corpus.tokens:,} training bytes in {sum(corpus.files)} files, "
        f"{len(corpus.held_out):,} held-out bytes in {corpus.held_out_files} files; "
        f"untrained loss {UNTRAINED_LOSS:.3f}; warm start {args.warm_start} steps; "
        f"load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    outcomes: list[Outcome] = []
    if "a" in args.variants:
        outcomes.append(run_every_step(corpus, config, args, dense_bytes(config), initial))
        print(f"  a: eval loss {outcomes[-1].loss:.4f} in {outcomes[-1].seconds:.0f} s", flush=True)
    kubo = [k for k in ("b", "c", "d") if k in args.variants]
    if kubo:
        with KuboSwarm(args.peers) as swarm:
            for key in kubo:
                run = run_diloco(key, list(swarm), corpus, config, args, initial)
                outcomes.append(asyncio.run(run))
    print(table(outcomes))
    for line in goal_lines(outcomes, args.h, args.ratio):
        print(line)
    if args.plot:
        title = f"stdlib byte LM (d = {d:,}), {args.peers} peers, {args.steps} steps, H = {args.h}"
        print(f"plot: {plot(outcomes, Path(args.plot), title)}")
    return 0 if all(o.agreed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
