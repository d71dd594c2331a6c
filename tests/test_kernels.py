"""The speed path (numformer.kernels): each kernel against the reference op it speeds up (numformer.ops; float64
to 1e-12, float32 within the stated tolerance, the same masks and shapes), gradients by finite differences
(float64), results that do not depend on how the work is split across threads, and whole models trained on
both paths (numformer.reference_mode)."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

import numformer
from numformer import _runtime, kernels, ops
from numformer.gradcheck import check_gradients
from numformer.kernels import activations as act_kernels
from numformer.kernels import fast_gelu
from numformer.kernels import fused_attention as attn_ops
from numformer.kernels import normalization as norm_ops
from numformer.kernels import swiglu as swiglu_kernels

from conftest import assert_close, assert_gradcheck


@pytest.fixture
def threads():
    """Set numformer's thread count inside a test; restored afterwards."""
    before = _runtime.get_num_threads()
    yield _runtime.set_num_threads
    _runtime.set_num_threads(before)


@pytest.fixture
def split_everything(monkeypatch, threads):
    """Force the smallest split grains so that tiny test inputs are split across 3 threads."""
    threads(3)
    monkeypatch.setattr(attn_ops, "_split_grain", lambda lead, t_q, t_k: 1)
    monkeypatch.setattr(attn_ops, "CAUSAL_BLOCK", 2)              # causal attention in blocks of 2 queries
    monkeypatch.setattr(attn_ops, "FEW_QUERIES", 0)               # ... each with the unshifted softmax
    monkeypatch.setattr(norm_ops, "_row_grain", lambda d: 1)
    monkeypatch.setattr(act_kernels, "_CHUNK", 7)
    monkeypatch.setattr(fast_gelu, "CHUNK", 7)
    monkeypatch.setattr(swiglu_kernels, "CHUNK", 7)


# -- runtime ---------------------------------------------------------------------------------------------

def test_set_fast_runtime_is_idempotent_and_reports(native_blas_afterwards):
    first = numformer.set_fast_runtime()
    second = numformer.set_fast_runtime()
    assert first == second and "malloc" in first and "blas" in first
    status = _runtime.fast_runtime_status()
    assert status["threads"] >= 1
    with pytest.raises(ValueError, match="blas must be"):
        numformer.set_fast_runtime(blas="mkl")


@pytest.mark.skipif(_runtime._libc() is None, reason="glibc's malloc_trim")
def test_release_free_memory_gives_the_heap_s_free_pages_back():
    """Under set_fast_runtime's malloc settings, 256 MB of freed 4 MB arrays stay resident (the heap keeps them
    for reuse); release_free_memory gives them back to the system. In a fresh process (mallopt is global)."""
    import subprocess
    import sys

    script = """
import numpy as np, numformer
from numformer import _runtime
numformer.set_fast_runtime(blas=None)
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
arrays = [np.ones(1 << 20, np.float32) for _ in range(64)]
held = resident()
del arrays
freed = resident()
assert _runtime.release_free_memory()
print(held - freed, freed - resident())
"""
    kept, released = map(int, subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                             check=True).stdout.split())
    assert kept < 64 << 20 and released > 192 << 20, (kept, released)


@pytest.mark.skipif(_runtime._openblas_thread_functions() is None, reason="needs OpenBLAS thread control")
def test_products_split_by_numformer_equal_unsplit_ones(rng, threads, native_blas_afterwards, monkeypatch):
    """Row blocks of a split product equal the whole product up to float32 rounding: bit for bit with some BLAS
    kernels (OpenBLAS on Intel Skylake), not with others (OpenBLAS's Haswell/Zen kernels round a block of 50
    rows differently from a block of 150). A given split is deterministic."""
    x = rng.standard_normal((3, 50, 24)).astype(np.float32)
    W = rng.standard_normal((40, 24)).astype(np.float32)
    dy = rng.standard_normal((3, 50, 40)).astype(np.float32)
    numformer.set_fast_runtime(blas="native")
    assert not _runtime.owns_blas()
    y0, c0 = kernels.linear_forward(x, W)
    g0 = kernels.linear_backward(dy, c0)
    numformer.set_fast_runtime(blas="numformer")
    assert _runtime.owns_blas()
    threads(3)
    monkeypatch.setattr(_runtime, "MATMUL_GRAIN", 64)            # split even these small products
    y1, c1 = kernels.linear_forward(x, W)
    g1 = kernels.linear_backward(dy, c1)
    close = {"rtol": 1e-5, "atol": 1e-5}                         # entries are sums of 24 to 150 products
    np.testing.assert_allclose(y1, y0, **close)
    np.testing.assert_allclose(g1[0], g0[0], **close)
    np.testing.assert_allclose(g1[1], g0[1], **close)
    y1_again, _ = kernels.linear_forward(x, W)
    assert np.array_equal(y1, y1_again)                           # the same split gives the same bits
    threads(2)                                                    # dx and dW at the same time, one per thread
    g2 = kernels.linear_backward(dy, c1)
    np.testing.assert_allclose(g2[0], g0[0], **close)
    np.testing.assert_allclose(g2[1], g0[1], **close)
    numformer.set_fast_runtime(blas="native")
    assert not _runtime.owns_blas()


@pytest.mark.skipif(_runtime._openblas_thread_functions() is None, reason="needs OpenBLAS thread control")
@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_products_with_few_rows_are_split_by_columns(rng, threads, native_blas_afterwards, monkeypatch, rows, dtype,
                                                     tol):
    """A decoding step's product (a batch of rows times the weights): each thread computes its own columns,
    reading its own part of the weights, and the result is the whole product's."""
    x = rng.standard_normal((rows, 48)).astype(dtype)
    W = rng.standard_normal((301, 48)).astype(dtype)
    numformer.set_fast_runtime(blas="numformer")
    threads(3)
    monkeypatch.setattr(_runtime, "MATMUL_GRAIN", 64)
    pieces = []
    split = _runtime.parallel_for
    monkeypatch.setattr(_runtime, "parallel_for", lambda n, fn, grain: split(n, lambda lo, hi: pieces.append(
        (lo, hi)) or fn(lo, hi), grain))
    y = _runtime.matmul(x, W.T)
    assert sorted(pieces) == [(0, 100), (100, 200), (200, 301)]                  # three column blocks
    assert y.dtype == dtype and np.abs(y - x @ W.T).max() <= tol * np.abs(x @ W.T).max()


