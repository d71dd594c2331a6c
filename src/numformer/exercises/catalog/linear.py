"""Exercise ``linear``: the affine map y = x Wᵀ + b of torch.nn.Linear, and its backward."""
from __future__ import annotations

from ..checker import Case, Exercise, Function


def _inputs(lead=(5,), bias=True):
    def make(rng):
        inputs = {"x": rng.standard_normal(lead + (4,)), "W": rng.standard_normal((3, 4))}
        if bias:
            inputs["b"] = rng.standard_normal(3)
        return inputs
    return make


EXERCISE = Exercise(
    name="linear",
    summary="y = x Wᵀ + b (torch.nn.Linear) and its three gradients",
    functions=(
        Function("linear_forward", """\
y = x Wᵀ + b. Returns (y, cache).

x: (..., d_in), any number of leading axes (batch, time)
W: (d_out, d_in), torch.nn.Linear's layout      b: (d_out,) or None
->   y: (..., d_out).""",
                 todos=("the product with the transposed weight", "the bias, when there is one",
                        "return y and your cache")),
        Function("linear_backward", """\
Gradients of y = x Wᵀ + b, from dy = ∂L/∂y of shape (..., d_out).
Returns (dx, dW, db).

dx: (..., d_in)   dW: (d_out, d_in), summed over every leading position
db: (d_out,), or None when the forward had no bias.
weight_grad=False: W is frozen (fine-tuning with LoRA, a frozen layer), so dW is
None and its product is never computed.
Since y_nk = Σ_i x_ni W_ki + b_k, each partial derivative is one factor of a
product.""",
                 todos=("dx", "dW, summed over all leading axes (flatten them first); None when weight_grad is "
                        "False", "db, or None without bias", "return (dx, dW, db)")),
    ),
    grads=("x", "W", "b"),
    case=Case("x (5, 4), W (3, 4), b (3,)", _inputs()),
    edge_cases=(
        Case("batch axes", _inputs((2, 3)),
             why="x has two leading axes (batch, time), as in a model: dW and db sum over every position"),
        Case("one vector", _inputs(()), why="x is a single vector of shape (d_in,)"),
    ),
    keyword_cases=(
        Case("b=None", _inputs((2, 3), bias=False), why="no bias: db is None"),
        Case("weight_grad=False", _inputs((2, 3)), backward_options=(("weight_grad", False),),
             why="a frozen weight: dW is None, dx and db as usual"),
    ),
    hints=(
        "Write y_nk = Σ_i x_ni W_ki + b_k and differentiate with respect to one x_ni, one W_ki, one b_k; then "
        "sum over everything that entry touches.",
        "Check the shapes: dW must be (d_out, d_in), and only one product of dy and x has that shape.",
        "With leading axes (B, T, d), reshape x to (-1, d_in) and dy to (-1, d_out) first: every position is "
        "one row, and a matrix product sums over the rows.",
        "Keep x and W (and whether there was a bias) in the cache; dx must come back in the shape of x.",
    ),
    page="tutorials/backprop.md#linear",
)
