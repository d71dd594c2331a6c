"""A model from a [model] section: its keys (type and range of each), presets, defaults and checks.

``build_model({"type": "gpt", "vocab_size": 65, ...})`` builds one; ``check_model_section`` checks a section
on its own (every size written in it), as config.json's [model] and a Hugging Face import are checked.
"""
from __future__ import annotations

import inspect

import numpy as np

from ..keys import BOOL, Key, check_section, did_you_mean, positive
from ..nn.blocks import NORM_PLACEMENTS
from ..nn.layers import FEED_FORWARD_ACTIVATIONS, NORMS
from ..nn.positional import POSITIONAL_KINDS
from .classifier import POOLINGS, EncoderClassifier
from .config import ATTENTION_KINDS, CONFIG_CLASSES, keyword_arguments
from .gpt import GPT
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
    """The config keys a model type accepts (its keyword form, ``models.config.KEYWORD_FORMS``) with their
    defaults (``inspect.Parameter.empty``: required)."""
    if kind not in MODEL_TYPES:
        raise ValueError(f"unknown model type {kind!r}; choose one of {sorted(MODEL_TYPES)}")
    return keyword_arguments(kind)


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
        "norm": Key(str, choices=tuple(NORMS)), "attention": Key(str, choices=ATTENTION_KINDS),
        "pooling": Key(str, choices=POOLINGS), "norm_first": BOOL, "tie_weights": BOOL, "bias": BOOL,
        "scale_embeddings": BOOL, "share_embeddings": BOOL, "tie_output": BOOL, "gradient_checkpointing": BOOL,
        "final_norm": Key(bool, none=True), "attn_bias": Key(bool, none=True),
        "qkv_bias": Key(bool, none=True), "sliding_window": positive(none=True), "padding_idx": ids,
        "pad_id": ids, "src_pad_id": ids, "tgt_pad_id": ids, "bos_id": ids, "eos_id": ids,
        "head_dim": positive(none=True), "qk_norm": BOOL, "feed_forward": BOOL,
        "norm_placement": Key(str, choices=NORM_PLACEMENTS, none=True),
        "attn_scale": positive(float, none=True), "attn_logit_softcap": positive(float, none=True),
        "final_logit_softcap": positive(float, none=True), "layers": Key(list, none=True),
        "rope_scaling": Key(dict, none=True),
    }


def build_model(config, rng=None, dtype=np.float32):
    """Build a model from a dict such as ``{"type": "gpt", "vocab_size": 65, "block_size": 64, ...}``, with
    ``rng`` (a Generator, a seed or None) and the parameters' ``dtype``.

    Keys not given take the keyword form's defaults (no preset: ``apply_preset`` does that). Unknown keys
    raise one ValueError naming them and listing the valid ones; a missing type or required key too.
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
    return MODEL_TYPES[kind](CONFIG_CLASSES[kind].from_dict(config), rng=rng, dtype=dtype)


def check_source_type(source, source_type, wanted, task, task_types):
    """ValueError when a fine-tuning source (``[model] init_from``) holds a model of another type than the
    config trains: ``wanted``, the type the config writes ([model] type or [data] model_type), or where it
    writes none, one of ``task_types``, the types task ``task`` trains."""
    if wanted is not None and not (isinstance(wanted, str) and wanted in MODEL_TYPES):
        return          # not a model type: the [model] check names it
    if source_type == wanted or (wanted is None and source_type in task_types):
        return
    cls = getattr(MODEL_TYPES.get(source_type), "__name__", source_type)
    held = f"{source} holds a {source_type} model ({cls})"
    if wanted is not None:
        raise ValueError(f"{held}; [model] init_from needs a run of the same model type ({wanted}): give a "
                         f"{wanted} run")
    raise ValueError(f"{held}; task {task!r} trains a {' or '.join(task_types)} model, so [model] init_from "
                     f"needs a run of that type")


def check_model_section(model):
    """A [model] section on its own (no [data]: every size written in it), checked like a whole config's;
    returns it with every default filled in."""
    model = dict(model)
    kind = model.pop("type", None)
    if kind is None:
        raise ValueError(f"[model] needs type, one of {sorted(MODEL_TYPES)} (and the model's sizes, or a [data] "
                         f"section, which sets them)")
    if not isinstance(kind, str) or kind not in MODEL_TYPES:
        raise ValueError(f"[model] type = {kind!r} is not a model type{did_you_mean(kind, MODEL_TYPES)}; choose one "
                         f"of {sorted(MODEL_TYPES)}")
    model = apply_preset(kind, model)
    valid = model_arguments(kind)
    model = check_section("model", model, model_keys(), valid)
    missing = sorted(k for k, d in valid.items() if d is inspect.Parameter.empty and k not in model)
    if missing:
        raise ValueError(f"[model] needs {missing} (or a [data] section, which sets the sizes)")
    full = {"type": kind, **{k: d for k, d in valid.items() if d is not inspect.Parameter.empty}, **model}
    check_model_together(full)
    return full


def apply_preset(kind, model, fine_tuning=False):
    """[model] with its ``preset``'s sizes where it does not set them (``MODEL_PRESETS``; the default
    preset, "small", where none is named). A fine-tuned model takes its sizes from the source instead. The
    resolved config records the sizes themselves, not the preset's name."""
    named = "preset" in model
    preset = model.pop("preset", DEFAULT_PRESET)
    if fine_tuning:
        if named:
            raise ValueError("[model] preset and init_from exclude each other: a fine-tuned model has the "
                             "source's sizes; remove preset")
        return model
    return {**preset_arguments(kind, preset), **model}


def check_model_together(m):
    """Rules between [model] keys: the model's config is built (``models.config``), so that every rule
    between options holds before a run folder is written; one ValueError naming [model]."""
    d_model, n_heads = m.get("d_model"), m.get("n_heads")
    if d_model and n_heads and d_model % n_heads and m.get("head_dim") is None:
        raise ValueError(f"[model] d_model = {d_model} must be divisible by n_heads = {n_heads}")
    try:
        CONFIG_CLASSES[m["type"]].from_dict({k: v for k, v in m.items() if k not in ("type", "init_from")})
    except (ValueError, TypeError) as e:
        raise ValueError(f"[model] {e}") from None


