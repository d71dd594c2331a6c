"""Exercise ``split_heads``: (B, T, E) -> (B, h, T, E/h) for multi-head attention, and its backward."""
from __future__ import annotations

from ..checker import Case, Exercise, Function, normal_inputs


def _x(shape, n_heads):
    return normal_inputs({"x": shape}, n_heads=n_heads)


EXERCISE = Exercise(
    name="split_heads",
    in_model=False,                 # the models run it fused (attention's kernel, the gated feed-forward)
    summary="(B, T, E) -> (B, h, T, E/h), and its backward",
    functions=(
        Function("split_heads_forward", """\
y[..., j, t, i] = x[..., t, j·d_h + i]: the E features of every position cut into
n_heads heads of d_h = E / n_heads consecutive features, the head axis moved
before the time axis. Returns (y, cache).

x: (..., T, E)   ->   y: (..., n_heads, T, d_h). Attention then runs on every
head's (T, d_h) matrix at once.""",
                 todos=("read the last axis as (n_heads, d_h)", "move the head axis before the time axis",
                        "return y and your cache")),
        Function("split_heads_backward", """\
dx from dy of shape (..., n_heads, T, d_h). Every entry of y is one entry of x,
moved: dx puts every entry of dy back where its entry of x came from.
->   dx: (..., T, E).""",
                 todos=("undo the moves in reverse order", "return dx")),
    ),
    grads=("x",),
    case=Case("x (2, 5, 12), n_heads=3", _x((2, 5, 12), 3)),
    edge_cases=(
        Case("batch axes", _x((2, 2, 5, 12), 4), why="x of shape (2, 2, 5, 12): only the last two axes move"),
        Case("one position", _x((2, 1, 12), 3), why="T = 1"),
    ),
    keyword_cases=(
        Case("n_heads=1", _x((2, 5, 12), 1), why="one head of width E"),
        Case("n_heads=12", _x((2, 5, 12), 12), why="twelve heads of width 1"),
    ),
    hints=(
        "A reshape never moves data: it reads the same numbers with other axis lengths. Which axis must be read "
        "as two?",
        "After the reshape the axes are (..., T, h, d_h): one transpose of two axes gives (..., h, T, d_h).",
        "The map only moves entries, so its backward moves each entry of dy back: the same two operations, "
        "inverted and in reverse order.",
    ),
    page="tutorials/backprop.md#heads-split-and-merge",
)
