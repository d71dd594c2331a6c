"""Loading a finished (or running) run folder for evaluation, generation and analysis.

Every file is checked as it is read: a missing folder or file, bad JSON, a
config.json that fails the config checks (``numformer.config``) or weights
saved with another model config each give one ValueError naming the file.
"""
from __future__ import annotations

from pathlib import Path

from ..config import load_config_json
from ..data.base import make_task
from ..interop.sources import load_run_model, tokenizer_from_state
from ..run_files import load_tokenizer_state


def load_model(run_dir, config=None):
    """The run's model with its saved weights (model.safetensors, else the checkpoint), in eval mode."""
    config = load_config_json(run_dir) if config is None else config
    return load_run_model(run_dir, config["model"], config["train"]["dtype"])


def load_tokenizer(run_dir):
    """The run's tokenizer (tokenizer.json), or None when the run has none."""
    state = load_tokenizer_state(run_dir)
    return None if state is None else tokenizer_from_state(state, run_dir)


def load_task(run_dir, config=None):
    """The run's task, rebuilt from its [data] config with the saved vocabulary."""
    config = load_config_json(run_dir) if config is None else config
    try:
        return make_task(config["data"], config["train"]["seed"], load_tokenizer_state(run_dir))
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        raise ValueError(f"tokenizer file {Path(run_dir) / 'tokenizer.json'} does not fit the run's [data] "
                         f"({type(e).__name__}: {e}); restore it or retrain") from None
