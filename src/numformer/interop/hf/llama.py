"""Llama (``LlamaForCausalLM``): RoPE, RMSNorm before each sub-layer and at the end, a SwiGLU feed-forward,
grouped-query attention, no biases unless ``attention_bias`` / ``mlp_bias``; separate q, k, v projections,
stacked into numformer's fused ``qkv_proj``.

    GPTConfig.from_keywords(positional="rope", activation="swiglu", norm="rms", n_kv_heads=num_key_value_heads,
                            head_dim=head_dim, attn_bias=attention_bias, bias=mlp_bias, ...)

``COMMON_FIELDS``, ``config_keywords``, ``hf_fields`` and ``LAYOUT`` are what every Llama-like family shares
(Mistral, Qwen2, Qwen3; Qwen2 and Qwen3 change the layout's biases and norms).
"""
from __future__ import annotations

from ...models import GPTConfig
from ..hf_rope import hf_rope_parameters, rope_settings
from .family import Family, Layout, Module_, check_export, shared
from .fields import (HONOURED, NO_EFFECT, SAME, TOKENIZER, TRAINING, Field, divides, documented, only, pad_id,
                     norm_eps, positive, read_rope, resolve, rope_refusal, same, with_fields)

MODEL_TYPE = "llama"


@documented("a positive even integer (default hidden_size // num_attention_heads)")
def head_dim_rule(v, r):
    if v is None:
        return "null, which the attention (reading head_dim with getattr) cannot use"
    if type(v) is not int or v < 1 or v % 2:
        return "must be a positive even integer (RoPE rotates pairs of features)"
    return None


COMMON_FIELDS = (  # fields every Llama-like config class has, in the class's order
    Field("vocab_size", 32000, HONOURED, positive, note="vocab_size"),
    Field("hidden_size", 4096, HONOURED, positive, note="d_model"),
    Field("intermediate_size", 11008, HONOURED, positive, note="d_ff"),
    Field("num_hidden_layers", 32, HONOURED, positive, note="n_layers"),
    Field("num_attention_heads", 32, HONOURED, positive, note="n_heads"),
    Field("num_key_value_heads", same("num_attention_heads"), HONOURED, divides("num_attention_heads"),
          type="int | None", null=SAME, note="n_kv_heads"),
    Field("hidden_act", "silu", HONOURED, only("silu", why=" (the SwiGLU gate)"), type="str",
          note="activation 'swiglu'"),
    Field("max_position_embeddings", 2048, HONOURED, positive, note="block_size"),
    Field("initializer_range", 0.02, NO_EFFECT, type="float"),
    Field("rms_norm_eps", 1e-6, HONOURED, norm_eps, type="float", note="layer_norm_eps (norm 'rms')"),
    Field("use_cache", True, NO_EFFECT, type="bool"),
    Field("pad_token_id", None, HONOURED, pad_id, type="int | None",
          note="padding_idx (that embedding row gets no lookup gradient)"),
    Field("bos_token_id", 1, TOKENIZER, type="int | None"),
    Field("eos_token_id", 2, TOKENIZER, type="int | list[int] | None"),
    Field("tie_word_embeddings", False, HONOURED, type="bool",
          note="tie_weights (a stored lm_head.weight that differs unties, as transformers)"),
    Field("rope_parameters", None, HONOURED, rope_refusal, type="dict | None", read=read_rope,
          note="rope_theta (its rope_theta, else the top-level one, else 10000) and rope_scaling (linear, "
               "dynamic, llama3, yarn)"),
    Field("rope_scaling", None, HONOURED, type="dict | None",
          note="the older name of rope_parameters; wins over it when both are set", accepts="as rope_parameters"),
    Field("rope_theta", 10000.0, HONOURED, type="float", note="rope_theta when rope_parameters has none"),
    Field("partial_rotary_factor", None, HONOURED, type="float | None", note="into rope_parameters",
          accepts="null or 1"),
    Field("attention_dropout", 0.0, TRAINING, type="float | None"),
    Field("head_dim", lambda r: r["hidden_size"] // r["num_attention_heads"], HONOURED, head_dim_rule,
          type="int | None", null=SAME, note="head_dim (the queries are num_attention_heads · head_dim wide)"),
)

FIELDS = with_fields(
    COMMON_FIELDS,
    pretraining_tp=Field("pretraining_tp", 1, NO_EFFECT, type="int | None",
                         note="unused by LlamaForCausalLM's forward"),
    attention_bias=Field("attention_bias", False, HONOURED, type="bool", note="attn_bias"),
    mlp_bias=Field("mlp_bias", False, HONOURED, type="bool", note="bias (of the feed-forward)"))


def config_keywords(r):
    """GPTConfig keywords of a resolved Llama-like config (``fields.resolve``)."""
    pad = r["pad_token_id"]
    theta, scaling = rope_settings(r["rope_parameters"], r["max_position_embeddings"])
    return {"vocab_size": r["vocab_size"], "block_size": r["max_position_embeddings"],
            "n_layers": r["num_hidden_layers"], "n_heads": r["num_attention_heads"],
            "n_kv_heads": r["num_key_value_heads"], "head_dim": r["head_dim"], "d_model": r["hidden_size"],
            "d_ff": r["intermediate_size"], "dropout": 0.0, "positional": "rope",
            "rope_theta": theta, "rope_scaling": scaling, "activation": "swiglu", "norm_first": True,
            "norm": "rms", "layer_norm_eps": r["rms_norm_eps"], "tie_weights": bool(r["tie_word_embeddings"]),
            **({"padding_idx": pad % r["vocab_size"]} if pad is not None else {})}


