"""Sliding-window attention (GPT(sliding_window=W), Mistral's window): every attention kernel, forward and
backward (finite differences in float64, and torch autograd), the KV cache (only the last W positions kept:
memory flat beyond W), generation (cached == uncached), and transformers' Mistral (float64 parity and greedy
generation with window < context < sequence length)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from numformer.gradcheck import check_gradients
from numformer.interop import hf
from numformer.models import GPT
from numformer.nn import MultiHeadAttention
from numformer.nn.attention import sliding_window_mask
from numformer.nn.dispatch import ATTENTION as KERNELS

from test_interop_hf import rel_err

KERNEL_NAMES = sorted(KERNELS)


def mha(kernel, monkeypatch, window=3, **kw):
    layer = MultiHeadAttention(8, 2, rng=np.random.default_rng(0), dtype=np.float64, sliding_window=window,
                               attention="flash" if kernel == "flash" else "plain", **kw)
    monkeypatch.setattr(layer, "kernel_name", lambda p_drop: kernel)
    layer.flash_block_q = layer.flash_block_k = 2                      # several blocks over T = 7
    return layer


def test_window_mask_is_mistrals():
    """Query i attends key j iff i - W < j <= i (transformers' sliding_window_overlay and causality)."""
    blocked = sliding_window_mask(5, 5, 2)
    allowed = ~blocked & np.tril(np.ones((5, 5), bool))
    assert [np.flatnonzero(r).tolist() for r in allowed] == [[0], [0, 1], [1, 2], [2, 3], [3, 4]]
    assert np.array_equal(sliding_window_mask(2, 6, 3, offset=4), sliding_window_mask(6, 6, 3)[4:])


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@pytest.mark.parametrize("options", [dict(), dict(n_kv_heads=1, positional="rope")])
def test_every_kernel_gradchecks_with_a_window(kernel, options, monkeypatch):
    layer = mha(kernel, monkeypatch, **options)
    x = np.random.default_rng(1).standard_normal((2, 7, 8))
    padding = np.zeros((2, 7), bool)
    padding[1, :2] = True                                       # a left-padded row too

    def forward():
        return layer(x, is_causal=True, key_padding_mask=padding)

    def backward(dout):
        return {"x": layer.backward(dout), "W": layer.qkv_proj.weight.grad}

    def fresh_backward(dout):
        layer.zero_grad()
        return backward(dout)

    errors = check_gradients(forward, fresh_backward, {"x": x, "W": layer.qkv_proj.weight.data})
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_every_kernel_matches_torch_autograd(kernel, monkeypatch):
    torch = pytest.importorskip("torch")
    layer = mha(kernel, monkeypatch, window=3, bias=False)
    x = np.random.default_rng(2).standard_normal((2, 7, 8))
    out = layer(x, is_causal=True)
    dout = np.random.default_rng(3).standard_normal(out.shape)
    dx = layer.backward(dout)

    tx = torch.tensor(x, requires_grad=True)
    W = torch.tensor(layer.qkv_proj.weight.data)
    Wo = torch.tensor(layer.out_proj.weight.data)
    q, k, v = (tx @ W.T).reshape(2, 7, 3, 2, 4).permute(2, 0, 3, 1, 4)
    allowed = torch.tensor(~sliding_window_mask(7, 7, 3) & np.tril(np.ones((7, 7), bool)))
    ctx = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    ref = ctx.transpose(1, 2).reshape(2, 7, 8) @ Wo.T
    ref.backward(torch.tensor(dout))
    assert rel_err(out, ref.detach().numpy()) < 1e-12
    assert rel_err(dx, tx.grad.numpy()) < 1e-12


def window_gpt(window=6, attention="plain", **kw):
    return GPT(50, 16, n_layers=2, n_heads=2, d_model=8, positional="rope", activation="swiglu", norm="rms",
               bias=False, sliding_window=window, attention=attention, rng=np.random.default_rng(0),
               dtype=np.float64, **kw)


def test_cached_equals_uncached_generation_beyond_the_window():
    model = window_gpt(window=5).eval()
    prompt = np.array([[5, 17, 3], [8, 2, 1]])
    a, la = model.generate(prompt, 30, rng=3, return_logits=True)
    b, lb = model.generate(prompt, 30, rng=3, use_cache=False, return_logits=True)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(la, lb, rtol=0, atol=1e-10)


def test_cached_forward_equals_full_forward_with_padding():
    model = window_gpt(window=4).eval()
    ids = np.random.default_rng(0).integers(1, 50, (2, 14))
    mask = np.ones((2, 14), int)
    mask[1, :3] = 0
    full = model(ids, attention_mask=mask)
    caches = model.new_kv_caches()
    steps = [model(ids[:, :5], kv_caches=caches, attention_mask=mask[:, :5])]
    for t in range(5, 14):
        steps.append(model(ids[:, t:t + 1], kv_caches=caches, attention_mask=mask[:, :t + 1]))
    assert rel_err(np.concatenate(steps, axis=1)[mask.astype(bool)], full[mask.astype(bool)]) < 1e-12


def test_kv_cache_memory_is_flat_beyond_the_window():
    """Bytes held by the caches after n positions: grow with n without a window, stay put with one."""
    def cache_bytes(model, n):
        caches = model.new_kv_caches()
        model(np.ones((1, 1), int), kv_caches=caches)
        for _ in range(n - 1):
            model(np.ones((1, 1), int), kv_caches=caches)
        return sum(c.k.nbytes + c.v.nbytes for c in caches), caches[0].stored, caches[0].length

    windowed, full = window_gpt(window=8).eval(), window_gpt(window=None).eval()
    sizes = {n: cache_bytes(windowed, n) for n in (16, 64, 256)}
    assert sizes[16][0] == sizes[64][0] == sizes[256][0]                      # flat
    assert all(s[1] <= 2 * (8 + 1) and s[2] == n for n, s in sizes.items())   # at most 2(W + 1) stored; all counted
    assert cache_bytes(full, 256)[0] >= 256 / 32 * sizes[256][0]              # the full cache keeps growing


def test_kv_cache_arrays_shrink_to_the_window_after_a_long_prompt():
    """A prompt of ten windows leaves its keys in the arrays (its own queries need them); the next step keeps
    the last W - 1 and reallocates the arrays to 2·(W + 1) positions, and the logits are those without a cache."""
    model = GPT(50, 64, n_layers=2, n_heads=2, d_model=8, positional="rope", norm="rms", sliding_window=4,
                rng=np.random.default_rng(0), dtype=np.float64).eval()
    ids = np.random.default_rng(1).integers(0, 50, (1, 48))
    caches = model.new_kv_caches()
    steps = [model(ids[:, :40], kv_caches=caches)]
    assert [c.k.shape[2] for c in caches] == [40, 40]
    for t in range(40, 48):
        steps.append(model(ids[:, t:t + 1], kv_caches=caches))
        assert all(c.k.shape[2] <= 2 * (4 + 1) and c.stored <= 2 * (4 + 1) for c in caches)
    assert np.abs(np.concatenate(steps, axis=1) - model(ids)).max() < 1e-12


# -- transformers' Mistral: window < context < sequence length ---------------------------------------------------
def mistral_folder(tmp_path, window=5, context=12):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MistralConfig(vocab_size=300, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, intermediate_size=24, max_position_embeddings=context,
                                     sliding_window=window, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "mistral")
    return tmp_path / "mistral"


@pytest.mark.parametrize("attention", ["plain", "flash"])
def test_mistral_float64_parity_past_window_and_context(tmp_path, attention):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from test_llama_hf import _float64_arithmetic

    folder = mistral_folder(tmp_path)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "mistral"
    tmodel = _float64_arithmetic(transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval())
    model = hf.load_pretrained(folder, dtype=np.float64, attention=attention)[0]
    assert model.sliding_window == 5 and model.block_size == 12
    idx = np.random.default_rng(1).integers(0, 300, (2, 30))                # 5 < 12 < 30
    with torch.no_grad():
        ref = tmodel(torch.from_numpy(idx)).logits.numpy()
    assert rel_err(model(idx), ref) < 1e-9


def test_mistral_greedy_generation_equals_transformers_and_exports_as_mistral(tmp_path):
    transformers = pytest.importorskip("transformers")
    from numformer.interop import hf
    from test_interop_hf import transformers_greedy

    folder = mistral_folder(tmp_path, window=4, context=40)
    tmodel = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    model = hf.load_pretrained(folder)[0]
    prompt = np.array([[5, 17, 3, 44, 9, 12]])
    np.testing.assert_array_equal(model.generate(prompt, 20, greedy=True), transformers_greedy(tmodel, prompt, 20))
    out = hf.export_hf(model, tmp_path / "out")
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["model_type"], cfg["sliding_window"], cfg["architectures"]) == ("mistral", 4, ["MistralForCausalLM"])
    assert hf.load_pretrained(out)[0].sliding_window == 4


def test_mistral_without_sliding_window_key_gets_mistralconfigs_4096(tmp_path):
    folder = mistral_folder(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("sliding_window")
    (folder / "config.json").write_text(json.dumps(cfg))
    assert hf.load_pretrained(folder)[0].sliding_window == 4096
