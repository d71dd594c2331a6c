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

# Elements per pass of the chunked float32 kernels: the temporaries of one chunk stay in the L2 cache.
_CHUNK = 32768


def _gelu_erf_f32(x):
    """Exact GELU in float32 and its derivative, in one pass over L2-sized chunks.

    With u = x/√2, a = |u|, t = 1/(1 + p·a) and e = exp(-u²) = exp(-x²/2), the
    A&S 7.1.26 approximation gives erf(a) = 1 - P(t)·e (absolute error below
    1.5e-7), so with h = ½·P(t)·e:

        Φ(x) = ½(1 + erf(u)) = 1 - h (x ≥ 0),  h (x < 0)  =  ½ + copysign(½ - h, x)
        GELU(x) = x·Φ(x)          GELU'(x) = Φ(x) + x·φ(x),   φ(x) = e/√(2π)

    The same e serves the value and the derivative (computed here, so that
    backward is one multiply). Returns (y, dy/dx), both shaped as x.
    """
    dt = x.dtype.type
    p = dt(0.3275911 * _SQRT_HALF)
    a1, a2, a3, a4, a5 = (dt(0.5 * c) for c in (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429))
    half, one, mhalf, c_pdf = dt(0.5), dt(1.0), dt(-0.5), dt(_INV_SQRT_2PI)
    xf = np.ascontiguousarray(x).reshape(-1)
    n = xf.size
    y = np.empty_like(xf)
    g = np.empty_like(xf)
    size = min(n, _CHUNK)
    t_buf = np.empty(size, xf.dtype)
    e_buf = np.empty(size, xf.dtype)
    for s in range(0, n, _CHUNK):
        stop = min(s + _CHUNK, n)
        xs, ys, gs, t, e = xf[s:stop], y[s:stop], g[s:stop], t_buf[:stop - s], e_buf[:stop - s]
        np.multiply(xs, mhalf, out=e)
        e *= xs
        np.exp(e, out=e)                                   # e = exp(-x²/2)
        np.abs(xs, out=t)
        t *= p
        t += one
        np.reciprocal(t, out=t)                            # t = 1 / (1 + p|x|/√2)
        np.multiply(t, a5, out=gs)                         # h = ½ P(t) e, Horner
        gs += a4
        gs *= t
        gs += a3
        gs *= t
        gs += a2
        gs *= t
        gs += a1
        gs *= t
        gs *= e
        np.subtract(half, gs, out=gs)
        np.copysign(gs, xs, out=gs)
        gs += half                                         # Φ(x)
        np.multiply(xs, gs, out=ys)                        # GELU(x) = x Φ(x)
        e *= c_pdf
        e *= xs
        gs += e                                            # Φ(x) + x φ(x)
    return y.reshape(x.shape), g.reshape(x.shape)


def gelu_forward(x, approximate="none"):
    """GELU(x) = x Φ(x), Φ the standard normal CDF (Hendrycks & Gimpel 2016).

    approximate="none":  Φ(x) = ½ (1 + erf(x / √2))         (torch.nn.GELU())
    approximate="tanh":  Φ(x) ≈ ½ (1 + tanh(√(2/π)(x + 0.044715 x³)))

    The cache holds the derivative dGELU/dx, computed here from the same
    intermediate values (so backward is a single multiply).
    """
    if approximate == "none":
        if x.dtype == np.float32:
            y, grad = _gelu_erf_f32(x)
            return y, (grad, approximate)
        cdf = 0.5 * (1.0 + erf(x * _SQRT_HALF))
        pdf = np.exp(-0.5 * (x * x)) * _INV_SQRT_2PI
        return x * cdf, (cdf + x * pdf, approximate)
    if approximate == "tanh":
        t = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x)))
        dinner = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * (x * x))
        grad = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner
        return 0.5 * x * (1.0 + t), (grad, approximate)
    raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")


def gelu_backward(dy, cache):
    """dx = dy ⊙ GELU'(x), GELU'(x) = Φ(x) + x φ(x) (for tanh, the derivative of the approximation)."""
    grad, _ = cache
    return dy * grad