def test_few_rows_columns_keeps_each_product_within_the_small_matrix_kernels(monkeypatch):
    """2 to FEW_ROWS rows: blocks of columns with m·n·k <= 100³ and m·n <= 1200 (OpenBLAS's limits), a multiple of
    8; none for one row (a matrix-vector product), more than FEW_ROWS, too long a k, or a BLAS without them."""
    monkeypatch.setattr(_runtime, "small_kernels", lambda: True)
    assert _runtime.few_rows_columns(8, 1024) == 120                     # 10⁶ / (8 · 1024) = 122
    assert _runtime.few_rows_columns(8, 768) == 144                      # 1200 / 8 = 150 binds first
    assert _runtime.few_rows_columns(16, 3072) == 16
    assert [_runtime.few_rows_columns(m, 1024) for m in (1, 17)] == [0, 0]
    assert _runtime.few_rows_columns(16, 10 ** 5) == 0                   # under 8 columns
    for m, k in [(2, 64), (5, 999), (16, 768)]:
        cols = _runtime.few_rows_columns(m, k)
        assert cols % 8 == 0 and m * cols * k <= 100 ** 3 and m * cols <= 1200
        assert m * (cols + 8) * k > 100 ** 3 or m * (cols + 8) > 1200     # the widest such block
    monkeypatch.setattr(_runtime, "small_kernels", lambda: False)
    assert _runtime.few_rows_columns(8, 1024) == 0


@pytest.mark.skipif(_runtime._openblas_thread_functions() is None, reason="needs OpenBLAS thread control")
@pytest.mark.parametrize("n_threads", [1, 3])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_products_with_few_rows_take_the_small_matrix_kernels(rng, threads, native_blas_afterwards, monkeypatch,
                                                              n_threads, dtype, tol):
    """Where the BLAS has small-matrix kernels, each thread's columns (all of them on one thread) are multiplied
    in blocks of ``few_rows_columns``, the last one shorter; the result is the whole product's."""
    x = rng.standard_normal((8, 48)).astype(dtype)
    W = rng.standard_normal((301, 48)).astype(dtype)
    numformer.set_fast_runtime(blas="numformer")
    threads(n_threads)
    monkeypatch.setattr(_runtime, "MATMUL_GRAIN", 64)
    monkeypatch.setattr(_runtime, "small_kernels", lambda: True)
    monkeypatch.setattr(_runtime, "SMALL_MNK", 8 * 48 * 24)            # blocks of 24 columns
    blocks, product = [], _runtime.column_blocks
    monkeypatch.setattr(_runtime, "column_blocks", lambda a, b, out, lo, hi, cols: blocks.append(
        (lo, hi, cols)) or product(a, b, out, lo, hi, cols))
    y = _runtime.matmul(x, W.T)
    assert sorted(blocks) == ([(0, 301, 24)] if n_threads == 1 else [(0, 100, 24), (100, 200, 24), (200, 301, 24)])
    assert y.dtype == dtype and np.abs(y - x @ W.T).max() <= tol * np.abs(x @ W.T).max()
    blocks.clear()
    monkeypatch.setattr(_runtime, "small_kernels", lambda: False)        # no such kernels: whole products
    y = _runtime.matmul(x, W.T)
    assert all(cols == hi - lo for lo, hi, cols in blocks)
    assert np.abs(y - x @ W.T).max() <= tol * np.abs(x @ W.T).max()


def test_parallel_for_covers_the_range_once_and_propagates_errors(threads):
    threads(4)
    seen = np.zeros(103, dtype=int)

    def fill(lo, hi):
        seen[lo:hi] += 1

    _runtime.parallel_for(103, fill, grain=10)
    assert (seen == 1).all()

    def boom(lo, hi):
        if lo > 0:
            raise RuntimeError("piece failed")

    with pytest.raises(RuntimeError, match="piece failed"):
        _runtime.parallel_for(100, boom, grain=10)

    def boom_on_the_calling_thread(lo, hi):
        if lo == 0:
            raise RuntimeError("first piece failed")
        time.sleep(0.01)                     # the other pieces finish after the caller's error

    with pytest.raises(RuntimeError, match="first piece failed"):
        _runtime.parallel_for(100, boom_on_the_calling_thread, grain=10)
    for _ in range(20):                      # the workers are handed back ready: no piece skipped or run twice
        seen[:] = 0
        _runtime.parallel_for(103, fill, grain=10)
        assert (seen == 1).all()
    with pytest.raises(ValueError):
        _runtime.set_num_threads(0)


def test_parallel_for_from_several_threads_at_once(threads):
    """Callers on other threads (a server's requests, a user's own threads) each get their own workers."""
    import threading

    threads(3)
    results = {}

    def caller(c):
        out = np.zeros(600, dtype=int)
        for _ in range(30):
            _runtime.parallel_for(600, lambda lo, hi: out.__setitem__(slice(lo, hi), out[lo:hi] + 1), grain=50)
        results[c] = out

    callers = [threading.Thread(target=caller, args=(c,)) for c in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=60)
    assert sorted(results) == [0, 1, 2, 3] and all((out == 30).all() for out in results.values())


# -- GELU -----------------------------------------------------------------------------------------------

def _gelu64(x):
    x = x.astype(np.float64)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return x * cdf, cdf + x * pdf


def test_gelu_float32_kernel_matches_exact_gelu():
    x = np.concatenate([np.linspace(-12, 12, 200_001), [0.0, -0.0, 1e-30, -1e-30, 1e-8, 40.0, -40.0]])
    x = x.astype(np.float32)
    y, (g, _) = kernels.gelu_forward(x)
    y64, g64 = _gelu64(x)
    assert y.dtype == np.float32 and g.dtype == np.float32
    assert np.max(np.abs(y - y64)) < 1e-6         # torch's own float32 GELU is ~1e-6 off here
    assert np.max(np.abs(g - g64)) < 1e-6
    dx = kernels.gelu_backward(np.ones_like(x), (g, "none"))
    assert np.array_equal(dx, g)


@pytest.mark.parametrize("shape", [(0,), (1,), (5, 7), (3, 4, 1000)])
def test_gelu_kernel_any_shape_and_split(shape, rng, split_everything):
    x = rng.standard_normal(shape).astype(np.float32) * 3
    y, (g, _) = kernels.gelu_forward(x)
    _runtime.set_num_threads(1)
    y1, (g1, _) = kernels.gelu_forward(x)
    assert y.shape == shape and np.array_equal(y, y1) and np.array_equal(g, g1)
    y64, g64 = _gelu64(x)
    assert_close(y, y64, 1e-6)
    # non-contiguous input
    xt = rng.standard_normal((6, 5)).astype(np.float32).T
    assert np.array_equal(kernels.gelu_forward(xt)[0], kernels.gelu_forward(np.ascontiguousarray(xt))[0])


def test_gelu_float32_kernel_equals_reference(rng, split_everything):
    """The fast float32 kernel (kernels/fast_gelu.py) against the reference gelu_erf it speeds up."""
    x = (rng.standard_normal((7, 300)) * 4).astype(np.float32)
    y, g = kernels.gelu_erf_f32(x)
    y_ref, g_ref = ops.gelu_erf(x.astype(np.float64))
    assert_close(y, y_ref, 1e-6, "GELU")
    assert_close(g, g_ref, 1e-6, "GELU'")


