"""Exercise ``gelu``: GELU(x) = x Φ(x), exact and tanh-approximated, and its derivative."""
from __future__ import annotations

import numpy as np

from ..checker import Case, Exercise, Function


def _x(rng, shape=(4, 7)):
    return rng.standard_normal(shape) * 3.0


EXERCISE = Exercise(
    name="gelu",
    summary="GELU, exact and tanh-approximated, and its derivative",
    functions=(
        Function("gelu_forward", """\
GELU(x) = x Φ(x), Φ the standard normal CDF, elementwise. Returns (y, cache).

approximate="none":  Φ(x) = ½ (1 + erf(x / √2))                    (torch's default)
approximate="tanh":  Φ(x) ≈ ½ (1 + tanh(√(2/π) (x + 0.044715 x³)))  (GPT-2's)
any other approximate: raise a ValueError.
NumPy has no erf: use numformer.ops.erf (or math.erf through np.vectorize).
x: any shape   ->   y: the shape of x.""",
                 todos=("Φ(x) for each value of approximate (a ValueError for any other)", "y = x Φ(x)",
                        "keep what the backward needs (the derivative itself is fine)")),
        Function("gelu_backward", """\
dx = dy ⊙ GELU'(x), with GELU'(x) = Φ(x) + x φ(x), φ(x) = exp(-x²/2) / √(2π);
for approximate="tanh", the derivative of the approximation (product rule, then
the chain rule through tanh).""",
                 todos=("GELU'(x) for the forward's approximate", "return dy times it")),
    ),
    grads=("x",),
    case=Case("x of shape (4, 7)", lambda rng: {"x": _x(rng)}),
    edge_cases=(
        Case("large inputs", lambda rng: {"x": np.linspace(-40.0, 40.0, 81)},
             why="x from -40 to 40: GELU(x) is x far right and 0 far left, and nothing overflows"),
        Case("batch axes", lambda rng: {"x": _x(rng, (2, 3, 4))}),
    ),
    keyword_cases=(
        Case('approximate="tanh"', lambda rng: {"x": _x(rng), "approximate": "tanh"},
             why="GPT-2's approximation, with its own derivative"),
        Case('approximate="tanh", large inputs', lambda rng: {"x": np.linspace(-40.0, 40.0, 81),
                                                              "approximate": "tanh"},
             why="x from -40 to 40, where x³ is large"),
        Case('approximate="erf"', lambda rng: {"x": _x(rng), "approximate": "erf"}, raises=ValueError,
             why='approximate is "none" or "tanh": any other value is a mistake of the caller\'s, refused with a '
                 'ValueError rather than computed as one of the two'),
    ),
    hints=(
        "Product rule: d/dx [x Φ(x)] = Φ(x) + x Φ'(x), and Φ' is the normal density φ.",
        "For the tanh form write u = √(2/π)(x + 0.044715 x³) and t = tanh(u): d/dx tanh(u) = (1 - t²) du/dx.",
        "Compute the derivative in the forward from the same intermediate values and keep it in the cache: "
        "the backward is then one multiplication.",
        "Use np.tanh, not a quotient of exponentials, which overflows for large |u|.",
    ),
    page="tutorials/backprop.md#gelu",
    allowed_imports=("numformer.ops.erf",),          # the stub imports it: NumPy has no erf
)
