"""Exercise ``softmax``: softmax along an axis, stable, and its backward without the Jacobian."""
from __future__ import annotations

import numpy as np

from ..checker import Case, Exercise, Function


def _x(rng, shape=(3, 4, 5)):
    return rng.standard_normal(shape) * 3.0


def _far_apart(rng):
    x = _x(rng)
    x[1] -= 2000.0
    return {"x": x}


def _masked_row(rng):
    x = _x(rng)
    x[1, 2] = -np.inf
    x[0, 1, 3] = -np.inf
    return {"x": x}


EXERCISE = Exercise(
    name="softmax",
    in_model=False,                 # the models run it fused (attention's kernel, the gated feed-forward)
    summary="softmax along an axis, stable, and its backward",
    functions=(
        Function("softmax_forward", """\
softmax(x)_i = exp(x_i) / Σ_j exp(x_j), along ``axis``. Returns (y, cache).

x: any shape; the sums run along ``axis``   ->   y: the shape of x, every slice
along ``axis`` summing to 1. Large entries must not overflow, and a slice that is
entirely -inf (a query whose keys are all masked) gives zeros, never NaN. The cache
is yours: whatever your backward needs.""",
                 todos=("make exp safe for large entries (softmax does not change when a constant is added to "
                        "the slice)", "exponentiate and normalise along axis", "guard the all -inf slice",
                        "return y and your cache")),
        Function("softmax_backward", """\
dx = ∂L/∂x from dy = ∂L/∂y, for y = softmax(x) along the axis of the forward.

∂y_i/∂x_j = y_i (δ_ij - y_j), so dx_j = Σ_i dy_i y_i (δ_ij - y_j).
dy: the shape of y   ->   dx: the shape of x. Do not build the (C, C) Jacobian:
one product, one sum along the axis, one subtraction.""",
                 todos=("take what you need from the cache", "sum the chain rule over i along the axis",
                        "return dx")),
    ),
    grads=("x",),
    case=Case("x of shape (3, 4, 5)", lambda rng: {"x": _x(rng)}),
    fd_case=Case("x of shape (2, 5)", lambda rng: {"x": _x(rng, (2, 5))}),
    edge_cases=(
        Case("large entries", lambda rng: {"x": _x(rng) + 1000.0},
             why="every entry is near 1000, as unscaled attention scores can be: exp(1000) is inf in float64"),
        Case("slices far apart", _far_apart,
             why="the slices x[1, j] lie about 2000 below the others: each slice needs its own shift (one "
                 "maximum over the whole array underflows them to 0)"),
        Case("masked entries", _masked_row,
             why="-inf entries are masked keys, and x[1, 2] is a slice whose keys are all masked: its "
                 "softmax is 0, and so is its gradient"),
        Case("one entry per slice", lambda rng: {"x": _x(rng, (4, 1))},
             why="a slice of length 1"),
    ),
    keyword_cases=(
        Case("axis=0", lambda rng: {"x": _x(rng), "axis": 0},
             why="the softmax runs along the first axis: every sum must run along axis"),
        Case("axis=1", lambda rng: {"x": _x(rng), "axis": 1}),
    ),
    hints=(
        "softmax(x + c) = softmax(x) for any constant c added to the whole slice. Which c keeps every exponent "
        "at or below 0?",
        "When the whole slice is -inf, its maximum is -inf too, and -inf - (-inf) is NaN: shift such a slice "
        "by 0 instead (np.isfinite tells which), and divide by 1 where the sum is 0.",
        "In the backward, Σ_i dy_i y_i (δ_ij - y_j) splits into two terms: one where i = j, and one that is the "
        "same for every j of the slice (a sum along the axis, kept with keepdims=True).",
        "The backward only needs y, not x: keep y (and the axis) in the cache.",
    ),
    page="tutorials/backprop.md#softmax",
)