def test_gelu_float64_stays_exact(rng):
    x = rng.standard_normal((4, 9)) * 3
    y, (g, _) = kernels.gelu_forward(x)
    y64, g64 = _gelu64(x)
    np.testing.assert_allclose(y, y64, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(g, g64, rtol=1e-14, atol=1e-15)


# -- attention ------------------------------------------------------------------------------------------

def _naive_attention(q, k, v, mask_add, scale):
    s = q @ np.swapaxes(k, -1, -2) * scale + mask_add
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    z = e.sum(axis=-1, keepdims=True)
    p = e / np.where(z == 0, 1.0, z)
    return p @ v, p


MASKS = ["none", "causal", "bool", "float", "padding", "all_masked_row"]


def _mask(kind, rng, B, H, Tq, Tk):
    """(functional mask for the op, is_causal, additive mask for the naive reference)."""
    if kind == "none":
        return None, False, 0.0
    if kind == "causal":
        return None, True, np.where(np.tril(np.ones((Tq, Tk), bool)), 0.0, -np.inf)
    if kind == "bool":
        m = rng.random((B, H, Tq, Tk)) > 0.3
        m[..., 0] = True
        return m, False, np.where(m, 0.0, -np.inf)
    if kind == "float":
        m = rng.standard_normal((Tq, Tk))
        return m, False, m
    if kind == "padding":
        keep = np.ones((B, 1, 1, Tk), bool)
        keep[0, ..., -2:] = False
        return keep, False, np.where(keep, 0.0, -np.inf)
    m = np.ones((B, H, Tq, Tk), bool)
    m[1, 0, 2] = False                                          # one query sees no key at all
    return m, False, np.where(m, 0.0, -np.inf)


@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("lengths", [(5, 5), (3, 6)])
@pytest.mark.parametrize("products_in_pieces", [True, False])
def test_fused_attention_equals_naive_and_split(kind, lengths, products_in_pieces, rng, split_everything,
                                                monkeypatch):
    monkeypatch.setattr(attn_ops, "_products_in_pieces", lambda *shape: products_in_pieces)
    B, H, (Tq, Tk), dk = 3, 2, lengths, 4
    q = rng.standard_normal((B, H, Tq, dk))
    k = rng.standard_normal((B, H, Tk, dk))
    v = rng.standard_normal((B, H, Tk, 3))
    mask, causal, add = _mask(kind, rng, B, H, Tq, Tk)
    out, cache = attn_ops.fused_attention_forward(q, k, v, mask, causal)
    ref, p = _naive_attention(q, k, v, add, 1 / math.sqrt(dk))
    assert_close(out, ref, 1e-12, "out")
    assert_close(np.swapaxes(cache.weights_t, -1, -2), p, 1e-12, "weights")
    assert np.isfinite(out).all()
    dout = rng.standard_normal(out.shape)
    grads = attn_ops.fused_attention_backward(dout, cache)
    _runtime.set_num_threads(1)
    out1, cache1 = attn_ops.fused_attention_forward(q, k, v, mask, causal)
    grads1 = attn_ops.fused_attention_backward(dout, cache1)
    assert np.array_equal(out, out1)
    for g, g1 in zip(grads, grads1):
        assert np.array_equal(g, g1)

    def fwd():
        return attn_ops.fused_attention_forward(q, k, v, mask, causal)[0]

    def bwd(dy):
        c = attn_ops.fused_attention_forward(q, k, v, mask, causal)[1]
        return dict(zip("qkv", attn_ops.fused_attention_backward(dy, c)))

    _runtime.set_num_threads(3)
    assert_gradcheck(check_gradients(fwd, bwd, {"q": q, "k": k, "v": v}))


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_equals_reference(causal, rng, split_everything):
    """The fused kernel (kernels/fused_attention.py) against the reference it speeds up (ops/attention.py)."""
    B, H, T, dk = 2, 3, 7, 4
    q, k, v = (rng.standard_normal((B, H, T, dk)) for _ in range(3))
    pad = np.ones((B, 1, 1, T), bool)
    pad[1, ..., -2:] = False
    dout = rng.standard_normal((B, H, T, dk))
    out, cache = attn_ops.fused_attention_forward(q, k, v, pad, causal)
    ref, _, ref_cache = ops.scaled_dot_product_attention_forward(q, k, v, pad, causal)
    assert_close(out, ref, 1e-12, "out")
    for name, g, g_ref in zip("qkv", attn_ops.fused_attention_backward(dout, cache),
                              ops.scaled_dot_product_attention_backward(dout, ref_cache)):
        assert_close(g, g_ref, 1e-12, "d" + name)


def test_fused_attention_writes_into_strided_outputs(rng):
    B, T, H, dh = 2, 5, 3, 4
    qkv = rng.standard_normal((B, T, 3, H, dh))
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    merged = np.empty((B, T, H, dh))
    out, cache = attn_ops.fused_attention_forward(q, k, v, is_causal=True, out=merged.transpose(0, 2, 1, 3))
    ref, _ = _naive_attention(q, k, v, np.where(np.tril(np.ones((T, T), bool)), 0.0, -np.inf), dh ** -0.5)
    assert_close(merged.transpose(0, 2, 1, 3), ref, 1e-12)
    dout = rng.standard_normal((B, H, T, dh))
    dqkv = np.empty_like(qkv)
    attn_ops.fused_attention_backward(dout, cache, *(dqkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3)))
    plain = attn_ops.fused_attention_backward(dout, cache)
    for i in range(3):
        assert np.array_equal(dqkv[:, :, i].transpose(0, 2, 1, 3), plain[i])


def test_multihead_attention_fast_path_equals_generic_path(rng):
    from numformer.nn import MultiHeadAttention

    mha = MultiHeadAttention(8, 2, rng=rng, dtype=np.float64)
    x = rng.standard_normal((2, 5, 8))
    pad = np.zeros((2, 5), bool)
    pad[1, -2:] = True
    dout = rng.standard_normal((2, 5, 8))
    results = []
    for head_mask in (None, np.ones(2)):          # a head mask takes the generic path
        mha.head_mask = head_mask
        mha.zero_grad()
        y = mha(x, key_padding_mask=pad, is_causal=True)
        dx = mha.backward(dout)
        results.append((y, dx, {n: p.grad.copy() for n, p in mha.named_parameters()}))
    (y0, dx0, g0), (y1, dx1, g1) = results
    assert_close(y0, y1, 1e-12, "out")
    assert_close(dx0, dx1, 1e-12, "dx")
    for n in g0:
        assert_close(g0[n], g1[n], 1e-12, n)


