"""Exercise ``rope``: rotary position embeddings (Llama's half-split layout) and their backward."""
from __future__ import annotations

import numpy as np

from ... import ops
from ..checker import Case, Exercise, Function, normal_inputs


def _x(shape=(2, 2, 5, 8), **options):
    return normal_inputs({"x": shape}, **options)


EXERCISE = Exercise(
    name="rope",
    model="llama",
    summary="rotary position embeddings; the backward rotates by -θ",
    functions=(
        Function("rope_forward", """\
Rotate each head vector x (last axis, of even size d) by its position p.
Returns (y, cache).

Split x = [x₁, x₂] into halves; the pair (x₁[i], x₂[i]) turns by the angle p·θ_i,
θ_i = theta^(-2i/d), i = 0 … d/2 - 1 (the rotate_half layout of Llama):
    y = x ⊙ cos(pθ) + rotate_half(x) ⊙ sin(pθ),   rotate_half([x₁, x₂]) = [-x₂, x₁]
with cos and sin repeated over both halves.
x: (..., T, d)   ->   y: the shape of x. The positions are offset … offset + T - 1,
or ``positions`` given explicitly (then ``offset`` is not used): (T,), or (B, T)
for x of shape (B, H, T, d) (one row of positions per sequence).
scaling: None (plain RoPE), or a numformer.ops.RopeScaling (scaled RoPE: linear,
dynamic, yarn, llama3). Then θ and an attention factor a are
numformer.ops.rope_inverse_frequencies(d, theta, scaling, n), n = the largest
position + 1, and cos and sin are multiplied by a.""",
                 todos=("the positions (offset, or positions)", "θ_i (and a, with scaling)",
                        "the angles p·θ_i, their cos and sin over both halves", "y; return y and your cache")),
        Function("rope_backward", """\
dx from dy (the shape of x). The forward multiplies each pair, as a column, by
a·R(pθ_i), R(φ) = [[cos φ, -sin φ], [sin φ, cos φ]] (a = 1 but for YaRN's
scaling); dx is the transpose a·R(pθ_i)ᵀ applied to dy's pair. The plain
rotation R is orthogonal: its transpose is its inverse, the rotation by -pθ_i.
YaRN multiplies it by the constant a, so the backward is Rᵀ times the same a
(not the inverse of a·R).""",
                 todos=("apply the transpose of the forward's linear map to dy", "return dx")),
    ),
    grads=("x",),
    case=Case("x (2, 2, 5, 8)", _x()),
    edge_cases=(
        Case("no batch axes", _x((5, 8)), why="x of shape (T, d) = (5, 8)"),
        Case("one position", _x((2, 2, 1, 8)), why="T = 1: the position is 0"),
    ),
    keyword_cases=(
        Case("offset=3", _x(offset=3), why="three positions are cached before these: they are at 3 … 7"),
        Case("theta=500.0", _x(theta=500.0), why="another base for the angles"),
        Case("positions (T,)", _x(positions=np.array([3, 5, 6, 9, 10])), why="explicit positions"),
        Case("positions (T,) and offset=3", _x(positions=np.array([3, 5, 6, 9, 10]), offset=3),
             why="explicit positions are the positions: offset only places positions that are not given"),
        Case("positions (B, T)", _x(positions=np.array([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]])),
             why="one row of positions per sequence (a left-padded batch), broadcast over the heads"),
        Case("scaling linear", _x(scaling=ops.RopeScaling("linear", factor=4.0)),
             why="linear scaling: every θ_i divided by 4"),
        Case("scaling yarn", _x(offset=6, scaling=ops.RopeScaling("yarn", factor=4.0,
                                                                   original_max_position_embeddings=4)),
             why="YaRN: other frequencies, and cos and sin times the attention factor a"),
        Case("scaling dynamic", _x(offset=6, scaling=ops.RopeScaling("dynamic", factor=4.0,
                                                                      max_position_embeddings=4)),
             why="dynamic NTK: θ's base grows with n, the largest position + 1 (here offset 6 + T = 11), not T"),
        Case("scaling dynamic with positions", _x(positions=np.array([3, 5, 6, 9, 12]),
                                                   scaling=ops.RopeScaling("dynamic", factor=4.0,
                                                                           max_position_embeddings=4)),
             why="with explicit positions n is the largest of them + 1 (here 13), not offset + T"),
        Case("scaling llama3", _x(offset=2, scaling=ops.RopeScaling("llama3", factor=8.0, low_freq_factor=1.0,
                                                                     high_freq_factor=4.0,
                                                                     original_max_position_embeddings=8)),
             why="Llama 3.1: the low frequencies divided by the factor, the high ones kept, a blend between"),
    ),
    hints=(
        "Build the angles as np.outer-like products of positions and θ (shape (T, d/2)), then concatenate the "
        "array with itself to cover both halves.",
        "rotate_half is a concatenation of two halves along the last axis, one of them negated.",
        "y = A x with A a block of 2 × 2 rotations (times a, with YaRN's scaling). The backward is Aᵀ dy: a "
        "rotation by -pθ (times the same a). The transpose of rotate_half is not rotate_half: [g₁, g₂] -> "
        "[g₂, -g₁].",
        "For positions of shape (B, T) and x of shape (B, H, T, d), cos and sin have shape (B, T, d): insert "
        "the head axis so that they broadcast.",
        "With scaling, only θ changes (and cos, sin get the factor a): let rope_inverse_frequencies compute both; "
        "the formulas of the forward and the backward are the same, with a·cos and a·sin.",
    ),
    page="tutorials/gpt-to-llama.md#rope",
    allowed_imports=("numformer.ops.RopeScaling", "numformer.ops.rope_inverse_frequencies"),   # scaled RoPE's θ
)
