"""Loading a finished (or running) run folder for evaluation, generation and analysis."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..models import build_model
from .checkpoint import CHECKPOINT, MODEL, load_model_weights


def load_config_json(run_dir):
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{run_dir} is not a numformer run folder (no config.json); train one with "
                         f"`numformer train CONFIG --out {run_dir}`")
    return json.loads(path.read_text())


def load_model(run_dir, config=None):
    """The run's model with its saved weights (model.safetensors, else the checkpoint), in eval mode."""
    run_dir = Path(run_dir)
    config = load_config_json(run_dir) if config is None else config
    model_cfg = {k: v for k, v in config["model"].items() if v is not None and k != "init_from"}
    model = build_model(model_cfg, rng=np.random.default_rng(0), dtype=np.dtype(config["train"]["dtype"]))
    for name in (MODEL, CHECKPOINT):
        if (run_dir / name).is_file():
            load_model_weights(run_dir / name, model)
            return model.eval()
    raise ValueError(f"{run_dir} has no saved weights ({MODEL} or {CHECKPOINT})")


def load_tokenizer_state(run_dir):
    path = Path(run_dir) / "tokenizer.json"
    return json.loads(path.read_text()) if path.is_file() else None


def load_task(run_dir, config=None):
    """The run's task, rebuilt from its [data] config with the saved vocabulary."""
    from ..data import make_task

    config = load_config_json(run_dir) if config is None else config
    return make_task(config["data"], config["train"]["seed"], load_tokenizer_state(run_dir))