# -- layer norm -----------------------------------------------------------------------------------------

def test_layer_norm_split_is_identical_and_correct(rng, split_everything):
    x = rng.standard_normal((3, 7, 6)) * 2 + 1
    gamma, beta = rng.standard_normal(6), rng.standard_normal(6)
    y, cache = kernels.layer_norm_forward(x, gamma, beta)
    mu = x.mean(-1, keepdims=True)
    ref = (x - mu) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * gamma + beta
    assert_close(y, ref, 1e-12)
    dy = rng.standard_normal(x.shape)
    grads = kernels.layer_norm_backward(dy, cache)
    _runtime.set_num_threads(1)
    y1, cache1 = kernels.layer_norm_forward(x, gamma, beta)
    grads1 = kernels.layer_norm_backward(dy, cache1)
    assert np.array_equal(y, y1)
    for g, g1 in zip(grads, grads1):
        assert np.array_equal(g, g1)
    _runtime.set_num_threads(3)

    def fwd():
        return kernels.layer_norm_forward(x, gamma, beta)[0]

    def bwd(d):
        return dict(zip(("x", "gamma", "beta"), kernels.layer_norm_backward(d, kernels.layer_norm_forward(x, gamma, beta)[1])))

    assert_gradcheck(check_gradients(fwd, bwd, {"x": x, "gamma": gamma, "beta": beta}))


NORMS = {"layer_norm": lambda m, x, g, b: m.layer_norm_forward(x, g, b),
         "layer_norm without beta": lambda m, x, g, b: m.layer_norm_forward(x, g, None),
         "rms_norm": lambda m, x, g, b: m.rms_norm_forward(x, g)}


@pytest.mark.parametrize("name", sorted(NORMS))
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_norm_kernels_equal_references_at_model_widths(name, dtype, tol, rng, split_everything):
    """Layer norm and RMSNorm, forward and backward, against numformer.ops at d = 128: 335 rows, split across 3
    threads, so that each piece multiplies by γ (and adds β) 64 rows at a time and its last rows one at a time
    (``_along_rows``); the results do not depend on the split."""
    x = (rng.standard_normal((5, 67, 128)) * 3 + 5).astype(dtype)
    g, b = (rng.standard_normal(128) + 1).astype(dtype), rng.standard_normal(128).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    op = name.split()[0]

    def run(m):
        y, cache = NORMS[name](m, x, g, b)
        return (y,) + tuple(getattr(m, f"{op}_backward")(dy, cache))

    split = run(kernels)
    _runtime.set_num_threads(1)
    whole = run(kernels)
    for got, one, want, what in zip(split, whole, run(ops), ("y", "dx", "dgamma", "dbeta")):
        assert got.dtype == want.dtype and np.array_equal(got, one), what
        assert_close(got, want, tol, what)


def test_layer_norm_float32_and_no_bias(rng):
    x = rng.standard_normal((4, 16)).astype(np.float32)
    gamma = rng.standard_normal(16).astype(np.float32)
    y, cache = kernels.layer_norm_forward(x, gamma, None)
    assert y.dtype == np.float32
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * gamma
    assert_close(y, ref, 1e-5)


# -- embedding and linear -------------------------------------------------------------------------------

@pytest.mark.parametrize("vocab", [7, 5000])          # one-hot product / sort + reduceat
def test_embedding_backward_paths_equal_add_at(vocab, rng):
    ids = rng.integers(0, vocab, (4, 9))
    ids[0, :3] = ids[1, 0]                            # repeated ids
    dy = rng.standard_normal((4, 9, 5))
    ref = np.zeros((vocab, 5))
    np.add.at(ref, ids.reshape(-1), dy.reshape(-1, 5))
    _, cache = kernels.embedding_forward(ids, np.zeros((vocab, 5)))
    assert_close(kernels.embedding_backward(dy, cache), ref, 1e-12)
    base = rng.standard_normal((vocab, 5))
    out = base.copy()
    assert kernels.embedding_backward(dy, cache, out=out) is out
    assert_close(out, base + ref, 1e-12)
    empty = np.zeros((0,), dtype=int)
    _, c0 = kernels.embedding_forward(empty, np.zeros((vocab, 5)))
    assert not kernels.embedding_backward(np.zeros((0, 5)), c0).any()


def test_linear_bias_gradient_is_the_row_sum(rng):
    x = rng.standard_normal((3, 4, 5))
    W, b = rng.standard_normal((6, 5)), rng.standard_normal(6)
    _, cache = kernels.linear_forward(x, W, b)
    dy = rng.standard_normal((3, 4, 6))
    _, _, db = kernels.linear_backward(dy, cache)
    assert_close(db, dy.reshape(-1, 6).sum(0), 1e-13)


# -- ReLU -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_kernel_equals_straightforward_and_split(dtype, rng, split_everything):
    x = rng.standard_normal((5, 13)).astype(dtype)
    x[0, :3] = 0.0
    dy = rng.standard_normal(x.shape).astype(dtype)
    y, cache = kernels.relu_forward(x)
    dx = kernels.relu_backward(dy, cache)
    assert np.array_equal(y, np.maximum(x, 0))
    assert np.array_equal(dx, np.where(x > 0, dy, 0))
    _runtime.set_num_threads(1)
    assert np.array_equal(kernels.relu_backward(dy, kernels.relu_forward(x)[1]), dx)



