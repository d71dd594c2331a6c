"""Finite-difference gradient checks (float64), for numformer's own tests and for your layers.

    err = check_gradients(forward, backward, {"x": x, "W": W})

``forward()`` computes an output array from the arrays (read by reference);
``backward(dout)`` returns {name: analytic gradient}. The scalar checked is
L = Σ out ⊙ R for a fixed random R, so every output element is exercised.
"""
from __future__ import annotations

import numpy as np


def numerical_gradient(f, x, eps=1e-6):
    """Central differences (f(x + εe_i) - f(x - εe_i)) / 2ε for each element of x (modified, then restored)."""
    grad = np.zeros_like(x, dtype=np.float64)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        f_plus = f()
        x[idx] = old - eps
        f_minus = f()
        x[idx] = old
        grad[idx] = (f_plus - f_minus) / (2 * eps)
    return grad


def relative_error(analytic, numeric, floor=1e-3):
    """‖a - n‖ / max(‖a‖, ‖n‖, floor): relative where the gradient is sizeable, absolute where it is ~0."""
    a = np.asarray(analytic, dtype=np.float64)
    n = np.asarray(numeric, dtype=np.float64)
    return float(np.linalg.norm(a - n) / max(np.linalg.norm(a), np.linalg.norm(n), floor))


def check_gradients(forward, backward, arrays, seed=0, eps=1e-6):
    """Largest relative error between analytic and numerical gradients over ``arrays`` (all float64).

    Returns {name: relative error}. Every array must be float64: float32
    rounding would swamp the finite differences.
    """
    for name, a in arrays.items():
        if a.dtype != np.float64:
            raise ValueError(f"gradient checks need float64 arrays; {name} is {a.dtype}")
    out = forward()
    R = np.random.default_rng(seed).standard_normal(np.shape(out))
    analytic = backward(R.copy())

    def loss():
        return float(np.sum(forward() * R))

    errors = {}
    for name, a in arrays.items():
        errors[name] = relative_error(analytic[name], numerical_gradient(loss, a, eps))
    return errors
