"""Complete models: EncoderClassifier, GPT, Transformer; ``build_model`` makes one from a config section."""
from __future__ import annotations

import inspect

import numpy as np

from ..keys import BOOL, Key, positive
from ..nn.attention import MultiHeadAttention
from ..nn.layers import FEED_FORWARD_ACTIVATIONS, NORMS
from ..nn.positional import POSITIONAL_KINDS
from .classifier import POOLINGS, EncoderClassifier
from .gpt import GPT
from .params import format_parameter_report, parameter_counts, parameter_report
from .transformer import Transformer

MODEL_TYPES = {"gpt": GPT, "classifier": EncoderClassifier, "transformer": Transformer}

# Named sizes for a config's ``[model] preset``: the keys a preset sets, where the config does not set them.
# "small" (the default) trains in minutes on a laptop CPU; "base" and "big" are the papers' sizes: the
# Transformer's base and big models ("Attention Is All You Need", table 3), BERT-base for the encoder
# classifier, GPT-2 small (124M parameters with GPT-2's vocabulary) for the GPT.
MODEL_PRESETS = {
    "gpt": {
        "small": {"n_layers": 4, "n_heads": 4, "d_model": 128, "d_ff": None, "dropout": 0.0},
        "base": {"n_layers": 12, "n_heads": 12, "d_model": 768, "d_ff": 3072, "dropout": 0.1},
    },
    "classifier": {
        "small": {"n_layers": 1, "n_heads": 1, "d_model": 64, "d_ff": None, "dropout": 0.1},
        "base": {"n_layers": 12, "n_heads": 12, "d_model": 768, "d_ff": 3072, "dropout": 0.1},
    },
    "transformer": {
        "small": {"n_layers": 2, "n_heads": 4, "d_model": 128, "d_ff": 512, "dropout": 0.1},
        "base": {"n_layers": 6, "n_heads": 8, "d_model": 512, "d_ff": 2048, "dropout": 0.1},
        "big": {"n_layers": 6, "n_heads": 16, "d_model": 1024, "d_ff": 4096, "dropout": 0.3},
    },
}
DEFAULT_PRESET = "small"


def preset_arguments(kind, preset=DEFAULT_PRESET):
    """The constructor arguments of a named size of a model type (``MODEL_PRESETS``); ValueError naming the
    valid presets for an unknown one."""
    presets = MODEL_PRESETS[kind]
    if not isinstance(preset, str) or preset not in presets:
        raise ValueError(f"[model] preset = {preset!r} is not a preset of the {kind} model; choose one of "
                         f"{sorted(presets)}")
    return dict(presets[preset])


def model_arguments(kind):
    """The config keys a model type accepts (its constructor arguments, minus rng and dtype)."""
    if kind not in MODEL_TYPES:
        raise ValueError(f"unknown model type {kind!r}; choose one of {sorted(MODEL_TYPES)}")
    sig = inspect.signature(MODEL_TYPES[kind].__init__)
    return {name: p.default for name, p in sig.parameters.items() if name not in ("self", "rng", "dtype")}


def model_keys():
    """The type and range of every [model] key (``numformer.keys.Key``), for ``numformer.config``."""
    ids = Key(int, 0, none=True)
    return {
        "vocab_size": positive(), "src_vocab_size": positive(), "tgt_vocab_size": positive(),
        "n_classes": positive(), "block_size": positive(), "max_len": positive(), "n_layers": positive(),
        "n_heads": positive(), "d_model": positive(),
        "d_ff": positive(none=True), "n_encoder_layers": positive(none=True), "n_decoder_layers": positive(none=True),
        "dropout": Key(float, 0, 1, open=(False, True)), "layer_norm_eps": positive(float),
        "positional": Key(str, choices=POSITIONAL_KINDS), "n_kv_heads": positive(none=True),
        "rope_theta": positive(float),
        "activation": Key(str, choices=FEED_FORWARD_ACTIVATIONS),
        "norm": Key(str, choices=tuple(NORMS)), "attention": Key(str, choices=MultiHeadAttention.ATTENTION_KINDS),
        "pooling": Key(str, choices=POOLINGS), "norm_first": BOOL, "tie_weights": BOOL, "bias": BOOL,
        "scale_embeddings": BOOL, "share_embeddings": BOOL, "tie_output": BOOL, "gradient_checkpointing": BOOL,
        "final_norm": Key(bool, none=True), "attn_bias": Key(bool, none=True),
        "qkv_bias": Key(bool, none=True), "sliding_window": positive(none=True), "padding_idx": ids,
        "pad_id": ids, "src_pad_id": ids, "tgt_pad_id": ids, "bos_id": ids, "eos_id": ids,
    }


def build_model(config, rng=None, dtype=np.float32):
    """Build a model from a dict such as ``{"type": "gpt", "vocab_size": 65, "block_size": 64, ...}``.

    Unknown keys raise one ValueError naming them and listing the valid ones.
    """
    config = dict(config)
    kind = config.pop("type", None)
    if kind is None:
        raise ValueError(f"the model section needs a 'type', one of {sorted(MODEL_TYPES)}")
    valid = model_arguments(kind)
    unknown = sorted(set(config) - set(valid))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} for model type {kind!r}; valid keys: {sorted(valid)}")
    missing = sorted(k for k, d in valid.items() if d is inspect.Parameter.empty and k not in config)
    if missing:
        raise ValueError(f"model type {kind!r} needs {missing}")
    return MODEL_TYPES[kind](**config, rng=rng, dtype=dtype)


__all__ = ["EncoderClassifier", "GPT", "Transformer", "MODEL_TYPES", "MODEL_PRESETS", "DEFAULT_PRESET",
           "preset_arguments", "build_model", "model_arguments", "model_keys",
           "parameter_counts", "parameter_report", "format_parameter_report"]