def test_causal_blocks_at_the_real_block_size(rng):
    """Causal attention over 150 queries (3 blocks of 64, the last one short) against the naive computation."""
    B, H, T, dk = 2, 3, 150, 8
    q, k, v = (rng.standard_normal((B, H, T, dk)) for _ in range(3))
    out, cache = attn_ops.fused_attention_forward(q, k, v, is_causal=True)
    add = np.where(np.tril(np.ones((T, T), bool)), 0.0, -np.inf)
    ref, p = _naive_attention(q, k, v, add, dk ** -0.5)
    assert_close(out, ref, 1e-12, "out")
    assert_close(np.swapaxes(cache.weights_t, -1, -2), p, 1e-12, "weights (zeros above the diagonal blocks)")
    dout = rng.standard_normal(out.shape)
    dq, dk_, dv = attn_ops.fused_attention_backward(dout, cache)
    ds = p * (dout @ np.swapaxes(v, -1, -2) - np.sum(dout * ref, axis=-1, keepdims=True)) * dk ** -0.5
    assert_close(dv, np.swapaxes(p, -1, -2) @ dout, 1e-12, "dv")
    assert_close(dq, ds @ k, 1e-12, "dq")
    assert_close(dk_, np.swapaxes(ds, -1, -2) @ q, 1e-12, "dk")


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_thread_pool_works_in_a_forked_child(threads):
    import os

    threads(2)
    seen = np.zeros(64)
    _runtime.parallel_for(64, lambda lo, hi: seen.__setitem__(slice(lo, hi), 1), grain=8)   # pool started
    pid = os.fork()
    if pid == 0:                                       # child: the pool must not wait on the parent's threads
        out = np.zeros(64)
        _runtime.parallel_for(64, lambda lo, hi: out.__setitem__(slice(lo, hi), 1), grain=8)
        os._exit(0 if out.all() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@pytest.mark.skipif(_runtime.openblas_core() is None, reason="needs NumPy's OpenBLAS")
def test_openblas_core_is_recorded_with_every_figure():
    """The kernel family OpenBLAS chose (small products' speed depends on it) is read from the library: forcing
    another with OPENBLAS_CORETYPE shows in a fresh process, and machine_info (every result's footer) has it."""
    import os
    import subprocess
    import sys

    from numformer.provenance import machine_info

    assert machine_info()["blas_core"] == _runtime.openblas_core()
    code = "from numformer import _runtime; print(_runtime.openblas_core())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "OPENBLAS_CORETYPE": "Sandybridge"}).stdout.strip()
    assert out == "Sandybridge"


# -- every kernel against its reference op -------------------------------------------------------------
# float64: to 1e-12 (the same formulas in another order). float32: 1e-5 relative to the values' scale for
# the reductions (layer norm, linear: sums of up to a few hundred products), 1e-6 for the elementwise GELU
# (the float32 kernel's erf approximation, as torch's own float32 GELU).

TOLERANCE = {np.float64: 1e-12, np.float32: 1e-5}


def _pairs(name, *args, dy_like=0, **kw):
    """(reference outputs, kernel outputs) of op ``name``: forward on args, backward of a random dy."""
    rng = np.random.default_rng(7)
    outs = []
    for lib in (ops, kernels):
        y, cache = getattr(lib, name + "_forward")(*args, **kw)
        y_main = y[dy_like] if isinstance(y, tuple) else y
        dy = rng.standard_normal(np.shape(y_main)).astype(y_main.dtype)
        rng = np.random.default_rng(7)
        grads = getattr(lib, name + "_backward")(dy, cache)
        outs.append((y, grads if isinstance(grads, tuple) else (grads,)))
    return outs


def _assert_pairs_close(pairs, tol, what):
    (y_ref, g_ref), (y, g) = pairs
    assert np.asarray(y).dtype == np.asarray(y_ref).dtype, what
    assert_close(y, y_ref, tol, what + " forward")
    for i, (a, b) in enumerate(zip(g, g_ref)):
        if b is None:
            assert a is None, what
        else:
            assert a.shape == b.shape and a.dtype == b.dtype, (what, i)
            assert_close(a, b, tol, f"{what} gradient {i}")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_kernel_equals_reference(dtype, bias, rng, split_everything):
    x = rng.standard_normal((3, 5, 24)).astype(dtype)
    W = rng.standard_normal((40, 24)).astype(dtype)
    b = rng.standard_normal(40).astype(dtype) if bias else None
    _assert_pairs_close(_pairs("linear", x, W, b), TOLERANCE[dtype], "linear")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_kernel_equals_reference(dtype, bias, rng, split_everything):
    x = (rng.standard_normal((3, 7, 16)) * 2 + 1).astype(dtype)
    gamma = rng.standard_normal(16).astype(dtype)
    beta = rng.standard_normal(16).astype(dtype) if bias else None
    _assert_pairs_close(_pairs("layer_norm", x, gamma, beta), TOLERANCE[dtype], "layer norm")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(3, 7, 16), (5, 33), (2, 3, 4, 1)])
def test_rms_norm_kernel_equals_reference(dtype, shape, rng, split_everything):
    x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
    gamma = rng.standard_normal(shape[-1]).astype(dtype)
    _assert_pairs_close(_pairs("rms_norm", x, gamma), TOLERANCE[dtype], "rms norm")
    strided = x[..., ::-1]                                        # a non-contiguous input
    _assert_pairs_close(_pairs("rms_norm", strided, gamma, eps=1e-3), TOLERANCE[dtype], "rms norm strided")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(5, 37), (2, 3, 64), (1,)])
def test_silu_and_silu_gate_kernels_equal_reference(dtype, shape, rng, split_everything):
    a = (rng.standard_normal(shape) * 4).astype(dtype)
    a.reshape(-1)[:2] = (-200.0, 200.0)[:a.size]                 # σ = 0 and 1, no warning
    b = rng.standard_normal(shape).astype(dtype)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        _assert_pairs_close(_pairs("silu", a), TOLERANCE[dtype], "silu")
        _assert_pairs_close(_pairs("silu_gate", a, b), TOLERANCE[dtype], "swiglu gate")
        _assert_pairs_close(_pairs("silu_gate", a.T, b.T), TOLERANCE[dtype], "swiglu gate strided")


def test_silu_kernel_keeps_its_relative_accuracy_for_negative_inputs():
    # SiLU(x) = x σ(x) is tiny for x << 0; a σ computed as ½ (1 + tanh(x/2)) loses it to cancellation in
    # float32 (relative error 2e-4 at x = -10, 2.6% at -15, 100% below -19), 1 / (1 + exp(-x)) does not
    x = np.linspace(-80.0, -1.0, 4001).astype(np.float32)
    exact, _ = ops.silu_forward(x.astype(np.float64))
    y, _ = kernels.silu_forward(x)
    assert np.max(np.abs(y - exact) / np.abs(exact)) < 1e-6


def test_silu_gate_kernel_runs_the_reference_for_mixed_inputs(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4)).astype(np.float32)
    for lib in (ops, kernels):
        h, cache = lib.silu_gate_forward(a, b[0])                # broadcast and mixed dtypes
        assert h.shape == (3, 4) and h.dtype == np.float64
    _assert_pairs_close(_pairs("silu", np.arange(-3, 4)), 1e-12, "silu of integers")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape, offset, positions", [
    ((2, 3, 5, 8), 0, None), ((2, 3, 5, 8), 7, None), ((5, 6), 300, None), ((1, 2, 1, 4), 1000, None),
    ((2, 3, 5, 8), 0, "row"), ((2, 3, 5, 8), 0, "batch"), ((2, 3, 5, 8), -2, None), ((3, 5, 10), 0, "negative")])
