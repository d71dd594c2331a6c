"""The GPT's modern-decoder options (RoPE, ALiBi, SwiGLU, RMSNorm, grouped-query attention):
finite differences in float64, parity with an independent torch model, flash = plain, cached = full."""
from __future__ import annotations

import numpy as np
import pytest

from numformer import GPT, build_model
from numformer.generate import generate
from numformer.nn import MultiHeadAttention

from conftest import assert_close, assert_gradcheck, module_gradcheck

torch = pytest.importorskip("torch")
F64 = np.float64

OPTIONS = {
    "rope": dict(positional="rope"),
    "alibi": dict(positional="alibi"),
    "swiglu": dict(activation="swiglu"),
    "gqa": dict(n_kv_heads=2),
    "mqa": dict(n_kv_heads=1),
    "llama": dict(positional="rope", norm="rms", activation="swiglu", n_kv_heads=2, bias=False,
                  tie_weights=False, rope_theta=500.0),
    "alibi-gqa-3heads": dict(positional="alibi", n_heads=6, d_model=12, n_kv_heads=3, norm="rms"),
}


def small(attention="plain", **kw):
    args = dict(vocab_size=11, block_size=16, n_layers=2, n_heads=4, d_model=8, d_ff=12, dropout=0.0,
                attention=attention, rng=np.random.default_rng(0), dtype=F64)
    args.update(kw)
    return GPT(**args)


