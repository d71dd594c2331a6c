"""The memory-efficient (flash) attention kernel equals the plain kernel: outputs and every gradient."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from numformer import GPT, EncoderClassifier, Transformer, ops
from numformer.models import build_model
from numformer.nn import MultiHeadAttention
from numformer.kernels.flash_attention import flash_attention_backward, flash_attention_forward

from conftest import assert_close, assert_gradcheck, module_gradcheck
from numformer.gradcheck import check_gradients

TOL = 1e-10     # float64, flash vs plain


def _qkv(rng, B=2, H=3, Tq=13, Tk=13, dk=4, dv=5):
    return (rng.standard_normal((B, H, Tq, dk)), rng.standard_normal((B, H, Tk, dk)),
            rng.standard_normal((B, H, Tk, dv)))


def _plain(q, k, v, dout, **kw):
    out, _, cache = ops.scaled_dot_product_attention_forward(q, k, v, **kw)
    return (out,) + ops.scaled_dot_product_attention_backward(dout, cache)


def _flash(q, k, v, dout, **kw):
    out, cache = flash_attention_forward(q, k, v, **kw)
    return (out,) + flash_attention_backward(dout, cache)


def _compare(flash, plain, tol=TOL):
    for name, a, b in zip(("out", "dq", "dk", "dv"), flash, plain):
        assert np.all(np.isfinite(a)), f"{name} has non-finite values"
        assert_close(a, b, tol, name)


def _cases(rng, B, Tq, Tk):
    """(name, flash kwargs, equivalent plain kwargs)."""
    pad = np.ones((B, Tk), dtype=bool)
    pad[1, -3:] = False
    bool_mask = rng.random((Tq, Tk)) > 0.4
    float_mask = rng.standard_normal((Tq, Tk))
    float_mask[rng.random((Tq, Tk)) > 0.7] = -np.inf
    full = rng.random((B, 3, Tq, Tk)) > 0.3
    float_pad = np.where(pad, 0.0, -np.inf) + rng.standard_normal((B, Tk))
    combined = np.where(pad[:, None, None, :], float_mask, -np.inf)
    return [
        ("none", {}, {}),
        ("causal", {"is_causal": True}, {"is_causal": True}),
        ("key_mask", {"key_mask": pad}, {"attn_mask": pad[:, None, None, :]}),
        ("float_key_mask", {"key_mask": float_pad}, {"attn_mask": float_pad[:, None, None, :]}),
        ("padding_attn_mask", {"attn_mask": pad[:, None, None, :]}, {"attn_mask": pad[:, None, None, :]}),
        ("bool", {"attn_mask": bool_mask}, {"attn_mask": bool_mask}),
        ("float", {"attn_mask": float_mask}, {"attn_mask": float_mask}),
        ("per_head", {"attn_mask": full}, {"attn_mask": full}),
        ("causal+padding+float", {"is_causal": True, "key_mask": pad, "attn_mask": float_mask},
         {"is_causal": True, "attn_mask": combined}),
    ]


@pytest.mark.parametrize("lengths", [(13, 13), (7, 19), (19, 6), (1, 9)])
@pytest.mark.parametrize("blocks", [(1, 1), (4, 4), (5, 3), (8, 64), (256, 256)])
def test_flash_equals_plain(rng, lengths, blocks):
    Tq, Tk = lengths
    q, k, v = _qkv(rng, Tq=Tq, Tk=Tk)
    dout = rng.standard_normal((2, 3, Tq, 5))
    for name, fkw, pkw in _cases(rng, 2, Tq, Tk):
        flash = _flash(q, k, v, dout, block_q=blocks[0], block_k=blocks[1], **fkw)
        try:
            _compare(flash, _plain(q, k, v, dout, **pkw))
        except AssertionError as e:
            raise AssertionError(f"mask {name}, lengths {lengths}, blocks {blocks}: {e}") from None


def test_flash_scale_and_causal_offset(rng):
    q, k, v = _qkv(rng, Tq=5, Tk=12)
    dout = rng.standard_normal((2, 3, 5, 5))
    offset = 7                                   # 7 cached keys: query i sees keys j <= i + 7 (bottom-right)
    allowed = np.tril(np.ones((5, 12), dtype=bool), k=offset)
    for blocks in ((2, 3), (4, 5), (64, 64)):
        _compare(_flash(q, k, v, dout, is_causal=True, causal_offset=offset, scale=0.3, block_q=blocks[0],
                        block_k=blocks[1]),
                 _plain(q, k, v, dout, attn_mask=allowed, scale=0.3))


def test_flash_fully_masked_rows_give_zeros_not_nan(rng):
    q, k, v = _qkv(rng, Tq=6, Tk=9)
    dout = rng.standard_normal((2, 3, 6, 5))
    mask = np.ones((6, 9), dtype=bool)
    mask[2] = False                              # query 2 may attend nothing
    fmask = np.zeros((6, 9))
    fmask[4] = -np.inf                           # query 4: every score -inf
    pad = np.ones((2, 9), dtype=bool)
    pad[1] = False                               # batch element 1: every key is padding
    for blocks in ((2, 2), (3, 4), (64, 64)):
        out, dq, dk, dv = _flash(q, k, v, dout, attn_mask=mask & (fmask == 0), key_mask=pad, block_q=blocks[0],
                                 block_k=blocks[1])
        plain = _plain(q, k, v, dout, attn_mask=(mask & (fmask == 0))[None, None] & pad[:, None, None, :])
        _compare((out, dq, dk, dv), plain)
        assert np.all(out[:, :, 2] == 0) and np.all(out[:, :, 4] == 0) and np.all(out[1] == 0)
        assert np.all(dq[:, :, 2] == 0) and np.all(dq[1] == 0) and np.all(dk[1] == 0) and np.all(dv[1] == 0)
        _compare(_flash(q, k, v, dout, attn_mask=fmask, block_q=blocks[0], block_k=blocks[1]),
                 _plain(q, k, v, dout, attn_mask=fmask))


@pytest.mark.parametrize("kind", ["none", "causal", "masks"])
def test_flash_finite_differences(rng, kind):
    q, k, v = _qkv(rng, B=2, H=2, Tq=5, Tk=7, dk=3, dv=2)
    pad = np.ones((2, 7), dtype=bool)
    pad[0, -2:] = False
    fmask = rng.standard_normal((5, 7))
    kw = {"none": {}, "causal": {"is_causal": True},
          "masks": {"is_causal": True, "key_mask": pad, "attn_mask": fmask}}[kind]
    arrays = {"q": q, "k": k, "v": v}

    def forward():
        return flash_attention_forward(**arrays, block_q=2, block_k=3, **kw)[0]

    def backward(dout):
        _, cache = flash_attention_forward(**arrays, block_q=2, block_k=3, **kw)
        return dict(zip("qkv", flash_attention_backward(dout, cache)))

    assert_gradcheck(check_gradients(forward, backward, arrays))


def test_flash_float32_close_to_plain(rng):
    q, k, v = (a.astype(np.float32) for a in _qkv(rng, Tq=40, Tk=40, dk=16, dv=16))
    dout = rng.standard_normal((2, 3, 40, 16)).astype(np.float32)
    flash = _flash(q, k, v, dout, is_causal=True, block_q=16, block_k=8)
    assert all(a.dtype == np.float32 for a in flash)
    _compare(flash, _plain(q, k, v, dout, is_causal=True), tol=1e-5)


def test_flash_rejects_dropout_and_bad_input(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match="dropout"):
        flash_attention_forward(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match="block_q"):
        flash_attention_forward(q, k, v, block_q=0)
    with pytest.raises(ValueError, match="broadcast"):
        flash_attention_forward(q, k, v, attn_mask=np.ones((4, 13), dtype=bool))
    with pytest.raises(ValueError, match="key_mask"):
        flash_attention_forward(q, k, v, key_mask=np.ones((2, 1, 13), dtype=bool))
    with pytest.raises(ValueError, match="d_k"):
        flash_attention_forward(q, k[..., :2], v)


def test_flash_memory_is_linear_not_quadratic():
    """Forward + backward at T = 4096 allocate far less than one (T, T) score matrix (134 MB in float64)."""
    rng = np.random.default_rng(0)
    T, d = 4096, 8
    q, k, v, dout = (rng.standard_normal((1, 1, T, d)) for _ in range(4))
    tracemalloc.start()
    try:
        out, cache = flash_attention_forward(q, k, v, is_causal=True, block_q=128, block_k=128)
        flash_attention_backward(dout, cache)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < T * T * 8 / 16, f"peak {peak / 1e6:.1f} MB"


# -- the module and the models ----------------------------------------------------------------------------------
def _pair(make):
    """The same module twice (same weights), plain and flash kernels."""
    return make("plain"), make("flash")


def _module_grads(m):
    return {n: p.grad.copy() for n, p in m.named_parameters()}


def _mha_masks(rng, B, Tq, Tk, H):
    pad = np.zeros((B, Tk), dtype=bool)
    pad[0, -2:] = True                                 # module convention: True = padding
    bool_mask = rng.random((Tq, Tk)) < 0.3             # True = blocked
    bool_mask[:, 0] = False
    return [
        {},
        {"is_causal": True},
        {"key_padding_mask": pad},
        {"key_padding_mask": np.where(pad, -np.inf, 0.0) + rng.standard_normal((B, Tk))},
        {"attn_mask": bool_mask},
        {"attn_mask": rng.standard_normal((Tq, Tk))},
        {"attn_mask": rng.random((B * H, Tq, Tk)) < 0.3, "key_padding_mask": pad},
        {"attn_mask": rng.random((B, H, Tq, Tk)) < 0.3, "is_causal": True},
        {"attn_mask": bool_mask, "key_padding_mask": pad, "is_causal": True},
    ]


@pytest.mark.parametrize("mode", ["self", "cross", "cross_kv"])
def test_multihead_attention_flash_equals_plain(rng, mode):
    B, Tq, E, H = 2, 7, 12, 3
    Tk = Tq if mode == "self" else 10
    plain, flash = _pair(lambda a: MultiHeadAttention(E, H, rng=np.random.default_rng(0), dtype=np.float64,
                                                      attention=a))
    flash.flash_block_q, flash.flash_block_k = 3, 4
    x = rng.standard_normal((B, Tq, E))
    mem = rng.standard_normal((B, Tk, E))
    val = rng.standard_normal((B, Tk, E))
    dout = rng.standard_normal((B, Tq, E))
    for masks in _mha_masks(rng, B, Tq, Tk, H):
        results = []
        for m in (plain, flash):
            m.zero_grad()
            if mode == "self":
                out = m(x, **masks)
            elif mode == "cross":
                out = m(x, mem, **masks)
            else:
                out = m(x, mem, val, **masks)
            grads = m.backward(dout)
            results.append((out, grads if isinstance(grads, tuple) else (grads,), _module_grads(m)))
        (o1, g1, p1), (o2, g2, p2) = results
        assert_close(o2, o1, TOL, f"out {sorted(masks)}")
        for a, b in zip(g2, g1):
            assert_close(a, b, TOL, f"input grad {sorted(masks)}")
        for n in p1:
            assert_close(p2[n], p1[n], TOL, f"{n} {sorted(masks)}")


def test_multihead_attention_flash_gradcheck(rng):
    m = MultiHeadAttention(6, 2, rng=rng, dtype=np.float64, attention="flash")
    m.flash_block_q, m.flash_block_k = 2, 3
    pad = np.zeros((2, 5), dtype=bool)
    pad[1, -1] = True
    x = rng.standard_normal((2, 5, 6))
    errors = module_gradcheck(m, {"x": x}, lambda x: m(x, key_padding_mask=pad, is_causal=True),
                              lambda g: {"x": g})
    assert_gradcheck(errors)


def test_multihead_attention_flash_dropout_and_weights(rng):
    m = MultiHeadAttention(8, 2, dropout=0.1, rng=rng, attention="flash")
    x = rng.standard_normal((1, 4, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="attention='flash' has no attention dropout"):
        m(x)
    m.eval()
    out = m(x)                                         # no dropout in evaluation: the flash kernel runs
    m.record_weights = True                            # weights wanted: the plain kernel builds them
    np.testing.assert_allclose(m(x), out, rtol=1e-5, atol=1e-6)
    assert m.last_weights.shape == (1, 2, 4, 4)
    with pytest.raises(ValueError, match="unknown attention kernel"):
        MultiHeadAttention(8, 2, attention="fast")


def _model_grads_equal(make, call, dlogits_shape_from, rng):
    plain, flash = _pair(make)
    for m in (plain, flash):
        for layer in m.modules():
            if isinstance(layer, MultiHeadAttention):
                layer.flash_block_q, layer.flash_block_k = 3, 5
    outs = []
    for m in (plain, flash):
        out = call(m)
        dlogits = np.random.default_rng(1).standard_normal(out.shape)
        m.backward(dlogits)
        outs.append((out, _module_grads(m)))
    (o1, g1), (o2, g2) = outs
    assert_close(o2, o1, TOL, "logits")
    for n in g1:
        assert_close(g2[n], g1[n], TOL, n)


def test_gpt_flash_equals_plain(rng):
    idx = rng.integers(0, 11, (2, 9))
    _model_grads_equal(lambda a: GPT(11, 16, n_layers=2, n_heads=2, d_model=8, rng=np.random.default_rng(0),
                                     dtype=np.float64, attention=a), lambda m: m(idx), None, rng)


def test_transformer_flash_equals_plain(rng):
    src = rng.integers(1, 13, (2, 8))
    src[1, -3:] = 0
    tgt = rng.integers(1, 13, (2, 6))
    tgt[0, -2:] = 0
    _model_grads_equal(lambda a: Transformer(13, 13, d_model=8, n_heads=2, n_layers=2, d_ff=16, dropout=0.0,
                                             src_pad_id=0, tgt_pad_id=0, rng=np.random.default_rng(0),
                                             dtype=np.float64, attention=a), lambda m: m(src, tgt), None, rng)


def test_classifier_flash_equals_plain(rng):
    ids = rng.integers(1, 13, (3, 7))
    ids[1, -4:] = 0
    _model_grads_equal(lambda a: EncoderClassifier(13, 2, max_len=16, d_model=8, n_heads=2, n_layers=2, dropout=0.0,
                                                   rng=np.random.default_rng(0), dtype=np.float64, attention=a),
                       lambda m: m(ids), None, rng)


def test_gpt_flash_kv_cache_equals_full_forward(rng):
    gpt = build_model({"type": "gpt", "vocab_size": 11, "block_size": 32, "n_layers": 2, "n_heads": 2,
                       "d_model": 8, "attention": "flash"}, rng=np.random.default_rng(0), dtype=np.float64)
    assert all(b.self_attn.attention == "flash" for b in gpt.blocks)
    gpt.eval()
    idx = rng.integers(0, 11, (2, 12))
    full = gpt(idx)
    caches = gpt.new_kv_caches()
    steps = [gpt(idx[:, :5], kv_caches=caches)]                      # prefill (causal with Tq > 1)
    for t in range(5, 12):
        steps.append(gpt(idx[:, t:t + 1], kv_caches=caches))
    assert_close(np.concatenate(steps, axis=1), full, 1e-10, "cached logits")
