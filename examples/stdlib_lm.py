"""A small byte-level causal transformer trained on the Python standard library's own sources.

Every Python installation carries its data set: the ``.py`` files under
``sysconfig.get_paths()["stdlib"]`` (sorted; ``test``/``tests``/``idle_test`` folders and
``site-packages`` skipped), so nothing is downloaded. Files are split BY FILE: every
``EVAL_EVERY``-th file is held out for evaluation, the others go to the peers in turn. Tokens are
bytes (vocabulary 256), so the untrained loss is ``ln 256 ≈ 5.545`` nats.

The model (:class:`TinyGPT`) is a pre-LayerNorm GPT with learned positions and a tied output
head; :class:`LMConfig` defaults to 4 layers, d_model 128, 4 heads, context 128: about 0.83M
parameters (``--d-model 192``: 1.8M). Batches are drawn by a generator seeded with
``(seed, peer, step)``, so peer ``i``'s ``k``-th inner step sees the same tokens in every
variant of ``benchmarks/bench_diloco.py`` (equal tokens) and in every process.

:func:`make_client` is a training-API :class:`~gradfed_ipfs.training.Client` on flat float32
vectors (:class:`~gradfed_ipfs.training.VectorAdapter`): each round it loads the global model,
runs ``inner_steps`` AdamW steps (the DiLoCo inner optimizer; its state stays on the peer
between rounds) and returns the new model; the strategy (DiLoCo's outer Nesterov SGD, or FedAvg)
runs inside the agreed round. :func:`train_synchronous` is the every-step-averaged reference
(the DDP equivalent, in one process).

Run ``python examples/stdlib_lm.py`` for a short in-process DiLoCo run (``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import sysconfig
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gradfed_ipfs.tensor import Codec
from gradfed_ipfs.training import (
    Client,
    ConfigValue,
    FederationConfig,
    History,
    Strategy,
    VectorAdapter,
    run_simulation,
)

Vector = NDArray[np.float32]
Tokens = NDArray[np.uint8]
VOCAB = 256
UNTRAINED_LOSS = math.log(VOCAB)
"""Cross-entropy (nats) of the uniform byte distribution: where an untrained model starts."""
EVAL_EVERY = 10
"""Every 10th source file (sorted order) is held out for evaluation."""
SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__"})


@dataclass(frozen=True)
class LMConfig:
    """Model, data and inner-optimizer settings every peer of a session must share.

    ``lr`` is AdamW's peak learning rate (linear warm-up over ``warmup`` steps, then cosine to
    ``lr / 10`` at ``total_steps``); ``batch`` windows of ``context`` bytes per step and peer.
    ``first_step`` is the global step a run starts at (after a warm start of that many steps:
    its batches and learning rates follow on).
    """

    d_model: int = 128
    layers: int = 4
    heads: int = 4
    context: int = 128
    batch: int = 16
    lr: float = 2e-3
    weight_decay: float = 0.1
    warmup: int = 50
    total_steps: int = 1000
    first_step: int = 0
    eval_windows: int = 64
    max_bytes_per_peer: int = 2_000_000
    seed: int = 0

    def lr_at(self, step: int) -> float:
        """Inner learning rate of global inner step ``step`` (0-based)."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total_steps - self.warmup))
        return self.lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * progress)))


# --------------------------------------------------------------------------- data


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The standard library's ``.py`` files, sorted (tests and ``site-packages`` skipped)."""
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    found = (p for p in base.rglob("*.py") if p.is_file())
    return sorted(p for p in found if not SKIPPED_DIRS & set(p.relative_to(base).parts[:-1]))


@dataclass(frozen=True)
class Corpus:
    """Byte streams: one per peer (its files, joined by a NUL) and the held-out files'."""

    parts: list[Tokens]
    held_out: Tokens
    files: list[int]
    held_out_files: int

    @property
    def tokens(self) -> int:
        """Training bytes across every peer."""
        return sum(len(p) for p in self.parts)


