"""Exercise ``rms_norm``: RMSNorm (Llama's normalization) and its backward."""
from __future__ import annotations

from ..checker import Case, Exercise, Function

D = 8


def _inputs(lead=(2, 3), scale=2.0, **options):
    def make(rng):
        return {"x": rng.standard_normal(lead + (D,)) * scale, "gamma": rng.standard_normal(D)} | options
    return make


def _zero_row(rng):
    inputs = _inputs()(rng)
    inputs["x"][0, 2] = 0.0
    return inputs


EXERCISE = Exercise(
    name="rms_norm",
    model="llama",
    summary="RMSNorm (Llama's normalization), and its backward",
    functions=(
        Function("rms_norm_forward", """\
RMSNorm(x) = x / √(mean(x²) + ε) ⊙ γ, the mean over the last axis
(Zhang & Sennrich 2019). Returns (y, cache).

x: (..., d)   gamma: (d,)   ->   y: (..., d). No mean is subtracted, no shift.""",
                 todos=("r = 1 / √(mean(x²) + ε) per position", "x̂ = x r, y = x̂ ⊙ γ",
                        "return y and your cache")),
        Function("rms_norm_backward", """\
Gradients of RMSNorm from dy of shape (..., d). Returns (dx, dgamma).

dgamma = Σ dy ⊙ x̂ over every leading axis: shape (d,). For dx: every x_i moves
every x̂_j, directly and through r = 1/√(mean(x²) + ε) (layer norm's derivation,
with one term fewer).""",
                 todos=("dgamma, summed over all leading axes", "g = ∂L/∂x̂", "dx, with the term that comes from r",
                        "return (dx, dgamma)")),
    ),
    grads=("x", "gamma"),
    case=Case("x (2, 3, 8), gamma (8,)", _inputs()),
    fd_case=Case("x (2, 8), gamma (8,)", _inputs((2,))),
    edge_cases=(
        Case("batch axes", _inputs((2, 2, 3)), why="x of shape (2, 2, 3, 8): dgamma sums over every leading axis"),
        Case("a zero row", _zero_row, why="x[0, 2] is all zeros: ε alone keeps the division finite"),
    ),
    keyword_cases=(
        Case("eps=0.1 on rows of small values", _inputs(scale=0.2, eps=0.1),
             why="ε is comparable to mean(x²) here, so where ε enters the formula shows"),
        Case("eps=0", _inputs(eps=0.0)),
    ),
    hints=(
        "Unlike layer norm, nothing is subtracted: x̂ = x · r with r = 1 / √(mean(x²) + ε), ε inside the root.",
        "∂r/∂x_i = -r³ x_i / d = -r² x̂_i / d.",
        "∂x̂_j/∂x_i = r (δ_ij - x̂_i x̂_j / d); sum it against g_j = dy_j γ_j.",
        "dx = r (g - x̂ · mean(g ⊙ x̂)), the mean over the last axis with keepdims=True.",
    ),
    page="tutorials/gpt-to-llama.md#rmsnorm",
)
