"""A run folder's tokenizer.json, read for every command that reads a run: the saved vocabulary the weights were
trained on, checked against the run's task and never rebuilt from the data (``load_tokenizer_json``).

This module sits below the configs and the model sources (``numformer.config``, ``interop.sources``), which
both read a run's tokenizer through it, and above the tasks and the run folder's files, which it uses.
"""
from __future__ import annotations

from pathlib import Path

from ..run_files import NOT_REBUILT, TOKENIZER, load_tokenizer_state, read_json
from .base import Task, find_task
from .tokenizers import TOKENIZER_TYPES, is_hf_document, tokenizer_from_dict


def load_tokenizer_json(run_dir, data):
    """The state in the run's tokenizer.json (``run_files.load_tokenizer_state``), or None for a run whose task
    keeps no tokenizer (``data``: the run's [data] section). Every command that reads a
    run's tokenizer reads it here: one ValueError naming the file when it is missing from a run whose task keeps
    one, when it holds no tokenizer's state, or (a task of numformer's) a tokenizer of an unknown type. It is
    never rebuilt from the data: a vocabulary built again from the data as they are now may give other ids.

    A task keeps a tokenizer when its class defines ``Task.tokenizer_state`` (every task of numformer's does), so
    a run folder without tokenizer.json is a run of a task without one, or a run whose tokenizer.json was lost."""
    path = Path(run_dir) / TOKENIZER
    state = load_tokenizer_state(run_dir)
    task_cls = find_task(data.get("task"), data.get("task_module"))
    if state is None:
        if task_cls.tokenizer_state is not Task.tokenizer_state:
            raise ValueError(f"{path} is missing: the run's task {data.get('task')!r} keeps its vocabulary there, "
                             f"and the weights were trained on its ids; restore tokenizer.json from a copy of the "
                             f"run folder ({NOT_REBUILT}), or train a new run")
        return None
    problem = _unknown_tokenizer(state) if task_cls.__module__.startswith("numformer.") else None
    if problem:
        raise ValueError(f"tokenizer file {path} is damaged ({problem}); restore it from a copy of the run folder "
                         f"({NOT_REBUILT})")
    if task_cls.__module__.startswith("numformer."):
        _check_vocab_sizes(path, state, _saved_model_section(run_dir))
    return state


def _saved_model_section(run_dir):
    """The [model] section of the run's config.json, or {} where it cannot be read (its readers name that)."""
    try:
        model = read_json(Path(run_dir) / "config.json", "config file").get("model")
    except (OSError, ValueError, AttributeError):
        return {}
    return model if isinstance(model, dict) else {}


def _check_vocab_sizes(path, state, model):
    """One ValueError naming tokenizer.json when a vocabulary in it (``state``) is not the size of the model's
    (``model``: the run's [model] section): an edited or swapped file whose ids the weights do not mean. A
    fine-tuned model (init_from) or a Hugging Face tokenizer's model (``import-hf``: Qwen's embedding has
    151,936 rows for 151,665 tokens) may have more ids than its tokenizer (a padded embedding), never fewer."""
    keys = (["vocab_size"] if "vocab_size" in model else
            ["src_vocab_size"] + ([] if state.get("joint") else ["tgt_vocab_size"]))
    for key, part in zip(keys, tokenizer_parts(state)):
        if not isinstance(model.get(key), int) or not isinstance(part, dict) or is_hf_document(part):
            continue
        try:
            size = tokenizer_from_dict(part).vocab_size
        except (KeyError, TypeError, AttributeError, ValueError):
            continue            # a damaged state: the tokenizer's reader names it
        padded = "init_from" in model or part.get("type") == "hf"
        if size > model[key] or (size != model[key] and not padded):
            raise ValueError(f"tokenizer file {path} holds a vocabulary of {size} tokens, but the model's {key} "
                             f"is {model[key]}: the weights were trained on the ids of another tokenizer; "
                             f"restore the run's tokenizer.json from a copy of the run folder ({NOT_REBUILT})")


def tokenizer_parts(state):
    """The tokenizers' states in a tokenizer.json state of a task of numformer's: the state itself, or a
    translation run's source tokenizer (``src``) and, without a joint vocabulary, its target tokenizer (``tgt``)."""
    if "type" not in state and "src" in state:
        return [state["src"]] + ([] if state.get("joint") else [state.get("tgt")])
    return [state]


def _unknown_tokenizer(state):
    """Why the tokenizer.json state of a task of numformer's holds a tokenizer of no known type, or None: its
    tokenizers are Hugging Face documents or states with a ``type`` of ``TOKENIZER_TYPES``."""
    for part in tokenizer_parts(state):
        kind = part.get("type") if isinstance(part, dict) else None
        if not is_hf_document(part) and not (isinstance(kind, str) and kind in TOKENIZER_TYPES):
            return (f"unknown tokenizer type {kind!r}; numformer's are {sorted(TOKENIZER_TYPES)} or a Hugging Face "
                    f"tokenizer.json")
    return None
