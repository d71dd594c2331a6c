"""A model described by data: GPTConfig (one BlockConfig per layer), the keyword form, to_dict/from_dict, and a
model whose layers all differ, checked by finite differences in float64 and against a hand-written PyTorch
model (forward and every gradient)."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

import numformer
from numformer.gradcheck import check_gradients
from numformer.models import (GPT, BlockConfig, EncoderClassifier, EncoderClassifierConfig, GPTConfig, Transformer,
                              TransformerConfig, build_model)
from numformer.ops.rope_scaling import RopeScaling, rope_inverse_frequencies

V, T, D = 11, 7, 8
# wavelengths 2π/θ_i of the first layer's head (base 100, size 6): 6.3 (between L₀/h = 4 and L₀/l = 16: smoothed),
# 29 and 136 (beyond 16: divided by the factor)
LLAMA3 = RopeScaling("llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position_embeddings=16)
YARN = RopeScaling("yarn", factor=4.0, original_max_position_embeddings=8)


def mixed_config(**changes):
    """Three layers that differ in everything a layer may: a window (3) on the first only, a head size of its
    own (not d_model / n_heads) on the first and last, q/k norm on the first, GeGLU, SwiGLU and a plain GELU
    feed-forward, pre, sandwich and post norms, RoPE bases and scalings (llama3 with all three frequency bands
    on the first, YaRN on the second), grouped keys and values, an attention scale and a soft-cap, biases on some
    projections only."""
    layers = (
        BlockConfig(n_heads=4, n_kv_heads=2, head_dim=6, d_ff=12, activation="geglu", sliding_window=3, qk_norm=True,
                    rope_theta=100.0, bias=False, rope_scaling=LLAMA3),
        BlockConfig(n_heads=2, head_dim=4, d_ff=10, activation="swiglu", norm_placement="sandwich", attn_scale=0.3,
                    attn_logit_softcap=2.0, bias=False, attn_bias=False, qkv_bias=True, rope_scaling=YARN),
        BlockConfig(n_heads=4, n_kv_heads=1, head_dim=2, d_ff=16, activation="gelu", norm_placement="post",
                    rope_theta=50000.0),
    )
    base = dict(vocab_size=V, block_size=16, d_model=D, layers=layers, positional="rope", norm="rms",
                layer_norm_eps=1e-6, final_norm=True, tie_weights=True, final_logit_softcap=4.0)
    return GPTConfig(**{**base, **changes})


def randomize(model, seed=1):
    """Norm gains and biases away from 1 and 0, so that every parameter matters."""
    rng = np.random.default_rng(seed)
    for name, p in model.named_parameters():
        if p.data.ndim == 1:
            p.data[...] = p.data + 0.3 * rng.standard_normal(p.shape)
    return model


# -- the config as data -----------------------------------------------------------------------------------
KEYWORD_FORMS = [
    dict(vocab_size=30, block_size=16, n_layers=2, n_heads=2, d_model=16),
    dict(vocab_size=30, block_size=16, n_layers=3, n_heads=4, n_kv_heads=2, d_model=16, positional="rope",
         activation="swiglu", norm="rms", bias=False, tie_weights=False, sliding_window=5, rope_theta=500.0),
    dict(vocab_size=30, block_size=16, n_layers=1, n_heads=2, d_model=16, norm_first=False, activation="relu",
         attn_bias=False, qkv_bias=True, padding_idx=3, dropout=0.1),
    dict(vocab_size=30, block_size=16, n_layers=2, n_heads=2, d_model=16, head_dim=6, qk_norm=True,
         norm_placement="sandwich", activation="geglu", attn_scale=0.5, attn_logit_softcap=3.0,
         final_logit_softcap=20.0, scale_embeddings=True, positional="rope", norm="rms"),
]


@pytest.mark.parametrize("keywords", KEYWORD_FORMS)
def test_gpt_of_a_config_equals_the_keyword_form(keywords):
    config = GPTConfig.from_keywords(**keywords)
    a, b = GPT(**keywords, rng=0), GPT(config, rng=0)
    assert a.config == b.config == config and len(config.layers) == keywords["n_layers"]
    assert len(set(config.layers)) == 1                              # the keyword form: identical layers
    assert [n for n, _ in a.named_parameters()] == [n for n, _ in b.named_parameters()]
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert np.array_equal(p.data, q.data), n
    idx = np.random.default_rng(0).integers(0, 30, (2, 9))
    np.testing.assert_array_equal(a.eval()(idx), b.eval()(idx))
    assert GPT(config=config, rng=0).config == config


def test_the_keyword_form_keeps_the_old_positional_order_and_initialization():
    """GPT(vocab, block, n_layers, n_heads, d_model) as before, and nanoGPT's initialization: block matrices
    N(0, 0.02), the residual outputs N(0, 0.02/√(2·n_layers)), biases 0."""
    m = GPT(13, 9, 3, 2, 16, rng=0)
    assert (m.vocab_size, m.block_size, m.n_layers, m.n_heads, m.d_model) == (13, 9, 3, 2, 16)
    out = m.blocks[0].self_attn.out_proj
    assert abs(out.weight.data.std() - 0.02 / math.sqrt(6)) < 0.004 and not out.bias.data.any()
    assert abs(m.blocks[0].self_attn.qkv_proj.weight.data.std() - 0.02) < 0.003


@pytest.mark.parametrize("config", [
    GPTConfig.from_keywords(**KEYWORD_FORMS[1]), GPTConfig.from_keywords(**KEYWORD_FORMS[3]), mixed_config(),
    GPTConfig.from_keywords(30, 16, n_layers=3, d_model=16, layers=[{"sliding_window": 4}, {}, {"norm_first": False}]),
])
def test_to_dict_and_from_dict_round_trip(config):
    d = config.to_dict()
    assert GPTConfig.from_dict(d) == config
    assert GPTConfig.from_dict({"type": "gpt", **d}) == config             # a config.json [model] section
    assert build_model({"type": "gpt", **d}).config == config
    assert ("layers" in d) == (len(set(config.layers)) > 1)                # uniform layers: the plain keyword form


def test_the_dict_lists_only_what_each_layer_changes():
    d = GPTConfig.from_keywords(30, 16, n_layers=4, d_model=16, sliding_window=8,
                                layers=[{"sliding_window": None, "rope_theta": 1e6}, {}, {}, {}]).to_dict()
    assert d["sliding_window"] == 8 and d["rope_theta"] == 10000.0       # what most layers have
    assert d["layers"] == [{"sliding_window": None, "rope_theta": 1e6}, {}, {}, {}]


def test_classifier_and_transformer_configs_round_trip():
    c = EncoderClassifier(20, 3, max_len=12, d_model=8, n_heads=2, n_layers=2, rng=0)
    assert EncoderClassifierConfig.from_dict(c.config.to_dict()) == c.config
    assert EncoderClassifier(c.config, rng=0).config == c.config
    t = Transformer(13, 14, d_model=8, n_heads=2, n_layers=1, d_ff=16, rng=0)
    assert TransformerConfig.from_dict(t.config.to_dict()) == t.config
    a, b = Transformer(t.config, rng=0), t
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert np.array_equal(p.data, q.data), n


@pytest.mark.parametrize("bad,message", [
    (dict(layers=[{}]), r"layers must be a list of 2 dicts"),
    (dict(layers=[{"n_head": 2}, {}]), r"layers\[0\] has key\(s\) \['n_head'\]"),
    (dict(layers=[{}, {"n_kv_heads": 3}]), r"GPT layer 1: n_kv_heads=3 must divide n_heads=4"),
    (dict(layers=[{}, {"activation": "swish"}]), r"GPT layer 1: unknown activation 'swish'"),
    (dict(norm_first=False, norm_placement="sandwich"), r"norm_first = false contradicts norm_placement"),
    (dict(head_dim=3, positional="rope"), r"layer 0 has head_dim = 3"),
])
def test_bad_configs_are_one_line_naming_the_layer_and_key(bad, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig.from_keywords(30, 16, n_layers=2, d_model=16, **bad)


def test_properties_of_layers_that_differ_point_to_the_config():
    model = GPT(mixed_config(), rng=0)
    assert model.d_model == D and model.n_layers == 3
    with pytest.raises(ValueError, match=r"differ in sliding_window; read model.config.layers\[i\].sliding_window"):
        model.sliding_window
    assert [c.window for c in model.new_kv_caches()] == [3, None, None]


# -- a model whose layers differ: finite differences and PyTorch ------------------------------------------------
@pytest.mark.parametrize("norm", ["rms", "rms_plus_one"])
def test_mixed_layers_gradcheck_in_float64(norm):
    model = randomize(GPT(mixed_config(norm=norm), rng=0, dtype=np.float64).train())
    idx = np.random.default_rng(2).integers(0, V, (2, T))
    params = dict(model.named_parameters())
    picked = {n: p.data for n, p in params.items()
              if n.startswith("blocks.") or n in ("tok_emb.weight", "norm_f.weight")}

    def forward():
        return model(idx)

    def backward(dout):
        model.zero_grad()
        model(idx)
        model.backward(dout)
        return {n: params[n].grad for n in picked}

    errors = check_gradients(forward, backward, picked)
    assert max(errors.values()) < 1e-6, max(errors.items(), key=lambda kv: kv[1])


def torch_reference(config):
    """A hand-written PyTorch model of a GPTConfig with RMSNorm (or Gemma's, scaled by 1 + w) and RoPE (every
    BlockConfig option; a scaled RoPE's frequencies from ``rope_inverse_frequencies``, which test_rope_scaling.py
    checks against transformers), with numformer's parameter names, so that its state dict loads numformer's
    weights."""
    offset = 1.0 if config.norm == "rms_plus_one" else 0.0
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class RMS(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d, dtype=torch.float64))

        def forward(self, x):
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + config.layer_norm_eps) * (offset + self.weight)

    def linear(i, o, bias):
        return nn.Linear(i, o, bias=bias, dtype=torch.float64)

    def rope(x, c):
        d, t = x.shape[-1], x.shape[-2]
        inv, factor = rope_inverse_frequencies(d, c.rope_theta, c.rope_scaling, seq_len=t)
        ang = torch.arange(t, dtype=torch.float64)[:, None] * torch.from_numpy(inv)
        ang = torch.cat([ang, ang], -1)
        rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
        return (x * ang.cos() + rot * ang.sin()) * factor

    class Attention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c = c
            self.qkv_proj = linear(config.d_model, (c.n_heads + 2 * c.n_kv_heads) * c.head_dim, c.qkv_bias)
            if c.qk_norm:
                self.q_norm, self.k_norm = RMS(c.head_dim), RMS(c.head_dim)
            self.out_proj = linear(c.n_heads * c.head_dim, config.d_model, c.attn_bias)

        def forward(self, x):
            c, (B, t, _) = self.c, x.shape
            q, k, v = self.qkv_proj(x).split([c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim,
                                              c.n_kv_heads * c.head_dim], -1)
            q, k, v = (z.view(B, t, -1, c.head_dim).transpose(1, 2) for z in (q, k, v))
            if c.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = rope(q, c), rope(k, c)
            rep = c.n_heads // c.n_kv_heads
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            s = q @ k.transpose(-1, -2) * (c.head_dim ** -0.5 if c.attn_scale is None else c.attn_scale)
            if c.attn_logit_softcap is not None:
                s = c.attn_logit_softcap * torch.tanh(s / c.attn_logit_softcap)
            i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
            allowed = (j <= i) & ((i - j < c.sliding_window) if c.sliding_window else True)
            s = s.masked_fill(~allowed, float("-inf"))
            return self.out_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(B, t, -1))

    class FeedForward(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.kind = c.activation
            if c.activation in ("swiglu", "geglu"):
                self.gate_proj, self.up_proj = linear(D, c.d_ff, c.bias), linear(D, c.d_ff, c.bias)
                self.down_proj = linear(c.d_ff, D, c.bias)
            else:
                self.linear1, self.linear2 = linear(D, c.d_ff, c.bias), linear(c.d_ff, D, c.bias)

        def forward(self, x):
            if self.kind == "swiglu":
                return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
            if self.kind == "geglu":
                return self.down_proj(nn.functional.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))
            return self.linear2(nn.functional.gelu(self.linear1(x)))

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c = c
            self.self_attn, self.ff = Attention(c), FeedForward(c)
            self.norm1, self.norm2 = RMS(D), RMS(D)
            if c.norm_placement == "sandwich":
                self.post_norm1, self.post_norm2 = RMS(D), RMS(D)

        def sublayer(self, i, x, f):
            norm = getattr(self, f"norm{i}")
            if self.c.norm_placement == "post":
                return norm(x + f(x))
            z = f(norm(x))
            return x + (getattr(self, f"post_norm{i}")(z) if self.c.norm_placement == "sandwich" else z)

        def forward(self, x):
            return self.sublayer(2, self.sublayer(1, x, self.self_attn), self.ff)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_emb = nn.Embedding(config.vocab_size, config.d_model, dtype=torch.float64)
            self.blocks = nn.ModuleList(Block(c) for c in config.layers)
            self.norm_f = RMS(config.d_model)

        def forward(self, idx):
            x = self.tok_emb(idx)
            for block in self.blocks:
                x = block(x)
            logits = self.norm_f(x) @ self.tok_emb.weight.T
            c = config.final_logit_softcap
            return logits if c is None else c * torch.tanh(logits / c)

    return Model()


@pytest.mark.parametrize("norm", ["rms", "rms_plus_one"])
def test_mixed_layers_match_a_hand_written_torch_model_in_float64(norm):
    torch = pytest.importorskip("torch")
    model = randomize(GPT(mixed_config(norm=norm), rng=0, dtype=np.float64).train())
    ref = torch_reference(model.config)
    ref.load_state_dict({n: torch.from_numpy(a.copy()) for n, a in model.state_dict().items()})
    idx = np.random.default_rng(3).integers(0, V, (2, T))
    dlogits = np.random.default_rng(4).standard_normal((2, T, V))
    logits = model(idx)
    model.backward(dlogits)
    t_logits = ref(torch.from_numpy(idx))
    (t_logits * torch.from_numpy(dlogits)).sum().backward()
    np.testing.assert_allclose(logits, t_logits.detach().numpy(), rtol=1e-10, atol=1e-12)
    t_grads = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, t_grads[name].grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


def test_mixed_layers_generate_the_same_with_and_without_the_cache():
    model = randomize(GPT(mixed_config(), rng=0, dtype=np.float64)).eval()
    prompt = np.random.default_rng(5).integers(0, V, (2, 4))
    a = model.generate(prompt, 8, greedy=True)
    b = model.generate(prompt, 8, greedy=True, use_cache=False)
    np.testing.assert_array_equal(a, b)


def test_the_reference_mode_and_the_kernels_agree_on_mixed_layers():
    model = randomize(GPT(mixed_config(), rng=0, dtype=np.float64).train())
    idx = np.random.default_rng(6).integers(0, V, (2, T))
    fast = model(idx)
    with numformer.reference_mode():
        ref = model(idx)
    np.testing.assert_allclose(fast, ref, rtol=1e-12, atol=1e-13)


def test_flash_attention_falls_back_to_the_reference_for_soft_capped_scores():
    from numformer.nn.dispatch import attention_kernel

    assert attention_kernel("flash") == "flash" and attention_kernel("plain") == "fused"
    assert attention_kernel("flash", softcap=2.0) == "reference" == attention_kernel("plain", softcap=2.0)
    assert attention_kernel("flash", need_weights=True) == "fused"
    assert attention_kernel("plain", p_drop=0.1) == "reference"
    plain = randomize(GPT(mixed_config(), rng=0, dtype=np.float64)).eval()
    flash = GPT(replace(mixed_config(), attention="flash"), rng=0, dtype=np.float64).eval()
    flash.load_state_dict(plain.state_dict())
    idx = np.random.default_rng(7).integers(0, V, (2, T))
    np.testing.assert_allclose(flash(idx), plain(idx), rtol=1e-12, atol=1e-13)


def test_the_engine_page_holds_the_generated_fields_tables():
    from pathlib import Path

    from numformer.models.config import config_fields_markdown

    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "engine.md").read_text(encoding="utf-8")
    assert config_fields_markdown() in page, "regenerate the GPTConfig tables of docs/reference/engine.md with " \
                                             "numformer.models.config.config_fields_markdown()"


def test_a_toml_config_sets_layers_that_differ_and_the_run_resumes(tmp_path, run_cli):
    """[[model.layers]] tables override the block keywords layer by layer; config.json keeps them, and the
    run resumes from it."""
    import json

    toml = tmp_path / "c.toml"
    toml.write_text('[model]\ntype = "gpt"\nn_layers = 2\nn_heads = 2\nd_model = 16\npositional = "rope"\n'
                    'sliding_window = 3\n[[model.layers]]\nqk_norm = true\nrope_theta = 100.0\n[[model.layers]]\n'
                    'sliding_window = 5\nactivation = "geglu"\n'
                    '[data]\ntask = "copy"\nlength = 4\nn_val = 16\nn_test = 16\n'
                    '[train]\nmax_steps = 2\nbatch_size = 4\nprocesses = 1\neval_every = 2\n')
    run = tmp_path / "run"
    assert run_cli("train", toml, "--out", run, "--quiet")[0] == 0
    saved = json.loads((run / "config.json").read_text())["model"]
    config = GPTConfig.from_dict(saved)
    assert [b.sliding_window for b in config.layers] == [3, 5] and config.layers[0].qk_norm
    assert config.layers[1].activation == "geglu" and config.layers[0].rope_theta == 100.0
    rc, _, err = run_cli("train", "--resume", "--out", run, "--set", "train.max_steps=3", "--quiet")
    assert rc == 0, err
    model = numformer.load(run)[0]
    assert model.config == config


def test_a_bad_layer_in_a_toml_config_is_one_line_naming_it(tmp_path, cli_error):
    toml = tmp_path / "c.toml"
    toml.write_text('[model]\ntype = "gpt"\nn_layers = 2\nn_heads = 2\nd_model = 16\n[[model.layers]]\n'
                    'n_kv_heads = 3\n[[model.layers]]\n[data]\ntask = "copy"\nlength = 4\n')
    assert "[model] GPT layer 0: n_kv_heads=3 must divide n_heads=2" in cli_error("train", toml, "--out",
                                                                                   tmp_path / "run")
