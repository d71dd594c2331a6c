"""Softmax, log-softmax, ReLU and GELU (exact and tanh)."""
from __future__ import annotations

import math

import numpy as np

from .._runtime import parallel_for
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

_SIGN_BIT = np.uint32(0x80000000)


def _gelu_erf_f32(x):
    """Exact GELU in float32 and its derivative, over L2-sized chunks split across threads.

    With u = x/√2 and e = exp(-u²) = exp(-x²/2), the A&S 7.1.26
    approximation gives erf(|u|) = 1 - P(t)·e (absolute error below 1.5e-7),
    t = 1/(1 + p|u|). Writing h = ½·P(t)·e and q = ½ - h ≥ 0:

        Φ(x) = ½(1 + erf(u)) = ½ + sign(x)·q         GELU(x) = x·Φ(x)
        GELU'(x) = Φ(x) + x·φ(x),   φ(x) = e/√(2π)

    The same e serves the value and the derivative (computed here, so that
    backward is one multiply). t = t'/p' with t' = 1/(|x| + 1/p'), p' = p/√2, and
    the powers of 1/p' and the ½ are folded into the coefficients; sign(x)·q is
    q with x's sign bit (integer ops; np.copysign is several times slower).
    Returns (y, dy/dx), both shaped as x.
    """
    dt = x.dtype.type
    p1 = 0.3275911 * _SQRT_HALF
    b1, b2, b3, b4, b5 = (dt(0.5 * c / p1 ** (k + 1)) for k, c in
                          enumerate((0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)))
    inv_p, half, mhalf, c_pdf = dt(1.0 / p1), dt(0.5), dt(-0.5), dt(_INV_SQRT_2PI)
    xf = np.ascontiguousarray(x).reshape(-1)
    n = xf.size
    y = np.empty_like(xf)
    g = np.empty_like(xf)

    def work(start, stop):
        size = min(stop - start, _CHUNK)
        t_buf = np.empty(size, xf.dtype)
        e_buf = np.empty(size, xf.dtype)
        s_buf = np.empty(size, np.uint32)
        for s in range(start, stop, _CHUNK):
            end = min(s + _CHUNK, stop)
            m = end - s
            xs, ys, gs, t, e, sb = xf[s:end], y[s:end], g[s:end], t_buf[:m], e_buf[:m], s_buf[:m]
            np.square(xs, out=e)
            e *= mhalf
            np.exp(e, out=e)                                   # e = exp(-x²/2)
            np.abs(xs, out=t)
            t += inv_p
            np.reciprocal(t, out=t)                            # t' = 1/(|x| + 1/p')
            np.multiply(t, b5, out=gs)                         # h = ½ P(t) e, Horner in t'
            gs += b4
            gs *= t
            gs += b3
            gs *= t
            gs += b2
            gs *= t
            gs += b1
            gs *= t
            gs *= e
            np.subtract(half, gs, out=gs)                      # q = ½ - h
            np.bitwise_and(xs.view(np.uint32), _SIGN_BIT, out=sb)
            gu = gs.view(np.uint32)
            np.bitwise_or(gu, sb, out=gu)                      # sign(x)·q
            gs += half                                         # Φ(x)
            np.multiply(xs, gs, out=ys)                        # GELU(x) = x Φ(x)
            e *= c_pdf
            e *= xs
            gs += e                                            # Φ(x) + x φ(x)

    parallel_for(n, work, _CHUNK)
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
    if dy.dtype != grad.dtype or dy.shape != grad.shape or dy.size < 2 * _CHUNK:
        return dy * grad
    dx = np.empty_like(grad)
    a, b, o = dy.reshape(-1), grad.reshape(-1), dx.reshape(-1)
    parallel_for(o.size, lambda lo, hi: np.multiply(a[lo:hi], b[lo:hi], out=o[lo:hi]), _CHUNK)
    return dx
