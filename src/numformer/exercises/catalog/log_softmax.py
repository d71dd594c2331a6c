"""Exercise ``log_softmax``: the logarithm of softmax by log-sum-exp, and its backward."""
from __future__ import annotations

import numpy as np

from ..checker import Case, Exercise, Function


def _x(rng, shape=(3, 4, 5)):
    return rng.standard_normal(shape) * 3.0


def _spread(rng):
    x = _x(rng)
    x[..., 0] -= 1000.0
    return {"x": x}


def _far_apart(rng):
    x = _x(rng)
    x[1] -= 2000.0
    return {"x": x}


def _masked_row(rng):
    x = _x(rng)
    x[2, 1] = -np.inf
    return {"x": x}


EXERCISE = Exercise(
    name="log_softmax",
    in_model=False,                 # the models run it fused (attention's kernel, the gated feed-forward)
    summary="log-softmax by log-sum-exp, and its backward",
    functions=(
        Function("log_softmax_forward", """\
log softmax(x)_i = x_i - log Σ_j exp(x_j), along ``axis``. Returns (y, cache).

x: any shape   ->   y: the shape of x (every entry <= 0). It must stay finite
where softmax underflows to 0 (an entry 1000 below the others has a log softmax
near -1000, not -inf), and a slice that is entirely -inf gives -inf, never NaN.""",
                 todos=("compute log Σ_j exp(x_j) along axis without overflow or underflow",
                        "subtract it", "return y and your cache")),
        Function("log_softmax_backward", """\
dx from dy, for y = log softmax(x): ∂y_i/∂x_j = δ_ij - softmax(x)_j.

dy: the shape of y   ->   dx: the shape of x.""",
                 todos=("sum the chain rule over i along the axis", "return dx")),
    ),
    grads=("x",),
    case=Case("x of shape (3, 4, 5)", lambda rng: {"x": _x(rng)}),
    fd_case=Case("x of shape (2, 5)", lambda rng: {"x": _x(rng, (2, 5))}),
    edge_cases=(
        Case("large entries", lambda rng: {"x": _x(rng) + 1000.0},
             why="every entry is near 1000: exp(1000) is inf in float64"),
        Case("slices far apart", _far_apart,
             why="the slices x[1, j] lie about 2000 below the others: each slice needs its own shift (one "
                 "maximum over the whole array gives -inf or a wrong log-sum-exp there)"),
        Case("widely spread entries", _spread,
             why="the first entry of every slice is 1000 below the others: its softmax underflows to 0, but its "
                 "log softmax is a finite number near -1000"),
        Case("a fully masked slice", _masked_row,
             why="x[2, 1] is entirely -inf: its log softmax is -inf, and no NaN may appear"),
    ),
    keyword_cases=(
        Case("axis=0", lambda rng: {"x": _x(rng), "axis": 0}, why="the sums must run along axis"),
        Case("axis=1", lambda rng: {"x": _x(rng), "axis": 1}),
    ),
    hints=(
        "log Σ_j exp(x_j) = m + log Σ_j exp(x_j - m) for any m; choose m so that no exponent is positive.",
        "Never take the log of a softmax you computed first: where it underflows to 0 the log is -inf.",
        "A slice that is entirely -inf has m = -inf: shift it by 0 instead (np.isfinite), and take log 1 "
        "where the sum is 0.",
        "The backward needs softmax(x), which is exp(y), and the axis its sum runs along: the cache can be y "
        "and the axis.",
    ),
    page="tutorials/backprop.md#log-softmax",
)
