"""Loading a finished (or running) run folder for evaluation, generation and analysis, and the config of a run
to resume.

Every file is checked as it is read: a missing folder or file, bad JSON, a
config.json that fails the config checks (``numformer.config``) or weights
saved with another model config each give one ValueError naming the file.
"""
from __future__ import annotations

from pathlib import Path

from ..config import apply_overrides, load_config_json, resolve_config, resume_changes, resume_section_changes
from ..data.base import make_task
from ..interop.sources import load_run_model, tokenizer_from_state
from ..run_files import load_tokenizer_state


def load_model(run_dir, config=None):
    """The run's model with its saved weights (model.safetensors, else the checkpoint), in eval mode."""
    config = load_config_json(run_dir) if config is None else config
    return load_run_model(run_dir, config["model"], config["train"]["dtype"], config.get("lora"))


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


def resumed_config(run_dir, overrides=None):
    """(resolved config, task, notes) of a run to resume: its config.json with ``overrides`` (--set) applied, the
    task with the saved vocabulary (so that ids mean what they meant), and a note line on each change the
    overrides make (``config.resume_changes`` for [train], ``config.resume_section_changes`` for [model], [data]
    and [lora]; each refuses in one line a change that cannot be made)."""
    saved, tokenizer_state = load_config_json(run_dir), load_tokenizer_state(run_dir)
    wanted = apply_overrides(saved, overrides)
    resume_section_changes(saved, wanted)       # a change refused by name before any data or source is read
    try:
        config, task = resolve_config(wanted, tokenizer_state)
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        if tokenizer_state is None:
            raise
        raise ValueError(f"tokenizer file {Path(run_dir) / 'tokenizer.json'} is damaged or does not fit the run's "
                         f"[data] ({type(e).__name__}: {e}); restore it or retrain") from None
    return config, task, resume_changes(saved["train"], config["train"]) + resume_section_changes(saved, config)
