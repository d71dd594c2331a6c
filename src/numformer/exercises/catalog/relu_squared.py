"""Exercise ``relu_squared``: ReLU²(x) = max(0, x)² (Primer's, modded-nanogpt's feed-forward) and its derivative."""
from __future__ import annotations

import numpy as np

from ..checker import Case, Exercise, Function


def _x(rng, shape=(4, 7)):
    return rng.standard_normal(shape) * 2.0


def _at_the_kink(rng):
    x = rng.integers(-2, 3, (4, 5)).astype(np.float64)        # about one entry in five exactly 0
    x[0, :3] = (0.0, -0.0, 0.0)
    return {"x": x}


def _large(rng):
    big = np.geomspace(1.0, 1e300, 31)                         # 1, 1e10, ..., 1e300
    return {"x": np.concatenate([-big[::-1], [0.0], big])}


EXERCISE = Exercise(
    name="relu_squared",
    in_model=False,             # the GPT and the Llama model of `exercises train` use GELU and SwiGLU; the
    route="model.activation=relu2",     # feed-forward runs it only with this setting
    summary="squared ReLU, max(0, x)², and its derivative",
    functions=(
        Function("relu_squared_forward", """\
ReLU²(x) = max(0, x)², elementwise (So et al. 2021, "Primer"; modded-nanogpt's
feed-forward). Returns (y, cache).

x: any shape   ->   y: the shape of x.""",
                 todos=("r = max(0, x), elementwise", "y = r²",
                        "keep what the backward needs (the derivative itself is fine)")),
        Function("relu_squared_backward", """\
dx = dy ⊙ ReLU²'(x), with ReLU²'(x) = 2 max(0, x) (the chain rule through the
square: 2 max(0, x) times ReLU's slope, 0 or 1); dx: the shape of dy.""",
                 todos=("ReLU²'(x) from your cache", "return dy times it")),
    ),
    grads=("x",),
    case=Case("x of shape (4, 7)", lambda rng: {"x": _x(rng)}),
    edge_cases=(
        Case("inputs exactly at the kink", _at_the_kink,
             why="x in {-2, -1, 0, 1, 2}, with 0 and -0.0: the derivative there is 2 max(0, 0) = 0, never 0 / 0"),
        Case("large inputs", _large,
             why="x from -1e300 to 1e300: past 1.3e154 x² overflows to inf, so y is inf far right and exactly 0 for "
                 "every negative x (a mask applied after squaring gives inf · 0 = NaN there); the derivative "
                 "2 max(0, x) stays finite"),
        Case("batch axes", lambda rng: {"x": _x(rng, (2, 3, 4))}),
    ),
    hints=(
        "Chain rule: with r = max(0, x), y = r², so dy/dx = 2r · dr/dx, and dr/dx is 1 where x > 0 and 0 "
        "elsewhere. 2r is already 0 where x <= 0: the derivative is 2 max(0, x).",
        "Or the product rule on y = r · r: r' r + r r' = 2 r r'. Either way the 2 stays, and so does the max.",
        "Compute the derivative in the forward and keep it in the cache: the backward is then one "
        "multiplication, dx = dy · cache.",
        "Clip first, then square: squaring first and masking after turns a huge negative x into inf · 0 = NaN. "
        "And keep the derivative itself: recovered from y (2√y, or 2y/x) it is wrong where y overflowed to inf, "
        "or NaN at x = 0.",
    ),
    page="tutorials/backprop.md#squared-relu",
)
