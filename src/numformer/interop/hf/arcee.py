"""Arcee (``ArceeForCausalLM``, Arcee AFM): Llama with a feed-forward that is not gated,
down_proj(act(up_proj(x))), whose activation is squared ReLU by default (``hidden_act`` "relu2").

    GPTConfig.from_keywords(**llama.config_keywords(...), activation=ACTIVATIONS[hidden_act],
                            attn_bias=attention_bias, bias=mlp_bias)

numformer's non-gated ``FeedForward`` names its two maps ``linear1`` (up_proj) and ``linear2`` (down_proj).
"""
from __future__ import annotations

from dataclasses import replace

from ...models import GPTConfig
from . import llama
from .family import Family, Module_, check_export, shared
from .fields import HONOURED, TOKENIZER, TRAINING, Field, norm_eps, only, positive, resolve, with_fields

MODEL_TYPE = "arcee"
# transformers' ACT2FN name -> numformer's activation, for those numformer computes
ACTIVATIONS = {"relu2": "relu2", "relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu"}
TO_HIDDEN_ACT = {"relu2": "relu2", "relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "silu"}

FIELDS = with_fields(
    llama.COMMON_FIELDS,
    hidden_size=Field("hidden_size", 2560, HONOURED, positive, note="d_model"),
    intermediate_size=Field("intermediate_size", 18432, HONOURED, positive, note="d_ff"),
    hidden_act=Field("hidden_act", "relu2", HONOURED, only(*ACTIVATIONS), type="str",
                     note="activation (of the feed-forward, not gated)"),
    max_position_embeddings=Field("max_position_embeddings", 4096, HONOURED, positive, note="block_size"),
    rms_norm_eps=Field("rms_norm_eps", 1e-5, HONOURED, norm_eps, type="float", note="layer_norm_eps (norm 'rms')"),
    bos_token_id=Field("bos_token_id", 128000, TOKENIZER, type="int | None"),
    eos_token_id=Field("eos_token_id", 128001, TOKENIZER, type="int | list[int] | None"),
    attention_dropout=Field("attention_dropout", 0.0, TRAINING, type="float"),
    attention_bias=Field("attention_bias", False, HONOURED, type="bool", note="attn_bias"),
    mlp_bias=Field("mlp_bias", False, HONOURED, type="bool", note="bias (of the feed-forward)"))


def to_config(c):
    """The GPTConfig of an Arcee config.json."""
    r = resolve(FIELDS, c, MODEL_TYPE)
    return GPTConfig.from_keywords(**{**llama.config_keywords(r), "activation": ACTIVATIONS[r["hidden_act"]]},
                                   bias=bool(r["mlp_bias"]), attn_bias=bool(r["attention_bias"]))


def to_hf(config):
    """The Arcee config.json of a GPTConfig; ValueError naming what Arcee cannot express (besides ``hf_fields``'
    checks: sliding windows, q/k/v biases without the output projection's)."""
    bias, attn, qkv, window = shared(config, "Arcee", "bias", "attn_bias", "qkv_bias", "sliding_window")
    check_export("Arcee", [(qkv == attn, "q/k/v biases without an output projection bias (qkv_bias != attn_bias)"),
                           (window is None, f"sliding_window = {window} (Arcee attends to every earlier token)")])
    return {"architectures": ["ArceeForCausalLM"], "model_type": MODEL_TYPE,
            **llama.hf_fields("Arcee", config, hidden_acts=TO_HIDDEN_ACT), "attention_bias": attn, "mlp_bias": bias}


_ATTENTION, _NORMS = llama.LAYOUT.layer[:2], llama.LAYOUT.layer[-2:]      # Llama's, around its three ff maps
LAYOUT = replace(llama.LAYOUT, layer=(*_ATTENTION, Module_("ff.linear1", ("model.layers.{i}.mlp.up_proj",), "ff"),
                                      Module_("ff.linear2", ("model.layers.{i}.mlp.down_proj",), "ff"), *_NORMS))

FAMILY = Family(MODEL_TYPE, FIELDS, to_config, to_hf, LAYOUT)
