"""One rule for every config field (the field table of each family file of numformer.interop.hf), per model_type,
against transformers.

For each family (gpt2, llama, mistral, qwen2, qwen3, gemma2, gemma3_text, arcee) and each config.json field transformers reads:
- honoured: a random tiny model whose config.json sets the field (old key spellings included) is built by
  transformers from that very config.json; numformer's import gives float64 logits and every gradient within
  1e-9 of transformers' (its float32 rotary/RMSNorm internals given float64 arithmetic, as in
  test_llama_hf.py), and float32 ones within 1e-4;
- refused: `numformer import-hf` exits 2 with exactly one stderr line naming the field;
- absent: numformer resolves the field to the value transformers' config class gives it;
- the table covers every field of transformers' config class (a new transformers field fails here).
Nothing is downloaded.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from numformer.interop import hf
from numformer.interop.hf import FAMILIES, resolve

from test_interop_hf import (TEXT, loss_and_grads_numformer, loss_and_grads_torch, rel_err, save_tokenizer,
                             transformers_greedy)
from test_llama_hf import _float64_arithmetic

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 300
BASE = {
    "gpt2": dict(vocab_size=VOCAB, n_positions=48, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0),
    "llama": dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=24, max_position_embeddings=48, bos_token_id=0, eos_token_id=0),
    "mistral": dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=24, max_position_embeddings=16, sliding_window=8,
                    bos_token_id=0, eos_token_id=0),
    "qwen2": dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=24, max_position_embeddings=48, rope_theta=1e6, bos_token_id=0, eos_token_id=0),
}
_GEMMA = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              head_dim=6, intermediate_size=24, max_position_embeddings=48, sliding_window=5,
              query_pre_attn_scalar=10, pad_token_id=None, bos_token_id=0, eos_token_id=0)
BASE.update({
    "qwen3": dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=6, intermediate_size=24, max_position_embeddings=48, rope_theta=1e6, bos_token_id=0,
                  eos_token_id=0),
    "gemma2": dict(_GEMMA, final_logit_softcapping=3.0, attn_logit_softcapping=2.0),
    "gemma3_text": dict(_GEMMA, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e5},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}}),
})
BASE["arcee"] = dict(BASE["llama"], rms_norm_eps=1e-5)
CONFIG_CLASSES = {"gpt2": "GPT2Config", "llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config",
                  "qwen3": "Qwen3Config", "gemma2": "Gemma2Config", "gemma3_text": "Gemma3TextConfig",
                  "arcee": "ArceeConfig"}
T = 24            # tokens per row: longer than the windows (8) and than mistral's context (16)

DELETE = "<delete>"
# (family, field): [config.json edits of an honoured case], each a dict (DELETE: remove the key; None: write null)
HONOURED = {
    ("gpt2", "vocab_size"): [{}], ("gpt2", "n_positions"): [{"n_positions": 30}],
    ("gpt2", "n_embd"): [{"n_embd": 24}], ("gpt2", "n_layer"): [{"n_layer": 1}], ("gpt2", "n_head"): [{"n_head": 4}],
    ("gpt2", "n_inner"): [{"n_inner": 40}, {"n_inner": None}, {"n_inner": DELETE}],
    ("gpt2", "activation_function"): [{"activation_function": "relu"}, {"activation_function": "gelu"},
                                      {"activation_function": "gelu_pytorch_tanh"}],
    ("gpt2", "resid_pdrop"): [{"resid_pdrop": 0.3}], ("gpt2", "embd_pdrop"): [{"embd_pdrop": 0.3}],
    ("gpt2", "attn_pdrop"): [{"attn_pdrop": 0.3}], ("gpt2", "layer_norm_epsilon"): [{"layer_norm_epsilon": 1e-3}],
    ("gpt2", "initializer_range"): [{"initializer_range": 0.5}], ("gpt2", "summary_type"): [{"summary_type": "last"}],
    ("gpt2", "summary_use_proj"): [{"summary_use_proj": False}],
    ("gpt2", "summary_activation"): [{"summary_activation": "tanh"}],
    ("gpt2", "summary_proj_to_labels"): [{"summary_proj_to_labels": False}],
    ("gpt2", "summary_first_dropout"): [{"summary_first_dropout": 0.5}],
    ("gpt2", "scale_attn_weights"): [{"scale_attn_weights": True}], ("gpt2", "use_cache"): [{"use_cache": False}],
    ("gpt2", "bos_token_id"): [{"bos_token_id": 3}], ("gpt2", "eos_token_id"): [{"eos_token_id": 3}],
    ("gpt2", "pad_token_id"): [{"pad_token_id": 5}],
    ("gpt2", "scale_attn_by_inverse_layer_idx"): [{"scale_attn_by_inverse_layer_idx": False}],
    ("gpt2", "reorder_and_upcast_attn"): [{"reorder_and_upcast_attn": True}],
    ("gpt2", "add_cross_attention"): [{"add_cross_attention": False}],
    ("gpt2", "tie_word_embeddings"): [{"tie_word_embeddings": False}, {"tie_word_embeddings": True}],
}
_LLAMA_LIKE = {
    "vocab_size": [{}], "hidden_size": [{"hidden_size": 24, "num_attention_heads": 6, "num_key_value_heads": 2}],
    "intermediate_size": [{"intermediate_size": 20}], "num_hidden_layers": [{"num_hidden_layers": 1}],
    "num_attention_heads": [{"num_attention_heads": 2, "num_key_value_heads": 2}],
    "num_key_value_heads": [{"num_key_value_heads": 1}, {"num_key_value_heads": None}],
    "hidden_act": [{"hidden_act": "silu"}], "max_position_embeddings": [{"max_position_embeddings": 20}],
    "initializer_range": [{"initializer_range": 0.5}], "rms_norm_eps": [{"rms_norm_eps": 1e-3}],
    "use_cache": [{"use_cache": False}], "pad_token_id": [{"pad_token_id": 5}],
    "bos_token_id": [{"bos_token_id": 3}], "eos_token_id": [{"eos_token_id": 3}],
    "tie_word_embeddings": [{"tie_word_embeddings": True}, {"tie_word_embeddings": False}],
    "rope_parameters": [{"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
                        {"rope_parameters": {"type": "default", "rope_theta": 700.0}},
                        {"rope_parameters": {"rope_type": "default"}, "rope_theta": 300.0}],
    "rope_scaling": [{"rope_scaling": {"rope_type": "default", "rope_theta": 300.0},
                      "rope_parameters": {"rope_type": "default", "rope_theta": 900.0}},
                     {"rope_scaling": {"type": "default"}, "rope_parameters": {"rope_theta": 900.0},
                      "rope_theta": 250.0}],
    "rope_theta": [{"rope_parameters": DELETE, "rope_theta": 2000.0}, {"rope_parameters": DELETE}],
    "partial_rotary_factor": [{"partial_rotary_factor": 1.0}],
    "attention_dropout": [{"attention_dropout": 0.5}], "head_dim": [{"head_dim": 4}, {"head_dim": None}],
}
for fam in ("llama", "mistral", "qwen2", "arcee"):
    HONOURED.update({(fam, k): v for k, v in _LLAMA_LIKE.items()})
HONOURED.update({
    ("mistral", "num_key_value_heads"): [{"num_key_value_heads": 1}],     # MistralConfig refuses a null
    ("qwen2", "head_dim"): [{"head_dim": 4}, {"head_dim": DELETE}],        # a null crashes Qwen2Attention
    ("arcee", "hidden_act"): [{"hidden_act": "relu2"}, {"hidden_act": DELETE}, {"hidden_act": "relu"},
                              {"hidden_act": "gelu_pytorch_tanh"}, {"hidden_act": "silu"}],
    ("arcee", "attention_bias"): [{"attention_bias": True}],
    ("arcee", "mlp_bias"): [{"mlp_bias": True}],
    ("llama", "pretraining_tp"): [{"pretraining_tp": 2}],
    ("llama", "attention_bias"): [{"attention_bias": True}],
    ("llama", "mlp_bias"): [{"mlp_bias": True}, {"mlp_bias": True, "attention_bias": True}],
    ("llama", "sliding_window"): [{"sliding_window": 8}],              # not a Llama field: ignored, as transformers
    ("mistral", "sliding_window"): [{"sliding_window": 8}, {"sliding_window": 30}, {"sliding_window": None},
                                    {"sliding_window": 1}],
    ("qwen2", "use_sliding_window"): [{"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0},
                                      {"use_sliding_window": False, "sliding_window": 8, "max_window_layers": 0}],
    ("qwen2", "sliding_window"): [{"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 0}],
    ("qwen2", "max_window_layers"): [{"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2},
                                     {"use_sliding_window": False, "max_window_layers": 1},
                                     {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}],
    ("qwen2", "layer_types"): [{"use_sliding_window": True, "sliding_window": 8,
                                "layer_types": ["sliding_attention"] * 2},
                               {"layer_types": ["full_attention"] * 2},
                               {"use_sliding_window": True, "sliding_window": 8,
                                "layer_types": ["sliding_attention", "full_attention"]}],
})
LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 2.0,
          "original_max_position_embeddings": 8, "rope_theta": 500.0}
HONOURED.update({       # scaled RoPE at positions past the original context (T = 24 > 8)
    ("llama", "rope_parameters"): HONOURED[("llama", "rope_parameters")] + [
        {"rope_parameters": LLAMA3}, {"rope_parameters": {"rope_type": "linear", "factor": 3.0, "rope_theta": 1e4}},
        {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                             "rope_theta": 1e4}}],
    ("llama", "rope_scaling"): HONOURED[("llama", "rope_scaling")] + [
        {"rope_scaling": {**{k: v for k, v in LLAMA3.items() if k != "rope_theta"}, "type": "llama3"},
         "rope_theta": 800.0, "rope_parameters": DELETE}],
    ("qwen2", "rope_parameters"): HONOURED[("qwen2", "rope_parameters")] + [{"rope_parameters": LLAMA3}],
    # a top-level original_max_position_embeddings (Phi-3's, DeepSeek's) wins over the flat dict's
    ("llama", "original_max_position_embeddings"): [
        {"rope_parameters": LLAMA3, "original_max_position_embeddings": 16},
        {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4},
         "original_max_position_embeddings": 6, "head_dim": 32},
        {"rope_parameters": {"rope_type": "linear", "factor": 3.0, "rope_theta": 1e4},
         "original_max_position_embeddings": 6}],
    ("gemma2", "original_max_position_embeddings"): [
        {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                             "rope_theta": 1e4}, "original_max_position_embeddings": 4, "head_dim": 32}],
    ("gemma3_text", "original_max_position_embeddings"): [       # nested by layer type: ignored
        {"rope_parameters": {"full_attention": LLAMA3, "sliding_attention": {"rope_type": "default",
                                                                             "rope_theta": 50.0}},
         "original_max_position_embeddings": 24}],
    ("mistral", "rope_scaling"): HONOURED[("mistral", "rope_scaling")] + [
        {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "beta_fast": 16.0}}],
    ("qwen3", "head_dim"): [{"head_dim": 6}, {"head_dim": 4}, {"head_dim": DELETE}],
    ("qwen3", "attention_bias"): [{"attention_bias": True}],
    ("qwen3", "tie_word_embeddings"): [{"tie_word_embeddings": True}, {"tie_word_embeddings": False}],
    ("qwen3", "use_sliding_window"): [{"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}],
    ("qwen3", "layer_types"): [{"use_sliding_window": True, "sliding_window": 5,
                                "layer_types": ["sliding_attention", "full_attention"]}],
    ("qwen3", "rope_parameters"): [{"rope_parameters": LLAMA3}],
    ("gemma2", "attn_logit_softcapping"): [{"attn_logit_softcapping": None}, {"attn_logit_softcapping": DELETE}],
    ("gemma2", "final_logit_softcapping"): [{"final_logit_softcapping": None},
                                            {"final_logit_softcapping": DELETE}],
    ("gemma2", "layer_types"): [{"layer_types": ["full_attention", "sliding_attention", "sliding_attention"]}],
    ("gemma2", "tie_word_embeddings"): [{"tie_word_embeddings": False}],
    ("gemma2", "attention_bias"): [{"attention_bias": True}],
    ("gemma2", "query_pre_attn_scalar"): [{"query_pre_attn_scalar": 3}],
    ("gemma2", "pad_token_id"): [{"pad_token_id": 5}],
    ("gemma3_text", "rope_parameters"): [
        {"rope_parameters": {"full_attention": LLAMA3, "sliding_attention": {"rope_type": "default",
                                                                             "rope_theta": 50.0}}},
        {"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                "original_max_position_embeddings": 8},
                             "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}}],
    ("gemma3_text", "rope_scaling"): [{"rope_parameters": DELETE, "rope_theta": 2e4, "rope_local_base_freq": 70.0,
                                       "rope_scaling": {"rope_type": "linear", "factor": 8.0}}],
    ("gemma3_text", "rope_local_base_freq"): [{"rope_parameters": DELETE, "rope_local_base_freq": 70.0}],
    ("gemma3_text", "sliding_window_pattern"): [{"layer_types": DELETE, "sliding_window_pattern": 2},
                                                {"layer_types": DELETE}],
    ("gemma3_text", "final_logit_softcapping"): [{"final_logit_softcapping": 2.5}],
    ("gemma3_text", "attn_logit_softcapping"): [{"attn_logit_softcapping": 1.0}],
    ("gemma3_text", "tie_word_embeddings"): [{"tie_word_embeddings": False}],
    ("gemma3_text", "sliding_window"): [{"sliding_window": 2}, {"sliding_window": 30}],
})
for fam in ("llama", "mistral", "qwen2", "arcee"):        # a head size of its own: queries num_attention_heads · head_dim wide
    HONOURED[(fam, "head_dim")] = HONOURED[(fam, "head_dim")] + [{"head_dim": 6}]
REFUSED = {
    ("gpt2", "activation_function"): {"activation_function": "silu"},
    ("gpt2", "scale_attn_weights"): {"scale_attn_weights": False},
    ("gpt2", "scale_attn_by_inverse_layer_idx"): {"scale_attn_by_inverse_layer_idx": True},
    ("gpt2", "add_cross_attention"): {"add_cross_attention": True},
    ("gpt2", "n_embd"): {"n_embd": 0},
    ("llama", "hidden_act"): {"hidden_act": "gelu"},
    ("llama", "head_dim"): {"head_dim": 5},
    ("llama", "num_key_value_heads"): {"num_key_value_heads": 3},
    ("llama", "rms_norm_eps"): {"rms_norm_eps": "1e-6"},
    ("llama", "rope_parameters"): {"rope_parameters": {"type": "longrope", "factor": 2.0, "rope_theta": 1e4}},
    ("llama", "rope_scaling"): {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},    # without its factors
    ("llama", "partial_rotary_factor"): {"partial_rotary_factor": 0.5},
    ("llama", "pad_token_id"): {"pad_token_id": 300},
    ("mistral", "hidden_act"): {"hidden_act": "relu"},
    ("arcee", "hidden_act"): {"hidden_act": "swish"},
    ("mistral", "sliding_window"): {"sliding_window": 0},
    ("mistral", "rope_parameters"): {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4,
                                                          "mrope_section": [1, 1]}},
    ("qwen2", "max_window_layers"): {"max_window_layers": "1"},
    ("qwen2", "layer_types"): {"use_sliding_window": True, "sliding_window": 8,
                               "layer_types": ["full_attention", "local_attention"]},
    ("qwen2", "head_dim"): {"head_dim": None},
    ("qwen2", "num_key_value_heads"): {"num_key_value_heads": 3},
    ("gpt2", "n_head"): {"n_head": 3},
    ("gpt2", "layer_norm_epsilon"): {"layer_norm_epsilon": [1e-5]},
    ("mistral", "num_key_value_heads"): {"num_key_value_heads": None},
    ("qwen2", "rope_scaling"): {"rope_scaling": {"type": "dynamic"}},                       # without its factor
    ("qwen3", "head_dim"): {"head_dim": 7},
    ("qwen3", "rope_scaling"): {"rope_scaling": {"rope_type": "longrope", "factor": 2.0}},
    ("gemma2", "hidden_activation"): {"hidden_activation": "gelu"},
    ("gemma2", "use_bidirectional_attention"): {"use_bidirectional_attention": True},
    ("gemma2", "layer_types"): {"layer_types": ["sliding_attention"] * 2},
    ("gemma3_text", "use_bidirectional_attention"): {"use_bidirectional_attention": True},
    ("gemma3_text", "rope_parameters"): {"rope_parameters": {"full_attention": {"rope_type": "longrope",
                                                                                 "factor": 2.0},
                                                              "sliding_attention": {"rope_type": "default"}}},
    ("gemma3_text", "sliding_window_pattern"): {"layer_types": DELETE, "sliding_window_pattern": 0},
    ("gemma3_text", "sliding_window"): {"sliding_window": None, "layer_types": ["full_attention"] * 3},
    ("gemma2", "sliding_window"): {"sliding_window": None, "layer_types": ["full_attention"] * 3},
    ("qwen3", "rms_norm_eps"): {"rms_norm_eps": -1.0},
    ("gemma3_text", "rms_norm_eps"): {"rms_norm_eps": -1e-6},
    ("arcee", "rms_norm_eps"): {"rms_norm_eps": -0.5},
    ("gpt2", "layer_norm_epsilon"): {"layer_norm_epsilon": -1e-5},
}


def edited(config, edits):
    out = dict(config)
    for k, v in edits.items():
        if v == DELETE:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def base_config_json(fam):
    """The base config as transformers writes it, without the keys its __post_init__ derives (head_dim,
    layer_types), so that edits of the fields they derive from take effect."""
    cls = getattr(transformers, CONFIG_CLASSES[fam])
    return {k: v for k, v in cls(**BASE[fam]).to_dict().items()
            if k not in ("head_dim", "layer_types") or k in BASE[fam]}


def make_family_model(tmp_path, fam, edits, seed=0):
    """A random transformers model built from config.json = base + ``edits`` (as written, old key names
    included), saved with that config.json; returns the folder."""
    folder = tmp_path / fam
    folder.mkdir(exist_ok=True)
    cfg = edited(base_config_json(fam), edits)
    (folder / "config.json").write_text(json.dumps(cfg))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(folder))
    with torch.no_grad():                    # norm weights and biases away from 1 and 0: every tensor matters
        for n, p in model.named_parameters():
            if "norm" in n or "ln_" in n or n.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(cfg))          # the edited file itself, not its re-save
    return folder


def transformers_model(folder, dtype):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    if dtype == torch.float64 and model.config.model_type != "gpt2":
        _float64_arithmetic(model)
    return model


def grads_by_hf_name(model, fam):
    family = hf.FAMILIES[fam]
    cfg = model.config
    grads = {n: p.grad for n, p in model.named_parameters()}
    out = {}
    for row in family.tensors(cfg):
        g = grads[row.nf]
        parts = np.split(g, np.cumsum(row.sizes)[:-1] if row.sizes else len(row.hf), axis=0)
        out.update({name: (p.T if row.transpose else p) for name, p in zip(row.hf, parts)})
    return out


def assert_parity(folder, fam, tdtype, ndtype, tol):
    tmodel = transformers_model(folder, tdtype)
    model = hf.load_pretrained(folder, dtype=ndtype)[0].train()
    rng = np.random.default_rng(1)
    idx, targets = rng.integers(0, VOCAB, (2, T)), rng.integers(0, VOCAB, (2, T))
    idx[:, 3] = 5                                                   # the pad token of the pad_token_id cases
    t_logits, t_loss, t_grads = loss_and_grads_torch(tmodel, idx, targets)
    logits, loss, _ = loss_and_grads_numformer(model, idx, targets)
    assert rel_err(logits, t_logits) < tol
    assert abs(loss - t_loss) < tol
    grads = grads_by_hf_name(model, fam)
    t_grads = {n: g for n, g in t_grads.items() if not (n == "lm_head.weight" and tmodel.config.tie_word_embeddings
                                                        and n not in grads)}
    assert set(grads) == set(t_grads)
    for name, g in t_grads.items():
        assert rel_err(grads[name], g) < tol, name
    return model


def assert_greedy_generation_matches(folder, new_tokens=25):
    """Greedy generation of the float64 import = transformers' generate (float64-faithful); sampled
    generation with the KV cache = without it (tokens, and logits within 1e-10)."""
    prompt = np.array([[5, 17, 3, 44, 9]])
    model = hf.load_pretrained(folder, dtype=np.float64)[0]
    np.testing.assert_array_equal(model.generate(prompt, new_tokens, greedy=True),
                                  transformers_greedy(transformers_model(folder, torch.float64), prompt, new_tokens))
    a, la = model.generate(prompt, new_tokens, rng=1, return_logits=True)
    b, lb = model.generate(prompt, new_tokens, rng=1, use_cache=False, return_logits=True)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(la, lb, rtol=0, atol=1e-10)


def fine_tune_from(tmp_path, folder):
    """``numformer train`` 3 steps with ``[model] init_from = folder`` (its tokenizer saved by the caller) on a
    small text; returns the run folder."""
    from numformer.cli import main

    text = tmp_path / "text.txt"
    text.write_text(TEXT * 6)
    (tmp_path / "ft.toml").write_text(f'''[model]
init_from = "{folder}"
[data]
task = "text"
path = "{text}"
block_size = 16
[train]
max_steps = 3
batch_size = 2
lr = 1e-3
eval_every = 3
''')
    assert main(["train", str(tmp_path / "ft.toml"), "--out", str(tmp_path / "run")]) == 0
    return tmp_path / "run"


CASES = [(fam, field, i) for (fam, field), cases in sorted(HONOURED.items()) for i in range(len(cases))]


@pytest.mark.parametrize("fam,field,case", CASES, ids=[f"{f}-{k}-{i}" for f, k, i in CASES])
def test_honoured_field_matches_transformers(tmp_path, fam, field, case):
    edits = HONOURED[(fam, field)][case]
    folder = make_family_model(tmp_path, fam, edits)
    assert_parity(folder, fam, torch.float64, np.float64, 1e-9)
    assert_parity(folder, fam, torch.float32, np.float32, 1e-4)


def refusal_line(tmp_path, capsys, fam, edits):
    """The one stderr line of `numformer import-hf` (exit 2) on a tiny model of ``fam`` with config.json ``edits``."""
    from numformer.cli import main

    folder = make_family_model(tmp_path, fam, {})
    save_tokenizer(folder)
    cfg = edited(json.loads((folder / "config.json").read_text()), edits)
    (folder / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert main(["import-hf", str(folder), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("fam,field", sorted(REFUSED), ids=[f"{f}-{k}" for f, k in sorted(REFUSED)])
def test_refused_field_is_one_line_naming_it_and_exit_2(tmp_path, capsys, fam, field):
    line = refusal_line(tmp_path, capsys, fam, REFUSED[(fam, field)])
    assert f"{fam} config.json field {field} = " in line, line


def test_gemma3s_flat_rope_parameters_are_refused_naming_the_nested_form(tmp_path, capsys):
    """transformers computes the layers of a flat dict as rope_type 'default', ignoring its scaling: one line."""
    line = refusal_line(tmp_path, capsys, "gemma3_text",
                        {"rope_parameters": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}})
    assert "gemma3_text config.json field rope_parameters = " in line, line
    assert "is not nested by layer type" in line and '"sliding_attention": {...}' in line, line


@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_absent_fields_take_transformers_defaults(fam):
    """Every field removed from config.json resolves to the value transformers' config class gives it."""
    cls = getattr(transformers, CONFIG_CLASSES[fam])
    small = {k: v for k, v in BASE[fam].items() if k in ("vocab_size",)}
    for f in FAMILIES[fam].fields:
        if f.name in ("rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor"):
            continue
        if fam == "qwen2" and f.name in ("sliding_window", "layer_types"):   # derived by __post_init__: below
            continue
        if f.name in ("layer_types", "sliding_window_pattern", "rope_local_base_freq") or \
                (fam == "qwen3" and f.name == "sliding_window"):
            continue                                                       # derived or keyword arguments: below
        ref = cls(**small)
        got = resolve(fam, {"model_type": fam, **small})[f.name]
        want = getattr(ref, f.name, None)
        if f.name == "head_dim" and not hasattr(ref, "head_dim"):     # Qwen2: the modeling file's getattr default
            want = ref.hidden_size // ref.num_attention_heads
        if want is None and f.null != "keep":       # left null by the config class, derived by the model
            continue
        assert got == want, (f.name, got, want)
    ref = cls(**small)
    if fam == "qwen2":
        from numformer.interop.hf.qwen2 import layer_windows
        assert set(layer_windows(resolve(fam, {"model_type": fam, **small}))) == {ref.sliding_window} == {None}
        assert set(ref.layer_types) == {"full_attention"}
    if fam in ("qwen3", "gemma2", "gemma3_text"):                # each layer's window, as transformers derives it
        cfg = hf.FAMILIES[fam].to_config({"model_type": fam, **small, "num_hidden_layers": 7})
        ref = cls(**small, num_hidden_layers=7)
        window = ref.sliding_window
        assert [b.sliding_window for b in cfg.layers] == [window if t == "sliding_attention" else None
                                                         for t in ref.layer_types]
        if fam == "gemma3_text":
            assert [b.rope_theta for b in cfg.layers] == [ref.rope_parameters[t]["rope_theta"]
                                                         for t in ref.layer_types]
        ref = cls(**small)
    if fam == "gemma3_text":
        return
    if fam != "gpt2":                                          # the RoPE base: transformers' standardized value
        assert resolve(fam, {"model_type": fam})["rope_parameters"]["rope_theta"] == ref.rope_parameters["rope_theta"]


