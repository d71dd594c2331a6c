"""Qwen3 (``Qwen3ForCausalLM``, dense): Llama with an RMSNorm over each query and key head before RoPE
(``q_norm`` / ``k_norm``, weights of head_dim), a head size of its own (``head_dim``, default 128 whatever
hidden_size is), biases on the four attention projections only when ``attention_bias``, and Qwen2's windows
(``use_sliding_window``, ``max_window_layers``, ``layer_types``).

    GPTConfig.from_keywords(**llama.config_keywords(...), qk_norm=True, bias=False, attn_bias=attention_bias,
                            qkv_bias=attention_bias, layers=[{"sliding_window": window of layer i}, ...])
"""
from __future__ import annotations

from dataclasses import replace

from ...models import GPTConfig
from . import llama, qwen2
from .family import Family, Module_, check_export, shared
from .fields import HONOURED, SAME, TOKENIZER, TRAINING, Field, divides, positive, resolve, with_fields

MODEL_TYPE = "qwen3"

FIELDS = with_fields(
    llama.COMMON_FIELDS,
    vocab_size=Field("vocab_size", 151936, HONOURED, positive, note="vocab_size"),
    intermediate_size=Field("intermediate_size", 22016, HONOURED, positive, note="d_ff"),
    max_position_embeddings=Field("max_position_embeddings", 32768, HONOURED, positive, note="block_size"),
    num_key_value_heads=Field("num_key_value_heads", 32, HONOURED, divides("num_attention_heads"),
                              type="int | None", null=SAME, note="n_kv_heads (null: num_attention_heads)"),
    head_dim=Field("head_dim", 128, HONOURED, llama.head_dim_rule, accepts="a positive even integer",
                   note="head_dim (its own: not hidden_size // num_attention_heads)"),
    bos_token_id=Field("bos_token_id", None, TOKENIZER, type="int | None"),
    eos_token_id=Field("eos_token_id", None, TOKENIZER, type="int | list[int] | None"),
    attention_dropout=Field("attention_dropout", 0.0, TRAINING, type="float"),
    attention_bias=Field("attention_bias", False, HONOURED, type="bool",
                         note="qkv_bias and attn_bias (the four attention projections)"),
    **{f.name: f for f in qwen2.FIELDS if f.name in qwen2.WINDOW_FIELDS})


def to_config(c):
    """The GPTConfig of a Qwen3 config.json: q/k norms, one window per layer."""
    r = resolve(FIELDS, c, MODEL_TYPE)
    windows = qwen2.layer_windows(r, MODEL_TYPE)
    bias = bool(r["attention_bias"])
    return GPTConfig.from_keywords(**llama.config_keywords(r), bias=False, attn_bias=bias, qkv_bias=bias,
                                   qk_norm=True, layers=[{"sliding_window": w} for w in windows])


def to_hf(config):
    """The Qwen3 config.json of a GPTConfig (q/k norms, no feed-forward biases, its windows as layer_types)."""
    bias, attn, qkv = shared(config, "Qwen3", "bias", "attn_bias", "qkv_bias")
    check_export("Qwen3", [(not bias, "feed-forward biases (Qwen3 has none)"),
                           (attn == qkv, "biases on some attention projections only (Qwen3's attention_bias "
                                         "sets all four)")])
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": MODEL_TYPE,
            **llama.hf_fields("Qwen3", config, qk_norm=True), "attention_bias": attn,
            **qwen2.window_fields(config, "Qwen3")}


QK_NORMS = (Module_("self_attn.q_norm", ("model.layers.{i}.self_attn.q_norm",), "never"),
            Module_("self_attn.k_norm", ("model.layers.{i}.self_attn.k_norm",), "never"))
# Llama's tensors (attention_bias: the q/k/v and output biases together) and the q/k norms
LAYOUT = replace(llama.LAYOUT, layer=llama.LAYOUT.layer + QK_NORMS)

FAMILY = Family(MODEL_TYPE, FIELDS, to_config, to_hf, LAYOUT)