def load_corpus(
    peers: int, config: LMConfig = LMConfig(), root: str | Path | None = None
) -> Corpus:
    """Split the stdlib by file: every :data:`EVAL_EVERY`-th file held out, the rest in turn.

    Each peer keeps at most ``config.max_bytes_per_peer`` bytes (whole files, in order), so a
    run's data does not depend on how large this Python's stdlib is beyond that.
    """
    files = stdlib_files(root)
    if len(files) < EVAL_EVERY * (peers + 1):
        raise ValueError(f"{len(files)} stdlib files are too few for {peers} peers")
    chunks: list[list[bytes]] = [[] for _ in range(peers)]
    sizes = [0] * peers
    held: list[bytes] = []
    train_index = 0
    for i, path in enumerate(files):
        text = path.read_bytes()
        if i % EVAL_EVERY == EVAL_EVERY - 1:
            held.append(text)
            continue
        peer, train_index = train_index % peers, train_index + 1
        if sizes[peer] < config.max_bytes_per_peer:
            chunks[peer].append(text)
            sizes[peer] += len(text) + 1
    parts = [np.frombuffer(b"\0".join(c), np.uint8).copy() for c in chunks]
    return Corpus(
        parts, np.frombuffer(b"\0".join(held), np.uint8).copy(), [len(c) for c in chunks], len(held)
    )


def batch_of(part: Tokens, config: LMConfig, peer: int, step: int) -> NDArray[np.int64]:
    """``(batch, context + 1)`` windows of ``part`` for ``peer``'s inner step ``step`` (seeded)."""
    rng = np.random.default_rng([config.seed, peer, step])
    starts = rng.integers(0, len(part) - config.context - 1, size=config.batch)
    index = starts[:, None] + np.arange(config.context + 1)[None, :]
    return np.asarray(part[index], dtype=np.int64)


def eval_windows(corpus: Corpus, config: LMConfig) -> NDArray[np.int64]:
    """Evenly spaced ``(eval_windows, context + 1)`` windows of the held-out files."""
    last = len(corpus.held_out) - config.context - 1
    starts = np.linspace(0, last, config.eval_windows).astype(np.int64)
    index = starts[:, None] + np.arange(config.context + 1)[None, :]
    return np.asarray(corpus.held_out[index], dtype=np.int64)


# --------------------------------------------------------------------------- model


def torch_module() -> Any:
    """Import torch, single-threaded per call site and deterministic (raises ImportError)."""
    import torch  # type: ignore[import-not-found,unused-ignore]

    torch.use_deterministic_algorithms(True)
    return torch