def to_config(c):
    """The GPTConfig of a Llama config.json."""
    r = resolve(FIELDS, c, MODEL_TYPE)
    return GPTConfig.from_keywords(**config_keywords(r), bias=bool(r["mlp_bias"]),
                                   attn_bias=bool(r["attention_bias"]))


def hf_fields(name, config, qk_norm=False, hidden_acts=None):
    """The config.json fields every Llama-like family writes, from a GPTConfig; ValueError naming what the
    family ``name`` cannot express. ``qk_norm``: the family normalizes queries and keys (Qwen3).
    ``hidden_acts``: {numformer activation: hidden_act} of a family whose feed-forward is not gated (Arcee);
    None: the SwiGLU feed-forward (hidden_act "silu")."""
    n_heads, head_dim, kv, d_ff, activation, placement, theta = shared(
        config, name, "n_heads", "head_dim", "n_kv_heads", "d_ff", "activation", "norm_placement", "rope_theta")
    has_qk_norm, scale, cap, scaling = shared(config, name, "qk_norm", "attn_scale", "attn_logit_softcap",
                                              "rope_scaling")
    context = None if scaling is None else scaling.max_position_embeddings
    check_export(name, [
        (placement == "pre" and config.final_norm, f"post-norm or sandwich blocks ({name} is pre-norm)"),
        (config.norm == "rms", f"norm = {config.norm!r} ({name} uses RMSNorm: norm = 'rms')"),
        (config.positional == "rope", f"positional = {config.positional!r} ({name} uses 'rope')"),
        (activation == "swiglu" if hidden_acts is None else activation in hidden_acts,
         f"activation = {activation!r} ({name} uses " + ("'swiglu'" if hidden_acts is None else
                                                           f"one of {sorted(hidden_acts)}") + ")"),
        (has_qk_norm == qk_norm, "q/k norms" if has_qk_norm else f"a model without q/k norms ({name} has them)"),
        (scale is None and cap is None and config.final_logit_softcap is None and not config.scale_embeddings,
         "another attention scale, soft-capping or scaled embeddings"),
        (context in (None, config.block_size), f"a {scaling and scaling.rope_type} RoPE scaling whose "
                                               f"max_position_embeddings ({context}) is not block_size "
                                               f"({config.block_size}), where transformers reads it")])
    return {"vocab_size": config.vocab_size, "hidden_size": config.d_model, "intermediate_size": d_ff,
            "num_hidden_layers": config.n_layers, "num_attention_heads": n_heads, "num_key_value_heads": kv,
            "head_dim": head_dim, "hidden_act": "silu" if hidden_acts is None else hidden_acts[activation],
            "max_position_embeddings": config.block_size,
            "rms_norm_eps": config.layer_norm_eps, "rope_parameters": hf_rope_parameters(theta, scaling),
            "rope_theta": theta, "tie_word_embeddings": config.tie_weights, "attention_dropout": 0.0,
            "initializer_range": 0.02, "use_cache": True, "pad_token_id": config.padding_idx}


def to_hf(config):
    """The Llama config.json of a GPTConfig; ValueError naming what Llama cannot express (besides
    ``hf_fields``' checks: sliding windows, q/k/v biases without the output projection's)."""
    bias, attn, qkv, window = shared(config, "Llama", "bias", "attn_bias", "qkv_bias", "sliding_window")
    check_export("Llama", [(qkv == attn, "q/k/v biases without an output projection bias (qkv_bias != attn_bias; "
                                         "export as qwen2)"),
                           (window is None, f"sliding_window = {window} (export as mistral)")])
    return {"architectures": ["LlamaForCausalLM"], "model_type": MODEL_TYPE, **hf_fields("Llama", config),
            "attention_bias": attn, "mlp_bias": bias, "pretraining_tp": 1}


LAYOUT = Layout(
    top=(Module_("tok_emb", ("model.embed_tokens",), "never"),),
    layer=(Module_("self_attn.qkv_proj", tuple(f"model.layers.{{i}}.self_attn.{p}_proj" for p in "qkv"), "qkv",
                   split=True),
           Module_("self_attn.out_proj", ("model.layers.{i}.self_attn.o_proj",), "attn"),
           Module_("ff.gate_proj", ("model.layers.{i}.mlp.gate_proj",), "ff"),
           Module_("ff.up_proj", ("model.layers.{i}.mlp.up_proj",), "ff"),
           Module_("ff.down_proj", ("model.layers.{i}.mlp.down_proj",), "ff"),
           Module_("norm1", ("model.layers.{i}.input_layernorm",), "never"),
           Module_("norm2", ("model.layers.{i}.post_attention_layernorm",), "never")),
    final=(Module_("norm_f", ("model.norm",), "never"),),
    prefixes=("model.",), ignored=r"\.rotary_emb\.inv_freq$")

FAMILY = Family(MODEL_TYPE, FIELDS, to_config, to_hf, LAYOUT)
