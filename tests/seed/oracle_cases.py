"""Check cases for the crate oracle: deterministic inputs, the crate call, and our answer.

Every family below pairs one crate function (see ``oracle/src/main.rs``) with the matching call
of our seed-compatible API and returns a list of :class:`~tests.seed.crate_oracle.Case`. Inputs
come from one seeded generator, so a run is reproducible; :func:`all_cases` numbers them.

A case marked ``deliberate=…`` is a documented deliberate difference (the text says where it
is documented): it must disagree with the crate, or the test fails and the note must go.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import gradfed_ipfs
from gradfed_ipfs import errors
from gradfed_ipfs import seed as api
from gradfed_ipfs._fmt import rust_display
from tests.seed.crate_oracle import Case, Err, Tol, attempt

F32_EPS = float(np.finfo(np.float32).eps)
MODEL_CID = str(gradfed_ipfs.make_cid(b"model"))


def f32(x: float) -> np.float32:
    return np.float32(x)


def f64(x: float) -> np.float64:
    return np.float64(x)


def vec(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).reshape(-1)


def sum_tol(*arrays: np.ndarray, terms: int | None = None) -> Tol:
    """Tolerance for results that sum ``terms`` float32 values in an unspecified order."""
    flat = [a.reshape(-1) for a in arrays if a.size]
    scale = max((float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0)) for a in flat), default=0)
    n = terms if terms is not None else max(len(arrays), 1)
    return Tol(rtol=4 * F32_EPS, atol=4 * (n + 1) * F32_EPS * scale)


class Gen:
    """Seeded generator of float32 test vectors with awkward values mixed in."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def scale(self) -> float:
        return float(10.0 ** self.rng.uniform(-4, 4))

    def vector(self, n: int | None = None, *, special: bool = False) -> np.ndarray:
        n = int(self.rng.integers(0, 12)) if n is None else n
        kind = self.rng.integers(0, 5)
        if kind == 0:
            v = self.rng.normal(0, self.scale(), n)
        elif kind == 1:
            v = self.rng.integers(-3, 4, n).astype(np.float64)  # ties and zeros
        elif kind == 2:
            v = self.rng.uniform(-1, 1, n) * self.scale()
        elif kind == 3:
            v = np.full(n, self.rng.normal(0, self.scale()))  # constant
        else:
            v = self.rng.standard_cauchy(n)  # heavy tails
        out = v.astype(np.float32)
        if special and n:
            pick = self.rng.integers(0, n)
            out[pick] = self.rng.choice(
                np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 3e38], dtype=np.float32)
            )
        return out

    def vectors(self, count: int, n: int) -> list[np.ndarray]:
        return [self.vector(n) for _ in range(count)]

    def floats32(self, count: int) -> np.ndarray:
        """float32 values across the whole range: bit patterns, round numbers, edge cases."""
        raw = self.rng.integers(0, 2**32, count, dtype=np.uint64).astype(np.uint32)
        values = raw.view(np.float32).copy()
        easy = np.array(
            [
                0.0,
                -0.0,
                1.0,
                -1.0,
                10.0,
                0.1,
                1 / 3,
                4 / 3,
                1e20,
                1e-20,
                1.5e-7,
                2**24,
                2**24 + 2,
                123456789.0,
                1e-45,
                3.4028235e38,
                np.nan,
                np.inf,
                -np.inf,
                0.5,
                100.0,
                1e7,
                1e16,
            ],
            dtype=np.float32,
        )
        k = min(easy.size, count)
        values[:k] = easy[:k]
        m = max(count // 2 - k, 0)
        scales = 10.0 ** self.rng.integers(-8, 9, m)
        values[k : k + m] = (self.rng.normal(0, 1, m) * scales).astype(np.float32)
        return values


def err_of(exc: Exception) -> Err:
    return Err(type(exc).__name__, str(exc))


# --------------------------------------------------------------------------- formatting, errors


def _tie_prone(g: Gen, count: int, mantissa_bits: int, dtype: type) -> np.ndarray:
    """Values whose exact decimal ends in 5 just past their shortest digits (rounding ties)."""
    mantissas = g.rng.integers(2 ** (mantissa_bits - 4), 2**mantissa_bits, count)
    shifts = g.rng.integers(1, 5, count).astype(np.float64)
    signs = g.rng.choice([-1.0, 1.0], count)
    return (signs * mantissas.astype(np.float64) * 2.0**-shifts).astype(dtype)


def fmt_cases(g: Gen) -> Iterator[Case]:
    for value in np.concatenate([g.floats32(240), _tie_prone(g, 60, 24, np.float32)]):
        yield Case(
            "fmt_f32",
            "fmt_f32",
            {"values": vec([value])},
            lambda _, v=value: [rust_display(float(v), 32)],
        )
    raw = g.rng.integers(0, 2**64, 80, dtype=np.uint64)
    doubles = np.concatenate(
        [
            np.array(
                [
                    0.0,
                    1.0,
                    0.1,
                    0.30000000000000004,
                    1e-17,
                    1e21,
                    1e300,
                    5e-324,
                    2.5,
                    np.nan,
                    np.inf,
                    1 / 3,
                    100.0,
                    0.01,
                    0.99,
                ],
                dtype=np.float64,
            ),
            raw.view(np.float64),
            g.rng.normal(0, 1, 40) * 10.0 ** g.rng.integers(-12, 13, 40),
            _tie_prone(g, 60, 53, np.float64),
        ]
    )
    for value in doubles:
        yield Case(
            "fmt_f64",
            "fmt_f64",
            {"values": np.array([value], dtype=np.float64)},
            lambda _, v=value: [rust_display(float(v), 64)],
        )


def error_display_cases(g: Gen) -> Iterator[Case]:
    def case(kind: str, payload: Any, ours: Callable[[], Exception]) -> Case:
        return Case(
            "error_display",
            "error_display",
            {"kind": kind, "payload": payload},
            lambda _: str(ours()),
        )

    yield case("ShapeMismatch", [[2, 3], [5]], lambda: errors.ShapeMismatch([2, 3], [5]))
    yield case("ShapeMismatch", [[], [0]], lambda: errors.ShapeMismatch([], [0]))
    yield case("ChecksumFailed", None, errors.ChecksumFailed)
    yield case("EmptyGradientSet", None, errors.EmptyGradientSet)
    yield case("EmptyGradients", None, errors.EmptyGradients)
    yield case("DimensionMismatch", None, errors.DimensionMismatch)
    yield case(
        "InvalidGradient",
        "Sum of weights is zero",
        lambda: errors.InvalidGradient("Sum of weights is zero"),
    )
    yield case("NodeNotFound", "layer-7", lambda: errors.NodeNotFound("layer-7"))
    yield case("PeerNotFound", "peer-x", lambda: errors.PeerNotFound("peer-x"))
    yield case("NoContributions", None, errors.NoContributions)
    yield case("ClientNotFound", "carol", lambda: errors.ClientNotFound("carol"))
    yield case("NotStarted", None, errors.NotStarted)
    yield case("GraphNodeNotFound", "n1", lambda: errors.GraphNodeNotFound("n1"))
    for value in g.floats32(30):
        yield case(
            "InvalidCompressionRatio",
            f32(value),
            lambda v=value: errors.InvalidCompressionRatio(float(v)),
        )
        yield case(
            "OutlierDetected", [7, f32(value)], lambda v=value: errors.OutlierDetected(7, float(v))
        )


# --------------------------------------------------------------------------- tensor.rs


def _sparse(s: api.SparseGradient) -> dict[str, Any]:
    return {"indices": s.indices.tolist(), "values": s.values, "shape": list(s.shape)}


def sparse_cases(g: Gen) -> Iterator[Case]:
    for i in range(40):
        shape = [int(d) for d in g.rng.integers(0, 5, g.rng.integers(0, 3))]
        total = int(np.prod(shape))
        nnz = int(g.rng.integers(0, 6))
        high = max(total + (2 if i % 3 == 0 else 0), 1)
        indices = g.rng.integers(0, high, nnz)
        values = g.vector(nnz + (1 if i % 7 == 0 else 0))

        def ours(_: Any, indices: Any = indices, values: Any = values, shape: Any = shape) -> Any:
            s = api.SparseGradient(indices, values, shape)
            return {
                "nnz": s.nnz(),
                "total": s.total_elements(),
                "sparsity": f32(s.sparsity_ratio()),
                "dense": s.to_dense(),
                "verify": attempt(s.verify_shape),
                "memory_size": s.memory_size(),
            }

        args = {"indices": indices.tolist(), "values": values, "shape": shape}
        yield Case("sparse", "sparse", args, ours)


def _quantized(values: np.ndarray) -> dict[str, Any]:
    q = api.QuantizedGradient.from_dense(values, [values.size])
    via = api.GradientCompressor.quantize(values, [values.size])
    return {
        "q": q.quantized_values.tolist(),
        "scale": f32(q.scale),
        "min": f32(q.min_val),
        "dense": q.to_dense(),
        "ratio": f32(q.compression_ratio()),
        "memory_size": q.memory_size(),
        "compressor_same": bool(
            np.array_equal(via.quantized_values, q.quantized_values)
            and f32(via.scale) == f32(q.scale)
        ),
    }


def quantize_cases(g: Gen) -> Iterator[Case]:
    fixed = [
        [0.0, 1e-8],  # issue 12: the range test must be float32
        [1.0, 2.0, 3.0, 4.0, 5.0],
        [],
        [7.0],
        [1.0, 1.0 + 2e-7],
        [0.0, 5e-9, 1e-8, 2e-8],
        [-1.0, 0.0, 1.0],
        [2.5, -2.5, 0.5, -0.5],
    ]
    inputs = [vec(v) for v in fixed] + [g.vector() for _ in range(50)]
    for values in inputs:
        yield Case(
            "quantize",
            "quantize",
            {"values": values, "shape": [values.size]},
            lambda _, v=values: _quantized(v),
        )
    for special in ([np.nan, 1.0, 2.0], [np.inf, 0.0], [-3e38, 3e38]):
        values = vec(special)
        yield Case(
            "quantize",
            "quantize",
            {"values": values, "shape": [values.size]},
            lambda _, v=values: _quantized(v),
            deliberate="QuantizedGradient.from_dense refuses NaN, inf and a range that "
            "overflows float32 (quantize_values docstring: Raises InvalidGradient)",
        )
    for values in (g.vector(5), vec([])):
        yield Case(
            "dense_memory",
            "dense_memory",
            {"values": values, "shape": [values.size]},
            lambda _, v=values: gradfed_ipfs.tensor.DenseGradient(v, [v.size]).memory_size(),
        )


def top_k_cases(g: Gen) -> Iterator[Case]:
    def run(values: np.ndarray, k: int, follow_crate_order: bool) -> Callable[[Any], Any]:
        def ours(raw: Any) -> Any:
            result = _sparse(api.GradientCompressor.top_k(values, [values.size], k))
            if follow_crate_order and isinstance(raw, dict):
                # Ours lists indices ascending, the crate by magnitude (documented); compare
                # the kept entries in the crate's order.
                position = {int(i): p for p, i in enumerate(result["indices"])}
                if set(position) == set(raw["indices"]):
                    order = [position[int(i)] for i in raw["indices"]]
                    result["indices"] = [result["indices"][p] for p in order]
                    result["values"] = result["values"][order]
            return result

        return ours

    yield Case(
        "top_k",
        "top_k",
        {"values": vec([]), "shape": [0], "k": 0},
        run(vec([]), 0, True),
        label="issue 12: top_k([], 0)",
    )
    for i in range(45):
        values = g.vector(int(g.rng.integers(1, 12)))
        k = (
            int(g.rng.integers(0, values.size + 2))
            if i % 4 == 0
            else int(g.rng.integers(1, values.size + 1))
        )
        yield Case(
            "top_k",
            "top_k",
            {"values": values, "shape": [values.size], "k": k},
            run(values, k, True),
        )
    values = vec([0.1, -0.5, 0.01, 0.8, -0.02])
    yield Case(
        "top_k",
        "top_k",
        {"values": values, "shape": [5], "k": 3},
        run(values, 3, False),
        deliberate="GradientCompressor.top_k docstring: indices in ascending order "
        "(the seed used magnitude order)",
    )


def threshold_cases(g: Gen) -> Iterator[Case]:
    for _ in range(30):
        values = g.vector(special=bool(g.rng.integers(0, 4) == 0))
        thr = f32(abs(g.rng.normal(0, 1)) * (float(np.max(np.abs(values), initial=1)) or 1.0))
        yield Case(
            "threshold",
            "threshold",
            {"values": values, "shape": [values.size], "threshold": thr},
            lambda _, v=values, t=thr: _sparse(
                api.GradientCompressor.threshold(v, [v.size], float(t))
            ),
        )


def random_sparsification_cases(g: Gen) -> Iterator[Case]:
    for ratio in (1.0, 1.0, 1.0, 0.0, -0.5, 1.5, 1.0000001, np.inf, -np.inf):
        values = g.vector()
        yield Case(
            "random_sparsification",
            "random_sparsification",
            {"values": values, "shape": [values.size], "keep_ratio": f32(ratio)},
            lambda _, v=values, r=ratio: _sparse(
                api.GradientCompressor.random_sparsification(v, [v.size], float(f32(r)), rng=0)
            ),
        )
    values = g.vector(4)
    yield Case(
        "random_sparsification",
        "random_sparsification",
        {"values": values, "shape": [4], "keep_ratio": f32(np.nan)},
        lambda _, v=values: _sparse(
            api.GradientCompressor.random_sparsification(v, [4], float("nan"), rng=0)
        ),
        deliberate="random_sparsification docstring: raises unless 0 < keep_ratio <= 1 "
        "(the seed let NaN through and kept nothing)",
    )


def aggregator_cases(g: Gen) -> Iterator[Case]:
    for i in range(30):
        count, n = int(g.rng.integers(0 if i == 0 else 1, 5)), int(g.rng.integers(0, 8))
        grads = g.vectors(count, n)
        if i % 6 == 5 and count > 1:
            grads[-1] = g.vector(n + 1)
        yield Case(
            "average",
            "average",
            {"gradients": grads},
            lambda _, gs=grads: api.GradientAggregator.average(gs),
            sum_tol(*grads),
        )
    listed = [
        ([[1, 2], [3, 4], [5, 6]], [0.1, 0.2, -0.3]),  # issue 12: float32 weight sum is 0
        ([[1, 2], [3, 4], [5, 6]], [1e8, 1, -1e8]),
        ([[0], [4]], [1, 3]),
        ([[1, 2]], [0.0]),
        ([[1, 2], [3, 4]], [1.0]),
    ]
    for grads_raw, weights_raw in listed:
        grads, weights = [vec(x) for x in grads_raw], vec(weights_raw)
        yield Case(
            "weighted_average",
            "weighted_average",
            {"gradients": grads, "weights": weights},
            lambda _, gs=grads, w=weights: api.GradientAggregator.weighted_average(
                gs, [float(x) for x in w]
            ),
            sum_tol(*grads),
        )
    for _ in range(35):
        count, n = int(g.rng.integers(1, 5)), int(g.rng.integers(1, 7))
        grads = g.vectors(count, n)
        weights = vec(g.rng.uniform(-0.5, 2, count))
        tol = sum_tol(*grads, terms=count)
        scale = float(np.sum(np.abs(weights))) / max(abs(float(np.sum(weights))), 1e-30)
        tol = Tol(tol.rtol * scale, tol.atol * scale)
        yield Case(
            "weighted_average",
            "weighted_average",
            {"gradients": grads, "weights": weights},
            lambda _, gs=grads, w=weights: api.GradientAggregator.weighted_average(
                gs, [float(x) for x in w]
            ),
            tol,
        )
    for _ in range(20):
        n = int(g.rng.integers(0, 8))
        current, previous = g.vector(n), g.vector(n if g.rng.integers(0, 5) else n + 1)
        factor = f32(g.rng.uniform(0, 1))
        yield Case(
            "apply_momentum",
            "apply_momentum",
            {"current": current, "previous": previous, "factor": factor},
            lambda _, c=current, p=previous, f=factor: api.GradientAggregator.apply_momentum(
                c, p, float(f)
            ),
        )


def verifier_cases(g: Gen) -> Iterator[Case]:
    for _ in range(20):
        values = g.vector()
        shape = [int(d) for d in g.rng.integers(0, 4, g.rng.integers(0, 3))]
        if g.rng.integers(0, 2):
            shape = [values.size]
        yield Case(
            "verify_shape",
            "verify_shape",
            {"gradient": values, "shape": shape},
            lambda _, v=values, s=shape: api.GradientVerifier.verify_shape(v, s),
        )
    listed: list[tuple[list[float], float]] = [
        ([0, 0, 0, 0, 0.1], 2.0),  # issue 12: float32 mean and variance
        ([0, 0, 0, 0, 1e20], 1.9),  # issue 12: float32 squares overflow
        ([1, 1, 1, 1], 0.5),
        ([], 1.0),
        ([1, 2, 3, 100], 1.5),
        ([5, 5, 5, 5, 5, 6], 2.0),
    ]
    inputs = [(vec(v), f32(t)) for v, t in listed]
    inputs += [(g.vector(special=bool(i % 5 == 0)), f32(g.rng.uniform(0.5, 3))) for i in range(50)]
    for values, thr in inputs:
        yield Case(
            "detect_outliers",
            "detect_outliers",
            {"gradient": values, "threshold": thr},
            lambda _, v=values, t=thr: api.GradientVerifier.detect_outliers(v, float(t)),
        )
    for _ in range(20):
        values = g.vector(special=True)
        yield Case(
            "verify_finite",
            "verify_finite",
            {"gradient": values},
            lambda _, v=values: api.GradientVerifier.verify_finite(v),
        )
    for _ in range(30):
        values = g.vector()
        yield Case(
            "l2_norm",
            "l2_norm",
            {"gradient": values},
            lambda _, v=values: f32(api.GradientVerifier.l2_norm(v)),
            sum_tol(values * values, terms=values.size),
        )
        max_norm = f32(abs(g.rng.normal(0, float(np.linalg.norm(values)) + 1)))
        yield Case(
            "clip_by_norm",
            "clip_by_norm",
            {"gradient": values, "max_norm": max_norm},
            lambda _, v=values, m=max_norm: api.GradientVerifier.clip_by_norm(v.copy(), float(m)),
            Tol(rtol=8 * values.size * F32_EPS),
        )


def backward_helper_cases(g: Gen) -> Iterator[Case]:
    for i in range(20):
        count, n = int(g.rng.integers(0 if i == 0 else 1, 5)), int(g.rng.integers(0, 8))
        grads = g.vectors(count, n)
        if i % 5 == 4 and count > 1:
            grads[0] = g.vector(n + 2)
        yield Case(
            "federated_average",
            "federated_average",
            {"gradients": grads},
            lambda _, gs=grads: api.federated_average(gs),
            sum_tol(*grads),
        )
    for _ in range(20):
        values = g.vector()
        max_norm = f32(abs(g.rng.normal(0, float(np.linalg.norm(values)) + 1)))
        yield Case(
            "clip_gradient_norm",
            "clip_gradient_norm",
            {"gradient": values, "max_norm": max_norm},
            lambda _, v=values, m=max_norm: api.clip_gradient_norm(v.copy(), float(m)),
            Tol(rtol=8 * values.size * F32_EPS),
        )
    values = vec([3.0, 4.0])
    yield Case(
        "clip_gradient_norm",
        "clip_gradient_norm",
        {"gradient": values, "max_norm": f32(-1.0)},
        lambda _: api.clip_gradient_norm(values.copy(), -1.0),
        deliberate="clip_gradient_norm docstring: a negative max_norm raises (the seed "
        "flipped the sign)",
    )


# --------------------------------------------------------------------------- all families

FAMILIES: list[Callable[[Gen], Iterator[Case]]] = [
    fmt_cases,
    error_display_cases,
    sparse_cases,
    quantize_cases,
    top_k_cases,
    threshold_cases,
    random_sparsification_cases,
    aggregator_cases,
    verifier_cases,
    backward_helper_cases,
]


def all_cases(seed: int = 12) -> list[Case]:
    """Every case of every family, with stable ids, from one seeded generator."""
    from tests.seed import oracle_scenarios

    g = Gen(seed)
    cases: list[Case] = []
    for family in FAMILIES + oracle_scenarios.FAMILIES:
        cases.extend(family(g))
    for number, case in enumerate(cases):
        case.id = f"{number:04d}-{case.family}"
    return cases
