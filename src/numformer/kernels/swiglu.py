"""Reference: ``numformer.ops.swiglu`` (SiLU, and the gated product h = SiLU(a) ⊙ b of the SwiGLU feed-forward).

The speed path: σ(x) = 1 / (1 + exp(-x)) as the reference (float32 exp is twice as fast as tanh where NumPy
has no AVX-512 kernels, and as fast where it has; exp(-x) = inf for x below -88 gives σ = 0, its overflow
warning silenced), the derivative from the value as σ (1 - y) + y (= σ (1 + x (1 - σ)) with y = x σ), every
step written in place into the outputs, over chunks of ``CHUNK`` elements split across numformer's threads. Each
element is computed by the same operations whatever the split. The gated product computes SiLU, its
derivative and the product in one pass over each chunk, its backward both input gradients in one pass.
Inputs that are not float arrays of one shape and dtype run the reference.
"""
from __future__ import annotations

import numpy as np

from .._runtime import parallel_for
from ..ops import swiglu as reference

# Elements per pass (and per thread at least): large enough that a numpy call's fixed cost stays small
# (these passes are not limited by memory at this size: smaller chunks measured slower).
CHUNK = 131072


def _over_chunks(n, chunk_fn, scratch_dtype):
    """Call ``chunk_fn(start, stop, scratch)`` over [0, n) in chunks of CHUNK, split across threads;
    ``scratch`` is a chunk-sized buffer of ``scratch_dtype``."""
    def work(lo, hi):
        scratch = np.empty(min(hi - lo, CHUNK), scratch_dtype)
        for s in range(lo, hi, CHUNK):
            e = min(s + CHUNK, hi)
            chunk_fn(s, e, scratch[:e - s])

    parallel_for(n, work, CHUNK)


def _silu_chunk(xs, ys, ds, t):
    """SiLU(xs) into ys and SiLU'(xs) = σ (1 + x (1 - σ)) = σ (1 - y) + y into ds, with scratch t; all of one
    length."""
    one = xs.dtype.type(1)
    np.negative(xs, out=ds)
    with np.errstate(over="ignore"):
        np.exp(ds, out=ds)
    ds += one
    np.divide(one, ds, out=ds)                          # σ(x) = 1 / (1 + exp(-x))
    np.multiply(xs, ds, out=ys)                         # y = x σ
    np.subtract(1, ys, out=t)
    ds *= t
    ds += ys                                            # σ (1 - y) + y


def _plain(*arrays):
    """True when the arrays are float arrays of one shape and dtype (the kernels' case)."""
    a = arrays[0]
    return a.dtype.kind == "f" and all(b.shape == a.shape and b.dtype == a.dtype for b in arrays[1:])


def silu_forward(x):
    """SiLU(x) = x σ(x); the cache holds SiLU'(x) = σ(x) (1 + x (1 - σ(x))) (``ops.silu_forward``)."""
    x = np.asarray(x)
    if not _plain(x):
        return reference.silu_forward(x)
    xf = np.ascontiguousarray(x).reshape(-1)
    y, d = np.empty_like(xf), np.empty_like(xf)
    _over_chunks(xf.size, lambda s, e, t: _silu_chunk(xf[s:e], y[s:e], d[s:e], t), xf.dtype)
    return y.reshape(x.shape), d.reshape(x.shape)


def silu_backward(dy, cache):
    """dx = dy ⊙ SiLU'(x) (``ops.silu_backward``); large arrays split across threads."""
    dy = np.asarray(dy)
    if not _plain(dy, cache) or dy.size < 2 * CHUNK:
        return reference.silu_backward(dy, cache)
    a, b = np.ascontiguousarray(dy).reshape(-1), cache.reshape(-1)
    dx = np.empty_like(a)
    parallel_for(a.size, lambda lo, hi: np.multiply(a[lo:hi], b[lo:hi], out=dx[lo:hi]), CHUNK)
    return dx.reshape(cache.shape)


def silu_gate_forward(a, b):
    """h = SiLU(a) ⊙ b (``ops.silu_gate_forward``); the cache is (SiLU(a), SiLU'(a), b) as the reference's.

    a, b: (..., d_ff)   ->   h: (..., d_ff). SiLU, its derivative and the product in one pass per chunk.
    """
    a, b = np.asarray(a), np.asarray(b)
    if not _plain(a, b):
        return reference.silu_gate_forward(a, b)
    af, bf = np.ascontiguousarray(a).reshape(-1), np.ascontiguousarray(b).reshape(-1)
    h, g, d = np.empty_like(af), np.empty_like(af), np.empty_like(af)

    def chunk(s, e, t):
        _silu_chunk(af[s:e], g[s:e], d[s:e], t)
        np.multiply(g[s:e], bf[s:e], out=h[s:e])

    _over_chunks(af.size, chunk, af.dtype)
    shape = a.shape
    return h.reshape(shape), (g.reshape(shape), d.reshape(shape), bf.reshape(shape))


def silu_gate_backward(dh, cache):
    """da = dh ⊙ b ⊙ SiLU'(a), db = dh ⊙ SiLU(a) (``ops.silu_gate_backward``), written straight into two new
    arrays, the elements split across threads. Returns (da, db), each shaped as a."""
    g, d, b = cache
    dh = np.asarray(dh)
    if not _plain(dh, g, d, b):
        return reference.silu_gate_backward(dh, cache)
    dhf, gf, df, bf = np.ascontiguousarray(dh).reshape(-1), g.reshape(-1), d.reshape(-1), b.reshape(-1)
    da, db = np.empty_like(dhf), np.empty_like(dhf)

    def piece(lo, hi):
        np.multiply(dhf[lo:hi], bf[lo:hi], out=da[lo:hi])
        da[lo:hi] *= df[lo:hi]
        np.multiply(dhf[lo:hi], gf[lo:hi], out=db[lo:hi])

    parallel_for(dhf.size, piece, CHUNK)
    return da.reshape(g.shape), db.reshape(g.shape)
