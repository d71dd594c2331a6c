"""Mistral (``MistralForCausalLM``): Llama without biases, with one sliding window for every layer
(``sliding_window``, MistralConfig's default 4096 when absent; null: none).

    GPTConfig.from_keywords(**llama.config_keywords(...), bias=False, sliding_window=sliding_window)
"""
from __future__ import annotations

from ...models import GPTConfig
from . import llama
from .family import Family, check_export, shared
from .fields import HONOURED, TRAINING, Field, divides, positive, positive_or_null, resolve, with_fields

MODEL_TYPE = "mistral"

FIELDS = with_fields(
    llama.COMMON_FIELDS,
    attention_dropout=Field("attention_dropout", 0.0, TRAINING, type="float"),
    intermediate_size=Field("intermediate_size", 14336, HONOURED, positive, note="d_ff"),
    num_key_value_heads=Field("num_key_value_heads", 8, HONOURED, divides("num_attention_heads"),
                              note="n_kv_heads"),
    max_position_embeddings=Field("max_position_embeddings", 4096 * 32, HONOURED, positive, note="block_size"),
    sliding_window=Field("sliding_window", 4096, HONOURED, positive_or_null, type="int | None",
                         note="sliding_window (null: none)"))


def to_config(c):
    """The GPTConfig of a Mistral config.json."""
    r = resolve(FIELDS, c, MODEL_TYPE)
    return GPTConfig.from_keywords(**llama.config_keywords(r), bias=False, sliding_window=r["sliding_window"])


def to_hf(config):
    """The Mistral config.json of a GPTConfig (one window for every layer, no biases)."""
    biases = shared(config, "Mistral", "bias", "attn_bias", "qkv_bias")
    window = shared(config, "Mistral", "sliding_window")
    check_export("Mistral", [(not any(biases), "biases (Mistral has none)")])
    return {"architectures": ["MistralForCausalLM"], "model_type": MODEL_TYPE, **llama.hf_fields("Mistral", config),
            "sliding_window": window}


FAMILY = Family(MODEL_TYPE, FIELDS, to_config, to_hf, llama.LAYOUT)
