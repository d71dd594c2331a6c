"""Reference: ``numformer.quantize.reference.quantized_linear_forward`` (y = x Ŵᵀ + b, Ŵ = s · q).

The speed path. Generating a token multiplies a handful of rows x by every weight matrix of the model, so
its time is the time to read the weights from memory: int8 weights are a quarter of the bytes of float32.
The reference would undo that, writing the whole float Ŵ to memory and reading it back; this kernel never
holds it. For a batch of up to ``SMALL_BATCH`` rows it walks the output rows in blocks small enough to stay
in the cache (``BLOCK_BYTES`` of float: four times a core's L2, in the L3; one buffer per thread, reused),
and for each block:

    B = float(q[rows])                       int8 -> float, written to the cache
    B *= s[rows, group]                      per group (one scale per row: applied to y instead, below)
    y[rows] = B @ xᵀ                         the BLAS, reading B from the cache (several rows of x: in pieces
                                             that its small-matrix kernels take, ``_runtime.few_rows_columns``)
    y[rows] *= s[rows]                       one scale per row: R × m products instead of R × K

so every weight byte comes from memory once per call, and the float block is read from cache. What is left per
weight is the conversion and the product: int8 is faster than float32 where reading four bytes from memory takes
longer than those two passes in the cache (``numformer bench quantize`` measures it). The output rows are shared
equally among numformer's threads (``_runtime.parallel_for``), each walking its share in blocks (``product_rows``),
with the BLAS on one thread inside them; inside ``worker_processes`` (``numformer.quantize.processes``) among
worker processes instead, whose hand-offs cost far less. A larger batch (a prompt's prefill, an evaluation)
dequantizes the matrix once and makes one product (``_runtime.matmul``). Summation order differs from the
reference's, so results agree to rounding (tests/test_quantize.py: float32 1e-5, float64 1e-12).
"""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import numpy as np

from .._runtime import blas_threads, few_rows_columns, get_num_threads, matmul, owns_blas, parallel_for
from . import reference
from .reference import group_width

__all__ = ["quantized_linear_forward", "dequantize", "quantize", "SMALL_BATCH", "BLOCK_BYTES", "l2_cache_bytes"]

SMALL_BATCH = 16                 # rows of x up to which the weight is dequantized block by block
ROW_UNIT = 8                     # the threads' shares of output rows are multiples of this
MIN_PIECE_WEIGHTS = 1 << 19      # no thread gets fewer weights (~0.1 ms of work: about what a handoff costs)
QUANTIZE_BLOCK_BYTES = 16 << 20  # ``quantize`` works on this many bytes of float rows at a time


def l2_cache_bytes(default=1 << 20):
    """The L2 cache of one core in bytes (Linux: sysfs; elsewhere, or unreadable: ``default``)."""
    try:
        for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
            if (index / "level").read_text(encoding="utf-8").strip() == "2":
                size = (index / "size").read_text(encoding="utf-8").strip().upper()
                unit = {"K": 1 << 10, "M": 1 << 20}.get(size[-1], 1)
                return int(size.rstrip("KM")) * unit
    except (OSError, ValueError):
        pass
    return default


# One float block: four times a core's L2 (4 MiB on a 1 MiB-L2 core), so it lives in the L3. Measured on an AMD
# EPYC with AVX-512 (L2 1 MiB/core, its model not recorded; ``numformer bench quantize``'s kernel table): with
# blocks of 1/4 to 1 L2 the conversion ran at ~0.14 ns a weight, with 2-8 MiB blocks at ~0.08 (the int8 rows
# are read in longer sequential runs, which the hardware prefetcher streams), and the product reads a block
# from the L3 as fast as from the L2 (~0.04 ns a weight). Larger blocks than the L3's share of a core fall out
# of it.
BLOCK_BYTES = 4 * l2_cache_bytes()

_buffers = threading.local()         # each thread's float block, reused across calls (grown when too small)
_product_pool = None                 # the active ``processes.WorkerProcesses`` (set and cleared by it), or None


def _block(rows, K, dtype):
    """This thread's (rows, K) float buffer of ``dtype``: one allocation per thread, not one per call."""
    key = np.dtype(dtype).str
    buf = getattr(_buffers, key, None)
    if buf is None or buf.size < rows * K:
        buf = np.empty(rows * K, dtype)
        setattr(_buffers, key, buf)
    return buf[:rows * K].reshape(rows, K)


