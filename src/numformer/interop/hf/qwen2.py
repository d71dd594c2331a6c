"""Qwen2 (``Qwen2ForCausalLM``): Llama with biases on the q/k/v projections only, and sliding windows on the
layers ``layer_types`` names (by default, with ``use_sliding_window``, the layers from ``max_window_layers``
on): a window per layer, so a checkpoint whose first layers attend to everything and whose last ones slide
is a GPTConfig whose layers differ.

    GPTConfig.from_keywords(**llama.config_keywords(...), bias=False, attn_bias=False, qkv_bias=True,
                            layers=[{"sliding_window": window of layer i}, ...])

This file is the worked example of the docs' "Adding a model family" page.
"""
from __future__ import annotations

from dataclasses import replace

from ...models import GPTConfig
from . import llama
from .family import Family, check_export, shared
from .fields import (HONOURED, TOKENIZER, TRAINING, Field, divides, positive, positive_or_null, resolve, same,
                     with_fields)

MODEL_TYPE = "qwen2"
LAYER_TYPES = ("full_attention", "sliding_attention")
WINDOW_FIELDS = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")

FIELDS = with_fields(
    llama.COMMON_FIELDS,
    attention_dropout=Field("attention_dropout", 0.0, TRAINING, type="float"),
    vocab_size=Field("vocab_size", 151936, HONOURED, positive, note="vocab_size"),
    intermediate_size=Field("intermediate_size", 22016, HONOURED, positive, note="d_ff"),
    max_position_embeddings=Field("max_position_embeddings", 32768, HONOURED, positive, note="block_size"),
    num_key_value_heads=Field("num_key_value_heads", 32, HONOURED, divides("num_attention_heads"),
                              type="int | None", null=same("num_attention_heads"), note="n_kv_heads"),
    bos_token_id=Field("bos_token_id", None, TOKENIZER, type="int | None"),
    eos_token_id=Field("eos_token_id", None, TOKENIZER, type="int | list[int] | None"),
    use_sliding_window=Field("use_sliding_window", False, HONOURED, type="bool",
                             note="the windows of sliding_window on the sliding layers"),
    sliding_window=Field("sliding_window", 4096, HONOURED, positive_or_null, type="int | None",
                         note="sliding_window of the sliding layers (when use_sliding_window)"),
    max_window_layers=Field("max_window_layers", 28, HONOURED, type="int",
                            note="the layers from this index slide (without layer_types)"),
    layer_types=Field("layer_types", None, HONOURED, type="list[str] | None",
                      note="which layers slide: layers[i].sliding_window",
                      accepts="null, or 'full_attention' / 'sliding_attention' for each layer (sliding ones "
                              "with use_sliding_window and a sliding_window)"),
    head_dim=Field("head_dim", lambda r: r["hidden_size"] // r["num_attention_heads"], HONOURED,
                   llama.head_dim_rule, type="int | None",
                   note="read with getattr by the modeling file: head_dim"))


def layer_windows(r, model_type=MODEL_TYPE):
    """Qwen2Config.__post_init__ and Qwen2Attention (Qwen3's likewise): layer i slides (window
    ``sliding_window``) when use_sliding_window, sliding_window is set and layer_types[i] (default: i >=
    max_window_layers) says so. Returns one window (or None) per layer."""
    window = r["sliding_window"] if r["use_sliding_window"] else None
    n = r["num_hidden_layers"]
    types = r["layer_types"]
    if types is None:
        types = ["sliding_attention" if window is not None and i >= r["max_window_layers"] else "full_attention"
                 for i in range(n)]
    elif len(types) != n or not set(types) <= set(LAYER_TYPES):
        raise ValueError(f"{model_type} config.json field layer_types = {types!r}: must list 'full_attention' or "
                         f"'sliding_attention' for each of the {n} layers")
    elif window is None and "sliding_attention" in types:       # transformers' attention fails on a None window
        raise ValueError(f"{model_type} config.json field layer_types = {types!r}: names sliding_attention layers, "
                         f"but there is no window (use_sliding_window is false or sliding_window null), which "
                         f"transformers cannot run; set use_sliding_window true and a sliding_window, or list "
                         f"those layers as full_attention")
    return [window if t == "sliding_attention" else None for t in types]


def to_config(c):
    """The GPTConfig of a Qwen2 config.json: one window per layer."""
    r = resolve(FIELDS, c, MODEL_TYPE)
    windows = layer_windows(r)
    return GPTConfig.from_keywords(**llama.config_keywords(r), bias=False, attn_bias=False, qkv_bias=True,
                                   layers=[{"sliding_window": w} for w in windows])


def window_fields(config, name):
    """use_sliding_window, sliding_window, max_window_layers and layer_types of a GPTConfig's windows (one
    size for every sliding layer); ValueError naming what the family ``name`` cannot express."""
    windows = [b.sliding_window for b in config.layers]
    sizes = {w for w in windows if w is not None}
    check_export(name, [(len(sizes) <= 1, f"windows of several sizes {sorted(sizes)} ({name} has one "
                                          f"sliding_window)")])
    window = sizes.pop() if sizes else None
    types = ["full_attention" if w is None else "sliding_attention" for w in windows]
    suffix = types.index("sliding_attention") if window and "full_attention" not in \
        types[types.index("sliding_attention"):] else len(types)
    return {"use_sliding_window": window is not None, "sliding_window": window, "max_window_layers": suffix,
            "layer_types": types}


def to_hf(config):
    """The Qwen2 config.json of a GPTConfig: its sliding layers as layer_types (one window size for all)."""
    bias, attn = shared(config, "Qwen2", "bias", "attn_bias")
    check_export("Qwen2", [(not bias and not attn, "feed-forward or attention output biases (Qwen2 has q/k/v "
                                                   "biases only)")])
    out = {"architectures": ["Qwen2ForCausalLM"], "model_type": MODEL_TYPE, **llama.hf_fields("Qwen2", config),
           **window_fields(config, "Qwen2")}
    if out["head_dim"] * out["num_attention_heads"] == out["hidden_size"]:
        out.pop("head_dim")        # not a Qwen2Config field: written only when the modeling file's getattr needs it
    return out


# Llama's tensors; q/k/v biases always (a model without them exports zeros), none elsewhere
LAYOUT = replace(llama.LAYOUT, layer=tuple(replace(m, bias="always" if m.bias == "qkv" else "never")
                                           for m in llama.LAYOUT.layer))

FAMILY = Family(MODEL_TYPE, FIELDS, to_config, to_hf, LAYOUT)
