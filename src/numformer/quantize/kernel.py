"""Reference: ``numformer.quantize.reference.quantized_linear_forward`` (y = x Ŵᵀ + b, Ŵ = s · q).

The speed path. Generating a token multiplies a handful of rows x by every weight matrix of the model, so
its time is the time to read the weights from memory: int8 weights are a quarter of the bytes of float32.
The reference would undo that, writing the whole float Ŵ to memory and reading it back; this kernel never
holds it. For a batch of up to ``SMALL_BATCH`` rows it walks the output rows in blocks small enough to stay
in the core's cache (``BLOCK_BYTES`` of float), and for each block:

    B = float(q[rows])                       int8 -> float, laid out (G, R, g): group j's columns together
    P = B @ x_j                              one product per group: P[j] = q[rows, group j] x[group j]ᵀ
    y[rows] = Σ_j s[rows, j] · P[j]          the scales applied to R × m sums instead of R × K weights

so every weight byte comes from memory once per call, and the float block is read from cache. The blocks
are shared among numformer's threads (``_runtime.parallel_for``), with the BLAS on one thread inside
them. A larger batch (a prompt's prefill, an evaluation) dequantizes the matrix once and makes one
product (``_runtime.matmul``). Summation order differs from the reference's, so results agree to rounding
(tests/test_quantize.py: float32 1e-5, float64 1e-12).
"""
from __future__ import annotations

import contextlib

import numpy as np

from .._runtime import blas_threads, get_num_threads, matmul, owns_blas, parallel_for
from .reference import group_width

__all__ = ["quantized_linear_forward", "dequantize", "SMALL_BATCH", "BLOCK_BYTES"]

SMALL_BATCH = 16                 # rows of x up to which the weight is dequantized block by block
BLOCK_BYTES = 512 * 1024         # bytes of one dequantized float block (a share of a core's L2 cache)


def _block_rows(K, itemsize):
    """Output rows per block: BLOCK_BYTES of dequantized weight, a multiple of 8, at least 8."""
    return max(8, BLOCK_BYTES // (K * itemsize) // 8 * 8)


def _one_blas_thread():
    """The BLAS on one thread while numformer's threads each call it (when numformer does not own it already,
    see ``numformer.set_fast_runtime``): two threads calling a multithreaded BLAS oversubscribe the cores."""
    if owns_blas() or get_num_threads() == 1:
        return contextlib.nullcontext()
    return blas_threads(1)


def quantized_linear_forward(x, q, scales, group_size=None, b=None):
    """y = x Ŵᵀ + b with Ŵ = s · q, as ``reference.quantized_linear_forward``, without materializing Ŵ
    for a small batch.

    x: (..., K)   q: (N, K) int8   scales: (N, G)   b: (N,) or None   ->   y: (..., N)
    """
    N, K = q.shape
    g = group_width(group_size, K)
    x2 = x.reshape(-1, K)
    dtype = np.result_type(x2.dtype, scales.dtype)
    scales = scales.astype(dtype, copy=False)
    if x2.shape[0] <= SMALL_BATCH:
        y = _small_batch(x2.astype(dtype, copy=False), q, scales, g)
    else:
        y = matmul(x2.astype(dtype, copy=False), dequantize(q, scales, g).T)
    if b is not None:
        y += b
    return y.reshape(*x.shape[:-1], N)


def _grouped(a, g):
    """a: (n, K) -> (G, n, g): group j's columns of every row together; zeros past K in the last group."""
    n, K = a.shape
    G = -(-K // g)
    out = np.zeros((G, n, g), a.dtype)
    return _copy_grouped(out, a, g)


def _copy_grouped(out, a, g):
    """Write a: (n, K) into out: (G, ≥n, g) as ``_grouped`` lays it out (converting the dtype); returns out[:, :n].
    The last group's columns past K are left as they are (zeros from ``_grouped`` or the caller)."""
    n, K = a.shape
    full = K // g * g
    dst = out[:, :n]
    if full:
        np.copyto(dst[:full // g], a[:, :full].reshape(n, full // g, g).transpose(1, 0, 2), casting="unsafe")
    if full < K:
        np.copyto(dst[-1, :, :K - full], a[:, full:], casting="unsafe")
    return dst


def _small_batch(x2, q, scales, g):
    """x2 Ŵᵀ for x2: (m, K), m small, block by block of output rows (see the module docstring)."""
    m, K = x2.shape
    N, G = scales.shape
    xg = _grouped(x2, g).transpose(0, 2, 1).copy()              # group j of x: xg[j] (g, m)
    sT = np.ascontiguousarray(scales.T)                         # (G, N)
    yT = np.empty((N, m), x2.dtype)
    R = _block_rows(G * g, x2.dtype.itemsize)

    def rows(b0, b1):
        block = np.zeros((G, R, g), x2.dtype)                  # the last group's padding stays zero
        sums = np.empty((G, R, m), x2.dtype)
        for r0 in range(b0 * R, min(b1 * R, N), R):
            r1 = min(r0 + R, N)
            B, P = _copy_grouped(block, q[r0:r1], g), sums[:, :r1 - r0]
            np.matmul(B, xg, out=P)                             # P[j] = q[rows, group j] · x[group j]ᵀ
            if G == 1:
                np.multiply(P[0], sT[0, r0:r1, None], out=yT[r0:r1])
            else:
                np.einsum("grm,gr->rm", P, sT[:, r0:r1], out=yT[r0:r1])

    with _one_blas_thread():
        parallel_for(-(-N // R), rows, 1)
    return np.ascontiguousarray(yT.T) if m > 1 else yT.reshape(1, N)


def dequantize(q, scales, group_size=None, dtype=None):
    """Ŵ = s · q as ``reference.dequantize``, in ``dtype`` (default the scales'), rows split across threads."""
    N, K = q.shape
    g = group_width(group_size, K)
    full = K // g * g
    dtype = np.dtype(dtype or scales.dtype)
    out = np.empty((N, K), dtype)
    scales = scales.astype(dtype, copy=False)

    def rows(r0, r1):
        n = r1 - r0
        if full:
            blk = out[r0:r1, :full].reshape(n, full // g, g)
            np.copyto(blk, q[r0:r1, :full].reshape(n, full // g, g), casting="unsafe")
            blk *= scales[r0:r1, :full // g, None]
        if full < K:
            np.multiply(q[r0:r1, full:], scales[r0:r1, -1:], out=out[r0:r1, full:])

    parallel_for(N, rows, max(1, (1 << 20) // K))
    return out
