"""Reference: ``numformer.ops.activations`` (ReLU, squared ReLU, GELU exact and tanh).

The speed path: ReLU, squared ReLU and the GELU backward split large arrays into chunks across numformer's
threads (``parallel_for``), the same operations on each element whatever the split; exact GELU in float32 runs the
chunked kernel ``kernels/fast_gelu.py``. Softmax has no kernel of its own: the models only need it inside
attention, where ``kernels/fused_attention.py`` runs it in place on the scores.
"""
from __future__ import annotations

import numpy as np

from .._runtime import parallel_for
from ..ops.activations import gelu_erf, gelu_tanh, relu_squared_forward as reference_relu_squared
from .fast_gelu import gelu_erf_f32

# Elements per pass of the chunked kernels (and per thread at least): a chunk's temporaries stay in L2.
_CHUNK = 32768


def relu_forward(x):
    """ReLU(x) = max(0, x), as ``ops.relu_forward``; large float arrays split across threads."""
    x = np.asarray(x)
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
    """dx = 0 where y = ReLU(x) <= 0, dy elsewhere (a NaN x passes dy on, as in PyTorch): ``ops.relu_backward``.

    A select done as a product of bit patterns: dy's bits, read as unsigned integers, times 1[y != 0] (y is >= 0
    or NaN) give each element dy or +0.0 exactly, where a floating-point 0 · dy would be NaN for an infinite or
    NaN dy, and np.where is several times slower.
    """
    y, dy = cache, np.asarray(dy)
    if dy.dtype != y.dtype or dy.shape != y.shape or dy.dtype.kind != "f" or dy.itemsize not in (2, 4, 8):
        return np.where(y <= 0, 0, dy).astype(dy.dtype, copy=False)
    yf = np.ascontiguousarray(y).reshape(-1)
    dx = np.empty_like(yf)
    bits = np.dtype(f"u{dx.itemsize}")            # an unsigned integer of the float's width
    dx_bits, dy_bits = dx.view(bits), np.ascontiguousarray(dy).reshape(-1).view(bits)

    def piece(lo, hi):
        passed = dx_bits[lo:hi]
        np.not_equal(yf[lo:hi], 0, out=passed, casting="unsafe")      # 1 where ReLU passed x on, else 0
        np.multiply(passed, dy_bits[lo:hi], out=passed)

    parallel_for(dx.size, piece, _CHUNK)
    return dx.reshape(dy.shape)


def gelu_forward(x, approximate="none"):
    """GELU(x) = x Φ(x), as ``ops.gelu_forward`` (same cache: the derivative and ``approximate``).

    Exact GELU in float32 runs ``gelu_erf_f32`` (within 1e-6 of the reference); every other case the
    reference formulas.
    """
    x = np.asarray(x)
    if approximate == "none":
        y, grad = gelu_erf_f32(x) if x.dtype == np.float32 else gelu_erf(x)
        return y, (grad, approximate)
    if approximate == "tanh":
        y, grad = gelu_tanh(x)
        return y, (grad, approximate)
    raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")


def gelu_backward(dy, cache):
    """dx = dy ⊙ GELU'(x), as ``ops.gelu_backward``; large arrays split across threads."""
    return _times_derivative(dy, cache[0])


def relu_squared_forward(x):
    """ReLU²(x) = max(0, x)², as ``ops.relu_squared_forward`` (same cache: the derivative 2 max(0, x)).

    Large float arrays are split across threads, each piece three passes written into the outputs:
    r = max(0, x) into the cache, y = r · r, then the cache doubled in place (r + r, exact).
    """
    x = np.asarray(x)
    if x.dtype.kind != "f" or x.size < 2 * _CHUNK:
        return reference_relu_squared(x)
    xf = np.ascontiguousarray(x).reshape(-1)
    y, grad = np.empty_like(xf), np.empty_like(xf)
    zero = x.dtype.type(0)

    def piece(lo, hi):
        r = grad[lo:hi]
        np.maximum(xf[lo:hi], zero, out=r)
        np.multiply(r, r, out=y[lo:hi])
        np.add(r, r, out=r)

    parallel_for(xf.size, piece, _CHUNK)
    return y.reshape(x.shape), grad.reshape(x.shape)


def relu_squared_backward(dy, cache):
    """dx = dy ⊙ 2 max(0, x), as ``ops.relu_squared_backward``; large arrays split across threads."""
    return _times_derivative(dy, cache)


def _times_derivative(dy, grad):
    """dy ⊙ grad (an activation's backward from its cached derivative), large arrays split across threads."""
    dy = np.asarray(dy)
    if dy.dtype != grad.dtype or dy.shape != grad.shape or dy.size < 2 * _CHUNK:
        return dy * grad
    dx = np.empty_like(grad)
    a, b, o = np.ascontiguousarray(dy).reshape(-1), np.ascontiguousarray(grad).reshape(-1), dx.reshape(-1)
    parallel_for(o.size, lambda lo, hi: np.multiply(a[lo:hi], b[lo:hi], out=o[lo:hi]), _CHUNK)
    return dx