def test_rope_kernel_equals_reference(dtype, shape, offset, positions, rng):
    """Offsets past the cached table (it grows), explicit positions (T,) and (B, T), negative positions."""
    x = rng.standard_normal(shape).astype(dtype)
    t = shape[-2]
    positions = {None: None, "row": np.arange(3, 3 + t), "batch": rng.integers(0, 600, (shape[0], t)),
                 "negative": np.arange(-2, t - 2)}[positions]
    for theta in (10000.0, 500000.0):
        _assert_pairs_close(_pairs("rope", x, offset, theta, positions), TOLERANCE[dtype], f"rope {shape}")
    strided = x.swapaxes(-2, -3) if x.ndim > 2 else x          # a non-contiguous input
    _assert_pairs_close(_pairs("rope", strided, offset), TOLERANCE[dtype], "rope strided")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("offset", [0, 300])
def test_rope_kernel_on_heads_side_by_side_equals_reference(dtype, offset, rng):
    """Queries seen as (B, H, T, d) in a fused projection's output (B, T, heads, d), the layout the attention
    layer hands over: the kernel rotates them along the rows of its memory (tables repeated for the heads);
    the same values and gradients as the reference, whose gradient comes in that layout too or not."""
    B, T, H, d = 2, 5, 3, 8
    qkv = rng.standard_normal((B, T, H + 2, d)).astype(dtype)
    q = qkv[:, :, :H].transpose(0, 2, 1, 3)
    y, cache = kernels.rope_forward(q, offset)
    y_ref, ref_cache = ops.rope_forward(q, offset)
    assert_close(y, y_ref, TOLERANCE[dtype], "forward")
    dy = rng.standard_normal((B, T, H, d)).astype(dtype)
    for g in (dy.transpose(0, 2, 1, 3), np.ascontiguousarray(dy.transpose(0, 2, 1, 3))):
        assert_close(kernels.rope_backward(g, cache), ops.rope_backward(g, ref_cache), TOLERANCE[dtype], "backward")


