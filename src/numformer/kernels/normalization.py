"""Reference: ``numformer.ops.normalization`` (``layer_norm_forward/backward``, ``rms_norm_forward/backward``).

The speed path of layer norm and RMS norm: rows split across numformer's threads (``parallel_for``), row
sums as BLAS matrix-vector products with a cached vector of ones, results written into preallocated
buffers. The batch-statistics norm has no kernel (the models run the reference).
"""
from __future__ import annotations

import numpy as np

from .._runtime import parallel_for
from ..ops._checks import with_features


def _ones(n, dtype):
    """A read-only vector of ones (row sums as BLAS matrix-vector products, several times faster than
    a reduction along a short last axis)."""
    key = (n, np.dtype(dtype).str)
    v = _ONES.get(key)
    if v is None:
        v = np.ones(n, dtype)
        v.setflags(write=False)
        if len(_ONES) > 64:
            _ONES.clear()
        _ONES[key] = v
    return v


_ONES = {}


# Rows per thread below which layer norm is not split (about 32K elements per piece).
def _row_grain(d):
    return max(1, 32768 // max(d, 1))


def layer_norm_forward(x, gamma, beta, eps=1e-5):
    """LayerNorm(x) = (x - μ) / √(σ² + ε) ⊙ γ + β, statistics over the last axis (``ops.layer_norm_forward``).

    x: (..., d)   gamma, beta: (d,) (beta may be None)   ->   y: (..., d)
    μ and σ² (biased) are computed per position, as in the paper and torch.
    Rows are split across threads (``numformer.set_num_threads``).
    """
    x = with_features(x, "layer_norm_forward")
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    n = x2.shape[0]
    dt = np.result_type(x, gamma)
    ones = _ones(d, dt)
    inv_d, eps_ = dt.type(1.0 / d), dt.type(eps)
    xhat = np.empty((n, d), dt)
    y = np.empty((n, d), dt)
    rstd = np.empty((n, 1), dt)
    mu = np.matmul(x2, ones)                                    # BLAS on this thread (see parallel_for)
    mu *= inv_d

    def piece(lo, hi):
        xp, xh, yp, rp = x2[lo:hi], xhat[lo:hi], y[lo:hi], rstd[lo:hi, 0]
        np.subtract(xp, mu[lo:hi, None], out=xh)                # x - μ, then x̂ in place
        var = np.einsum("nd,nd->n", xh, xh)                     # Σ (x - μ)², no temporary
        var *= inv_d
        var += eps_
        np.sqrt(var, out=var)
        np.reciprocal(var, out=rp)
        xh *= rp[:, None]
        np.multiply(xh, gamma, out=yp)
        if beta is not None:
            yp += beta

    parallel_for(n, piece, _row_grain(d))
    return y.reshape(x.shape), (xhat.reshape(x.shape), rstd.reshape(*x.shape[:-1], 1), gamma)


def _backward_start(dy, xhat, r, gamma):
    """What the layer-norm and RMSNorm backward passes share: the rows as 2-D views (dy, x̂, r), the buffers
    p = dy ⊙ x̂ (filled) and dx (empty), dgamma = Σ_rows p and mean(g ⊙ x̂) = (p γ) / d, with 1/d and the row
    grain of the threads."""
    d = xhat.shape[-1]
    dy2, xhat2, r2 = dy.reshape(-1, d), xhat.reshape(-1, d), r.reshape(-1, 1)
    n = dy2.shape[0]
    dt = np.result_type(dy2, xhat2)
    inv_d = dt.type(1.0 / d)
    grain = _row_grain(d)
    p = np.empty((n, d), dt)
    dx = np.empty((n, d), dt)

    def prod(lo, hi):
        np.multiply(dy2[lo:hi], xhat2[lo:hi], out=p[lo:hi])   # dy ⊙ x̂

    parallel_for(n, prod, grain)
    dgamma = np.matmul(_ones(n, dt), p)                         # BLAS products on this thread (see parallel_for)
    mean_gx = np.matmul(p, gamma)                               # Σ_d g ⊙ x̂
    mean_gx *= inv_d
    return dy2, xhat2, r2, p, dx, dgamma, mean_gx, inv_d, grain


def layer_norm_backward(dy, cache):
    """dx = (1/σ) (g - mean(g) - x̂ · mean(g ⊙ x̂)), with g = dy ⊙ γ (``ops.layer_norm_backward``).

    dy: (..., d)   ->   dx: (..., d)   dgamma, dbeta: (d,)
    Returns (dx, dgamma, dbeta), the parameter gradients summed over all
    leading axes. The row means of g and g ⊙ x̂ are matrix-vector products
    (dy γ and (dy ⊙ x̂) γ), so only dy ⊙ x̂ and dx are full passes.
    """
    xhat, rstd, gamma = cache
    dy2, xhat2, rstd2, p, dx, dgamma, mean_gx, inv_d, grain = _backward_start(dy, xhat, rstd, gamma)
    n = dy2.shape[0]
    dbeta = np.matmul(_ones(n, dx.dtype), dy2)
    mean_g = np.matmul(dy2, gamma)                              # Σ_d g
    mean_g *= inv_d

    def piece(lo, hi):
        pp, dyp, xh, dxp = p[lo:hi], dy2[lo:hi], xhat2[lo:hi], dx[lo:hi]
        np.multiply(dyp, gamma, out=dxp)                        # g
        np.multiply(xh, mean_gx[lo:hi, None], out=pp)
        dxp -= pp
        dxp -= mean_g[lo:hi, None]
        dxp *= rstd2[lo:hi]

    parallel_for(n, piece, grain)
    return dx.reshape(dy.shape), dgamma, dbeta


def rms_norm_forward(x, gamma, eps=1e-6):
    """RMSNorm(x) = x / √(mean(x²) + ε) ⊙ γ over the last axis (``ops.rms_norm_forward``).

    x: (..., d)   gamma: (d,)   ->   y: (..., d); the cache is (x̂, 1/rms, γ) as the reference's.
    mean(x²) is a row dot product (``einsum``, no x² temporary) accumulated in the inputs' dtype, as the
    reference; x̂ and y are written into preallocated buffers, rows split across threads.
    """
    x = with_features(x, "rms_norm_forward")
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    n = x2.shape[0]
    dt = np.result_type(x, gamma)
    inv_d, eps_ = dt.type(1.0 / d), dt.type(eps)
    xhat = np.empty((n, d), dt)
    y = np.empty((n, d), dt)
    rrms = np.empty((n, 1), dt)

    def piece(lo, hi):
        xp, rp = x2[lo:hi], rrms[lo:hi, 0]
        ms = np.einsum("nd,nd->n", xp, xp)                      # Σ x², no temporary
        ms *= inv_d
        ms += eps_
        np.sqrt(ms, out=ms)
        np.reciprocal(ms, out=rp)
        np.multiply(xp, rrms[lo:hi], out=xhat[lo:hi])
        np.multiply(xhat[lo:hi], gamma, out=y[lo:hi])

    parallel_for(n, piece, _row_grain(d))
    return y.reshape(x.shape), (xhat.reshape(x.shape), rrms.reshape(*x.shape[:-1], 1), gamma)


def rms_norm_backward(dy, cache):
    """dx = r (g - x̂ · mean(g ⊙ x̂)), r = 1/rms, g = dy ⊙ γ (``ops.rms_norm_backward``).

    dy: (..., d)   ->   dx: (..., d)   dgamma: (d,)
    Returns (dx, dgamma). With p = dy ⊙ x̂ (the one product both need), dgamma = Σ_rows p and
    mean(g ⊙ x̂) = (p γ) / d are BLAS matrix-vector products; dx is built in place in its own buffer.
    """
    xhat, rrms, gamma = cache
    dy2, xhat2, rrms2, p, dx, dgamma, mean_gx, inv_d, grain = _backward_start(dy, xhat, rrms, gamma)
    n = dy2.shape[0]

    def piece(lo, hi):
        pp, dxp = p[lo:hi], dx[lo:hi]
        np.multiply(dy2[lo:hi], gamma, out=dxp)                 # g
        np.multiply(xhat2[lo:hi], mean_gx[lo:hi, None], out=pp)
        dxp -= pp
        dxp *= rrms2[lo:hi]

    parallel_for(n, piece, grain)
    return dx.reshape(dy.shape), dgamma
