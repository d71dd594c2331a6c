"""Exercise ``swiglu``: Llama's gated feed-forward (SiLU(x W_gateᵀ) ⊙ x W_upᵀ) W_downᵀ and its backward."""
from __future__ import annotations

from ..checker import Case, Exercise, Function

D, F = 4, 6


def _inputs(lead=(2, 3), scale=1.0, biases=()):
    """A ``Case.make`` with the biases named in ``biases`` ("b_gate", "b_up", "b_down") given."""
    def make(rng):
        inputs = {"x": rng.standard_normal(lead + (D,)) * scale, "w_gate": rng.standard_normal((F, D)),
                  "w_up": rng.standard_normal((F, D)), "w_down": rng.standard_normal((D, F))}
        sizes = {"b_gate": F, "b_up": F, "b_down": D}
        return inputs | {name: rng.standard_normal(sizes[name]) for name in biases}
    return make


EXERCISE = Exercise(
    name="swiglu",
    in_model=False,                 # the models run it fused (attention's kernel, the gated feed-forward)
    summary="Llama's gated feed-forward and its seven gradients",
    functions=(
        Function("swiglu_forward", """\
FFN(x) = (SiLU(x W_gateᵀ + b_gate) ⊙ (x W_upᵀ + b_up)) W_downᵀ + b_down,
SiLU(a) = a σ(a) (Shazeer 2020). Returns (y, cache).

x: (..., d_model)   w_gate, w_up: (d_ff, d_model)   w_down: (d_model, d_ff)
(torch.nn.Linear's layout)   b_gate, b_up: (d_ff,) or None
b_down: (d_model,) or None (Llama has no biases)   ->   y: (..., d_model).""",
                 todos=("a = x W_gateᵀ (+ b_gate), b = x W_upᵀ (+ b_up)", "h = SiLU(a) ⊙ b",
                        "y = h W_downᵀ (+ b_down); return y and your cache")),
        Function("swiglu_backward", """\
Gradients from dy of shape (..., d_model).
Returns (dx, dw_gate, dw_up, dw_down, db_gate, db_up, db_down): each bias gradient
None when the forward had no such bias; the weight and bias gradients summed over
every leading axis. SiLU'(a) = σ(a) (1 + a (1 - σ(a))).""",
                 todos=("through the down projection: dh, dw_down, db_down", "through the gate: da and db",
                        "through the two input projections: dx (both paths add), dw_gate, dw_up, the biases",
                        "return the seven gradients")),
    ),
    grads=("x", "w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"),
    case=Case("x (2, 3, 4), no biases, d_ff 6", _inputs()),
    edge_cases=(
        Case("large pre-activations", _inputs(scale=400.0),
             why="x W_gateᵀ reaches hundreds: σ(a) must not overflow to NaN (exp(1000) is inf)"),
        Case("batch axes", _inputs((2, 2, 3))),
    ),
    keyword_cases=(
        Case("with biases", _inputs(biases=("b_gate", "b_up", "b_down")),
             why="b_gate, b_up and b_down given: their gradients are returned"),
        Case("b_up alone", _inputs(biases=("b_up",)),
             why="each bias may be given without the others: a gradient for each one given, None for the rest"),
    ),
    hints=(
        "Three linear maps and a product: a = x W_gateᵀ, b = x W_upᵀ, h = SiLU(a) ⊙ b, y = h W_downᵀ. Go "
        "backwards through them in that order; the linear exercise's gradients apply to each map.",
        "Product rule on h = g ⊙ b with g = SiLU(a): dg = dh ⊙ b and db = dh ⊙ g.",
        "SiLU'(a) = σ(a) + a σ(a)(1 - σ(a)): keep σ(a) (or the whole derivative) in the cache.",
        "x feeds both the gate and the up projection: dx is the sum of the two paths' gradients.",
        "Compute σ(a) = 1 / (1 + exp(-a)) (exp(-a) may overflow to inf for very negative a, giving 0, which is "
        "right), never exp(a) / (1 + exp(a)).",
    ),
    page="tutorials/gpt-to-llama.md#swiglu",
)