def test_rope_kernel_errors_as_the_reference(rng):
    for lib in (ops, kernels):
        with pytest.raises(ValueError, match="even head size"):
            lib.rope_forward(rng.standard_normal((2, 3, 5)))
        with pytest.raises(ValueError, match="sequence length"):
            lib.rope_forward(rng.standard_normal((2, 3, 4)), positions=np.arange(2))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_kernel_equals_reference(dtype, approximate, rng, split_everything):
    x = (rng.standard_normal((5, 37)) * 3).astype(dtype)
    tol = 1e-12 if dtype == np.float64 else 1e-6
    _assert_pairs_close(_pairs("gelu", x, approximate), tol, f"gelu {approximate}")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_relu_kernel_equals_reference(dtype, rng, split_everything):
    x = rng.standard_normal((5, 37)).astype(dtype)
    x[0, :4] = 0.0
    (y_ref, (dx_ref,)), (y, (dx,)) = _pairs("relu", x)
    assert np.array_equal(y, y_ref) and np.array_equal(dx, dx_ref) and dx.dtype == dtype     # exactly


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_relu_squared_kernel_equals_reference(dtype, rng, split_everything):
    x = (rng.standard_normal((5, 37)) * 2).astype(dtype)
    x[0, :4] = 0.0
    x[1, :2] = np.nan
    (y_ref, (dx_ref,)), (y, (dx,)) = _pairs("relu_squared", x)
    for a, b in ((y, y_ref), (dx, dx_ref)):         # the same operations on each element: equal, NaN included
        assert a.dtype == dtype and np.array_equal(a, b, equal_nan=True)
    assert np.isnan(y[1, :2]).all() and (y[0, :4] == 0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dy_kind", ["finite", "with inf and NaN"])
def test_relu_kernel_equals_reference_and_torch_at_nan_and_inf(dtype, dy_kind, rng, split_everything):
    """x = NaN passes dy on, x = ±inf is a number like any other, and where x <= 0 the gradient is 0 whatever dy
    (inf or NaN too): kernel, reference and torch.relu's backward alike, split across threads or not (the
    kernel gave NaN for a NaN x where the reference gave 0, torch dy)."""
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((6, 23)).astype(dtype)
    x[0, :6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, np.nan]
    x[4, 7] = np.nan                                           # in another thread's piece
    dy = rng.standard_normal(x.shape).astype(dtype)
    if dy_kind != "finite":                                    # on x > 0, x <= 0 and x NaN alike
        dy[0, :6] = [np.inf, np.nan, -np.inf, np.nan, np.inf, -np.inf]
        dy[2, :5] = [np.inf, -np.inf, np.nan, np.inf, np.nan]
    x_torch = torch.tensor(x, requires_grad=True)
    torch.relu(x_torch).backward(torch.tensor(dy))
    expected = x_torch.grad.numpy()
    assert np.array_equal(expected[0, [0, 5]], dy[0, [0, 5]]) and expected[0, 2] == 0     # NaN x: dy; -inf: 0
    for threads in (3, 1):
        _runtime.set_num_threads(threads)
        for lib in (ops, kernels):
            y, cache = lib.relu_forward(x)
            np.testing.assert_array_equal(y, np.maximum(x, 0), err_msg=f"{lib.__name__} forward")
            dx = lib.relu_backward(dy, cache)
            assert dx.dtype == dtype
            np.testing.assert_array_equal(dx, expected, err_msg=f"{lib.__name__} backward, {threads} threads")


@pytest.mark.parametrize("vocab", [7, 5000])                 # one-hot product / flat np.add.at
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_embedding_kernel_equals_reference(vocab, dtype, rng):
    ids = rng.integers(0, vocab, (4, 9))
    ids[0, :3] = ids[1, 0]
    E = rng.standard_normal((vocab, 5)).astype(dtype)
    _assert_pairs_close(_pairs("embedding", ids, E), TOLERANCE[dtype], "embedding")


@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_attention_kernels_equal_reference_with_every_mask(kind, dtype, rng, split_everything):
    """The fused and flash kernels against ops.attention with the same masks and shapes."""
    from numformer.kernels.flash_attention import flash_attention_backward, flash_attention_forward

    B, H, Tq, Tk, dk = 2, 2, 5, 6, 4
    q = rng.standard_normal((B, H, Tq, dk)).astype(dtype)
    k, v = (rng.standard_normal((B, H, Tk, dk)).astype(dtype) for _ in range(2))
    mask, causal, _ = _mask(kind, rng, B, H, Tq, Tk)
    if mask is not None and mask.dtype != bool:
        mask = mask.astype(dtype)
    dout = rng.standard_normal((B, H, Tq, dk)).astype(dtype)
    ref, _, ref_cache = ops.scaled_dot_product_attention_forward(q, k, v, mask, causal)
    ref_grads = ops.scaled_dot_product_attention_backward(dout, ref_cache)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    fused, fused_cache = kernels.fused_attention_forward(q, k, v, mask, causal)
    flash, flash_cache = flash_attention_forward(q, k, v, attn_mask=mask, is_causal=causal, block_q=2, block_k=4)
    for name, out, grads in (("fused", fused, kernels.fused_attention_backward(dout, fused_cache)),
                             ("flash", flash, flash_attention_backward(dout, flash_cache))):
        assert out.dtype == dtype, name
        assert_close(out, ref, tol, name + " out")
        for g, g_ref, which in zip(grads, ref_grads, "qkv"):
            assert_close(g, g_ref, tol, f"{name} d{which}")


def _grouped_reference(q, k, v, mask, causal, dout):
    """ops.repeat_kv_forward, then the reference attention, and back: (out, dq, dk, dv)."""
    rep = q.shape[1] // k.shape[1]
    (kr, ck), (vr, cv) = ops.repeat_kv_forward(k, rep), ops.repeat_kv_forward(v, rep)
    out, _, cache = ops.scaled_dot_product_attention_forward(q, kr, vr, mask, causal)
    dq, dk, dv = ops.scaled_dot_product_attention_backward(dout, cache)
    return out, dq, ops.repeat_kv_backward(dk, ck), ops.repeat_kv_backward(dv, cv)


@pytest.mark.parametrize("kind", ["none", "causal", "float", "padding", "all_masked_row"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("heads", [(4, 2), (3, 1), (2, 2)])
def test_fused_attention_shares_key_value_heads_as_repeat_kv(kind, dtype, heads, rng, split_everything):
    """Keys and values with fewer heads than the queries (grouped-query attention): the fused kernel equals
    repeat_kv + the reference, forward and gradients, the same under any thread split."""
    (H, H_kv), B, Tq, Tk = heads, 2, 5, 5
    q = rng.standard_normal((B, H, Tq, 4)).astype(dtype)
    k, v = (rng.standard_normal((B, H_kv, Tk, 4)).astype(dtype) for _ in range(2))
    mask, causal, _ = _mask(kind, rng, B, H, Tq, Tk)
    if mask is not None and mask.dtype != bool:
        mask = mask.astype(dtype)
    dout = rng.standard_normal((B, H, Tq, 4)).astype(dtype)
    out, cache = kernels.fused_attention_forward(q, k, v, mask, causal)
    grads = kernels.fused_attention_backward(dout, cache)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out,) + grads, _grouped_reference(q, k, v, mask, causal, dout)):
        assert a.dtype == dtype and a.shape == b.shape, name
        assert_close(a, b, TOLERANCE[dtype], name)
    _runtime.set_num_threads(1)
    out1, cache1 = kernels.fused_attention_forward(q, k, v, mask, causal)
    assert np.array_equal(out, out1)
    for g, g1 in zip(grads, kernels.fused_attention_backward(dout, cache1)):
        assert np.array_equal(g, g1)


@pytest.mark.parametrize("few", [0, 10 ** 6])
@pytest.mark.parametrize("dtype, size", [(np.float32, -200.0), (np.float32, 200.0), (np.float64, -1000.0),
                                         (np.float64, 1000.0)])
def test_fused_attention_with_scores_beyond_the_unshifted_exp(dtype, size, few, rng, split_everything, monkeypatch):
    """Scores far below or far above what exp takes without subtracting the largest (the kernel's fast softmax
    underflows or overflows there): the items concerned are computed again as the reference, and every item
    equals the reference (float64: forward and gradients; float32: the forward, whose gradients at such
    scores lose digits in the reference's float32 arithmetic as in the kernel's). ``few``: every block takes
    the unshifted softmax (0) or the shifted one of a cached step's few queries."""
    monkeypatch.setattr(attn_ops, "FEW_QUERIES", few)
    B, H, T, dk = 3, 2, 6, 4
    q, k, v = (rng.standard_normal((B, H, T, dk)).astype(dtype) for _ in range(3))
    q[1, 0] = np.abs(q[1, 0]) * size                   # large scores of one sign in one item only
    k[1, 0] = np.abs(k[1, 0])
    dout = rng.standard_normal(q.shape).astype(dtype)
    with np.errstate(over="raise", invalid="raise"):
        out, cache = kernels.fused_attention_forward(q, k, v, is_causal=True)
    ref, _, ref_cache = ops.scaled_dot_product_attention_forward(q, k, v, is_causal=True)
    assert np.isfinite(out).all()
    assert_close(out, ref, TOLERANCE[dtype], "out")
    if dtype == np.float64:
        for g, g_ref, name in zip(kernels.fused_attention_backward(dout, cache),
                                  ops.scaled_dot_product_attention_backward(dout, ref_cache), "qkv"):
            assert_close(g, g_ref, TOLERANCE[dtype], "d" + name)


def _general_path_only(*args, **kwargs):
    raise AssertionError("the decoding step took the general path (_Forward)")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("heads", [(12, 12), (4, 2), (3, 1)])
@pytest.mark.parametrize("t_q, t_k", [(1, 1), (1, 9), (3, 9)])
def test_decoding_step_equals_reference_and_general_path(dtype, heads, t_q, t_k, rng, monkeypatch):
    """A cached generation step (a few queries, no mask) takes ``_decoding_step``, not the general machinery:
    it equals repeat_kv + the reference, forward and the gradients its cache gives, and the general path. The
    queries come in the modules' layout, a (B, Tq, H, d) array seen as (B, H, Tq, d)."""
    (H, H_kv), B = heads, 2
    q = rng.standard_normal((B, t_q, H, 8)).astype(dtype).transpose(0, 2, 1, 3)
    k, v = (rng.standard_normal((B, H_kv, t_k, 8)).astype(dtype) for _ in range(2))
    dout = rng.standard_normal(q.shape).astype(dtype)
    with monkeypatch.context() as m:
        m.setattr(attn_ops, "_Forward", _general_path_only)
        out, cache = kernels.fused_attention_forward(q, k, v)
    grads = kernels.fused_attention_backward(dout, cache)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out,) + grads, _grouped_reference(q, k, v, None, False, dout)):
        assert a.dtype == dtype and a.shape == b.shape, name
        assert_close(a, b, TOLERANCE[dtype], name)
    monkeypatch.setattr(attn_ops, "FEW_QUERIES", 0)                  # the general path, for the same call
    general, general_cache = kernels.fused_attention_forward(q, k, v)
    assert_close(out, general, TOLERANCE[dtype], "out")
    assert_close(cache.weights_t, general_cache.weights_t, TOLERANCE[dtype], "weights")


@pytest.mark.parametrize("dtype, size", [(np.float32, -200.0), (np.float32, 200.0), (np.float64, 1000.0)])
def test_decoding_step_with_scores_beyond_the_unshifted_exp(dtype, size, rng, monkeypatch):
    """Scores that overflow or underflow exp unshifted: the decoding step subtracts each query's largest."""
    monkeypatch.setattr(attn_ops, "_Forward", _general_path_only)
    q = rng.standard_normal((2, 4, 1, 8)).astype(dtype)
    k, v = (rng.standard_normal((2, 2, 7, 8)).astype(dtype) for _ in range(2))
    q[1, 0] = np.abs(q[1, 0]) * size
    k[1, 0] = np.abs(k[1, 0])
    with np.errstate(over="raise", invalid="raise"):
        out, _ = kernels.fused_attention_forward(q, k, v)
    ref = _grouped_reference(q, k, v, None, False, np.zeros_like(q))[0]
    assert np.isfinite(out).all()
    assert_close(out, ref, TOLERANCE[dtype], "out")


