"""Exercise ``repeat_kv``: grouped-query attention's key/value heads shared by several query heads."""
from __future__ import annotations

from ..checker import Case, Exercise, Function, normal_inputs


def _x(shape, n_rep):
    return normal_inputs({"x": shape}, n_rep=n_rep)


EXERCISE = Exercise(
    name="repeat_kv",
    summary="grouped-query heads; the backward sums the shared ones",
    functions=(
        Function("repeat_kv_forward", """\
y[b, g·n_rep + t] = x[b, g] for t = 0 … n_rep - 1: each of the H_kv key (or value)
heads repeated n_rep times, the copies next to each other, so that query head h
reads key/value head h // n_rep (Hugging Face's repeat_kv). Returns (y, cache).

x: (B, H_kv, T, d)   ->   y: (B, H_kv·n_rep, T, d). n_rep = 1 may return x itself.""",
                 todos=("repeat every head n_rep times, next to itself", "return y and your cache")),
        Function("repeat_kv_backward", """\
dx from dy of shape (B, H_kv·n_rep, T, d): a head used by n_rep query heads
receives the gradients of all of them.   ->   dx: (B, H_kv, T, d).""",
                 todos=("group the n_rep copies of each head", "combine their gradients", "return dx")),
    ),
    grads=("x",),
    case=Case("x (2, 2, 3, 4), n_rep=3", _x((2, 2, 3, 4), 3)),
    edge_cases=(
        Case("one key/value head", _x((2, 1, 3, 4), 4), why="multi-query attention: one head serves all four"),
    ),
    keyword_cases=(
        Case("n_rep=1", _x((2, 3, 3, 4), 1), why="as many key/value heads as query heads: nothing is repeated"),
    ),
    hints=(
        "Head order matters: with 2 key/value heads and n_rep = 2 the query heads read [k0, k0, k1, k1], "
        "not [k0, k1, k0, k1].",
        "A value used in n places receives the sum of the n gradients (the chain rule sums over every use).",
        "Reshape dy to (B, H_kv, n_rep, T, d) and reduce over the axis of the copies.",
    ),
    page="tutorials/gpt-to-llama.md#grouped-query-attention",
)