@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_table_covers_every_field_of_the_transformers_config_class(fam):
    cls = getattr(transformers, CONFIG_CLASSES[fam])
    base = {f.name for f in dataclasses.fields(transformers.PreTrainedConfig)}
    own = {f.name for f in dataclasses.fields(cls)} - base
    table = {f.name for f in FAMILIES[fam].fields}
    assert own <= table, f"transformers' {cls.__name__} has fields the table lacks: {sorted(own - table)}"
    kwargs = {"rope_scaling", "rope_theta", "partial_rotary_factor"} if fam != "gpt2" else set()
    if fam == "gemma3_text":                           # Gemma3TextConfig's keyword arguments (v4 files)
        kwargs = {"rope_scaling", "rope_theta", "rope_local_base_freq", "sliding_window_pattern"}
    getattr_keys = {"head_dim"} if fam == "qwen2" else set()
    assert table - own <= kwargs | getattr_keys, sorted(table - own)


def test_tied_gpt2_with_a_stored_lm_head_uses_it_as_transformers_does(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = make_family_model(tmp_path, "gpt2", {"tie_word_embeddings": True})
    state = load_file(folder / "model.safetensors")
    state["lm_head.weight"] = np.random.default_rng(3).standard_normal(state["transformer.wte.weight"].shape) \
        .astype(np.float32)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    model = assert_parity(folder, "gpt2", torch.float32, np.float32, 1e-4)
    assert not model.tie_weights
    np.testing.assert_array_equal(model.lm_head.weight.data, state["lm_head.weight"])
    state["lm_head.weight"] = state["transformer.wte.weight"]            # stored and equal: tied
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    assert hf.load_pretrained(folder)[0].tie_weights


def test_gpt2_aliases_win_over_the_fields_own_keys_as_in_transformers(tmp_path):
    """GPT-2's config.json with both n_head and num_attention_heads (n_layer and num_hidden_layers) of different
    values: transformers' attribute_map sets the field from the alias, so the alias's values are the model's
    (before: numformer read n_head and n_layer, and ran another model without a word)."""
    base = base_config_json("gpt2")
    heads, layers = base["n_head"], base["n_layer"]
    folder = make_family_model(tmp_path, "gpt2", {"n_head": 1, "num_attention_heads": heads,
                                                  "n_layer": layers + 1, "num_hidden_layers": layers})
    model = assert_parity(folder, "gpt2", torch.float64, np.float64, 1e-9)
    assert (model.config.n_layers, model.config.layers[0].n_heads) == (layers, heads)


FIELDS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "hf-checkpoints.md"


def test_docs_hold_the_generated_fields_tables():
    from numformer.interop.hf import fields_markdown

    assert fields_markdown() in FIELDS_PAGE.read_text(encoding="utf-8"), \
        "regenerate the tables of docs/reference/hf-checkpoints.md: python tests/test_hf_fields.py --write"


def write_fields_tables():
    """Replace the page's tables (from '### gpt2' to 'Tested field by field') with ``fields_markdown()``."""
    from numformer.interop.hf import fields_markdown

    page = FIELDS_PAGE.read_text(encoding="utf-8")
    start, end = page.index("### gpt2\n"), page.index("\nTested field by field")
    FIELDS_PAGE.write_text(page[:start] + fields_markdown() + page[end:], encoding="utf-8")


WRONG_TYPE = {"int": "1", "float": "0.5", "bool": "yes", "str": 7, "dict": "rope", "list[str]": "full_attention",
              "list[int]": "2"}


@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_every_field_of_the_wrong_type_is_one_line_naming_config_json_and_the_field(tmp_path, fam):
    """The class of a config.json value of a type transformers' config class refuses (``max_window_layers:
    "1"``): for every field of every table, one ValueError naming the file and the field, never a TypeError
    from deeper down."""
    for f in FAMILIES[fam].fields:
        main_type = f.type.split(" | ")[0]
        folder = tmp_path / f.name
        folder.mkdir()
        cfg = {"model_type": fam, **BASE[fam], f.name: WRONG_TYPE[main_type]}
        (folder / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ValueError) as err:
            hf.hf_model_config(folder, cfg)
        message = str(err.value)
        assert "\n" not in message and str(folder / "config.json") in message, message
        assert f"{fam} config.json field {f.name} = " in message and "must be" in message, message


def _annotation(t):
    """transformers' annotation of a config field, in the tables' spelling: the types it accepts (an int
    being a float too)."""
    text = str(t).replace("<class '", "").replace("'>", "").replace("transformers.modeling_rope_utils.", "")
    parts = {p.strip() for p in text.split("|")} - {"RopeParameters"}
    return parts - {"int"} if "float" in parts else parts


@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_table_types_are_the_transformers_annotations(fam):
    cls = getattr(transformers, CONFIG_CLASSES[fam])
    table = {f.name: f for f in FAMILIES[fam].fields}
    for f in dataclasses.fields(cls):
        if f.name in table:
            assert _annotation(table[f.name].type) == _annotation(f.type), (f.name, table[f.name].type, f.type)


def test_a_kv_head_count_that_does_not_divide_names_the_field_and_what_to_do(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    cfg = {"model_type": "llama", **BASE["llama"], "num_key_value_heads": 3}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config.json: llama config.json field num_key_value_heads = 3: must divide "
                                         r"num_attention_heads = 4 .*transformers cannot run this config.json either"):
        hf.hf_model_config(folder, cfg)


@pytest.mark.parametrize("fam", ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "arcee"])
def test_a_negative_rms_norm_eps_is_refused_at_load_naming_the_field(tmp_path, fam):
    """A negative rms_norm_eps makes the norms NaN (NumPy warned, then the logits were blamed on 'a diverged
    run?'): refused when config.json is read, naming the field; 0 is read, as transformers reads it."""
    folder = tmp_path / "m"
    folder.mkdir()
    cfg = {"model_type": fam, **BASE[fam], "rms_norm_eps": -1.0}
    with pytest.raises(ValueError, match=rf"^{folder / 'config.json'}: {fam} config.json field rms_norm_eps = -1\.0: "
                                         r"must be a finite number >= 0: .*NaN"):
        hf.hf_model_config(folder, cfg)
    assert hf.FAMILIES[fam].to_config({**cfg, "rms_norm_eps": 0.0}).layer_norm_eps == 0.0


@pytest.mark.parametrize("fam", ["qwen2", "qwen3"])
def test_sliding_layers_without_a_window_are_refused(tmp_path, fam):
    """layer_types naming sliding layers while use_sliding_window is false: transformers' attention fails on
    the None window, so numformer refuses the file rather than run those layers as full attention."""
    folder = tmp_path / "m"
    folder.mkdir()
    cfg = {"model_type": fam, **BASE[fam], "use_sliding_window": False, "sliding_window": 8,
           "layer_types": ["sliding_attention", "full_attention"]}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"{fam} config.json field layer_types = .*names sliding_attention layers, "
                                         r"but there is no window .*set use_sliding_window true"):
        hf.hf_model_config(folder, cfg)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, CONFIG_CLASSES[fam])(**{
        k: v for k, v in cfg.items() if k != "model_type"}))
    with pytest.raises(TypeError):                              # what transformers does with such a file
        model(torch.zeros((1, 12), dtype=torch.long))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_fields_tables()
    else:
        sys.exit("usage: python tests/test_hf_fields.py --write")
