"""Softmax, log-softmax, ReLU, squared ReLU and GELU (exact and tanh): the references.

The speed path (threaded ReLU, squared ReLU and GELU backward, the chunked float32 GELU) is
``numformer.kernels.activations``; softmax has no kernel of its own (``kernels.fused_attention`` runs it in
place on the attention scores).
"""
from __future__ import annotations

import math

import numpy as np

from .special import erf


def softmax_forward(x, axis=-1):
    """softmax(x)_i = exp(x_i - max x) / Σ_j exp(x_j - max x), over ``axis`` (default the last).

    x: any shape   ->   y: shaped as x; returns (y, cache), the cache (y, axis).
    A row that is entirely -inf (every key masked) gives zeros, never NaN.
    """
    x = np.asarray(x)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0).astype(x.dtype, copy=False)      # an all -inf row: shift by 0
    e = np.exp(x - m)
    s = e.sum(axis=axis, keepdims=True)
    y = e / np.where(s == 0, 1.0, s).astype(x.dtype, copy=False)
    return y, (y, axis)


def softmax_backward(dy, cache):
    """dx = y ⊙ (dy - Σ_j dy_j y_j), the sum over the forward's axis; dx shaped as dy."""
    y, axis = cache
    return y * (dy - np.sum(dy * y, axis=axis, keepdims=True))


def log_softmax_forward(x, axis=-1):
    """log softmax(x)_i = x_i - max x - log Σ_j exp(x_j - max x) (log-sum-exp, stable), over ``axis``.

    x: any shape   ->   y: shaped as x; returns (y, cache), the cache (y, axis).
    A row that is entirely -inf gives -inf (the log of softmax's zeros), never NaN.
    """
    x = np.asarray(x)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0).astype(x.dtype, copy=False)
    shifted = x - m
    s = np.sum(np.exp(shifted), axis=axis, keepdims=True)
    y = shifted - np.log(np.where(s == 0, 1.0, s).astype(x.dtype, copy=False))
    return y, (y, axis)


def log_softmax_backward(dy, cache):
    """dx = dy - softmax(x) Σ_j dy_j (softmax(x) = exp(y), the sum over the forward's axis); dx shaped as dy."""
    y, axis = cache
    return dy - np.exp(y) * np.sum(dy, axis=axis, keepdims=True)


def relu_forward(x):
    """ReLU(x) = max(0, x), elementwise: x any shape, y shaped as x; returns (y, cache), the cache is y."""
    y = np.maximum(x, 0)
    return y, y


def relu_backward(dy, cache):
    """dx = 0 where y = ReLU(x) <= 0 (x <= 0), dy elsewhere: dy ⊙ 1[x > 0] for every x but NaN.

    A NaN x (y NaN) passes dy on, and a zeroed element is 0 whatever dy (inf or NaN too, a select, not 0 · dy):
    PyTorch's rule (its ReLU backward zeroes dy where y <= 0), so that a NaN shows up in the same gradients.
    """
    y, dy = cache, np.asarray(dy)
    return np.where(y <= 0, 0, dy).astype(dy.dtype, copy=False)


def relu_squared_forward(x):
    """ReLU²(x) = max(0, x)², elementwise (So et al. 2021, "Primer"; the feed-forward of modded-nanogpt).

    x: any shape   ->   y: shaped as x; returns (y, cache), the cache the derivative 2 max(0, x) (so that
    backward is a single multiply). A NaN x gives NaN in both.
    """
    r = np.maximum(x, 0)
    return r * r, r + r


def relu_squared_backward(dy, cache):
    """dx = dy ⊙ 2 max(0, x) (the forward's cache); dx shaped as dy.

    Where x <= 0 the product is 0 · dy: NaN for an infinite or NaN dy, where torch's relu(x).square() gives 0
    (its ReLU backward selects). Both agree for every finite dy.
    """
    return dy * cache


_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_erf(x):
    """Exact GELU and its derivative: (x Φ(x), Φ(x) + x φ(x)) with
    Φ(x) = ½ (1 + erf(x / √2)) and φ(x) = exp(-x²/2) / √(2π). Returns (y, dy/dx)."""
    x = np.asarray(x)
    cdf = 0.5 * (1.0 + erf(x * _SQRT_HALF))
    pdf = np.exp(-0.5 * (x * x)) * _INV_SQRT_2PI
    return x * cdf, cdf + x * pdf


def gelu_tanh(x):
    """GELU with the tanh approximation and its derivative: with u = √(2/π)(x + 0.044715 x³), t = tanh(u),
    (½ x (1 + t),  ½ (1 + t) + ½ x (1 - t²) du/dx). Returns (y, dy/dx)."""
    x = np.asarray(x)
    t = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x)))
    du = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * (x * x))
    return 0.5 * x * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du


def gelu_forward(x, approximate="none"):
    """GELU(x) = x Φ(x), Φ the standard normal CDF (Hendrycks & Gimpel 2016).

    approximate="none":  Φ(x) = ½ (1 + erf(x / √2))         (torch.nn.GELU())
    approximate="tanh":  Φ(x) ≈ ½ (1 + tanh(√(2/π)(x + 0.044715 x³)))

    x: any shape   ->   y: shaped as x; returns (y, cache). The cache holds the derivative dGELU/dx
    (and ``approximate``), computed here from the same intermediate values (so backward is a single multiply).
    """
    if approximate == "none":
        y, grad = gelu_erf(x)
    elif approximate == "tanh":
        y, grad = gelu_tanh(x)
    else:
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return y, (grad, approximate)


def gelu_backward(dy, cache):
    """dx = dy ⊙ GELU'(x), GELU'(x) = Φ(x) + x φ(x) (for tanh, the derivative of the approximation)."""
    grad, _ = cache
    return dy * grad