def _block_rows(K, itemsize):
    """Output rows per block: BLOCK_BYTES of dequantized weight, a multiple of 8, at least 8."""
    return max(8, BLOCK_BYTES // (K * itemsize) // 8 * 8)


def _one_blas_thread():
    """The BLAS on one thread for the blocks' products (unless numformer owns it already, see
    ``numformer.set_fast_runtime``): the kernel splits the rows over numformer's threads itself, and a
    multithreaded BLAS waking its threads for each block's small product costs more than the product."""
    if owns_blas():
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


def _small_batch(x2, q, scales, g):
    """x2 Ŵᵀ for x2: (m, K), m small, block by block of R output rows (see the module docstring). One row
    (batch-1 decoding) is a matrix-vector product per block, straight into its slice of y. Inside
    ``numformer.quantize.worker_processes`` the rows are shared with the worker processes instead of threads."""
    m, K = x2.shape
    if _product_pool is not None:
        y = _product_pool.product(x2, q, scales, g)
        if y is not None:
            return y
    N = q.shape[0]
    xT = x2[0] if m == 1 else np.ascontiguousarray(x2.T)       # (K,) or (K, m)
    yT = np.empty((N,) if m == 1 else (N, m), x2.dtype)

    def rows(u0, u1):                                           # rows [u0, u1) · ROW_UNIT: one thread's share
        product_rows(q, scales, g, xT, yT, u0 * ROW_UNIT, min(u1 * ROW_UNIT, N))

    # Equal shares of rows, each walked in blocks: shares of whole blocks would leave a thread idle on a matrix
    # of fewer blocks than threads, and one waiting for another on a matrix of three.
    with _one_blas_thread():
        parallel_for(-(-N // ROW_UNIT), rows, max(1, -(-MIN_PIECE_WEIGHTS // (K * ROW_UNIT))))
    return yT.reshape(1, N) if m == 1 else np.ascontiguousarray(yT.T)


def product_rows(q, scales, g, xT, yT, lo, hi):
    """yT[lo:hi] = Ŵ[lo:hi] xT with Ŵ = s · q, in equal blocks of at most R rows (one thread's or one process's
    share of the rows; the BLAS on the calling thread).

    q: (N, K) int8   scales: (N, G)   xT: (K,) or (K, m)   yT: (N,) or (N, m), written in rows [lo, hi) only
    """
    if hi <= lo:
        return
    K, G = q.shape[1], scales.shape[1]
    R = _block_rows(K, yT.dtype.itemsize)
    step = -(-(hi - lo) // -(-(hi - lo) // R))                  # equal blocks of at most R rows
    block = _block(step, K, yT.dtype)
    # Several rows of x: products of `sub` rows of B at a time, which the BLAS's small-matrix kernels take
    # (x Ŵᵀ's columns are Ŵ's rows; ``_runtime.few_rows_columns``). One row: one matrix-vector product a block.
    sub = few_rows_columns(1 if yT.ndim == 1 else yT.shape[1], K) or step
    for r0 in range(lo, hi, step):
        r1 = min(r0 + step, hi)
        B = block[:r1 - r0]
        np.copyto(B, q[r0:r1], casting="unsafe")               # int8 -> float, into the cache-resident block
        if G > 1:
            _scale_groups(B, scales[r0:r1], g)
        for s0 in range(r0, r1, sub):                           # the BLAS reads B from the cache
            s1 = min(s0 + sub, r1)
            np.matmul(B[s0 - r0:s1 - r0], xT, out=yT[s0:s1])
    if G == 1:                                                  # one scale per row: on N × m sums, not N × K
        yT[lo:hi] *= scales[lo:hi, 0] if yT.ndim == 1 else scales[lo:hi]


def _scale_groups(B, scales, g):
    """B (n, K) *= each group of g columns' scale (scales (n, G)), in place; the last group may be shorter."""
    n, K = B.shape
    full = K // g * g
    if full:
        B[:, :full].reshape(n, full // g, g)[...] *= scales[:, :full // g, None]
    if full < K:
        B[:, full:] *= scales[:, -1:]


def dequantize(q, scales, group_size=None, dtype=None):
    """Ŵ = s · q as ``reference.dequantize``, in ``dtype`` (default the scales'), rows split across threads."""
    N, K = q.shape
    g = group_width(group_size, K)
    out = np.empty((N, K), np.dtype(dtype or scales.dtype))
    scales = scales.astype(out.dtype, copy=False)

    def rows(r0, r1):
        np.copyto(out[r0:r1], q[r0:r1], casting="unsafe")
        _scale_groups(out[r0:r1], scales[r0:r1], g)

    parallel_for(N, rows, max(1, (1 << 20) // K))
    return out


def quantize(W, bits=8, group_size=None):
    """``reference.quantize``, a block of rows at a time (``QUANTIZE_BLOCK_BYTES``): the same int8 weights and
    scales, since each row's scales are its own, but float temporaries of a block's size instead of several of
    the whole matrix's (quantizing a vocabulary-sized output layer while a model loads).

    W: (N, K) float   ->   q: (N, K) int8,  scales: (N, G) of W's dtype
    """
    W = np.asarray(W)
    if W.ndim != 2 or not np.issubdtype(W.dtype, np.floating) or W.shape[0] == 0:
        return reference.quantize(W, bits, group_size)                # its errors, or the empty matrix
    N, K = W.shape
    q = np.empty((N, K), np.int8)
    scales = np.empty((N, -(-K // group_width(group_size, K))), W.dtype)
    step = max(1, QUANTIZE_BLOCK_BYTES // max(1, K * W.itemsize))
    for r0 in range(0, N, step):
        q[r0:r0 + step], scales[r0:r0 + step] = reference.quantize(W[r0:r0 + step], bits, group_size)
    return q, scales
