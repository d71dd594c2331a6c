"""A model from any source: a numformer run folder, a Hugging Face folder, or a hub id.

    model, tokenizer = numformer.load("runs/shakespeare")     # or "gpt2", "hf:gpt2", "path/to/hf_folder"

``load`` is the one loading function: ``numformer generate`` (and ``explore``, ``chat``) calls it; in halves,
so do ``numformer import-hf``, a config's ``[model] init_from`` and the trainer's fine-tuning start.
``read_source`` reads what a source says without its weights (its [model] section, in the keyword form of
``GPTConfig.to_dict``, and its tokenizer); ``load_weights`` copies the source's weights into a model built
from that section. This module sits below the configs and training, which call it, and above the models and
the Hugging Face files, which it uses; nothing registers anything when numformer is imported.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._limits import bounded_json
from .._platform import check_memory
from ..data.run_tokenizer import load_tokenizer_json
from ..data.tokenizers import tokenizer_from_dict
from ..keys import Key
from ..lora import add_lora, check_lora_options, merge_lora
from ..models import build_model, check_model_section, model_arguments
from ..nn import init
from ..run_files import (RUN_ONLY_FILES, check_run_dir, load_metadata, load_model_weights, load_tokenizer_state,
                         model_tensors, read_run_config, run_weights, weights_path)
from .hf import checkpoints as hf

FINE_TUNING_OPTIONS = ("dropout", "attention", "gradient_checkpointing")   # may differ from the source model


@dataclass(frozen=True)
class Source:
    """What a source says, without its weights. kind: "run" or "hf"; folder: the run folder or the Hugging Face
    folder (a hub id's cached snapshot); model: its [model] section (with its type); tokenizer_state: the
    tokenizer's saved state, or None; dtype: the weights' dtype name (a run's [train] dtype; float32 for a
    Hugging Face source); lora: a LoRA run's [lora] section, else None."""
    kind: str
    folder: Path
    model: dict
    tokenizer_state: dict | None
    dtype: str = "float32"
    lora: dict | None = None          # a LoRA run's [lora] section (its weights hold the adapters), else None


def is_run_folder(source):
    """Whether ``source`` is a numformer run folder: its config.json has a [model] section, or it holds no
    config at all (``{}``, a list, null, no JSON) beside a file only a run writes (``RUN_ONLY_FILES``): a run
    whose config.json was damaged, which reading it names (``read_run_config``), not a Hugging Face folder."""
    path = Path(str(source)) / "config.json"
    if not path.is_file():
        return False
    try:
        config = bounded_json(path.read_bytes(), str(path))
    except (OSError, ValueError):
        config = None
    if isinstance(config, dict) and config:
        return "model" in config
    return any(os.path.lexists(path.parent / name) for name in RUN_ONLY_FILES)


def read_source(source):
    """The ``Source`` of a run folder, a Hugging Face folder or a hub id (written ``hf:NAME`` or plain);
    reads configs and tokenizers only. A run's [model] section is checked as a config's is."""
    if is_run_folder(source):
        return _read_run(Path(source))
    folder = hf.resolve_source(source)
    hf_config = hf.read_hf_config(folder)
    config = hf.hf_model_config(folder, hf_config)
    tokenizer = hf.load_tokenizer(folder, hf_config)
    return Source("hf", folder, {"type": "gpt", **config.to_dict()},
                  None if tokenizer is None else tokenizer.to_dict())


def _read_run(folder):
    check_run_dir(folder)
    path = folder / "config.json"
    saved = read_run_config(folder)
    try:
        model = check_model_section({k: v for k, v in saved["model"].items() if k != "init_from"})
        dtype = Key(str, choices=("float32", "float64")).check("train", "dtype",
                                                                saved.get("train", {}).get("dtype", "float32"))
        lora = saved.get("lora")
        if lora is not None:
            lora = {**lora, "target_modules": check_lora_options(**lora)}
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: {e}") from None
    data = saved.get("data")
    # a run's tokenizer.json as every reader of a run reads it (a lost or damaged one refused, never rebuilt);
    # a hand-made folder whose config.json names no task only has what its tokenizer.json holds
    tokenizer_state = (load_tokenizer_json(folder, data) if isinstance(data, dict) and "task" in data
                       else load_tokenizer_state(folder))
    return Source("run", folder, model, tokenizer_state, dtype, lora)


def load_weights(model, source):
    """Copy the weights of ``source`` (run folder, Hugging Face folder or hub id) into ``model``, a model
    built from its [model] section; a LoRA run's adapters merged into its base weights. Returns the model."""
    if is_run_folder(source):
        src = read_source(source)
        if src.lora:        # its weights hold the adapters: start from the model they make (PEFT's merge_and_unload)
            merged = merge_lora(load_run_model(src.folder, src.model, src.dtype, src.lora))
            model.load_state_dict(merged.state_dict())
            return model
        load_model_weights(run_weights(source), model)
        return model
    return hf.load_hf_weights(model, hf.resolve_source(source))


def check_load_memory(source, dtype):
    """One ValueError (``_platform.check_memory``) when this machine lacks the memory to load the weights of
    ``source`` (run folder, Hugging Face folder or hub id) in ``dtype``: for a caller to check before it builds
    the model (``numformer import-hf``, a run's [model] init_from). Silent: the loading that follows names a
    run's checkpoint.safetensors read for want of model.safetensors (``run_weights``), once."""
    if is_run_folder(source):
        check_memory(source, *hf.memory_needed(model_tensors(weights_path(source)), dtype))
    else:
        check_memory(source, *hf.folder_memory_needed(hf.resolve_source(source), dtype))


def load(source, dtype=None, quantize=None, **overrides):
    """(model in eval mode, tokenizer or None) of a run folder, a Hugging Face folder or a hub id.

    dtype: the weights' dtype (default: the run's, float32 for a Hugging Face model); quantize: a
    ``numformer.quantize.LayerQuantizer``, which quantizes each linear layer as soon as its weights are
    read, so the float model is never whole in memory (its report in ``quantize.report``; a LoRA run is
    refused: merge its adapters, then ``quantize_model``); overrides: the options that do not change the
    weights (``FINE_TUNING_OPTIONS``: dropout, attention, gradient_checkpointing). A LoRA run's model carries
    its adapters, unmerged.
    """
    changed = sorted(set(overrides) - set(FINE_TUNING_OPTIONS))
    if changed:
        raise ValueError(f"{changed} would change the model of {source}; only {list(FINE_TUNING_OPTIONS)} may be "
                         f"set when loading it")
    if not is_run_folder(source):
        return hf.load_pretrained(source, dtype=np.float32 if dtype is None else dtype, quantize=quantize,
                                  **overrides)
    src = read_source(source)
    model = load_run_model(src.folder, {**src.model, **overrides}, dtype or src.dtype, src.lora, quantize)
    state = src.tokenizer_state
    return model, None if state is None else tokenizer_from_state(state, src.folder)


def load_run_model(run_dir, model_section, dtype, lora=None, quantize=None):
    """A run's model: built from its [model] section in ``dtype`` (with the adapters of its [lora] section
    ``lora``, when it has one), with its saved weights (model.safetensors, else the checkpoint's), which must
    have been trained with that section (``check_weights``); eval mode. quantize: a ``LayerQuantizer``, as
    ``load``'s."""
    run_dir = Path(run_dir)
    section = {k: v for k, v in model_section.items() if k != "init_from"}
    # every parameter is written by load_model_weights (strict: or it raises); until then its zeros take no
    # memory (the operating system maps a page when it is first written)
    with init.skipped():
        model = build_model(section, rng=np.random.default_rng(0), dtype=np.dtype(dtype))
        if lora:
            add_lora(model, **lora, rng=0)
    path = run_weights(run_dir)
    check_weights(path, load_metadata(path, "model file"), section, dtype)          # before any weight is read
    if quantize is not None:
        quantize.start(model)           # a LoRA model is refused here
    check_memory(run_dir, *hf.memory_needed(model_tensors(path), dtype, quantize))
    load_model_weights(path, model, written=None if quantize is None else quantize.written)
    if quantize is not None:
        quantize.finish()
    return model.eval()


def check_weights(path, meta, model_section, dtype):
    """Weights saved with ``train.run_folder.weights_metadata`` must match the run's [model] section (an
    edited n_heads keeps every shape but changes the model). A key the saved section lacks (written before
    the key existed) counts as its default."""
    saved = meta.get("model_config")
    if saved is None:
        return
    saved = bounded_json(saved, f"the model_config metadata of {path}")
    if not isinstance(saved, dict):
        raise ValueError(f"the model_config metadata of {path} is a JSON {type(saved).__name__}, not the [model] "
                         f"section it was trained with; {path} is damaged: restore it or retrain")
    defaults = model_arguments(model_section["type"]) if model_section.get("type") in ("gpt", "classifier",
                                                                                          "transformer") else {}
    value = lambda section, k: section.get(k, defaults.get(k))       # noqa: E731
    changed = sorted(k for k in set(saved) | set(model_section) if k != "init_from"
                     and value(saved, k) != value(model_section, k))
    if changed:
        diffs = ", ".join(f"{k} {saved.get(k)!r} -> {model_section.get(k)!r}" for k in changed)
        raise ValueError(f"{path} was trained with another [model] config than config.json ({diffs}); "
                         f"restore config.json or retrain")
    if meta.get("dtype") not in (None, str(dtype)):
        raise ValueError(f"{path} was trained in {meta['dtype']}, but config.json says dtype = "
                         f"{str(dtype)!r}; restore config.json")


def tokenizer_from_state(state, run_dir):
    """A tokenizer from (part of) a run's tokenizer.json; a damaged file is one ValueError naming it."""
    try:
        return tokenizer_from_dict(state)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"tokenizer file {Path(run_dir) / 'tokenizer.json'} is damaged "
                         f"({type(e).__name__}: {e}); restore it or retrain") from None


__all__ = ["Source", "load", "read_source", "load_weights", "load_run_model", "is_run_folder", "check_weights",
           "tokenizer_from_state", "FINE_TUNING_OPTIONS"]
