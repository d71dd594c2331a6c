"""Reference: ``numformer.ops.normalization`` (``layer_norm_forward/backward``, ``rms_norm_forward/backward``).

The speed path of layer norm and RMS norm: rows split across numformer's threads (``parallel_for``), row
sums as BLAS matrix-vector products with a cached vector of ones, results written into preallocated
buffers. Two more things keep the passes over memory few and fast:

* a product by γ along the rows is made over rows k at a time, (n/k, k·d) against γ tiled k times, with
  k·d at least NumPy's ufunc buffer (``_along_rows``): NumPy broadcasts a (d,) vector over rows shorter
  than its buffer one short inner loop at a time, about 1.5x slower than a plain product;
* a per-row scale r times γ is one BLAS product of rank 2, r ⊗ γ (``_outer``), after which the product
  by it is a plain one instead of two broadcast ones: layer norm's y = (x - μ) ⊙ (r ⊗ γ) (its cache holds
  x - μ, not x̂) and both backward passes' r g = dy ⊙ (r ⊗ γ).

The batch-statistics norm has no kernel (the models run the reference).
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


def _row_dots(a, b):
    """Σ_d a ⊙ b per row: (n, d), (n, d) -> (n,), with no temporary (``np.vecdot``; NumPy 1.x: ``einsum``)."""
    if _VECDOT is not None:
        return _VECDOT(a, b)
    return np.einsum("nd,nd->n", a, b)


_VECDOT = getattr(np, "vecdot", None)


def _tiled(v, n):
    """v: (d,) -> (k, d), v repeated over k rows, k·d >= NumPy's ufunc buffer size (k <= n): the operand of
    ``_along_rows``."""
    d = v.shape[0]
    k = max(1, min(n, -(-np.getbufsize() // max(d, 1))))
    out = np.empty((k, d), v.dtype)
    out[...] = v
    return out


def _along_rows(op, a, vk, out):
    """out = op(a, v) with v along the rows: a, out (n, d) C-contiguous, vk = ``_tiled(v, ·)`` (k, d), op a
    binary ufunc. The first n - n mod k rows are taken k at a time, as (n/k, k·d) against the k·d elements of
    vk (one long inner loop per k rows), the rest against v."""
    n, d = a.shape
    k = vk.shape[0]
    m = n - n % k
    if m:
        op(a[:m].reshape(m // k, k * d), vk.reshape(k * d), out=out[:m].reshape(m // k, k * d))
    if m < n:
        op(a[m:], vk[0], out=out[m:])


def _outer(a, b):
    """a ⊗ b: (n,), (d,) -> (n, d), element (i, j) the rounded a_i·b_j, as a BLAS product of inner dimension
    2, [a, 0] · [b; 1] (one rounding: adding 0·1 is exact). NumPy's matmul of inner dimension 1, np.outer and
    a broadcast product all loop per row, several times slower."""
    dt = np.result_type(a, b)
    a2 = np.zeros((a.shape[0], 2), dt)
    a2[:, 0] = a
    b2 = np.ones((2, b.shape[0]), dt)
    b2[0] = b
    return np.matmul(a2, b2)


def layer_norm_forward(x, gamma, beta, eps=1e-5):
    """LayerNorm(x) = (x - μ) / √(σ² + ε) ⊙ γ + β, statistics over the last axis (``ops.layer_norm_forward``).

    x: (..., d)   gamma, beta: (d,) (beta may be None)   ->   y: (..., d)
    μ and σ² (biased) are computed per position, as in the paper and torch: μ = (x · 1)/d on the BLAS,
    σ² = Σ_d (x - μ)² / d a row dot product, y = (x - μ) ⊙ (1/σ ⊗ γ) (+ β along the rows, ``_along_rows``) with
    1/σ ⊗ γ one BLAS product (``_outer``). The cache is (x - μ, 1/σ, γ): x̂ = (x - μ)/σ is never formed
    (``layer_norm_backward`` folds 1/σ into its row factors). Rows are split across threads
    (``numformer.set_num_threads``).
    """
    x = with_features(x, "layer_norm_forward")
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    n = x2.shape[0]
    dt = np.result_type(x, gamma)
    inv_d, eps_ = dt.type(1.0 / d), dt.type(eps)
    grain = _row_grain(d)
    xc = np.empty((n, d), dt)
    rstd = np.empty(n, dt)
    mu = np.matmul(x2, _ones(d, dt))                            # BLAS on this thread (see parallel_for)
    mu *= inv_d

    def stats(lo, hi):
        xcp, var = xc[lo:hi], rstd[lo:hi]
        np.subtract(x2[lo:hi], mu[lo:hi, None], out=xcp)        # x - μ
        np.divide(_row_dots(xcp, xcp), d, out=var)              # σ² = Σ (x - μ)² / d, no temporary
        var += eps_
        np.sqrt(var, out=var)
        np.reciprocal(var, out=var)                             # 1/σ

    parallel_for(n, stats, grain)
    y = _outer(rstd, np.asarray(gamma, dt))                     # 1/σ ⊗ γ, on this thread
    bk = None if beta is None else _tiled(np.asarray(beta), n)

    def scale(lo, hi):
        yp = y[lo:hi]
        yp *= xc[lo:hi]
        if bk is not None:
            _along_rows(np.add, yp, bk, yp)

    parallel_for(n, scale, grain)
    return y.reshape(x.shape), (xc.reshape(x.shape), rstd.reshape(*x.shape[:-1], 1), gamma)


def _backward_start(dy, z, r, gamma):
    """What the layer-norm and RMSNorm backward passes share, on the rows as 2-D views dy (n, d), z (n, d) (the
    cached x - μ or x̂), r (n,): the buffer dx (n, d) holding p = dy ⊙ z (the caller's dgamma is a BLAS product of
    it, then it overwrites it), Σ_d g ⊙ z = p γ (BLAS), s = r ⊗ γ (n, d) (``_outer``), 1/d and the row grain of
    the threads."""
    d = z.shape[-1]
    dy2, z2, r1 = dy.reshape(-1, d), z.reshape(-1, d), r.reshape(-1)
    n = dy2.shape[0]
    dt = np.result_type(dy2, z2)
    grain = _row_grain(d)
    dx = np.empty((n, d), dt)

    def prod(lo, hi):
        np.multiply(dy2[lo:hi], z2[lo:hi], out=dx[lo:hi])      # p = dy ⊙ z

    parallel_for(n, prod, grain)
    sum_gz = np.matmul(dx, gamma)                               # BLAS products on this thread (see parallel_for)
    s = _outer(r1, np.asarray(gamma, dt))                       # r ⊗ γ: r g = dy ⊙ s
    return dy2, z2, r1, dx, s, sum_gz, dt.type(1.0 / d), grain


def layer_norm_backward(dy, cache):
    """dx = (1/σ) (g - mean(g) - x̂ · mean(g ⊙ x̂)), with g = dy ⊙ γ (``ops.layer_norm_backward``).

    dy: (..., d)   ->   dx: (..., d)   dgamma, dbeta: (d,)
    Returns (dx, dgamma, dbeta), the parameter gradients summed over all leading axes. From the forward's cache
    (x - μ, r = 1/σ, γ), with x̂ = (x - μ) r: dgamma = r · (dy ⊙ (x - μ)) and dbeta = 1 · dy over the rows,
    dx = dy ⊙ (r ⊗ γ) - (x - μ) ⊙ (r³ Σ_d g ⊙ (x - μ) / d) - r Σ_d g / d; the row sums are BLAS
    matrix-vector products, so dy ⊙ (x - μ), r ⊗ γ and the three steps of dx are the full passes.
    """
    xc, rstd, gamma = cache
    dy2, xc2, r, dx, s, c_gx, inv_d, grain = _backward_start(dy, xc, rstd, gamma)
    n = dy2.shape[0]
    dgamma = np.matmul(r, dx)                                   # Σ_rows dy ⊙ x̂
    dbeta = np.matmul(_ones(n, dx.dtype), dy2)
    r_d = r * inv_d
    c_g = np.matmul(dy2, gamma)                                 # Σ_d g
    c_g *= r_d                                                  # r mean(g)
    r_d *= r
    r_d *= r
    c_gx *= r_d                                                 # r³ Σ_d g ⊙ (x - μ) / d = r mean(g ⊙ x̂) / σ

    def piece(lo, hi):
        dxp, sp = dx[lo:hi], s[lo:hi]
        np.multiply(dy2[lo:hi], sp, out=dxp)                    # r g
        np.multiply(xc2[lo:hi], c_gx[lo:hi, None], out=sp)      # r x̂ mean(g ⊙ x̂)
        dxp -= sp
        dxp -= c_g[lo:hi, None]

    parallel_for(n, piece, grain)
    return dx.reshape(dy.shape), dgamma, dbeta


def rms_norm_forward(x, gamma, eps=1e-6):
    """RMSNorm(x) = x / √(mean(x²) + ε) ⊙ γ over the last axis (``ops.rms_norm_forward``).

    x: (..., d)   gamma: (d,)   ->   y: (..., d); the cache is (x̂, 1/rms, γ) as the reference's.
    mean(x²) is a row dot product (no x² temporary) accumulated in the inputs' dtype, as the reference; x̂ and
    y = x̂ ⊙ γ (along the rows k at a time, ``_along_rows``) are written into preallocated buffers, rows split
    across threads.
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
    gk = _tiled(np.asarray(gamma, dt), n)

    def piece(lo, hi):
        xp, rp = x2[lo:hi], rrms[lo:hi]
        ms = _row_dots(xp, xp)                                  # Σ x², no temporary
        ms *= inv_d
        ms += eps_
        np.sqrt(ms, out=ms)
        np.reciprocal(ms, out=rp[:, 0])
        np.multiply(xp, rp, out=xhat[lo:hi])
        _along_rows(np.multiply, xhat[lo:hi], gk, y[lo:hi])

    parallel_for(n, piece, _row_grain(d))
    return y.reshape(x.shape), (xhat.reshape(x.shape), rrms.reshape(*x.shape[:-1], 1), gamma)


