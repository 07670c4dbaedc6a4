"""ServerNesterov (DiLoCo's outer step) against ``torch.optim.SGD(nesterov=True)``.

Conventions: the round's aggregate ``Δ`` is the negative pseudo-gradient, so torch is given
``param.grad = −Δ``, and our state ``"v"`` is torch's momentum buffer negated.

The bound, where arithmetic is inexact: torch rounds each of its float32 operations (``μ`` and
``η`` are themselves rounded to float32; then ``μ b``, ``+ g``, ``μ b'``, ``g + μ b'``,
``η g'`` and ``x − η g'``, fewer with FMA), while ServerNesterov computes in float64 and rounds
``v'`` and ``x'`` once each. Let ``m`` be the largest magnitude among ``x, Δ, v, v', x'`` at an
element and ``ulp`` float32's spacing at ``m``; every intermediate is below ``2.71 m``, so each
rounding costs at most half the spacing at its result (≤ 2 ulp), and ``μ``'s and ``η``'s own
rounding under 1 ulp each. Summing the worst cases: torch's buffer is within 2 ulp of the exact
one and its model within 6.5; ours within 1 and 0.5. The test asserts 4 ulps for the buffer and
8 for the model (measured over 10 steps of 20k values: 1 and 2). Relative to the result itself
no bound holds (``x`` and ``η g'`` may cancel), which is why the bound is in ulps of ``m``.
"""

from __future__ import annotations

import numpy as np

from gradfed_ipfs.tensor import OptimizerState, ServerNesterov
from tests.required import import_area

torch = import_area("torch", "torch")

BUFFER_ULPS, MODEL_ULPS = 4, 8


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


def test_each_step_is_torchs_within_the_ulp_bound_over_ten_steps() -> None:
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
    assert worst_x <= MODEL_ULPS, worst_x
    assert worst_v <= BUFFER_ULPS, worst_v
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
