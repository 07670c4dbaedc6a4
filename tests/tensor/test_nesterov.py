"""ServerNesterov (DiLoCo's outer step) against ``torch.optim.SGD(nesterov=True)``.

Conventions: the round's aggregate ``Δ`` is the negative pseudo-gradient, so torch is given
``param.grad = −Δ``, and our state ``"v"`` is torch's momentum buffer negated.

The bound, where arithmetic is inexact: torch rounds each of its float32 operations (``μ`` and
``η`` are themselves rounded to float32; ``b·μ``, ``+ g``, ``g + μ b``, ``x − η g'``, with or
without FMA), while ServerNesterov computes in float64 and rounds once. Each float32 rounding
is at most half an ulp of its result, and every intermediate is at most about 2× the largest
magnitude ``m`` among the step's inputs and outputs at that element, so the two differ by at
most a few ulps of ``m``: we assert at most 4 float32 ulps of ``m`` (measured: 2 for the model,
1 for the buffer, over 10 steps of 100k values). Relative to the result itself no bound holds
(``x`` and ``η g'`` may cancel), which is why the bound is in ulps of ``m``.
"""

from __future__ import annotations

import numpy as np

from gradfed_ipfs.tensor import OptimizerState, ServerNesterov
from tests.required import import_area

torch = import_area("torch", "torch")

ULP_BOUND = 4


def torch_step(
    x: np.ndarray, delta: np.ndarray, v: np.ndarray | None, lr: float, momentum: float
) -> tuple[np.ndarray, np.ndarray]:
    """One torch SGD(nesterov=True) step from our (x, v); returns (x', v' = −buffer)."""
    param = torch.nn.Parameter(torch.from_numpy(x.copy()))
    sgd = torch.optim.SGD([param], lr=lr, momentum=momentum, nesterov=True)
    if v is not None:  # torch starts the buffer at the first gradient, as we do
        sgd.state[param]["momentum_buffer"] = torch.from_numpy(-v)
    param.grad = torch.from_numpy(-delta)
    sgd.step()
    return param.detach().numpy().copy(), -sgd.state[param]["momentum_buffer"].numpy()


def ulps(ours: np.ndarray, theirs: np.ndarray, *magnitudes: np.ndarray) -> float:
    """Largest |ours − theirs| in float32 ulps of the elementwise largest magnitude."""
    scale = np.maximum.reduce([np.abs(m).astype(np.float32) for m in magnitudes])
    gap = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
    return float((gap / np.spacing(scale)).max())


def test_each_step_is_torchs_within_4_ulps_over_ten_steps() -> None:
    rng = np.random.default_rng(0)
    opt = ServerNesterov()
    x = rng.standard_normal(20_000).astype(np.float32)
    state: OptimizerState | None = None
    worst_x = worst_v = 0.0
    differs = 0
    for _ in range(10):
        delta = (0.1 * rng.standard_normal(x.size)).astype(np.float32)
        v = None if state is None else state.arrays["v"]
        tx, tv = torch_step(x, delta, None if v is None else v.copy(), 0.7, 0.9)
        nx, state = opt.step(x, delta, state)
        nv = state.arrays["v"]
        inputs = [x, delta, nx, nv] + ([] if v is None else [v])
        worst_x = max(worst_x, ulps(nx, tx, *inputs))
        worst_v = max(worst_v, ulps(nv, tv, *inputs))
        differs += int((nx != tx).sum())
        x = nx
    assert state is not None
    assert state.step == 10
    assert worst_x <= ULP_BOUND, worst_x
    assert worst_v <= ULP_BOUND, worst_v
    assert differs > 0  # the comparison is of float32 torch against float64 math, not a copy


def test_where_the_arithmetic_is_exact_it_is_torchs_bit_for_bit() -> None:
    # Dyadic rates and small integer-valued updates: every operation on both sides is exact,
    # so any difference in the formula (order, sign, Nesterov's look-ahead) shows in the bits.
    rng = np.random.default_rng(1)
    opt = ServerNesterov(learning_rate=0.5, momentum=0.5)
    x = rng.integers(-64, 64, 256).astype(np.float32)
    state: OptimizerState | None = None
    param = torch.nn.Parameter(torch.from_numpy(x.copy()))
    sgd = torch.optim.SGD([param], lr=0.5, momentum=0.5, nesterov=True)
    for _ in range(6):
        delta = rng.integers(-8, 8, x.size).astype(np.float32)
        param.grad = torch.from_numpy(-delta)
        sgd.step()
        x, state = opt.step(x, delta, state)
        np.testing.assert_array_equal(x, param.detach().numpy())
        np.testing.assert_array_equal(state.arrays["v"], -sgd.state[param]["momentum_buffer"])