def build_model(config: LMConfig) -> Any:
    """Return a seeded :class:`TinyGPT` (the same initial weights in every process)."""
    torch = torch_module()
    nn = torch.nn
    functional = torch.nn.functional

    class Block(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            d = config.d_model
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x: Any) -> Any:
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            shape = (b, t, config.heads, d // config.heads)
            q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
            attended = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.ln2(x))

    class TinyGPT(nn.Module):  # type: ignore[misc,name-defined]
        """Byte embeddings + positions, ``layers`` pre-LN blocks, tied output head."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, config.d_model)
            self.position = nn.Parameter(torch.zeros(config.context, config.d_model))
            self.blocks = nn.ModuleList(Block() for _ in range(config.layers))
            self.norm = nn.LayerNorm(config.d_model)

        def forward(self, tokens: Any) -> Any:
            x = self.embed(tokens) + self.position[: tokens.shape[1]]
            for block in self.blocks:
                x = block(x)
            return self.norm(x) @ self.embed.weight.T  # logits (batch, time, 256)

    torch.manual_seed(config.seed)
    model = TinyGPT()
    with torch.no_grad():  # GPT-2's init: N(0, 0.02), residual projections scaled by depth
        for name, tensor in model.named_parameters():
            if (name.endswith("weight") and tensor.dim() == 2) or name == "position":
                tensor.normal_(0.0, 0.02)
            elif name.endswith("bias"):
                tensor.zero_()
        for block in model.blocks:
            for linear in (block.proj, block.mlp[2]):
                linear.weight.mul_(1.0 / math.sqrt(2 * config.layers))
    return model


def loss_on(model: Any, windows: NDArray[np.int64]) -> Any:
    """Mean next-byte cross-entropy (nats) of ``model`` on ``(n, context + 1)`` windows."""
    torch = torch_module()
    tokens = torch.from_numpy(windows)
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def parameter_count(config: LMConfig) -> int:
    """Number of float parameters (the flat vector's length d)."""
    return sum(int(p.numel()) for p in build_model(config).parameters())


class LMModel:
    """One peer's PyTorch copy of the model, loaded from and saved to flat float32 vectors."""

    def __init__(self, config: LMConfig) -> None:
        from gradfed_ipfs.adapters.torch import flatten_state_dict

        self.config = config
        self.torch = torch_module()
        self.module = build_model(config)
        self.initial, self.layout = flatten_state_dict(self.module.state_dict())
        self.optimizer: Any = None

    def load(self, vector: Vector) -> None:
        """Set the parameters to ``vector`` (float32 ``(d,)``)."""
        from gradfed_ipfs.adapters.torch import load_flat

        load_flat(self.module, np.asarray(vector, np.float32), self.layout)

    def vector(self) -> Vector:
        """The parameters as a new flat float32 vector ``(d,)``."""
        from gradfed_ipfs.adapters.torch import flatten_state_dict

        flat: Vector = flatten_state_dict(self.module.state_dict())[0]
        return flat

    def adamw(self) -> Any:
        """This copy's AdamW (created once: DiLoCo keeps inner state across rounds)."""
        if self.optimizer is None:
            c = self.config
            self.optimizer = self.torch.optim.AdamW(
                self.module.parameters(), lr=c.lr, betas=(0.9, 0.95), weight_decay=c.weight_decay
            )
        return self.optimizer

    def step(self, step: int, gradient_of: Callable[[], None]) -> None:
        """One AdamW step at global step ``step``; ``gradient_of`` fills ``.grad``."""
        optimizer = self.adamw()
        for group in optimizer.param_groups:
            group["lr"] = self.config.lr_at(step)
        optimizer.zero_grad(set_to_none=True)
        gradient_of()
        self.torch.nn.utils.clip_grad_norm_(self.module.parameters(), 1.0)
        optimizer.step()

    def evaluate(self, windows: NDArray[np.int64]) -> float:
        """Mean cross-entropy (nats) on ``windows``, in batches of 16, no gradients."""
        with self.torch.no_grad():
            losses = [
                float(loss_on(self.module, windows[i : i + 16])) for i in range(0, len(windows), 16)
            ]
        return float(np.mean(losses))


# --------------------------------------------------------------------------- training


def make_client(corpus: Corpus, index: int, config: LMConfig) -> Client[Vector]:
    """Peer ``index``'s client: the round's ``inner_steps`` AdamW steps on its files.

    The round's config gives ``inner_steps`` H and ``server_round`` r (from 1): inner step
    ``i`` is global step ``first_step + (r - 1)·H + i``, which the learning-rate schedule and
    the batches follow, so round r trains on the bytes (a)'s steps ``(r - 1)·H …`` see.
    ``num_samples`` is the windows trained on (``H · batch``; equal on every peer).
    """
    model = LMModel(config)
    part = corpus.parts[index]

    def train(
        vector: Vector, round_config: Mapping[str, ConfigValue]
    ) -> tuple[Vector, int, dict[str, float]]:
        steps = int(round_config["inner_steps"])
        server_round = int(round_config["server_round"])  # counts from 1
        first = config.first_step + (server_round - 1) * steps
        model.load(vector)
        losses = []
        for step in range(first, first + steps):
            windows = batch_of(part, config, index, step)

            def gradient(windows: NDArray[np.int64] = windows) -> None:
                loss = loss_on(model.module, windows)
                loss.backward()
                losses.append(float(loss.detach()))

            model.step(step, gradient)
        return model.vector(), steps * config.batch, {"train_loss": float(np.mean(losses))}

    return Client(train=train)


def federation(
    corpus: Corpus, config: LMConfig, rounds: int, inner_steps: int, **kwargs: object
) -> FederationConfig[Vector]:
    """Rounds of ``inner_steps`` inner steps, held-out loss measured after every round."""
    evaluator = LMModel(config)
    windows = eval_windows(corpus, config)

    def evaluate_fn(vector: Vector, server_round: int) -> tuple[float, dict[str, float]]:
        evaluator.load(vector)
        return evaluator.evaluate(windows), {}

    settings: dict[str, object] = {
        "rounds": rounds,
        "fit_metrics": ("train_loss",),
        "on_fit_config": lambda r: {"inner_steps": inner_steps},
        "evaluate_fn": evaluate_fn,
        "final_evaluation": False,
        **kwargs,
    }
    return FederationConfig(**settings)  # type: ignore[arg-type]


def initial_vector(config: LMConfig) -> Vector:
    """The session's initial model as a flat float32 vector (seeded)."""
    return LMModel(config).initial


def final_loss(history: History) -> float:
    """Held-out loss of the last global model, as this peer measured it."""
    losses = [e.local_loss for e in history.entries if e.local_loss is not None]
    return float(losses[-1]) if losses else float("nan")


def simulate(
    peers: int,
    rounds: int,
    inner_steps: int,
    strategy: Callable[[], Strategy],
    config: LMConfig = LMConfig(),
    *,
    log: Callable[[str], None] | None = None,
    compression: Codec | None = None,
) -> list[History]:
    """Run a DiLoCo-style session in one process (in-memory bus and store); the histories.

    ``compression`` is the agreed rounds' contribution codec (error feedback on).
    """
    config = replace(config, total_steps=rounds * inner_steps)
    corpus = load_corpus(peers, config)
    return asyncio.run(
        run_simulation(
            [make_client(corpus, i, config) for i in range(peers)],
            adapter=VectorAdapter(),
            initial_model=initial_vector(config),
            config=federation(corpus, config, rounds, inner_steps),
            strategy=strategy,
            session="stdlib-lm",
            log=log,
            compression=compression,
        )
    )


@dataclass
class SyncRun:
    """The every-step-averaged reference: held-out loss after each ``eval_every`` steps."""

    losses: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0
    vector: Vector = field(default_factory=lambda: np.zeros(0, np.float32))  # final parameters


def train_synchronous(
    corpus: Corpus,
    config: LMConfig,
    steps: int,
    eval_every: int = 100,
    initial: Vector | None = None,
) -> SyncRun:
    """Average every peer's gradient after every step (DDP's update, in one process).

    Step ``k`` averages the gradients of peer ``i``'s batch ``batch_of(part_i, config, i, k)``
    over the peers: the same tokens the DiLoCo peers see at their ``k``-th inner step. It
    starts from ``initial`` (default the seeded model) at global step ``config.first_step``.
    """
    started, model = time.monotonic(), LMModel(config)
    if initial is not None:
        model.load(initial)
    windows, run = eval_windows(corpus, config), SyncRun()
    peers = len(corpus.parts)
    for k in range(steps):
        step = config.first_step + k

        def gradient(step: int = step) -> None:
            for i, part in enumerate(corpus.parts):
                (loss_on(model.module, batch_of(part, config, i, step)) / peers).backward()

        model.step(step, gradient)
        if (k + 1) % eval_every == 0 or k + 1 == steps:
            run.losses.append((k + 1, model.evaluate(windows)))
    run.seconds, run.vector = time.monotonic() - started, model.vector()
    return run


def main(argv: Sequence[str] | None = None) -> int:
    """A short DiLoCo run in one process; prints the held-out loss before and after."""
    from gradfed_ipfs.training import FedAvg

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--peers", type=int, default=3)
    add("--rounds", type=int, default=4)
    add("--h", type=int, default=50, help="inner AdamW steps per round (DiLoCo's H)")
    add("--d-model", type=int, default=LMConfig.d_model)
    add("--fedavg", action="store_true", help="average the peers' models (no outer optimizer)")
    args = parser.parse_args(argv)
    torch_module().set_num_threads(1)
    config = LMConfig(d_model=args.d_model)
    print(f"model: {parameter_count(config):,} parameters; untrained loss {UNTRAINED_LOSS:.3f}")
    strategy: Callable[[], Strategy] = FedAvg if args.fedavg else diloco_strategy
    histories = simulate(args.peers, args.rounds, args.h, strategy, config, log=print)
    print(
        f"held-out loss after {args.rounds} rounds of H = {args.h}: {final_loss(histories[0]):.4f}"
    )
    print(f"every peer on one model CID: {len({h.entries[-1].model for h in histories}) == 1}")
    return 0


def diloco_strategy() -> Strategy:
    """DiLoCo's outer optimizer (Nesterov SGD, lr 0.7, momentum 0.9)."""
    from gradfed_ipfs.training import DiLoCo

    return DiLoCo(outer_lr=0.7, momentum=0.9)


if __name__ == "__main__":
    sys.exit(main())