def rms_norm_backward(dy, cache):
    """dx = r (g - x̂ · mean(g ⊙ x̂)), r = 1/rms, g = dy ⊙ γ (``ops.rms_norm_backward``).

    dy: (..., d)   ->   dx: (..., d)   dgamma: (d,)
    Returns (dx, dgamma). With p = dy ⊙ x̂ (the one product both need), dgamma = Σ_rows p and
    mean(g ⊙ x̂) = (p γ) / d are BLAS matrix-vector products; dx = dy ⊙ (r ⊗ γ) - x̂ ⊙ (r mean(g ⊙ x̂)) is built
    in place in its own buffer.
    """
    xhat, rrms, gamma = cache
    dy2, xhat2, r, dx, s, c_gx, inv_d, grain = _backward_start(dy, xhat, rrms, gamma)
    dgamma = np.matmul(_ones(dy2.shape[0], dx.dtype), dx)      # Σ_rows dy ⊙ x̂
    c_gx *= r
    c_gx *= inv_d                                               # r mean(g ⊙ x̂)

    def piece(lo, hi):
        dxp, sp = dx[lo:hi], s[lo:hi]
        np.multiply(dy2[lo:hi], sp, out=dxp)                    # r g
        np.multiply(xhat2[lo:hi], c_gx[lo:hi, None], out=sp)
        dxp -= sp

    parallel_for(dy2.shape[0], piece, grain)
    return dx.reshape(dy.shape), dgamma
