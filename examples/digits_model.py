"""The model, the data and the option parsing of ``federated_digits.py`` (pure NumPy, no I/O).

Softmax regression (64 pixels + bias -> 10 classes) on scikit-learn's bundled ``digits``
(no download), trained by full-batch gradient descent; the training set is split between peers
with label proportions drawn from a seeded Dirichlet (non-IID).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gradfed_ipfs.errors import InvalidGradient
from gradfed_ipfs.tensor.aggregation import (
    AggregationStrategy,
    Krum,
    Median,
    MultiKrum,
    SampleWeightedMean,
    TrimmedMean,
)
from gradfed_ipfs.tensor.codecs import Codec, Int2, Int4, Int8, TopK, TopKInt2, TopKInt8

Array = NDArray[np.float64]
N_FEATURES = 65  # 64 pixels + bias
N_CLASSES = 10


@dataclass
class DigitsData:
    """Standardized train/test split and each peer's training indices."""

    x_train: Array
    y_train: NDArray[np.int64]
    x_test: Array
    y_test: NDArray[np.int64]
    parts: list[NDArray[np.int64]]


# --------------------------------------------------------------------------- model and data


def load_data(peers: int, alpha: float, seed: int) -> DigitsData:
    """Load ``digits`` (bundled, no download), split 75/25 and partition non-IID by label."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    x, y = x[order] / 16.0, y[order].astype(np.int64)
    n_train = int(0.75 * len(y))
    mean, std = x[:n_train].mean(0), x[:n_train].std(0) + 1e-6

    def prepare(rows: Array) -> Array:
        return np.hstack([(rows - mean) / std, np.ones((len(rows), 1))])

    y_train = y[:n_train]
    parts: list[list[int]] = [[] for _ in range(peers)]
    for label in range(N_CLASSES):
        members = rng.permutation(np.flatnonzero(y_train == label))
        cuts = (np.cumsum(rng.dirichlet([alpha] * peers)) * len(members)).astype(int)[:-1]
        for part, chunk in zip(parts, np.split(members, cuts), strict=True):
            part.extend(int(i) for i in chunk)
    return DigitsData(
        prepare(x[:n_train]),
        y_train,
        prepare(x[n_train:]),
        y[n_train:],
        [np.array(sorted(p), dtype=np.int64) for p in parts],
    )


def gradient(weights: Array, x: Array, y: NDArray[np.int64], l2: float = 1e-3) -> Array:
    """Gradient of the mean cross-entropy (+ L2) of softmax regression; ``weights`` is flat."""
    w = weights.reshape(N_FEATURES, N_CLASSES)
    logits = x @ w
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    probs[np.arange(len(y)), y] -= 1.0
    result: Array = (x.T @ probs / len(y) + l2 * w).reshape(-1)
    return result


def accuracy(weights: NDArray[Any], x: Array, y: NDArray[np.int64]) -> float:
    """Fraction of ``x`` classified as ``y``."""
    predicted = (x @ weights.reshape(N_FEATURES, N_CLASSES)).argmax(axis=1)
    return float((predicted == y).mean())


def local_train(weights: Array, x: Array, y: NDArray[np.int64], steps: int, lr: float) -> Array:
    """Run ``steps`` full-batch gradient steps from ``weights``; return the new weights."""
    w = weights.copy()
    for _ in range(steps):
        w -= lr * gradient(w, x, y)
    return w


def train_centralized(data: DigitsData, rounds: int, steps: int, lr: float) -> list[float]:
    """Train on the pooled data; test accuracy after each round's worth of ``steps`` steps."""
    w = np.zeros(N_FEATURES * N_CLASSES)
    curve = []
    for _ in range(rounds):
        w = local_train(w, data.x_train, data.y_train, steps, lr)
        curve.append(accuracy(w, data.x_test, data.y_test))
    return curve


# --------------------------------------------------------------------------- option parsing


def parse_method(text: str, peers: int) -> AggregationStrategy:
    """``fedavg``, ``median``, ``trimmed:BETA``, ``krum:F`` or ``multikrum:F[:M]`` (M = N - F)."""
    name, _, arg = text.lower().partition(":")
    try:
        if name == "fedavg" and not arg:
            return SampleWeightedMean()
        if name == "median" and not arg:
            return Median()
        if name == "trimmed":
            return TrimmedMean(beta=float(arg or 0.1))
        if name == "krum":
            return Krum(f=int(arg or 1))
        if name == "multikrum":
            f_text, _, m_text = arg.partition(":")
            f = int(f_text or 1)
            return MultiKrum(f=f, m=int(m_text) if m_text else max(1, peers - f))
    except ValueError as exc:
        raise InvalidGradient(f"bad aggregation method {text!r}: {exc}") from None
    raise InvalidGradient(
        f"unknown aggregation method {text!r} (fedavg, median, trimmed:B, krum:F, multikrum:F[:M])"
    )


def parse_codec(text: str | None) -> Codec | None:
    """``int8``, ``int4``, ``int2``, ``topk:R``, ``topk:R,int8``, ``topk:R,int2``; or ``None``."""
    if not text:
        return None
    parts = [p.strip().lower() for p in text.split(",") if p.strip()]
    ratio: float | None = None
    bits: int | None = None
    for part in parts:
        name, _, arg = part.partition(":")
        try:
            if name == "topk":
                ratio = float(arg or 0.01)
            elif name in ("int8", "int4", "int2") and not arg:
                bits = int(name[3:])
            else:
                raise InvalidGradient(f"unknown codec {part!r} (topk:R, int8, int4, int2)")
        except ValueError:
            raise InvalidGradient(f"bad codec parameter in {part!r}") from None
    if ratio is not None and bits in (8, 2):
        return TopKInt8(ratio=ratio) if bits == 8 else TopKInt2(ratio=ratio)
    if ratio is not None and bits is None:
        return TopK(ratio=ratio)
    if ratio is None and bits is not None:
        return {8: Int8, 4: Int4, 2: Int2}[bits]()
    raise InvalidGradient(f"unsupported codec combination {text!r}")


def single_threaded_blas() -> AbstractContextManager[object]:
    """Limit BLAS to one thread (these matrices are tiny; threads make them ~15x slower)."""
    from threadpoolctl import threadpool_limits

    limits: AbstractContextManager[object] = threadpool_limits(limits=1, user_api="blas")
    return limits


def plot_curves(
    federated: list[float], centralized: list[float], label: str, title: str, path: Path
) -> Path:
    """Write a PNG (matplotlib, Agg backend) of accuracy against rounds; return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rounds = np.arange(1, len(federated) + 1)
    figure, axes = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    axes.plot(rounds, centralized, "--", color="gray", label="centralized (same steps)")
    axes.plot(rounds, federated, marker="o", markersize=3, label=label)
    axes.set_xlabel("round")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel("test accuracy")
    axes.set_ylim(0.0, 1.0)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    axes.set_title(title)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
