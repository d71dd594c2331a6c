"""The Llama-family ops: RoPE, ALiBi, SwiGLU and grouped-query repetition.

Each op: finite differences in float64 and parity with torch autograd (Hugging Face's own
``rotate_half`` / ``apply_rotary_pos_emb`` / ``repeat_kv`` / BLOOM's ALiBi where they exist),
over random shapes including sequence length 1, batch 1, masks and cache offsets.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from numformer import ops
from numformer.ops.alibi import alibi_distance

from conftest import F32_TOL, F64_TOL, assert_close
from test_ops import T, check_op, torch_parity

torch = pytest.importorskip("torch")
llama = pytest.importorskip("transformers.models.llama.modeling_llama")


def _hf_cos_sin(head_dim, positions, theta, dtype):
    """cos/sin as transformers' LlamaRotaryEmbedding computes them (float64 here)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.from_numpy(np.asarray(positions, dtype=np.float64))[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


# -- RoPE ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,offset,theta", [((2, 3, 5, 8), 0, 10000.0), ((1, 2, 1, 4), 7, 10000.0),
                                                ((1, 1, 6, 16), 3, 500000.0), ((3, 4, 2), 11, 100.0)])
def test_rope(rng, shape, offset, theta):
    arrays = {"x": rng.standard_normal(shape)}

    def fwd(x):
        return ops.rope_forward(x, offset=offset, theta=theta)

    check_op(fwd, ops.rope_backward, arrays)
    T_len, d = shape[-2], shape[-1]

    def tfn(x):
        cos, sin = _hf_cos_sin(d, np.arange(offset, offset + T_len), theta, x.dtype)
        return x * cos + llama.rotate_half(x) * sin

    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(fwd, ops.rope_backward, tfn, arrays, dtype, tol)


def test_rope_matches_hf_apply_rotary_pos_emb_with_position_ids(rng):
    """Per-sequence positions (B, T), as for left-padded prompts; q and k rotated by HF's own function."""
    q, k = rng.standard_normal((2, 2, 3, 2, 6))
    positions = np.array([[4, 5], [0, 1]])
    yq, _ = ops.rope_forward(q, positions=positions)
    yk, _ = ops.rope_forward(k, positions=positions)
    cos, sin = _hf_cos_sin(6, positions, 10000.0, torch.float64)
    tq, tk = llama.apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(k), cos, sin)
    assert_close(yq, tq.numpy(), F64_TOL, "q")
    assert_close(yk, tk.numpy(), F64_TOL, "k")


def test_rope_scores_depend_on_relative_position_only(rng):
    q, k = rng.standard_normal((2, 8))
    s = [ops.rope_forward(q[None], offset=p + 3)[0] @ ops.rope_forward(k[None], offset=p)[0].T for p in (0, 5, 40)]
    np.testing.assert_allclose(s[0], s[1], rtol=1e-12)
    np.testing.assert_allclose(s[0], s[2], rtol=1e-12)


def test_rope_cached_positions_continue():
    x = np.random.default_rng(0).standard_normal((1, 2, 7, 4))
    full, _ = ops.rope_forward(x)
    head, _ = ops.rope_forward(x[:, :, :5])
    tail, _ = ops.rope_forward(x[:, :, 5:], offset=5)
    np.testing.assert_allclose(np.concatenate([head, tail], axis=2), full, rtol=1e-14)


def test_rope_odd_head_size_is_one_clear_error():
    with pytest.raises(ValueError, match="even head size"):
        ops.rope_forward(np.zeros((1, 3, 5)))


# -- ALiBi -----------------------------------------------------------------------------------------
def _press_slopes(n):
    """The slopes from the ALiBi paper's code (github.com/ofirpress/attention_with_linear_biases)."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    p = 2 ** math.floor(math.log2(n))
    return power_of_2(p) + _press_slopes(2 * p)[0::2][:n - p]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 8, 12, 16, 20, 32])
def test_alibi_slopes_match_the_paper_and_bloom(n):
    np.testing.assert_allclose(ops.alibi_slopes(n), _press_slopes(n), rtol=1e-15)
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    mask = torch.ones(1, 5)
    hf = bloom.build_alibi_tensor(mask, n, torch.float64).reshape(n, 1, 5)    # slope_h · j
    np.testing.assert_allclose(hf[:, 0, 1].numpy(), ops.alibi_slopes(n), rtol=1e-6)     # BLOOM: float32 slopes
    assert ops.alibi_slopes(8)[0] == 0.5 and ops.alibi_slopes(8)[-1] == 2.0 ** -8


def test_alibi_causal_bias_equals_blooms_up_to_a_per_row_constant():
    """BLOOM adds slope·j; the paper's -slope·(i - j) differs by a per-query constant, which softmax ignores."""
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    n, t = 6, 5
    hf = bloom.build_alibi_tensor(torch.ones(1, t), n, torch.float64).reshape(n, 1, t).numpy()
    ours = ops.alibi_bias(ops.alibi_slopes(n), t, t)
    causal = np.tril(np.ones((t, t), dtype=bool))
    diff = np.where(causal, ours - hf, np.nan)
    np.testing.assert_allclose(diff - np.nanmax(diff, axis=-1, keepdims=True), np.where(causal, 0.0, np.nan)[None].repeat(n, 0),
                               atol=1e-6)


