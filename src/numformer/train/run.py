"""Loading a finished (or running) run folder for evaluation, generation and analysis, and the config of a run
to resume.

Every file is checked as it is read: a missing folder or file, bad JSON, a
config.json that fails the config checks (``numformer.config``) or weights
saved with another model config each give one ValueError naming the file.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..config import apply_overrides, resolve_config, resume_changes
from ..data.base import make_task
from ..data.tokenizers import tokenizer_from_dict
from ..models import build_model
from .run_files import CHECKPOINT, MODEL, load_config_json, load_model_weights, load_tokenizer_state, read_json
from .run_folder import check_weights


def load_model(run_dir, config=None):
    """The run's model with its saved weights (model.safetensors, else the checkpoint), in eval mode."""
    run_dir = Path(run_dir)
    config = load_config_json(run_dir) if config is None else config
    model_cfg = {k: v for k, v in config["model"].items() if k != "init_from"}
    model = build_model(model_cfg, rng=np.random.default_rng(0), dtype=np.dtype(config["train"]["dtype"]))
    for name in (MODEL, CHECKPOINT):
        if (run_dir / name).is_file():
            meta = load_model_weights(run_dir / name, model)
            check_weights(run_dir / name, meta, config)
            return model.eval()
    raise ValueError(f"{run_dir} has no saved weights ({MODEL} or {CHECKPOINT})")


def load_tokenizer(run_dir):
    """The run's tokenizer (tokenizer.json), or None when the run has none."""
    state = load_tokenizer_state(run_dir)
    return None if state is None else tokenizer_from_state(state, run_dir)


def tokenizer_from_state(state, run_dir):
    """A tokenizer from (part of) a run's tokenizer.json; a damaged file is one ValueError naming it."""
    try:
        return tokenizer_from_dict(state)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"tokenizer file {Path(run_dir) / 'tokenizer.json'} is damaged "
                         f"({type(e).__name__}: {e}); restore it or retrain") from None


def load_task(run_dir, config=None):
    """The run's task, rebuilt from its [data] config with the saved vocabulary."""
    config = load_config_json(run_dir) if config is None else config
    try:
        return make_task(config["data"], config["train"]["seed"], load_tokenizer_state(run_dir))
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        raise ValueError(f"tokenizer file {Path(run_dir) / 'tokenizer.json'} does not fit the run's [data] "
                         f"({type(e).__name__}: {e}); restore it or retrain") from None


def resumed_config(run_dir, overrides=None):
    """(resolved config, task, notes) of a run to resume: its config.json with ``overrides`` (--set) applied, the
    task with the saved vocabulary (so that ids mean what they meant), and a note line on each change the
    overrides make (``config.resume_changes``, which refuses in one line a change that cannot be made)."""
    saved, tokenizer_state = load_config_json(run_dir), load_tokenizer_state(run_dir)
    try:
        config, task = resolve_config(apply_overrides(saved, overrides), tokenizer_state)
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        if tokenizer_state is None:
            raise
        raise ValueError(f"tokenizer file {Path(run_dir) / 'tokenizer.json'} is damaged or does not fit the run's "
                         f"[data] ({type(e).__name__}: {e}); restore it or retrain") from None
    return config, task, resume_changes(saved["train"], config["train"])
