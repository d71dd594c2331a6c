"""Complete models: GPT, EncoderClassifier, Transformer, each built from its config (``GPTConfig`` with one
``BlockConfig`` per layer, ``EncoderClassifierConfig``, ``TransformerConfig``); ``build_model`` makes one from
a config section."""
from .build import (DEFAULT_PRESET, MODEL_PRESETS, MODEL_TYPES, apply_preset, build_model, check_model_section,
                    check_model_together, check_source_type, model_arguments, model_keys, preset_arguments)
from .classifier import EncoderClassifier
from .config import BlockConfig, EncoderClassifierConfig, GPTConfig, TransformerConfig
from .gpt import GPT
from .params import format_parameter_report, parameter_counts, parameter_report
from .transformer import Transformer

__all__ = ["EncoderClassifier", "GPT", "Transformer", "GPTConfig", "BlockConfig", "EncoderClassifierConfig",
           "TransformerConfig", "MODEL_TYPES", "MODEL_PRESETS", "DEFAULT_PRESET", "preset_arguments", "build_model",
           "model_arguments", "model_keys", "check_model_section", "check_model_together", "check_source_type",
           "apply_preset",
           "parameter_counts", "parameter_report", "format_parameter_report"]
