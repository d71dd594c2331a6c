"""Complete models: EncoderClassifier, GPT, Transformer; ``build_model`` makes one from a config section."""
from __future__ import annotations

import inspect

import numpy as np

from .classifier import EncoderClassifier
from .gpt import GPT
from .params import format_parameter_report, parameter_counts, parameter_report
from .transformer import Transformer

MODEL_TYPES = {"gpt": GPT, "classifier": EncoderClassifier, "transformer": Transformer}


def model_arguments(kind):
    """The config keys a model type accepts (its constructor arguments, minus rng and dtype)."""
    if kind not in MODEL_TYPES:
        raise ValueError(f"unknown model type {kind!r}; choose one of {sorted(MODEL_TYPES)}")
    sig = inspect.signature(MODEL_TYPES[kind].__init__)
    return {name: p.default for name, p in sig.parameters.items() if name not in ("self", "rng", "dtype")}


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


__all__ = ["EncoderClassifier", "GPT", "Transformer", "MODEL_TYPES", "build_model", "model_arguments",
           "parameter_counts", "parameter_report", "format_parameter_report"]
