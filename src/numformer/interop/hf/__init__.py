"""Hugging Face checkpoints in and out, one file per model family.

    model, tokenizer = load_pretrained("gpt2")          # hub id, or a folder with config.json + model.safetensors
    export_hf(model, "out_dir", tokenizer)              # config.json + model.safetensors (+ tokenizer.json)

``gpt2.py``, ``llama.py``, ``mistral.py``, ``qwen2.py``, ``qwen3.py``, ``gemma2.py``, ``gemma3.py`` (model_type
``gemma3_text``): each family's field table (every config.json field transformers reads), its map from config.json
to a ``GPTConfig`` and back, and its tensor names (``family.py`` says what a family file fills in, ``fields.py``
how a field table is applied); ``families.py`` lists them; ``checkpoints.py`` reads and writes the folders, the
same for every family.
Loading any source (a run folder too) is ``numformer.interop.sources.load``.
"""
from .checkpoints import (CONFIG, WEIGHTS, export_hf, hf_model_config, load_hf_weights, load_pretrained,
                          load_tokenizer, read_hf_config, read_safetensors, resolve_source, to_hf_state,
                          to_numformer_state)
from .families import FAMILIES, default_export_type, family, fields_markdown, resolve
from .family import Family, TensorMap

__all__ = ["load_pretrained", "export_hf", "load_hf_weights", "load_tokenizer", "hf_model_config", "read_hf_config",
           "read_safetensors", "resolve_source", "to_hf_state", "to_numformer_state", "FAMILIES", "family",
           "default_export_type", "fields_markdown", "resolve", "Family", "TensorMap", "CONFIG", "WEIGHTS"]