def test_the_decoding_step_is_only_for_unmasked_calls_of_few_queries(rng, monkeypatch):
    """A mask, causal attention, many queries or a batch worth splitting across threads take the general path."""
    monkeypatch.setattr(attn_ops, "_decoding_step", _general_path_only)
    q, k, v = (rng.standard_normal((2, 2, t, 4)) for t in (1, 5, 5))
    kernels.fused_attention_forward(q, k, v, np.ones((1, 5), bool))
    kernels.fused_attention_forward(q, k, v, is_causal=True)
    kernels.fused_attention_forward(*(rng.standard_normal((2, 2, 16, 4)) for _ in range(3)))
    monkeypatch.setattr(attn_ops, "_split_grain", lambda lead, t_q, t_k: 1)
    kernels.fused_attention_forward(q, k, v)


# -- whole models on both paths -------------------------------------------------------------------------

def _train(build, batch, steps, reference):
    """``steps`` AdamW steps of a fresh model (float64, fixed seed) on one batch; returns its weights."""
    from numformer.optim import AdamW
    from numformer.train.step import loss_and_backward

    model = build()
    inputs, targets = batch
    opt = AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    with numformer.reference_mode(reference):
        for _ in range(steps):
            opt.zero_grad()
            loss_and_backward(model, inputs, targets)
            opt.step()
    return {name: p.data.copy() for name, p in model.named_parameters()}


def _models():
    r = np.random.default_rng(3)
    src, tgt = r.integers(1, 30, (3, 7)), r.integers(1, 30, (3, 6))
    src[0, -2:] = 0                                               # padding in the source
    ids = r.integers(1, 30, (4, 9))
    ids[1, -3:] = 0
    return {
        "gpt": (lambda: numformer.GPT(30, 16, n_layers=2, n_heads=2, d_model=16, activation="gelu",
                                      rng=np.random.default_rng(0), dtype=np.float64),
                ({"idx": ids[:, :-1]}, ids[:, 1:])),
        "llama": (lambda: numformer.GPT(30, 16, n_layers=2, n_heads=4, n_kv_heads=2, d_model=16, d_ff=24,
                                        positional="rope", activation="swiglu", norm="rms", bias=False,
                                        rng=np.random.default_rng(0), dtype=np.float64),
                  ({"idx": ids[:, :-1]}, ids[:, 1:])),
        "transformer": (lambda: numformer.Transformer(30, 30, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                                                      dropout=0.0, src_pad_id=0, tgt_pad_id=0,
                                                      rng=np.random.default_rng(0), dtype=np.float64),
                        ({"src": src, "tgt": tgt[:, :-1]}, tgt[:, 1:])),
        "classifier": (lambda: numformer.EncoderClassifier(30, 3, max_len=16, d_model=16, n_heads=2, n_layers=2,
                                                           dropout=0.0, rng=np.random.default_rng(0),
                                                           dtype=np.float64),
                       ({"ids": ids}, r.integers(0, 3, 4))),
    }


@pytest.mark.parametrize("name", ["gpt", "llama", "transformer", "classifier"])
def test_models_train_to_the_same_weights_on_kernels_and_references(name, split_everything):
    """20 AdamW steps in float64 on the speed path and inside numformer.reference_mode(): the same weights to
    1e-10 (and the kernels really ran: the two paths are not bit-identical)."""
    build, batch = _models()[name]
    fast = _train(build, batch, 20, reference=False)
    ref = _train(build, batch, 20, reference=True)
    assert fast.keys() == ref.keys()
    moved = _train(build, batch, 0, reference=False)
    assert any(np.abs(fast[n] - moved[n]).max() > 1e-3 for n in fast), "the model did not train"
    for n in fast:
        np.testing.assert_allclose(fast[n], ref[n], rtol=0, atol=1e-10, err_msg=n)
    assert any(not np.array_equal(fast[n], ref[n]) for n in fast), "both paths ran the same code"


def test_reference_mode_switches_every_op_and_restores(monkeypatch):
    """Inside reference_mode every entry of the table is the ops function, outside the kernel one; the
    attention layer picks the reference kernel; the previous setting returns on leaving (also on error)."""
    from numformer.nn import MultiHeadAttention
    from numformer.nn.dispatch import F, OPS, using_reference

    mha = MultiHeadAttention(8, 2)
    assert not using_reference() and mha.kernel_name(0.0) == "fused"
    with numformer.reference_mode():
        assert using_reference() and mha.kernel_name(0.0) == "reference"
        for name, (reference, _) in OPS.items():
            assert getattr(F, name) is reference
            assert reference.__module__.startswith("numformer.ops") or name == "embedding_backward_into"
        with numformer.reference_mode(False):
            assert all(getattr(F, n) is kernel for n, (_, kernel) in OPS.items())
        assert using_reference()
    with pytest.raises(RuntimeError):
        with numformer.reference_mode():
            raise RuntimeError("inside")
    assert not using_reference()
    with pytest.raises(AttributeError, match="no op"):
        F.not_an_op


@pytest.mark.parametrize("bias", [True, False])
def test_swiglu_module_equals_the_swiglu_op(bias, rng):
    """SwiGLUFeedForward (three Linear modules and SiLU through the table) computes ops.swiglu_forward/backward."""
    from numformer.nn import SwiGLUFeedForward

    ff = SwiGLUFeedForward(8, 12, bias=bias, rng=rng, dtype=np.float64)
    x, dy = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    lins = (ff.gate_proj, ff.up_proj, ff.down_proj)
    biases = [None if lin.bias is None else lin.bias.data for lin in lins]
    y_ref, cache = ops.swiglu_forward(x, *(lin.weight.data for lin in lins), *biases)
    dx_ref, *grads = ops.swiglu_backward(dy, cache)
    for reference in (False, True):
        ff.zero_grad()
        with numformer.reference_mode(reference):
            assert_close(ff(x), y_ref, 1e-12, "out")
            assert_close(ff.backward(dy), dx_ref, 1e-12, "dx")
        for lin, dw, db in zip(lins, grads[:3], grads[3:]):
            assert_close(lin.weight.grad, dw, 1e-12, "dW")
            assert (lin.bias is None) == (db is None) and (db is None or np.allclose(lin.bias.grad, db, atol=1e-12))