@pytest.mark.parametrize("shape,offset", [((2, 3, 4, 5), 0), ((1, 2, 1, 6), 5), ((4, 3, 3), 2)])
def test_alibi_op(rng, shape, offset):
    arrays = {"scores": rng.standard_normal(shape), "slopes": rng.random(shape[-3]) + 0.1}

    def fwd(scores, slopes):
        return ops.alibi_forward(scores, slopes, offset)

    check_op(fwd, ops.alibi_backward, arrays)
    dist = alibi_distance(shape[-2], shape[-1], offset)

    def tfn(scores, slopes):
        return scores - slopes[:, None, None] * torch.from_numpy(dist).to(scores.dtype)

    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(fwd, ops.alibi_backward, tfn, arrays, dtype, tol)


def test_alibi_cached_query_rows_equal_the_full_bias():
    slopes = ops.alibi_slopes(3)
    full = ops.alibi_bias(slopes, 6, 6)
    np.testing.assert_array_equal(ops.alibi_bias(slopes, 2, 6, offset=4), full[:, 4:])


# -- SwiGLU ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,bias", [((2, 3, 4), False), ((1, 1, 4), True), ((5, 4), False)])
def test_swiglu(rng, shape, bias):
    d, f = shape[-1], 6
    arrays = {"x": rng.standard_normal(shape), "w_gate": rng.standard_normal((f, d)),
              "w_up": rng.standard_normal((f, d)), "w_down": rng.standard_normal((d, f))}
    if bias:
        arrays.update(b_gate=rng.standard_normal(f), b_up=rng.standard_normal(f), b_down=rng.standard_normal(d))

    def bwd(dy, cache):
        g = ops.swiglu_backward(dy, cache)
        return g if bias else g[:4]

    check_op(ops.swiglu_forward, bwd, arrays)
    F = torch.nn.functional

    def tfn(x, w_gate, w_up, w_down, b_gate=None, b_up=None, b_down=None):
        return F.linear(F.silu(F.linear(x, w_gate, b_gate)) * F.linear(x, w_up, b_up), w_down, b_down)

    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(ops.swiglu_forward, bwd, tfn, arrays, dtype, tol)


def test_silu_large_inputs_finite(rng):
    x = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0])
    y, cache = ops.silu_forward(x)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(ops.silu_backward(np.ones_like(x), cache)))
    tx = T(x)
    torch.nn.functional.silu(tx).sum().backward()
    assert_close(y, torch.nn.functional.silu(torch.from_numpy(x)).numpy(), F64_TOL)
    assert_close(ops.silu_backward(np.ones_like(x), cache), tx.grad.numpy(), F64_TOL)


# -- grouped-query attention -----------------------------------------------------------------------
@pytest.mark.parametrize("shape,n_rep", [((2, 2, 3, 4), 3), ((1, 1, 1, 2), 4), ((2, 3, 2, 2), 1)])
def test_repeat_kv(rng, shape, n_rep):
    arrays = {"x": rng.standard_normal(shape)}

    def fwd(x):
        return ops.repeat_kv_forward(x, n_rep)

    check_op(fwd, ops.repeat_kv_backward, arrays)
    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(fwd, ops.repeat_kv_backward, lambda x: llama.repeat_kv(x, n_rep), arrays, dtype, tol)


@pytest.mark.parametrize("causal,offset", [(True, 0), (False, 0), (True, 3)])
def test_grouped_query_attention_with_rope_and_alibi_against_torch(rng, causal, offset):
    """repeat_kv + RoPE + ALiBi + attention composed, against torch's SDPA with enable_gqa (float64)."""
    B, H, Hkv, Tq, d = 2, 4, 2, 3, 4
    Tk = Tq + offset
    q = rng.standard_normal((B, H, Tq, d))
    k, v = rng.standard_normal((2, B, Hkv, Tk, d))
    slopes = ops.alibi_slopes(H)
    bias = ops.alibi_bias(slopes, Tq, Tk, offset)
    if causal:
        bias = np.where(np.tril(np.ones((Tq, Tk), bool), k=offset), bias, -np.inf)

    def ours(q, k, v):
        rq, cq = ops.rope_forward(q, offset=offset)
        rk, ck = ops.rope_forward(k)
        kk, c1 = ops.repeat_kv_forward(rk, H // Hkv)
        vv, c2 = ops.repeat_kv_forward(v, H // Hkv)
        out, _, ca = ops.scaled_dot_product_attention_forward(rq, kk, vv, attn_mask=bias)
        return out, (cq, ck, c1, c2, ca)

    def ours_backward(dy, cache):
        cq, ck, c1, c2, ca = cache
        dq, dkk, dvv = ops.scaled_dot_product_attention_backward(dy, ca)
        return (ops.rope_backward(dq, cq), ops.rope_backward(ops.repeat_kv_backward(dkk, c1), ck),
                ops.repeat_kv_backward(dvv, c2))

    def tfn(q, k, v):
        cq, sq = _hf_cos_sin(d, np.arange(offset, offset + Tq), 10000.0, q.dtype)
        ck, sk = _hf_cos_sin(d, np.arange(Tk), 10000.0, q.dtype)
        rq = q * cq + llama.rotate_half(q) * sq
        rk = k * ck + llama.rotate_half(k) * sk
        return torch.nn.functional.scaled_dot_product_attention(rq, rk, v, attn_mask=torch.from_numpy(bias),
                                                                 enable_gqa=True)

    arrays = {"q": q, "k": k, "v": v}
    check_op(ours, ours_backward, arrays)
    torch_parity(ours, ours_backward, tfn, arrays, np.float64, F64_TOL)


def test_kv_heads_must_divide_heads():
    with pytest.raises(ValueError, match="must divide n_heads=6"):
        ops.check_kv_heads(6, 4)
    ops.check_kv_heads(6, 3)
