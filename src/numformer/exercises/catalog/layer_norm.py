"""Exercise ``layer_norm``: layer normalization over the last axis and its backward."""
from __future__ import annotations

import numpy as np

from ..checker import Case, Exercise, Function

D = 8


def _inputs(lead=(2, 3), scale=3.0, shift=1.0, beta=True, **options):
    def make(rng):
        inputs = {"x": rng.standard_normal(lead + (D,)) * scale + shift, "gamma": rng.standard_normal(D),
                  "beta": rng.standard_normal(D) if beta else None}
        return inputs | options
    return make


def _constant_row(rng):
    inputs = _inputs()(rng)
    inputs["x"][1, 0] = 2.5
    return inputs


EXERCISE = Exercise(
    name="layer_norm",
    summary="LayerNorm over the last axis, and its backward",
    functions=(
        Function("layer_norm_forward", """\
LayerNorm(x) = (x - μ) / √(σ² + ε) ⊙ γ + β, with μ and σ² the mean and the
biased variance (divide by d) of each position's d features. Returns (y, cache).

x: (..., d), any number of leading axes   gamma: (d,)
beta: (d,), or None (no shift)   ->   y: (..., d).""",
                 todos=("μ and σ² over the last axis (keepdims=True)", "x̂ = (x - μ) / √(σ² + ε)",
                        "y = x̂ ⊙ γ + β (β may be None)", "return y and your cache")),
        Function("layer_norm_backward", """\
Gradients of LayerNorm from dy of shape (..., d). Returns (dx, dgamma, dbeta).

dgamma = Σ dy ⊙ x̂ and dbeta = Σ dy, summed over every leading axis: shape (d,)
(dbeta even when the forward had beta=None). For dx: every x_i moves every x̂_j,
directly and through μ and σ².""",
                 todos=("dgamma and dbeta, summed over all leading axes", "g = ∂L/∂x̂",
                        "dx, with the two terms that come from μ and σ²", "return (dx, dgamma, dbeta)")),
    ),
    grads=("x", "gamma", "beta"),
    case=Case("x (2, 3, 8), gamma, beta (8,)", _inputs()),
    fd_case=Case("x (2, 8), gamma, beta (8,)", _inputs((2,))),
    edge_cases=(
        Case("batch axes", _inputs((2, 2, 3)), why="x of shape (2, 2, 3, 8): the parameter gradients sum over "
                                                  "every leading axis"),
        Case("a constant row", _constant_row,
             why="x[1, 0] has the same value in every feature: its variance is 0, and ε alone keeps the "
                 "division finite"),
        Case("beta=None", _inputs(beta=False), why="no shift β: y = x̂ ⊙ γ, and dbeta is still Σ dy"),
    ),
    keyword_cases=(
        Case("eps=0.1 on rows of small variance", _inputs(scale=0.2, eps=0.1),
             why="ε is comparable to the variance here, so where ε enters the formula shows"),
        Case("eps=0", _inputs(eps=0.0)),
    ),
    hints=(
        "σ² is the biased variance: the mean of (x - μ)², dividing by d, as np.var does by default (and as "
        "torch does). ε goes inside the square root.",
        "Write r = 1 / √(σ² + ε). Then ∂μ/∂x_i = 1/d, ∂σ²/∂x_i = 2(x_i - μ)/d and ∂r/∂x_i = -r² x̂_i / d.",
        "Differentiating x̂_j = (x_j - μ) r by the product rule gives ∂x̂_j/∂x_i = r (δ_ij - 1/d - x̂_i x̂_j / d); "
        "sum it against g_j = dy_j γ_j.",
        "The result has three terms: g itself, minus its mean, minus x̂ times the mean of g ⊙ x̂ (all means over "
        "the last axis, keepdims=True), times r.",
    ),
    page="tutorials/backprop.md#layer-norm",
)
