"""Exercise ``merge_heads``: (B, h, T, d_h) -> (B, T, h·d_h), the heads side by side, and its backward."""
from __future__ import annotations

from ..checker import Case, Exercise, Function, normal_inputs


def _x(shape):
    return normal_inputs({"x": shape})


EXERCISE = Exercise(
    name="merge_heads",
    in_model=False,                 # the models run it fused (attention's kernel, the gated feed-forward)
    summary="(B, h, T, d_h) -> (B, T, h·d_h), and its backward",
    functions=(
        Function("merge_heads_forward", """\
y[..., t, j·d_h + i] = x[..., j, t, i]: the inverse of split_heads, the heads
side by side along the features of every position. Returns (y, cache).

x: (..., h, T, d_h)   ->   y: (..., T, h·d_h).""",
                 todos=("move the head axis after the time axis", "read the last two axes as one",
                        "return y and your cache")),
        Function("merge_heads_backward", """\
dx from dy of shape (..., T, h·d_h): every entry moves back where it came from.
->   dx: (..., h, T, d_h).""",
                 todos=("undo the moves in reverse order", "return dx")),
    ),
    grads=("x",),
    case=Case("x (2, 3, 5, 4)", _x((2, 3, 5, 4))),
    edge_cases=(
        Case("batch axes", _x((2, 2, 3, 5, 4)), why="x of shape (2, 2, 3, 5, 4): only the last three axes change"),
        Case("one head", _x((2, 1, 5, 4)), why="h = 1"),
        Case("one position", _x((2, 3, 1, 4)), why="T = 1"),
    ),
    hints=(
        "Reshaping (B, h, T, d_h) to (B, T, h·d_h) directly has the right shape and the wrong numbers: it cuts "
        "the memory of head 0 into time steps. Move the axes first.",
        "The backward needs the number of heads to read the last axis of dy as (h, d_h): keep it in the cache.",
    ),
    page="tutorials/backprop.md#heads-split-and-merge",
)
