"""Softmax, log-softmax, ReLU and GELU (exact and tanh)."""
from __future__ import annotations

import math

import numpy as np

from .special import erf


def softmax_forward(x, axis=-1):
    """softmax(x)_i = exp(x_i - max x) / Σ_j exp(x_j - max x).

    A row that is entirely -inf (every key masked) gives zeros, never NaN.
    """
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0).astype(x.dtype, copy=False)
    e = np.exp(x - m)
    s = e.sum(axis=axis, keepdims=True)
    s[s == 0] = 1.0
    e /= s
    return e, (e, axis)


def softmax_backward(dy, cache):
    """dx = y ⊙ (dy - Σ_j dy_j y_j)."""
    y, axis = cache
    return y * (dy - np.sum(dy * y, axis=axis, keepdims=True))


def log_softmax_forward(x, axis=-1):
    """log softmax(x)_i = x_i - max x - log Σ_j exp(x_j - max x) (log-sum-exp, stable)."""
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0).astype(x.dtype, copy=False)
    shifted = x - m
    lse = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    y = shifted - lse
    return y, (y, axis)


def log_softmax_backward(dy, cache):
    """dx = dy - softmax(x) Σ_j dy_j."""
    y, axis = cache
    return dy - np.exp(y) * np.sum(dy, axis=axis, keepdims=True)


def relu_forward(x):
    """ReLU(x) = max(0, x)."""
    y = np.maximum(x, 0)
    return y, y


def relu_backward(dy, cache):
    """dx = dy ⊙ 1[x > 0]."""
    return np.where(cache > 0, dy, 0).astype(dy.dtype, copy=False)


_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_forward(x, approximate="none"):
    """GELU(x) = x Φ(x), Φ the standard normal CDF (Hendrycks & Gimpel 2016).

    approximate="none":  Φ(x) = ½ (1 + erf(x / √2))         (torch.nn.GELU())
    approximate="tanh":  Φ(x) ≈ ½ (1 + tanh(√(2/π)(x + 0.044715 x³)))
    """
    if approximate == "none":
        cdf = 0.5 * (1.0 + erf(x * _SQRT_HALF))
        return x * cdf, (x, cdf, approximate)
    if approximate == "tanh":
        t = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x)))
        return 0.5 * x * (1.0 + t), (x, t, approximate)
    raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")


def gelu_backward(dy, cache):
    """d/dx x Φ(x) = Φ(x) + x φ(x); for tanh, the derivative of the approximation."""
    x, aux, approximate = cache
    if approximate == "none":
        pdf = np.exp(-0.5 * (x * x)) * _INV_SQRT_2PI
        return dy * (aux + x * pdf)
    t = aux
    dinner = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * (x * x))
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner)
