"""Softmax, log-softmax, ReLU and GELU (exact and tanh).

ReLU and the GELU backward split large arrays into chunks across numformer's threads (``parallel_for``):
the same operations on each element whatever the split. Exact GELU in float32 has a fast kernel of its
own, ``ops/fast_gelu.py``, tested against ``gelu_erf`` here.
"""
from __future__ import annotations

import math

import numpy as np

from .._runtime import parallel_for
from .fast_gelu import gelu_erf_f32
from .special import erf

# Elements per pass of the chunked kernels (and per thread at least): a chunk's temporaries stay in L2.
_CHUNK = 32768


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
    if x.dtype.kind != "f" or x.size < 2 * _CHUNK:
        y = np.maximum(x, 0)
        return y, y
    xf = np.ascontiguousarray(x).reshape(-1)
    y = np.empty_like(xf)
    zero = x.dtype.type(0)
    parallel_for(xf.size, lambda lo, hi: np.maximum(xf[lo:hi], zero, out=y[lo:hi]), _CHUNK)
    y = y.reshape(x.shape)
    return y, y


def relu_backward(dy, cache):
    """dx = dy ⊙ 1[x > 0]  (= dy ⊙ sign(y) with y = ReLU(x) >= 0; np.where is several times slower)."""
    y = cache
    if dy.dtype != y.dtype or dy.shape != y.shape or dy.dtype.kind != "f":
        return np.where(y > 0, dy, 0).astype(dy.dtype, copy=False)
    yf = np.ascontiguousarray(y).reshape(-1)
    df = np.ascontiguousarray(dy).reshape(-1)
    dx = np.empty_like(yf)

    def piece(lo, hi):
        np.sign(yf[lo:hi], out=dx[lo:hi])
        np.multiply(dx[lo:hi], df[lo:hi], out=dx[lo:hi])

    parallel_for(dx.size, piece, _CHUNK)
    return dx.reshape(dy.shape)


_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

def gelu_erf(x):
    """Exact GELU and its derivative, the reference: (x Φ(x), Φ(x) + x φ(x)) with
    Φ(x) = ½ (1 + erf(x / √2)) and φ(x) = exp(-x²/2) / √(2π). Returns (y, dy/dx)."""
    cdf = 0.5 * (1.0 + erf(x * _SQRT_HALF))
    pdf = np.exp(-0.5 * (x * x)) * _INV_SQRT_2PI
    return x * cdf, cdf + x * pdf


def gelu_forward(x, approximate="none"):
    """GELU(x) = x Φ(x), Φ the standard normal CDF (Hendrycks & Gimpel 2016).

    approximate="none":  Φ(x) = ½ (1 + erf(x / √2))         (torch.nn.GELU())
    approximate="tanh":  Φ(x) ≈ ½ (1 + tanh(√(2/π)(x + 0.044715 x³)))

    The cache holds the derivative dGELU/dx, computed here from the same
    intermediate values (so backward is a single multiply). Exact GELU in
    float32 runs the fast kernel ``ops.fast_gelu.gelu_erf_f32``; every other
    dtype the reference ``gelu_erf``.
    """
    if approximate == "none":
        y, grad = gelu_erf_f32(x) if x.dtype == np.float32 else gelu_erf(x)
        return y, (grad, approximate)
    if approximate == "tanh":
        t = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x)))
        dinner = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * (x * x))
        grad = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner
        return 0.5 * x * (1.0 + t), (grad, approximate)
    raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")


def gelu_backward(dy, cache):
    """dx = dy ⊙ GELU'(x), GELU'(x) = Φ(x) + x φ(x) (for tanh, the derivative of the approximation)."""
    grad, _ = cache
    if dy.dtype != grad.dtype or dy.shape != grad.shape or dy.size < 2 * _CHUNK:
        return dy * grad
    dx = np.empty_like(grad)
    a, b, o = dy.reshape(-1), grad.reshape(-1), dx.reshape(-1)
    parallel_for(o.size, lambda lo, hi: np.multiply(a[lo:hi], b[lo:hi], out=o[lo:hi]), _CHUNK)
    return dx