@pytest.mark.parametrize("attention", ["plain", "flash"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_gpt_option_gradients(name, attention):
    m = small(attention, n_layers=1, **OPTIONS[name])
    if attention == "flash":
        for b in m.blocks:
            b.self_attn.flash_block_q = b.self_attn.flash_block_k = 2     # several blocks in 5 positions
    idx = np.random.default_rng(1).integers(0, 11, size=(2, 5))
    assert_gradcheck(module_gradcheck(m, {}, lambda: m(idx)))


# -- an independent torch implementation of the same model ------------------------------------
def _torch_forward(m, idx, params):
    """The GPT's computation written with torch ops (pre-LN); params: {name: torch tensor}."""
    F = torch.nn.functional
    B, T = idx.shape
    H, d = m.n_heads, m.d_model
    dh = d // H
    x = params["tok_emb.weight"][torch.from_numpy(idx)]
    if m.positional == "learned":
        x = x + params["pos_emb.weight"][:T]

    def norm(z, prefix, mod):
        if mod.__class__.__name__ == "RMSNorm":
            return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + mod.eps) * params[prefix + ".weight"]
        return F.layer_norm(z, (d,), params[prefix + ".weight"], params.get(prefix + ".bias"), mod.eps)

    def lin(z, prefix):
        return F.linear(z, params[prefix + ".weight"], params.get(prefix + ".bias"))

    mask = torch.full((T, T), -torch.inf, dtype=torch.float64).triu(1)
    for i, blk in enumerate(m.blocks):
        p, att = f"blocks.{i}", blk.self_attn
        Hkv = att.n_kv_heads
        qkv = lin(norm(x, p + ".norm1", blk.norm1), p + ".self_attn.qkv_proj").view(B, T, H + 2 * Hkv, dh)
        q, k, v = (qkv[:, :, :H], qkv[:, :, H:H + Hkv], qkv[:, :, H + Hkv:])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        bias = mask
        if att.positional == "rope":
            inv = 1.0 / att.rope_theta ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh)
            ang = torch.arange(T, dtype=torch.float64)[:, None] * inv
            ang = torch.cat([ang, ang], -1)

            def rot(t):
                t1, t2 = t[..., :dh // 2], t[..., dh // 2:]
                return t * ang.cos() + torch.cat([-t2, t1], -1) * ang.sin()
            q, k = rot(q), rot(k)
        if att.positional == "alibi":
            dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs().double()
            bias = mask - torch.from_numpy(att.alibi_slopes)[:, None, None] * dist
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = x + lin(y.transpose(1, 2).reshape(B, T, d), p + ".self_attn.out_proj")
        h = norm(x, p + ".norm2", blk.norm2)
        if blk.activation == "swiglu":
            f = lin(F.silu(lin(h, p + ".ff.gate_proj")) * lin(h, p + ".ff.up_proj"), p + ".ff.down_proj")
        else:
            f = lin(F.gelu(lin(h, p + ".ff.linear1")), p + ".ff.linear2")
        x = x + f
    x = norm(x, "norm_f", m.norm_f)
    w = params["tok_emb.weight"] if m.tie_weights else params["lm_head.weight"]
    return x @ w.T


@pytest.mark.parametrize("attention", ["plain", "flash"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_gpt_option_parity_with_torch(name, attention):
    m = small(attention, **OPTIONS[name])
    rng = np.random.default_rng(3)
    for p in m.parameters():                    # not the init's zeros and ones: every path carries signal
        p.data[...] = rng.standard_normal(p.shape) * 0.3
    for B, T in ((2, 7), (1, 1), (1, 16)):
        idx = rng.integers(0, 11, size=(B, T))
        m.zero_grad()
        logits = m(idx)
        dlogits = rng.standard_normal(logits.shape)
        m.backward(dlogits)
        params = {n: torch.tensor(p.data, requires_grad=True) for n, p in m.named_parameters()}
        ref = _torch_forward(m, idx, params)
        ref.backward(torch.from_numpy(dlogits))
        assert_close(logits, ref.detach().numpy(), 1e-10, f"logits B={B} T={T}")
        for n, p in m.named_parameters():
            assert_close(p.grad, params[n].grad.numpy(), 1e-10, f"d{n} B={B} T={T}")


# -- flash = plain; cached decoding = full forward ----------------------------------------------
@pytest.mark.parametrize("name", ["rope", "alibi", "llama", "alibi-gqa-3heads"])
def test_gpt_option_flash_equals_plain(name):
    idx = np.random.default_rng(2).integers(0, 11, size=(2, 13))
    res = []
    for attention in ("plain", "flash"):
        m = small(attention, **OPTIONS[name])
        for b in m.blocks:
            b.self_attn.flash_block_q, b.self_attn.flash_block_k = 4, 3
        out = m(idx)
        m.backward(np.random.default_rng(1).standard_normal(out.shape))
        res.append((out, {n: p.grad for n, p in m.named_parameters()}))
    (o1, g1), (o2, g2) = res
    assert_close(o2, o1, 1e-10, "logits")
    for n in g1:
        assert_close(g2[n], g1[n], 1e-10, n)


@pytest.mark.parametrize("attention", ["plain", "flash"])
@pytest.mark.parametrize("name", ["rope", "alibi", "gqa", "llama", "alibi-gqa-3heads"])
def test_gpt_option_cached_decoding_equals_full_forward(name, attention):
    m = small(attention, **OPTIONS[name]).eval()
    idx = np.random.default_rng(4).integers(0, 11, size=(2, 12))
    full = m(idx)
    caches = m.new_kv_caches()
    steps = [m(idx[:, :5], kv_caches=caches)]                            # prefill, then one token at a time
    for t in range(5, 12):
        steps.append(m(idx[:, t:t + 1], kv_caches=caches))
    assert_close(np.concatenate(steps, axis=1), full, 1e-10, "cached logits")
    kv_heads = m.blocks[0].self_attn.n_kv_heads
    assert caches[0].k.shape[1] == kv_heads and caches[0].length == 12      # only n_kv_heads heads are stored


@pytest.mark.parametrize("name", ["rope", "alibi", "llama"])
def test_gpt_option_generation_cached_equals_uncached(name):
    m = small(**OPTIONS[name])
    prompt = np.random.default_rng(5).integers(0, 11, size=(2, 3))
    a, la = generate(m, prompt, 20, rng=np.random.default_rng(9), shift=4, return_logits=True)
    b, lb = generate(m, prompt, 20, rng=np.random.default_rng(9), shift=4, use_cache=False, return_logits=True)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(la, lb, rtol=0, atol=1e-10)


def test_gqa_kv_cache_memory():
    """The cache of a grouped-query model holds n_kv_heads / n_heads of the multi-head cache's bytes."""
    sizes = {}
    for kv in (4, 2, 1):
        m = small(n_kv_heads=kv).eval()
        caches = m.new_kv_caches()
        m(np.zeros((1, 16), dtype=int), kv_caches=caches)
        sizes[kv] = sum(c.k[:, :, :c.length].nbytes + c.v[:, :, :c.length].nbytes for c in caches)
    assert sizes[2] * 2 == sizes[4] and sizes[1] * 4 == sizes[4]


def test_rope_and_alibi_models_have_no_position_table():
    for positional in ("rope", "alibi"):
        m = small(positional=positional)
        assert not any("pos_emb" in n for n, _ in m.named_parameters())
    assert small(positional="rope").num_parameters() == small().num_parameters() - 16 * 8


def test_swiglu_default_width_keeps_the_parameter_count():
    gelu = GPT(65, 64, d_model=96, n_layers=1, bias=False)
    swiglu = GPT(65, 64, d_model=96, n_layers=1, bias=False, activation="swiglu")
    assert swiglu.d_ff == 256 and swiglu.num_parameters() == gelu.num_parameters()


# -- one clear line for bad input -----------------------------------------------------------------
def test_bad_options_are_one_clear_error():
    with pytest.raises(ValueError, match=r"n_kv_heads=3 must divide n_heads=4"):
        small(n_kv_heads=3)
    with pytest.raises(ValueError, match=r"positional='rope' needs an even head size.*= 3"):
        small(positional="rope", d_model=12)
    with pytest.raises(ValueError, match="unknown positional encoding 'rotary'"):
        small(positional="rotary")
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        small(activation="swish")
    learned = small()
    alibi = small(positional="alibi")
    with pytest.raises(ValueError, match=r"learned position table \(pos_emb.weight\).*positional='alibi'"):
        alibi.load_state_dict(learned.state_dict())
    with pytest.raises(ValueError, match="positional='rope' is an option of self-attention"):
        MultiHeadAttention(8, 4, positional="rope")(np.zeros((1, 3, 8)), np.zeros((1, 4, 8)))


@pytest.mark.parametrize("same_kv", [True, False])
def test_grouped_query_cross_attention_gradients(same_kv):
    """n_kv_heads also works for cross-attention (the memory is projected to n_kv_heads heads)."""
    att = MultiHeadAttention(8, 4, n_kv_heads=2, rng=np.random.default_rng(0), dtype=F64)
    rng = np.random.default_rng(1)
    x, mem = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 5, 8))
    val = mem if same_kv else rng.standard_normal((2, 5, 8))
    inputs = {"x": x, "mem": mem} if same_kv else {"x": x, "mem": mem, "val": val}
    names = list(inputs)
    errors = module_gradcheck(att, inputs, lambda **a: att(a["x"], a["mem"], a.get("val", a["mem"])),
                              lambda g: dict(zip(names, g)))
    assert_gradcheck(errors)


def test_build_model_accepts_the_options():
    m = build_model({"type": "gpt", "vocab_size": 11, "block_size": 8, "n_heads": 4, "d_model": 8,
                     "positional": "rope", "activation": "swiglu", "norm": "rms", "n_kv_heads": 2,
                     "rope_theta": 1e4, "bias": False})
    assert m.blocks[0].self_attn.n_kv_heads == 2 and m.blocks[0].self_attn.qkv_proj.weight.shape == (16, 8)


def test_llama_config_matches_the_gpt2_config_in_parameters():
    """configs/shakespeare_char_llama.toml: RoPE, RMSNorm, SwiGLU, grouped-query, no biases; its parameter count
    is the closest to shakespeare_char.toml's that these options allow (they move it in steps of 1,536)."""
    from pathlib import Path

    from numformer.config import load_config
    from numformer.train import resolve_config

    root = Path(__file__).resolve().parents[1] / "configs"
    counts = {}
    for name in ("shakespeare_char", "shakespeare_char_llama"):
        config, _ = resolve_config(load_config(root / f"{name}.toml"))
        model = {k: v for k, v in config["model"].items() if v is not None}
        counts[name] = build_model(model).num_parameters()
        if name.endswith("llama"):
            assert (model["positional"], model["norm"], model["activation"], model["bias"]) == (
                "rope", "rms", "swiglu", False) and model["n_kv_heads"] < model["n_heads"]
    assert abs(counts["shakespeare_char_llama"] - counts["shakespeare_char"]) < 1536 / 2


# -- the same options in the encoder-decoder Transformer and the classifier -------------------------
@pytest.mark.parametrize("options", [dict(positional="rope", n_kv_heads=1, activation="swiglu", norm="rms"),
                                     dict(positional="alibi")])
def test_transformer_and_classifier_options_gradients(options):
    from numformer import EncoderClassifier, Transformer

    t = Transformer(13, 13, d_model=8, n_heads=2, n_layers=1, d_ff=12, dropout=0.0, src_pad_id=0,
                    rng=np.random.default_rng(0), dtype=F64, **options)
    src = np.array([[3, 4, 5, 6], [7, 8, 0, 0]])
    tgt = np.array([[1, 2, 3], [4, 5, 6]])
    assert_gradcheck(module_gradcheck(t, {}, lambda: t(src, tgt)))
    c = EncoderClassifier(13, 3, max_len=10, d_model=8, n_heads=2, n_layers=1, dropout=0.0, pad_id=0,
                          rng=np.random.default_rng(0), dtype=F64, **options)
    assert_gradcheck(module_gradcheck(c, {}, lambda: c(src)))


@pytest.mark.parametrize("positional", ["rope", "alibi"])
def test_transformer_cached_decoding_equals_full(positional):
    from numformer import Transformer

    t = Transformer(13, 13, d_model=8, n_heads=2, n_layers=2, d_ff=12, dropout=0.0, positional=positional,
                    n_kv_heads=1, rng=np.random.default_rng(0), dtype=F64).eval()
    src = np.random.default_rng(1).integers(1, 13, (2, 6))
    tgt = np.random.default_rng(2).integers(1, 13, (2, 7))
    full = t(src, tgt)
    memory = t.encode(src)
    caches = t.new_caches()
    steps = [t.decode(tgt[:, i:i + 1], memory, caches=caches) for i in range(7)]
    assert_close(np.concatenate(steps, axis=1), full, 1e-10, "cached logits")


@pytest.mark.parametrize("name", ["llama", "alibi-gqa-3heads"])
def test_gpt_option_gradient_checkpointing_gives_the_same_gradients(name):
    idx = np.random.default_rng(6).integers(0, 11, size=(2, 9))
    res = []
    for ckpt in (False, True):
        m = small(gradient_checkpointing=ckpt, **OPTIONS[name])
        out = m(idx)
        m.backward(np.random.default_rng(1).standard_normal(out.shape))
        res.append((out, {n: p.grad for n, p in m.named_parameters()}))
    (o1, g1), (o2, g2) = res
    np.testing.assert_array_equal(o1, o2)
    for n in g1:
        np.testing.assert_allclose(g2[n], g1[n], rtol=1e-12, atol=1e-14, err_msg=n)
